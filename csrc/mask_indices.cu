// mask -> indices (per-row stream compaction), indices -> mask and boolean compaction.
//
// mask -> indices runs one block per row (grid-stride over rows) and walks the row in tiles of
// kThreads entries; an exclusive block scan (warp shuffles, then a scan of the warp totals)
// gives each True entry its rank, and a running carry links the tiles, so any row length works.
// The output width `max_count` is given by the caller: the kernel never needs the data-dependent
// maximum, so no host synchronization happens here.
#include "common.cuh"
#include "ops.h"

namespace nestbatch {
namespace {

constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ int warp_inclusive_scan(int value, int lane) {
#pragma unroll
  for (int delta = 1; delta < 32; delta <<= 1) {
    const int other = __shfl_up_sync(0xffffffffu, value, delta);
    if (lane >= delta) value += other;
  }
  return value;
}

__global__ void __launch_bounds__(kThreads) mask_to_indices_kernel(
    const bool* __restrict__ mask, int64_t batch_size, int64_t num_entries, int64_t max_count,
    int64_t* __restrict__ indices, int64_t* __restrict__ counts) {
  __shared__ int warp_totals[kWarps];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  for (int64_t b = blockIdx.x; b < batch_size; b += gridDim.x) {
    const bool* row = mask + b * num_entries;
    int64_t* out = indices + b * max_count;
    int64_t carry = 0;
    for (int64_t base = 0; base < num_entries; base += kThreads) {
      const int64_t i = base + threadIdx.x;
      const int flag = (i < num_entries && row[i]) ? 1 : 0;
      const int inclusive = warp_inclusive_scan(flag, lane);
      if (lane == 31) warp_totals[warp] = inclusive;
      __syncthreads();
      if (warp == 0) {
        const int total = lane < kWarps ? warp_totals[lane] : 0;
        const int scanned = warp_inclusive_scan(total, lane);
        if (lane < kWarps) warp_totals[lane] = scanned;
      }
      __syncthreads();
      const int before_warp = warp > 0 ? warp_totals[warp - 1] : 0;
      const int64_t rank = carry + before_warp + inclusive - flag;
      if (flag && rank < max_count) out[rank] = i;
      carry += warp_totals[kWarps - 1];
      // Every thread has read warp_totals before the next tile overwrites them.
      __syncthreads();
    }
    for (int64_t slot = carry + threadIdx.x; slot < max_count; slot += kThreads) out[slot] = 0;
    if (threadIdx.x == 0) counts[b] = carry;
  }
}

__global__ void __launch_bounds__(kThreads) indices_to_mask_kernel(
    const int64_t* __restrict__ indices, const int64_t* __restrict__ sizes, int64_t batch_size,
    int64_t width, int64_t num_targets, bool* __restrict__ mask) {
  const int64_t total = batch_size * width;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t b = k / width;
    const int64_t j = k - b * width;
    if (j >= sizes[b]) continue;
    const int64_t index = indices[k];
    if (index >= 0 && index < num_targets) mask[b * num_targets + index] = true;
  }
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> mask_to_indices_cuda(const at::Tensor& mask,
                                                         int64_t max_count) {
  TORCH_CHECK(mask.dim() == 2 && mask.scalar_type() == at::kBool,
              "mask_to_indices: mask must be a bool tensor of shape (B, N)");
  TORCH_CHECK(max_count >= 0, "mask_to_indices: max_count must be non-negative");
  const c10::cuda::CUDAGuard guard(mask.device());
  const at::Tensor src = mask.contiguous();
  const int64_t batch_size = src.size(0);
  const auto long_options = src.options().dtype(at::kLong);
  at::Tensor indices = at::empty({batch_size, max_count}, long_options);
  at::Tensor counts = at::empty({batch_size}, long_options);
  if (batch_size == 0) return {indices, counts};
  mask_to_indices_kernel<<<grid_for(batch_size, 1), kThreads, 0,
                           c10::cuda::getCurrentCUDAStream()>>>(
      src.data_ptr<bool>(), batch_size, src.size(1), max_count, indices.data_ptr<int64_t>(),
      counts.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return {indices, counts};
}

at::Tensor indices_to_mask_cuda(const at::Tensor& indices, const at::Tensor& sizes,
                                int64_t num_targets) {
  TORCH_CHECK(indices.dim() == 2, "indices_to_mask: indices must have shape (B, M)");
  TORCH_CHECK(sizes.dim() == 1 && sizes.size(0) == indices.size(0),
              "indices_to_mask: sizes must have shape (B,)");
  TORCH_CHECK(num_targets >= 0, "indices_to_mask: num_targets must be non-negative");
  const c10::cuda::CUDAGuard guard(indices.device());
  const at::Tensor idx = as_int64(indices);
  const at::Tensor lens = as_int64(sizes);
  const int64_t batch_size = idx.size(0);
  const int64_t width = idx.size(1);
  at::Tensor mask = at::zeros({batch_size, num_targets}, idx.options().dtype(at::kBool));
  if (batch_size * width == 0 || num_targets == 0) return mask;
  indices_to_mask_kernel<<<grid_for(batch_size * width, kThreads), kThreads, 0,
                           c10::cuda::getCurrentCUDAStream()>>>(
      idx.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), batch_size, width, num_targets,
      mask.data_ptr<bool>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return mask;
}

std::tuple<at::Tensor, at::Tensor> bool_compaction_cuda(const at::Tensor& data,
                                                        const at::Tensor& mask,
                                                        int64_t max_count) {
  TORCH_CHECK(data.dim() >= 2, "bool_compaction: data must have shape (B, N, *D)");
  TORCH_CHECK(mask.dim() == 2 && mask.size(0) == data.size(0) && mask.size(1) == data.size(1),
              "bool_compaction: mask must have shape (B, N)");
  auto [indices, counts] = mask_to_indices_cuda(mask, max_count);
  at::Tensor out = indexing_access_cuda(data, indices, counts, 0);
  return {out, counts};
}

}  // namespace nestbatch

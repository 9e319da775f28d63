// mask -> indices (per-row stream compaction), indices -> mask and boolean compaction.
//
// mask -> indices has two paths, picked on the host from the shapes alone (use_chunks):
// * one block per row (grid-stride over rows) walks its row in tiles of kThreads entries; an
//   exclusive block scan (warp shuffles, then a scan of the warp totals) gives each True entry its
//   rank, and a running carry links the tiles, so any row length works. Many rows fill the GPU.
// * chunks, for a few long rows, which would leave most SMs idle and scan serially: each row is
//   cut into chunks of kChunk entries (every thread owns kItemsPerThread consecutive entries,
//   read as one 16-byte load where the alignment allows). Pass 1 counts the True entries of every
//   chunk; pass 2 is an inclusive cumsum of those counts along each row (ATen, on the current
//   stream), whose last column is the row's count; pass 3 rescans each chunk and writes every
//   True entry at the chunk's start plus its rank in the chunk; a last kernel writes the filler 0
//   into the slots past the row's count. Every output slot is written once.
// Both paths give the same output. The output width `max_count` is given by the caller: nothing
// needs the data-dependent maximum, so no host synchronization happens here.
#include <ATen/ops/cumsum.h>

#include "common.cuh"
#include "ops.h"

namespace nestbatch {
namespace {

constexpr int kWarps = kThreads / 32;
// 16 one-byte entries: one uint4 load per thread, and the flags fit the bits of an unsigned.
constexpr int kItemsPerThread = 16;
constexpr int64_t kChunk = static_cast<int64_t>(kThreads) * kItemsPerThread;
constexpr int64_t kMinChunksPerRow = 4;
// 256-thread blocks that one SM holds at once (2048 resident threads).
constexpr int64_t kRowBlocksPerSm = 8;

// The host-side rule, which tests rely on: chunks when every row spans at least
// kMinChunksPerRow chunks (N >= 16384) and the rows are fewer than the blocks the GPU holds at
// once (B < 8 * SMs), i.e. when one block per row would leave SMs idle for a long serial scan.
bool use_chunks(int64_t batch_size, int64_t num_entries) {
  return num_entries >= kMinChunksPerRow * kChunk &&
         batch_size < kRowBlocksPerSm * multiprocessor_count();
}

__device__ __forceinline__ int warp_inclusive_scan(int value, int lane) {
#pragma unroll
  for (int delta = 1; delta < 32; delta <<= 1) {
    const int other = __shfl_up_sync(0xffffffffu, value, delta);
    if (lane >= delta) value += other;
  }
  return value;
}

// Exclusive prefix of `value` over the block, and in `total` its sum over the block. Every thread
// of the block must call it; it ends with a barrier, so it can be called again at once.
__device__ __forceinline__ int block_exclusive_scan(int value, int& total) {
  __shared__ int warp_totals[kWarps];
  const int lane = static_cast<int>(threadIdx.x) & 31;
  const int warp = static_cast<int>(threadIdx.x) >> 5;
  const int inclusive = warp_inclusive_scan(value, lane);
  if (lane == 31) warp_totals[warp] = inclusive;
  __syncthreads();
  if (warp == 0) {
    const int sum = lane < kWarps ? warp_totals[lane] : 0;
    const int scanned = warp_inclusive_scan(sum, lane);
    if (lane < kWarps) warp_totals[lane] = scanned;
  }
  __syncthreads();
  const int before_warp = warp > 0 ? warp_totals[warp - 1] : 0;
  total = warp_totals[kWarps - 1];
  // Every thread has read warp_totals before a next scan overwrites them.
  __syncthreads();
  return before_warp + inclusive - value;
}

__global__ void __launch_bounds__(kThreads) mask_to_indices_kernel(
    const bool* __restrict__ mask, int64_t batch_size, int64_t num_entries, int64_t max_count,
    int64_t* __restrict__ indices, int64_t* __restrict__ counts) {
  for (int64_t b = blockIdx.x; b < batch_size; b += gridDim.x) {
    const bool* row = mask + b * num_entries;
    int64_t* out = indices + b * max_count;
    int64_t carry = 0;
    for (int64_t base = 0; base < num_entries; base += kThreads) {
      const int64_t i = base + threadIdx.x;
      const int flag = (i < num_entries && row[i]) ? 1 : 0;
      int tile_total;
      const int64_t rank = carry + block_exclusive_scan(flag, tile_total);
      if (flag && rank < max_count) out[rank] = i;
      carry += tile_total;
    }
    for (int64_t slot = carry + threadIdx.x; slot < max_count; slot += kThreads) out[slot] = 0;
    if (threadIdx.x == 0) counts[b] = carry;
  }
}

// Bit k is entry begin + k of the row; entries at or past `end` read as False. kVector: the row
// pointer plus `begin` is 16-byte aligned and end - begin a multiple of 16 (or negative).
template <bool kVector>
__device__ __forceinline__ unsigned load_flags(const bool* row, int64_t begin, int64_t end) {
  unsigned bits = 0;
  if constexpr (kVector) {
    if (begin >= end) return 0;
    const uint4 v = *reinterpret_cast<const uint4*>(row + begin);
    const unsigned words[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int k = 0; k < kItemsPerThread; ++k) {
      if ((words[k >> 2] >> (8 * (k & 3))) & 0xffu) bits |= 1u << k;
    }
  } else {
    for (int k = 0; k < kItemsPerThread && begin + k < end; ++k) {
      if (row[begin + k]) bits |= 1u << k;
    }
  }
  return bits;
}

// The first entry (in its row) that the calling thread owns in chunk `c`.
__device__ __forceinline__ int64_t thread_begin(int64_t c) {
  return c * kChunk + static_cast<int64_t>(threadIdx.x) * kItemsPerThread;
}

// Pass 1: chunk_counts[b * num_chunks + c] = True entries of chunk c of row b.
template <bool kVector>
__global__ void __launch_bounds__(kThreads) count_chunks_kernel(
    const bool* __restrict__ mask, int64_t num_entries, int64_t num_chunks,
    int64_t total_chunks, int64_t* __restrict__ chunk_counts) {
  for (int64_t chunk = blockIdx.x; chunk < total_chunks; chunk += gridDim.x) {
    const int64_t b = chunk / num_chunks;
    const int64_t begin = thread_begin(chunk - b * num_chunks);
    const unsigned bits = load_flags<kVector>(mask + b * num_entries, begin, num_entries);
    int total;
    block_exclusive_scan(__popc(bits), total);
    if (threadIdx.x == 0) chunk_counts[chunk] = total;
  }
}

// Pass 3: the True entries of each chunk at their rank in the row, from the row's inclusive
// cumsum of the chunk counts (pass 2). Slots past the row's count are left to zero_tail_kernel.
template <bool kVector>
__global__ void __launch_bounds__(kThreads) scatter_chunks_kernel(
    const bool* __restrict__ mask, int64_t num_entries, int64_t num_chunks,
    int64_t total_chunks, const int64_t* __restrict__ chunk_counts,
    const int64_t* __restrict__ chunk_ends, int64_t max_count, int64_t* __restrict__ indices) {
  for (int64_t chunk = blockIdx.x; chunk < total_chunks; chunk += gridDim.x) {
    const int64_t chunk_start = chunk_ends[chunk] - chunk_counts[chunk];
    // The same for the whole block, so no thread skips a barrier that others reach.
    if (chunk_start >= max_count) continue;
    const int64_t b = chunk / num_chunks;
    const int64_t begin = thread_begin(chunk - b * num_chunks);
    const unsigned bits = load_flags<kVector>(mask + b * num_entries, begin, num_entries);
    int total;
    int64_t rank = chunk_start + block_exclusive_scan(__popc(bits), total);
    int64_t* out = indices + b * max_count;
    for (int k = 0; k < kItemsPerThread && rank < max_count; ++k) {
      if ((bits >> k) & 1u) out[rank++] = begin + k;
    }
  }
}

// The documented filler 0 in slots [counts[b], max_count) of every row.
__global__ void __launch_bounds__(kThreads) zero_tail_kernel(
    const int64_t* __restrict__ counts, int64_t batch_size, int64_t max_count,
    int64_t* __restrict__ indices) {
  const int64_t total = batch_size * max_count;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t b = k / max_count;
    if (k - b * max_count >= counts[b]) indices[k] = 0;
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

// Passes 1 to 3 of the chunked path, and the filler of the tail slots; returns the counts.
template <bool kVector>
at::Tensor launch_chunk_passes(const at::Tensor& src, int64_t max_count, at::Tensor& indices) {
  const int64_t batch_size = src.size(0);
  const int64_t num_entries = src.size(1);
  const int64_t num_chunks = ceil_div(num_entries, kChunk);
  const int64_t total_chunks = batch_size * num_chunks;
  const auto stream = c10::cuda::getCurrentCUDAStream();
  at::Tensor chunk_counts = at::empty({batch_size, num_chunks}, indices.options());
  count_chunks_kernel<kVector><<<grid_for(total_chunks, 1), kThreads, 0, stream>>>(
      src.data_ptr<bool>(), num_entries, num_chunks, total_chunks,
      chunk_counts.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  const at::Tensor chunk_ends = at::cumsum(chunk_counts, 1);
  at::Tensor counts = chunk_ends.select(1, num_chunks - 1).contiguous();
  if (max_count == 0) return counts;
  scatter_chunks_kernel<kVector><<<grid_for(total_chunks, 1), kThreads, 0, stream>>>(
      src.data_ptr<bool>(), num_entries, num_chunks, total_chunks,
      chunk_counts.data_ptr<int64_t>(), chunk_ends.data_ptr<int64_t>(), max_count,
      indices.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  zero_tail_kernel<<<grid_for(batch_size * max_count, kThreads), kThreads, 0, stream>>>(
      counts.data_ptr<int64_t>(), batch_size, max_count, indices.data_ptr<int64_t>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return counts;
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
  const int64_t num_entries = src.size(1);
  const auto long_options = src.options().dtype(at::kLong);
  at::Tensor indices = at::empty({batch_size, max_count}, long_options);
  if (batch_size > 0 && use_chunks(batch_size, num_entries)) {
    const bool vector = num_entries % kItemsPerThread == 0 &&
                        reinterpret_cast<uintptr_t>(src.data_ptr()) % 16 == 0;
    at::Tensor counts = vector ? launch_chunk_passes<true>(src, max_count, indices)
                               : launch_chunk_passes<false>(src, max_count, indices);
    return {indices, counts};
  }
  at::Tensor counts = at::empty({batch_size}, long_options);
  if (batch_size == 0) return {indices, counts};
  mask_to_indices_kernel<<<grid_for(batch_size, 1), kThreads, 0,
                           c10::cuda::getCurrentCUDAStream()>>>(
      src.data_ptr<bool>(), batch_size, num_entries, max_count, indices.data_ptr<int64_t>(),
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

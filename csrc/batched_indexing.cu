// Per-sample gather / scatter / index-pair mapping over (B, N, *D) data.
//
// Index arithmetic is int64 throughout. Indices of valid slots that are out of range are never
// dereferenced: a gather writes the filler, a scatter skips the slot. The Python wrappers raise on
// such indices before launching; the kernels only guarantee memory safety.
//
// Scatters (indexing write, inverse access, mapping) run in two passes so that every output row
// is written exactly once: the slots first claim their target rows in a (B, N) map of slot indices
// (int32, or int64 when the index width M exceeds INT32_MAX), then a gather over the output rows
// copies each from its claiming slot, or from the background (`into` / `target`) or the filler.
// Duplicate targets resolve to the highest slot, whole rows.
#include <limits>
#include <type_traits>

#include "common.cuh"
#include "ops.h"

namespace nestbatch {
namespace {

// Output row (b, j) of a (B, M) grid reads data row (b, indices[b, j]) when j < sizes[b].
struct GatherMap {
  const int64_t* indices;
  const int64_t* sizes;
  int64_t width;        // M
  int64_t num_sources;  // N
  __device__ RowPair operator()(int64_t row) const {
    const int64_t b = row / width;
    const int64_t j = row - b * width;
    if (j >= sizes[b]) return {-1, row};
    const int64_t index = indices[row];
    const bool in_range = index >= 0 && index < num_sources;
    return {in_range ? b * num_sources + index : -1, row};
  }
};

// The claim map holds slot indices j < M. For rows of a few bytes its traffic (the -1 fill, the
// atomics, the read in the gather) outweighs the data, so it takes 4 bytes per target row unless
// the index width M exceeds INT32_MAX. Decided from the shape, so that no operator synchronizes.
inline at::ScalarType claim_type_for(int64_t width) {
  return width <= std::numeric_limits<int32_t>::max() ? at::kInt : at::kLong;
}

// Slot j < sizes[b] of sample b claims output row (b, targets[b, j]) when that index, and for a
// mapping its source index too, is in range. The highest claiming slot wins (atomicMax), so
// duplicate targets resolve deterministically to whole rows of one slot; unclaimed rows keep -1.
template <typename Claim>
__global__ void __launch_bounds__(kThreads) claim_rows_kernel(
    const int64_t* __restrict__ targets, const int64_t* __restrict__ sources,
    const int64_t* __restrict__ sizes, int64_t batch_size, int64_t width, int64_t num_targets,
    int64_t num_sources, Claim* __restrict__ owners) {
  const int64_t slots = batch_size * width;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < slots;
       k += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t b = k / width;
    const int64_t j = k - b * width;
    if (j >= sizes[b]) continue;
    const int64_t target = targets[k];
    if (target < 0 || target >= num_targets) continue;
    if (sources != nullptr && (sources[k] < 0 || sources[k] >= num_sources)) continue;
    atomicMax(owners + b * num_targets + target, static_cast<Claim>(j));
  }
}

// Output row (b, t) of a (B, N) grid: the row of the slot j that claimed it, which is input row
// (b, j) of a (B, M) grid, or with `sources` row (b, sources[b, j]) of a (B, Ns) grid; unclaimed
// rows show the background (or get the filler when there is none).
template <typename Claim>
struct ClaimedRowMap {
  const Claim* owners;
  const int64_t* sources;  // null: slot j reads input row (b, j)
  int64_t width;           // M
  int64_t num_targets;     // N
  int64_t num_sources;     // Ns
  bool has_background;
  __device__ RowPair operator()(int64_t row) const {
    const int64_t b = row / num_targets;
    const int64_t j = owners[row];
    if (j < 0) return {has_background ? kBackground : kFiller, row};
    const int64_t slot = b * width + j;
    return {sources != nullptr ? b * num_sources + sources[slot] : slot, row};
  }
};

// Both passes of a scatter into `out` (B, N, *D), with a (B, N) map of Claim: slot j of `targets`
// (B, M) claims its target row, then every output row is copied from its claiming slot, else from
// `buffers.background` or, when that is null, with the filler. `sources` may be undefined (slot j
// reads input row (b, j)); otherwise it names the input row of each slot, out of `num_sources`.
template <typename Claim>
void scatter_rows_with(const RowBuffers& buffers, const at::Tensor& out, const at::Tensor& targets,
                       const at::Tensor& sources, const at::Tensor& sizes, int64_t num_sources,
                       const FillPattern& pattern) {
  // The signed types CUDA's atomicMax takes (int64_t is long on Linux, which it does not take).
  static_assert(std::is_same_v<Claim, int> || std::is_same_v<Claim, long long>,
                "claims are int or long long");
  constexpr at::ScalarType claim_type = sizeof(Claim) == 4 ? at::kInt : at::kLong;
  const int64_t batch_size = targets.size(0);
  const int64_t width = targets.size(1);
  const int64_t num_targets = out.size(1);
  at::Tensor owners = at::full({batch_size, num_targets}, -1, targets.options().dtype(claim_type));
  auto* claims = static_cast<Claim*>(owners.data_ptr());
  const int64_t* source_rows = sources.defined() ? sources.data_ptr<int64_t>() : nullptr;
  if (batch_size * width > 0) {
    claim_rows_kernel<Claim><<<grid_for(batch_size * width, kThreads), kThreads, 0,
                               c10::cuda::getCurrentCUDAStream()>>>(
        targets.data_ptr<int64_t>(), source_rows, sizes.data_ptr<int64_t>(), batch_size, width,
        num_targets, num_sources, claims);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
  }
  launch_row_copy(buffers, batch_size * num_targets, feature_row_bytes(out, 2), pattern,
                  ClaimedRowMap<Claim>{claims, source_rows, width, num_targets, num_sources,
                                       buffers.background != nullptr});
}

// No map is needed (nor filled) when there is nothing to write.
void scatter_rows(const RowBuffers& buffers, const at::Tensor& out, const at::Tensor& targets,
                  const at::Tensor& sources, const at::Tensor& sizes, int64_t num_sources,
                  const FillPattern& pattern) {
  if (out.numel() == 0) return;
  if (claim_type_for(targets.size(1)) == at::kInt) {
    scatter_rows_with<int>(buffers, out, targets, sources, sizes, num_sources, pattern);
  } else {
    scatter_rows_with<long long>(buffers, out, targets, sources, sizes, num_sources, pattern);
  }
}

void check_index_args(const char* op, const at::Tensor& indices, const at::Tensor& sizes,
                      int64_t batch_size) {
  TORCH_CHECK(indices.dim() == 2 && indices.size(0) == batch_size, op,
              ": indices must have shape (B, M)");
  TORCH_CHECK(sizes.dim() == 1 && sizes.size(0) == batch_size, op,
              ": sizes must have shape (B,)");
}

std::vector<int64_t> rows_shape(const at::Tensor& like, int64_t batch_size, int64_t rows) {
  std::vector<int64_t> shape{batch_size, rows};
  for (int64_t d = 2; d < like.dim(); ++d) shape.push_back(like.size(d));
  return shape;
}

}  // namespace

at::Tensor indexing_access_cuda(const at::Tensor& data, const at::Tensor& indices,
                                const at::Tensor& sizes, const at::Scalar& filler_value) {
  TORCH_CHECK(data.dim() >= 2, "indexing_access: data must have shape (B, N, *D)");
  check_index_args("indexing_access", indices, sizes, data.size(0));
  const c10::cuda::CUDAGuard guard(data.device());
  const at::Tensor src = data.contiguous();
  const at::Tensor idx = as_int64(indices);
  const at::Tensor lens = as_int64(sizes);
  const int64_t width = idx.size(1);
  at::Tensor out = at::empty(rows_shape(src, src.size(0), width), src.options());
  launch_row_copy(src.data_ptr(), out.data_ptr(), src.size(0) * width, feature_row_bytes(src, 2),
                  make_fill_pattern(filler_value, src.scalar_type()),
                  GatherMap{idx.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), width,
                            src.size(1)});
  return out;
}

at::Tensor indexing_write_cuda(const at::Tensor& to_write, const at::Tensor& indices,
                               const at::Tensor& sizes, const at::Tensor& into) {
  TORCH_CHECK(to_write.dim() >= 2 && into.dim() == to_write.dim() &&
                  to_write.size(0) == into.size(0) &&
                  to_write.sizes().slice(2) == into.sizes().slice(2),
              "indexing_write: to_write (B, M, *D) and into (B, N, *D) must match");
  TORCH_CHECK(to_write.scalar_type() == into.scalar_type(),
              "indexing_write: to_write and into must have the same dtype");
  check_index_args("indexing_write", indices, sizes, into.size(0));
  TORCH_CHECK(indices.size(1) == to_write.size(1),
              "indexing_write: indices must have shape (B, M)");
  const c10::cuda::CUDAGuard guard(into.device());
  const at::Tensor src = to_write.contiguous();
  const at::Tensor idx = as_int64(indices);
  const at::Tensor lens = as_int64(sizes);
  const at::Tensor background = into.contiguous();
  at::Tensor out = at::empty_like(background);
  scatter_rows(RowBuffers{src.data_ptr(), background.data_ptr(), out.data_ptr()}, out, idx,
               at::Tensor(), lens, 0, make_fill_pattern(0, out.scalar_type()));
  return out;
}

at::Tensor inverse_indexing_access_cuda(const at::Tensor& data, const at::Tensor& indices,
                                        const at::Tensor& sizes, int64_t num_targets,
                                        const at::Scalar& filler_value) {
  TORCH_CHECK(data.dim() >= 2, "inverse_indexing_access: data must have shape (B, M, *D)");
  TORCH_CHECK(num_targets >= 0, "inverse_indexing_access: num_targets must be non-negative");
  check_index_args("inverse_indexing_access", indices, sizes, data.size(0));
  TORCH_CHECK(indices.size(1) == data.size(1),
              "inverse_indexing_access: indices must have shape (B, M)");
  const c10::cuda::CUDAGuard guard(data.device());
  const at::Tensor src = data.contiguous();
  const at::Tensor idx = as_int64(indices);
  const at::Tensor lens = as_int64(sizes);
  at::Tensor out = at::empty(rows_shape(src, src.size(0), num_targets), src.options());
  scatter_rows(RowBuffers{src.data_ptr(), nullptr, out.data_ptr()}, out, idx, at::Tensor(), lens,
               0, make_fill_pattern(filler_value, src.scalar_type()));
  return out;
}

at::Tensor index_mapping_cuda(const at::Tensor& source, const at::Tensor& source_indices,
                              const at::Tensor& target_indices, const at::Tensor& sizes,
                              const at::Tensor& target) {
  TORCH_CHECK(source.dim() >= 2 && target.dim() == source.dim() &&
                  target.size(0) == source.size(0) &&
                  target.sizes().slice(2) == source.sizes().slice(2),
              "index_mapping: source (B, Ns, *D) and target (B, Nt, *D) must match");
  TORCH_CHECK(source.scalar_type() == target.scalar_type(),
              "index_mapping: source and target must have the same dtype");
  check_index_args("index_mapping", source_indices, sizes, source.size(0));
  TORCH_CHECK(target_indices.sizes() == source_indices.sizes(),
              "index_mapping: source_indices and target_indices must have the same shape");
  const c10::cuda::CUDAGuard guard(target.device());
  const at::Tensor src = source.contiguous();
  const at::Tensor s_idx = as_int64(source_indices);
  const at::Tensor t_idx = as_int64(target_indices);
  const at::Tensor lens = as_int64(sizes);
  const at::Tensor background = target.contiguous();
  at::Tensor out = at::empty_like(background);
  scatter_rows(RowBuffers{src.data_ptr(), background.data_ptr(), out.data_ptr()}, out, t_idx,
               s_idx, lens, src.size(1), make_fill_pattern(0, out.scalar_type()));
  return out;
}

}  // namespace nestbatch

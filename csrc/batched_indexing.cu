// Per-sample gather / scatter / index-pair mapping over (B, N, *D) data.
//
// Index arithmetic is int64 throughout. Indices of valid slots that are out of range are never
// dereferenced: a gather writes the filler, a scatter skips the slot. The Python wrappers raise on
// such indices before launching; the kernels only guarantee memory safety.
//
// Scatters (indexing write, inverse access, mapping) run in two passes so that every output row
// is written exactly once: the slots first claim their target rows in a (B, N) int64 map, then a
// gather over the output rows copies each from its claiming slot, or from the background
// (`into` / `target`) or the filler. Duplicate targets resolve to the highest slot, whole rows.
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

// Slot j < sizes[b] of sample b claims output row (b, targets[b, j]) when that index, and for a
// mapping its source index too, is in range. The highest claiming slot wins (atomicMax), so
// duplicate targets resolve deterministically to whole rows of one slot; unclaimed rows keep -1.
__global__ void __launch_bounds__(kThreads) claim_rows_kernel(
    const int64_t* __restrict__ targets, const int64_t* __restrict__ sources,
    const int64_t* __restrict__ sizes, int64_t batch_size, int64_t width, int64_t num_targets,
    int64_t num_sources, long long* __restrict__ owners) {
  const int64_t slots = batch_size * width;
  for (int64_t k = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x; k < slots;
       k += static_cast<int64_t>(gridDim.x) * kThreads) {
    const int64_t b = k / width;
    const int64_t j = k - b * width;
    if (j >= sizes[b]) continue;
    const int64_t target = targets[k];
    if (target < 0 || target >= num_targets) continue;
    if (sources != nullptr && (sources[k] < 0 || sources[k] >= num_sources)) continue;
    atomicMax(owners + b * num_targets + target, static_cast<long long>(j));
  }
}

// Output row (b, t) of a (B, N) grid: the row of the slot j that claimed it, which is input row
// (b, j) of a (B, M) grid, or with `sources` row (b, sources[b, j]) of a (B, Ns) grid; unclaimed
// rows show the background (or get the filler when there is none).
struct ClaimedRowMap {
  const int64_t* owners;
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

// (B, N) int64: for every target row, the slot that writes it (-1: none). `sources` may be
// undefined (no source bound to check).
at::Tensor claim_rows(const at::Tensor& targets, const at::Tensor& sources,
                      const at::Tensor& sizes, int64_t num_targets, int64_t num_sources) {
  const int64_t batch_size = targets.size(0);
  const int64_t width = targets.size(1);
  at::Tensor owners = at::full({batch_size, num_targets}, -1, targets.options().dtype(at::kLong));
  if (batch_size * width == 0 || num_targets == 0) return owners;
  static_assert(sizeof(long long) == sizeof(int64_t), "atomicMax works on 64-bit slots");
  claim_rows_kernel<<<grid_for(batch_size * width, kThreads), kThreads, 0,
                      c10::cuda::getCurrentCUDAStream()>>>(
      targets.data_ptr<int64_t>(), sources.defined() ? sources.data_ptr<int64_t>() : nullptr,
      sizes.data_ptr<int64_t>(), batch_size, width, num_targets, num_sources,
      reinterpret_cast<long long*>(owners.data_ptr<int64_t>()));
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return owners;
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
  const int64_t num_targets = background.size(1);
  const at::Tensor owners = claim_rows(idx, at::Tensor(), lens, num_targets, 0);
  // Every output row is written once: by its claiming slot, else from `into`.
  at::Tensor out = at::empty_like(background);
  launch_row_copy(RowBuffers{src.data_ptr(), background.data_ptr(), out.data_ptr()},
                  out.size(0) * num_targets, feature_row_bytes(out, 2),
                  make_fill_pattern(0, out.scalar_type()),
                  ClaimedRowMap{owners.data_ptr<int64_t>(), nullptr, src.size(1), num_targets, 0,
                                true});
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
  const at::Tensor owners = claim_rows(idx, at::Tensor(), lens, num_targets, 0);
  // Every output row is written once: by its claiming slot, else with the filler.
  at::Tensor out = at::empty(rows_shape(src, src.size(0), num_targets), src.options());
  launch_row_copy(src.data_ptr(), out.data_ptr(), out.size(0) * num_targets,
                  feature_row_bytes(out, 2), make_fill_pattern(filler_value, src.scalar_type()),
                  ClaimedRowMap{owners.data_ptr<int64_t>(), nullptr, src.size(1), num_targets, 0,
                                false});
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
  const int64_t num_targets = background.size(1);
  const at::Tensor owners = claim_rows(t_idx, s_idx, lens, num_targets, src.size(1));
  // Every output row is written once: from the source row its claiming pair names, else from
  // `target`.
  at::Tensor out = at::empty_like(background);
  launch_row_copy(RowBuffers{src.data_ptr(), background.data_ptr(), out.data_ptr()},
                  out.size(0) * num_targets, feature_row_bytes(out, 2),
                  make_fill_pattern(0, out.scalar_type()),
                  ClaimedRowMap{owners.data_ptr<int64_t>(), s_idx.data_ptr<int64_t>(),
                                s_idx.size(1), num_targets, src.size(1), true});
  return out;
}

}  // namespace nestbatch

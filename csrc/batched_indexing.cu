// Per-sample gather / scatter / index-pair mapping over (B, N, *D) data.
//
// Index arithmetic is int64 throughout. Indices of valid slots that are out of range are never
// dereferenced: a gather writes the filler, a scatter skips the slot. The Python wrappers raise on
// such indices before launching; the kernels only guarantee memory safety.
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

// Input row (b, j) of a (B, M) grid is written to output row (b, indices[b, j]) when valid.
struct ScatterMap {
  const int64_t* indices;
  const int64_t* sizes;
  int64_t width;        // M
  int64_t num_targets;  // N
  __device__ RowPair operator()(int64_t row) const {
    const int64_t b = row / width;
    const int64_t j = row - b * width;
    if (j >= sizes[b]) return {row, -1};
    const int64_t index = indices[row];
    const bool in_range = index >= 0 && index < num_targets;
    return {row, in_range ? b * num_targets + index : -1};
  }
};

// Pair (b, j): source row (b, source_indices[b, j]) -> target row (b, target_indices[b, j]).
struct MappingMap {
  const int64_t* source_indices;
  const int64_t* target_indices;
  const int64_t* sizes;
  int64_t width;
  int64_t num_sources;
  int64_t num_targets;
  __device__ RowPair operator()(int64_t row) const {
    const int64_t b = row / width;
    const int64_t j = row - b * width;
    if (j >= sizes[b]) return {0, -1};
    const int64_t s = source_indices[row];
    const int64_t t = target_indices[row];
    const bool in_range = s >= 0 && s < num_sources && t >= 0 && t < num_targets;
    return {b * num_sources + s, in_range ? b * num_targets + t : -1};
  }
};

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

// Scatters the rows of `src` (B, M, *D) into `out` (B, N, *D), already holding the background.
void scatter_rows(const at::Tensor& src, const at::Tensor& idx, const at::Tensor& lens,
                  at::Tensor& out) {
  launch_row_copy(src.data_ptr(), out.data_ptr(), src.size(0) * src.size(1),
                  feature_row_bytes(src, 2), make_fill_pattern(0, src.scalar_type()),
                  ScatterMap{idx.data_ptr<int64_t>(), lens.data_ptr<int64_t>(), src.size(1),
                             out.size(1)});
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
  at::Tensor out = into.clone(at::MemoryFormat::Contiguous);
  scatter_rows(src, idx, lens, out);
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
  // Which target rows stay filler is only known after the scatter, so the filler goes first.
  at::Tensor out = at::full(rows_shape(src, src.size(0), num_targets), filler_value,
                            src.options());
  scatter_rows(src, idx, lens, out);
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
  at::Tensor out = target.clone(at::MemoryFormat::Contiguous);
  const int64_t width = s_idx.size(1);
  launch_row_copy(src.data_ptr(), out.data_ptr(), src.size(0) * width, feature_row_bytes(src, 2),
                  make_fill_pattern(0, src.scalar_type()),
                  MappingMap{s_idx.data_ptr<int64_t>(), t_idx.data_ptr<int64_t>(),
                             lens.data_ptr<int64_t>(), width, src.size(1), out.size(1)});
  return out;
}

}  // namespace nestbatch

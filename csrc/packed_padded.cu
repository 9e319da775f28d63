// packed <-> padded conversions and padding fill for one ragged dim.
//
// Every output element is written exactly once, by the kernel that computes it: a padded output
// row is either a copy of its packed row or the filler, so no separate fill pass runs first.
#include "common.cuh"
#include "ops.h"

namespace nestbatch {
namespace {

// Padded row (b, t) of a (B, L) grid reads packed row offsets[b] + t when t < length of b. Rows
// outside the packed values (inconsistent offsets) get the filler instead of an out-of-bounds read.
struct PackedToPaddedMap {
  const int64_t* offsets;
  int64_t max_len;
  int64_t num_values;
  __device__ RowPair operator()(int64_t row) const {
    const int64_t b = row / max_len;
    const int64_t t = row - b * max_len;
    const int64_t start = offsets[b];
    const int64_t length = offsets[b + 1] - start;
    const int64_t source = start + t;
    return {(t < length && source >= 0 && source < num_values) ? source : -1, row};
  }
};

// Packed row i belongs to the sample b with offsets[b] <= i < offsets[b + 1] (binary search over
// the B + 1 offsets, which stay in L1/L2); it reads padded row (b, i - offsets[b]). Rows past the
// padded length (inconsistent offsets) get the filler instead of an out-of-bounds read.
struct PaddedToPackedMap {
  const int64_t* offsets;
  int64_t batch_size;
  int64_t max_len;
  __device__ RowPair operator()(int64_t row) const {
    int64_t lo = 0;
    int64_t hi = batch_size - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) >> 1;
      if (offsets[mid] <= row) {
        lo = mid;
      } else {
        hi = mid - 1;
      }
    }
    const int64_t t = row - offsets[lo];
    return {(t >= 0 && t < max_len) ? lo * max_len + t : -1, row};
  }
};

// Row (b, t) of a (B, N) grid keeps its value when t < sizes[b], else gets the filler.
struct FillPaddingMap {
  const int64_t* sizes;
  int64_t width;
  __device__ RowPair operator()(int64_t row) const {
    const int64_t b = row / width;
    const int64_t t = row - b * width;
    return {t < sizes[b] ? row : -1, row};
  }
};

}  // namespace

at::Tensor packed_to_padded_cuda(const at::Tensor& values, const at::Tensor& offsets,
                                 int64_t max_len, const at::Scalar& padding_value) {
  TORCH_CHECK(values.dim() >= 1, "packed_to_padded: values must have a row dim");
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) >= 1,
              "packed_to_padded: offsets must have shape (B + 1,)");
  TORCH_CHECK(max_len >= 0, "packed_to_padded: max_len must be non-negative");
  const c10::cuda::CUDAGuard guard(values.device());
  const at::Tensor src = values.contiguous();
  const at::Tensor offs = as_int64(offsets);
  const int64_t batch_size = offs.size(0) - 1;
  std::vector<int64_t> shape{batch_size, max_len};
  for (int64_t d = 1; d < src.dim(); ++d) shape.push_back(src.size(d));
  at::Tensor out = at::empty(shape, src.options());
  launch_row_copy(src.data_ptr(), out.data_ptr(), batch_size * max_len,
                  feature_row_bytes(src, 1), make_fill_pattern(padding_value, src.scalar_type()),
                  PackedToPaddedMap{offs.data_ptr<int64_t>(), max_len, src.size(0)});
  return out;
}

at::Tensor padded_to_packed_cuda(const at::Tensor& data, const at::Tensor& offsets,
                                 int64_t total) {
  TORCH_CHECK(data.dim() >= 2, "padded_to_packed: data must have shape (B, L, *D)");
  TORCH_CHECK(offsets.dim() == 1 && offsets.size(0) == data.size(0) + 1,
              "padded_to_packed: offsets must have shape (B + 1,)");
  TORCH_CHECK(total >= 0, "padded_to_packed: total must be non-negative");
  const c10::cuda::CUDAGuard guard(data.device());
  const at::Tensor src = data.contiguous();
  const at::Tensor offs = as_int64(offsets);
  std::vector<int64_t> shape{total};
  for (int64_t d = 2; d < src.dim(); ++d) shape.push_back(src.size(d));
  at::Tensor out = at::empty(shape, src.options());
  if (src.size(0) == 0) return out;  // no sample, so total is 0
  launch_row_copy(src.data_ptr(), out.data_ptr(), total, feature_row_bytes(src, 2),
                  make_fill_pattern(0, src.scalar_type()),
                  PaddedToPackedMap{offs.data_ptr<int64_t>(), src.size(0), src.size(1)});
  return out;
}

at::Tensor fill_padding_cuda(const at::Tensor& data, const at::Tensor& sizes,
                             const at::Scalar& value) {
  TORCH_CHECK(data.dim() >= 2, "fill_padding: data must have shape (B, N, *D)");
  TORCH_CHECK(sizes.dim() == 1 && sizes.size(0) == data.size(0),
              "fill_padding: sizes must have shape (B,)");
  const c10::cuda::CUDAGuard guard(data.device());
  const at::Tensor src = data.contiguous();
  const at::Tensor lens = as_int64(sizes);
  at::Tensor out = at::empty_like(src);
  launch_row_copy(src.data_ptr(), out.data_ptr(), src.size(0) * src.size(1),
                  feature_row_bytes(src, 2), make_fill_pattern(value, src.scalar_type()),
                  FillPaddingMap{lens.data_ptr<int64_t>(), src.size(1)});
  return out;
}

}  // namespace nestbatch

// packed <-> padded conversions and padding fill for one ragged dim.
//
// Every output element is written exactly once, by the kernel that computes it: a padded output
// slot is either a copy of its packed row or the filler, so no separate fill pass runs first.
#include "common.cuh"
#include "ops.h"

namespace nestbatch {
namespace {

// Sample b is one contiguous span in each layout: packed rows offsets[b]:offsets[b + 1] and padded
// rows b * max_len : (b + 1) * max_len. So a conversion is one flat copy per sample, in vector
// units, with no per-element division or search: blockIdx.y picks the sample (and strides over
// samples), blockIdx.x and the thread pick units of its span. Each thread moves kUnroll units
// per step, all loads before all stores, so that enough bytes are in flight to fill the memory
// pipeline when rows are narrow (one scalar per row) as well as when they are wide.
//
// Rows outside the packed values or past max_len (inconsistent offsets, which the Python layer
// refuses unless told not to validate) are never read or written out of bounds: to_padded gives
// them the filler, to_packed leaves packed rows that no sample covers unwritten.
constexpr int kUnroll = 4;
constexpr int64_t kUnitsPerBlockStep = static_cast<int64_t>(kThreads) * kUnroll;

template <typename Unit, bool kToPadded>
__global__ void __launch_bounds__(kThreads) packed_padded_kernel(
    const Unit* __restrict__ src, Unit* __restrict__ dst, const int64_t* __restrict__ offsets,
    int64_t batch_size, int64_t max_len, int64_t units_per_row, int64_t num_packed_rows,
    Unit fill) {
  const int64_t padded_span = max_len * units_per_row;
  const int64_t step = static_cast<int64_t>(gridDim.x) * kUnitsPerBlockStep;
  for (int64_t b = blockIdx.y; b < batch_size; b += gridDim.y) {
    const int64_t start = offsets[b];
    const int64_t length = offsets[b + 1] - start;
    // Rows [first, last) of the sample lie inside both the packed rows and the padded row.
    const int64_t first = start < 0 ? -start : 0;
    int64_t last = length < max_len ? length : max_len;
    last = last < num_packed_rows - start ? last : num_packed_rows - start;
    const int64_t lo = first * units_per_row;
    const int64_t hi = (last > first ? last : first) * units_per_row;
    const int64_t packed_base = start * units_per_row;
    const int64_t padded_base = b * padded_span;
    const int64_t span = kToPadded ? padded_span : hi;
    for (int64_t u0 = blockIdx.x * kUnitsPerBlockStep + threadIdx.x; u0 < span; u0 += step) {
      Unit v[kUnroll];
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t u = u0 + k * kThreads;
        const bool valid = u >= lo && u < hi;
        if (kToPadded) {
          v[k] = valid ? src[packed_base + u] : fill;
        } else if (valid) {
          v[k] = src[padded_base + u];
        }
      }
#pragma unroll
      for (int k = 0; k < kUnroll; ++k) {
        const int64_t u = u0 + k * kThreads;
        if (kToPadded) {
          if (u < span) dst[padded_base + u] = v[k];
        } else if (u >= lo && u < hi) {
          dst[packed_base + u] = v[k];
        }
      }
    }
  }
}

template <typename Unit, bool kToPadded>
void launch_packed_padded_unit(const void* src, void* dst, const int64_t* offsets,
                               int64_t batch_size, int64_t max_len, int64_t row_bytes,
                               int64_t num_packed_rows, const FillPattern& pattern) {
  const int64_t units_per_row = row_bytes / static_cast<int64_t>(sizeof(Unit));
  // One grid row per sample (65535 at most; the kernel strides over the rest). Along x, enough
  // blocks for the longest possible span, capped so that the grid stays about 8 waves of the
  // per-SM cap even when every sample is short: a long sample among many short ones still gets
  // several blocks, and blocks of short samples exit at once.
  const int64_t rows_y = batch_size < 65535 ? batch_size : 65535;
  const int64_t wanted_x = ceil_div(max_len * units_per_row, kUnitsPerBlockStep);
  const int64_t cap_x = ceil_div(8 * grid_block_cap(), rows_y);
  const int64_t blocks_x = wanted_x < cap_x ? wanted_x : cap_x;
  const dim3 grid(static_cast<unsigned>(blocks_x < 1 ? 1 : blocks_x),
                  static_cast<unsigned>(rows_y));
  Unit fill;
  std::memcpy(&fill, pattern.bytes, sizeof(Unit));
  packed_padded_kernel<Unit, kToPadded><<<grid, kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
      static_cast<const Unit*>(src), static_cast<Unit*>(dst), offsets, batch_size, max_len,
      units_per_row, num_packed_rows, fill);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// The widest vector unit dividing the row size and both base pointers: every sample's span then
// starts on a unit boundary in both layouts, since it starts on a row boundary.
template <bool kToPadded>
void launch_packed_padded(const at::Tensor& src, const at::Tensor& dst, const at::Tensor& offsets,
                          int64_t max_len, int64_t row_bytes, int64_t num_packed_rows,
                          const FillPattern& pattern) {
  const int64_t batch_size = offsets.size(0) - 1;
  if (batch_size == 0 || max_len == 0 || row_bytes == 0) return;
  const int64_t* offs = offsets.data_ptr<int64_t>();
  const void* in = src.data_ptr();
  void* out = dst.data_ptr();
  switch (pick_unit_bytes(row_bytes, {in, out})) {
    case 16:
      launch_packed_padded_unit<uint4, kToPadded>(in, out, offs, batch_size, max_len, row_bytes,
                                                  num_packed_rows, pattern);
      break;
    case 8:
      launch_packed_padded_unit<uint2, kToPadded>(in, out, offs, batch_size, max_len, row_bytes,
                                                  num_packed_rows, pattern);
      break;
    case 4:
      launch_packed_padded_unit<uint32_t, kToPadded>(in, out, offs, batch_size, max_len,
                                                     row_bytes, num_packed_rows, pattern);
      break;
    case 2:
      launch_packed_padded_unit<uint16_t, kToPadded>(in, out, offs, batch_size, max_len,
                                                     row_bytes, num_packed_rows, pattern);
      break;
    default:
      launch_packed_padded_unit<uint8_t, kToPadded>(in, out, offs, batch_size, max_len, row_bytes,
                                                    num_packed_rows, pattern);
      break;
  }
}

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
  launch_packed_padded<true>(src, out, offs, max_len, feature_row_bytes(src, 1), src.size(0),
                             make_fill_pattern(padding_value, src.scalar_type()));
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
  if (total == 0) return out;
  launch_packed_padded<false>(src, out, offs, src.size(1), feature_row_bytes(src, 2), total,
                              make_fill_pattern(0, src.scalar_type()));
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

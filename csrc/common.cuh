// Shared machinery of the nestbatch CUDA kernels: a row-copy kernel driven by a row map, the
// choice of the widest aligned vector unit, fill patterns for every dtype and launch helpers.
//
// Every kernel here moves whole feature rows (the trailing, uniform dims of a batch flattened
// into one row of bytes). Copies are dtype-agnostic: rows are moved as 16/8/4/2/1-byte units,
// so one kernel instantiation per unit width serves every dtype, and the dtype only matters for
// the fill value, which is encoded once on the host into a repeated byte pattern.
#pragma once

#include <ATen/Dispatch_v2.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/full.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <cstring>
#include <initializer_list>

// PyTorch caches the properties of every device; this is its accessor, declared as in
// ATen/cuda/CUDAContextLight.h and implemented in libtorch_cuda, which every CUDA extension links.
// That header is not included: it pulls in the cuBLAS, cuSPARSE and cuSOLVER headers, which an
// nvcc-only toolkit (scripts/check_cuda_sources.sh on a CPU machine) does not have.
namespace at::cuda {
cudaDeviceProp* getCurrentDeviceProperties();
}  // namespace at::cuda

namespace nestbatch {

constexpr int kThreads = 256;

// Destination row dst receives row src of the source (src >= 0), the filler (kFiller), or the
// same row of the background tensor (kBackground: a tensor laid out like the destination, whose
// rows show through where nothing is written). Nothing is written when dst < 0.
struct RowPair {
  int64_t src;
  int64_t dst;
};

constexpr int64_t kFiller = -1;
constexpr int64_t kBackground = -2;

// 16 bytes holding the fill value, cast to the output dtype, repeated element after element.
struct alignas(16) FillPattern {
  unsigned char bytes[16];
};

inline FillPattern make_fill_pattern(const at::Scalar& value, at::ScalarType dtype) {
  FillPattern pattern{};
  AT_DISPATCH_V2(
      dtype, "nestbatch_fill_pattern", AT_WRAP([&] {
        const scalar_t converted = value.to<scalar_t>();
        static_assert(16 % sizeof(scalar_t) == 0, "element size must divide 16 bytes");
        for (size_t at = 0; at < 16; at += sizeof(scalar_t)) {
          std::memcpy(pattern.bytes + at, &converted, sizeof(scalar_t));
        }
      }),
      AT_EXPAND(AT_ALL_TYPES), at::kHalf, at::kBFloat16, at::kBool);
  return pattern;
}

// Widest unit (16, 8, 4, 2 or 1 bytes) dividing the row size and every base pointer, so that
// each thread issues one aligned vector load/store per unit.
inline int pick_unit_bytes(int64_t row_bytes, std::initializer_list<const void*> pointers) {
  for (int unit : {16, 8, 4, 2}) {
    if (row_bytes % unit != 0) continue;
    bool aligned = true;
    for (const void* p : pointers) {
      aligned = aligned && (reinterpret_cast<uintptr_t>(p) % unit == 0);
    }
    if (aligned) return unit;
  }
  return 1;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// From PyTorch's per-device cache: no CUDA runtime query at each launch.
inline int64_t multiprocessor_count() {
  return at::cuda::getCurrentDeviceProperties()->multiProcessorCount;
}

// The most blocks a grid gets: 32 per SM keeps every SM busy for a few waves, and the grid-stride
// loops of the kernels cover whatever lies beyond, so a grid stays far below the hardware limit
// (and launches stay cheap) whatever the problem size.
inline int64_t grid_block_cap() { return multiprocessor_count() * 32; }

inline unsigned grid_for(int64_t work_items, int64_t items_per_block) {
  const int64_t wanted = ceil_div(work_items, items_per_block);
  const int64_t cap = grid_block_cap();
  const int64_t capped = wanted < cap ? wanted : cap;
  return static_cast<unsigned>(capped < 1 ? 1 : capped);
}

// Copies (or fills) whole rows. A group of `threads_per_row` consecutive threads (a power of two)
// handles one row, consecutive threads touching consecutive units of the row: loads and stores
// of a warp are coalesced whether rows are long (one row per warp or block) or short (several
// rows per warp, which are adjacent in memory for the gather/fill maps).
template <typename Unit, typename Map>
__global__ void __launch_bounds__(kThreads) row_copy_kernel(
    const Unit* __restrict__ src, const Unit* __restrict__ background, Unit* __restrict__ dst,
    int64_t num_rows, int64_t units_per_row, int threads_per_row, Unit fill, Map map) {
  const int lane = static_cast<int>(threadIdx.x) % threads_per_row;
  const int rows_per_block = static_cast<int>(blockDim.x) / threads_per_row;
  const int64_t stride = static_cast<int64_t>(gridDim.x) * rows_per_block;
  for (int64_t row = static_cast<int64_t>(blockIdx.x) * rows_per_block +
                     static_cast<int>(threadIdx.x) / threads_per_row;
       row < num_rows; row += stride) {
    const RowPair pair = map(row);
    if (pair.dst < 0) continue;
    Unit* out = dst + pair.dst * units_per_row;
    if (pair.src == kFiller) {
      for (int64_t u = lane; u < units_per_row; u += threads_per_row) out[u] = fill;
    } else {
      const Unit* in = pair.src == kBackground ? background + pair.dst * units_per_row
                                               : src + pair.src * units_per_row;
      for (int64_t u = lane; u < units_per_row; u += threads_per_row) out[u] = in[u];
    }
  }
}

// The memory of a row copy: `background` (may be null when the map never asks for it) is laid
// out like `dst`.
struct RowBuffers {
  const void* src;
  const void* background;
  void* dst;
};

template <typename Unit, typename Map>
void launch_row_copy_unit(const RowBuffers& buffers, int64_t num_rows, int64_t row_bytes,
                          const FillPattern& pattern, const Map& map) {
  const int64_t units_per_row = row_bytes / static_cast<int64_t>(sizeof(Unit));
  int threads_per_row = 1;
  while (threads_per_row < units_per_row && threads_per_row < kThreads) threads_per_row <<= 1;
  const int rows_per_block = kThreads / threads_per_row;
  Unit fill;
  std::memcpy(&fill, pattern.bytes, sizeof(Unit));
  row_copy_kernel<Unit, Map>
      <<<grid_for(num_rows, rows_per_block), kThreads, 0, c10::cuda::getCurrentCUDAStream()>>>(
          static_cast<const Unit*>(buffers.src), static_cast<const Unit*>(buffers.background),
          static_cast<Unit*>(buffers.dst), num_rows, units_per_row, threads_per_row, fill, map);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

// Launches the row-copy kernel with the widest vector unit that the row size and the pointers
// allow. `num_rows` is the number of rows the map is evaluated on.
template <typename Map>
void launch_row_copy(const RowBuffers& buffers, int64_t num_rows, int64_t row_bytes,
                     const FillPattern& pattern, const Map& map) {
  if (num_rows == 0 || row_bytes == 0) return;
  switch (pick_unit_bytes(row_bytes, {buffers.src, buffers.background, buffers.dst})) {
    case 16:
      launch_row_copy_unit<uint4>(buffers, num_rows, row_bytes, pattern, map);
      break;
    case 8:
      launch_row_copy_unit<uint2>(buffers, num_rows, row_bytes, pattern, map);
      break;
    case 4:
      launch_row_copy_unit<uint32_t>(buffers, num_rows, row_bytes, pattern, map);
      break;
    case 2:
      launch_row_copy_unit<uint16_t>(buffers, num_rows, row_bytes, pattern, map);
      break;
    default:
      launch_row_copy_unit<uint8_t>(buffers, num_rows, row_bytes, pattern, map);
      break;
  }
}

template <typename Map>
void launch_row_copy(const void* src, void* dst, int64_t num_rows, int64_t row_bytes,
                     const FillPattern& pattern, const Map& map) {
  launch_row_copy(RowBuffers{src, nullptr, dst}, num_rows, row_bytes, pattern, map);
}

// Bytes of one feature row of a tensor whose first `lead_dims` dims index rows.
inline int64_t feature_row_bytes(const at::Tensor& t, int64_t lead_dims) {
  int64_t elements = 1;
  for (int64_t d = lead_dims; d < t.dim(); ++d) elements *= t.size(d);
  return elements * static_cast<int64_t>(t.element_size());
}

// Index and size tensors may be int32 or int64; kernels read int64 (a no-op when already int64).
inline at::Tensor as_int64(const at::Tensor& t) {
  return t.to(at::kLong).contiguous();
}

}  // namespace nestbatch

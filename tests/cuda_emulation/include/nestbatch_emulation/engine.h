// Host emulation of the CUDA execution model: the interface between the shim headers (which the
// real kernel sources include instead of the CUDA ones) and the execution engine (engine.cpp).
//
// A launch runs its blocks one after another on the calling thread. The threads of a block are
// cooperative fibers that switch only at __syncthreads() and at warp-synchronous intrinsics, so
// a kernel without barriers runs each thread to completion in turn. Everything here is plain
// C++: the kernel sources are compiled by g++ as they are, only their `<<<...>>>` launches are
// rewritten (tests/cuda_emulation/build.py) into calls of nestbatch_emulation::launch.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

// ------------------------------------------------------------------------- CUDA builtin types
struct uint3 {
  unsigned x, y, z;
};

struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
};

// The vector types carry the alignment of CUDA's, which is what makes a 16-byte unit one load.
struct alignas(8) uint2 {
  unsigned x, y;
};
struct alignas(16) uint4 {
  unsigned x, y, z, w;
};

using cudaStream_t = struct CUstream_st*;

enum cudaError_t {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevice = 101,
  cudaErrorMisalignedAddress = 716,
};

enum cudaDeviceAttr {
  cudaDevAttrMaxThreadsPerBlock = 1,
  cudaDevAttrWarpSize = 10,
  cudaDevAttrMultiProcessorCount = 16,
};

constexpr int warpSize = 32;

// The fields of cudaDeviceProp that kernels size their launches from (the real struct has more).
struct cudaDeviceProp {
  char name[256];
  int multiProcessorCount;
  int maxThreadsPerBlock;
  int maxThreadsPerMultiProcessor;
  int warpSize;
};

// The builtin variables. They are ordinary globals that the engine rewrites whenever it switches
// to another fiber; switches happen only inside the (out-of-line) barrier functions, so compiled
// kernel code re-reads them after every barrier, as it must.
extern uint3 threadIdx;
extern uint3 blockIdx;
extern dim3 blockDim;
extern dim3 gridDim;

namespace nestbatch_emulation {

// ---------------------------------------------------------------------------------- launches
// Where a launch comes from (written by the launch rewriter), for error messages.
struct KernelSite {
  const char* kernel;
  const char* file;
  int line;
};

// The `<<<grid, block, shared_bytes, stream>>>` part of a launch.
struct LaunchConfig {
  dim3 grid;
  dim3 block;
  size_t shared_bytes;
  cudaStream_t stream;
  LaunchConfig(dim3 g, dim3 b, size_t shared = 0, cudaStream_t s = nullptr)
      : grid(g), block(b), shared_bytes(shared), stream(s) {}
};

// Runs `body(closure)` once per thread of the grid (engine.cpp). `pointee_bytes` lists, for each
// pointer parameter of the kernel, the size of what it points to (how tests see which vector unit
// a launch used); `argument_error` is non-empty when a pointer argument is misaligned.
using ThreadBody = void (*)(void* closure);
void run_grid(const KernelSite& site, const LaunchConfig& config, ThreadBody body, void* closure,
              std::string pointee_bytes, const std::string& argument_error);

namespace detail {

// The error for a pointer argument that is not aligned for its pointee (on a GPU, the first
// access faults with cudaErrorMisalignedAddress), or "" when it is fine.
template <typename T>
std::string check_alignment(size_t position, const T& value) {
  if constexpr (std::is_pointer_v<T> && !std::is_void_v<std::remove_pointer_t<T>> &&
                !std::is_function_v<std::remove_pointer_t<T>>) {
    const auto address = reinterpret_cast<uintptr_t>(value);
    constexpr size_t alignment = alignof(std::remove_pointer_t<T>);
    if (address % alignment != 0) {
      return "pointer argument " + std::to_string(position) + " is not aligned to " +
             std::to_string(alignment) + " bytes (address % " + std::to_string(alignment) +
             " == " + std::to_string(address % alignment) + ")";
    }
  }
  return "";
}

template <typename T>
std::string pointee_size(const T&) {
  if constexpr (std::is_pointer_v<T> && !std::is_void_v<std::remove_pointer_t<T>> &&
                !std::is_function_v<std::remove_pointer_t<T>>) {
    return std::to_string(sizeof(std::remove_pointer_t<T>)) + ",";
  }
  return "";
}

template <typename Tuple, size_t... I>
std::string first_alignment_error(const Tuple& params, std::index_sequence<I...>) {
  std::string error;
  ((error = error.empty() ? check_alignment(I, std::get<I>(params)) : error), ...);
  return error;
}

template <typename Tuple, size_t... I>
std::string pointee_sizes(const Tuple& params, std::index_sequence<I...>) {
  return (std::string() + ... + pointee_size(std::get<I>(params)));
}

}  // namespace detail

// What `kernel<<<config>>>(args...)` becomes. As in CUDA, the arguments are converted to the
// parameter types once, before any thread runs, and every thread gets its own copy of them.
template <typename... Params, typename... Args>
void launch(const KernelSite& site, void (*kernel)(Params...), const LaunchConfig& config,
            Args&&... args) {
  static_assert(sizeof...(Params) == sizeof...(Args), "kernel launched with a wrong arity");
  struct Closure {
    void (*kernel)(Params...);
    std::tuple<std::decay_t<Params>...> params;
  };
  Closure closure{kernel, std::tuple<std::decay_t<Params>...>(std::forward<Args>(args)...)};
  const auto indices = std::index_sequence_for<Params...>{};
  const ThreadBody body = [](void* raw) {
    auto* c = static_cast<Closure*>(raw);
    std::apply(c->kernel, c->params);  // copies every parameter into this thread's frame
  };
  run_grid(site, config, body, &closure, detail::pointee_sizes(closure.params, indices),
           detail::first_alignment_error(closure.params, indices));
}

// ------------------------------------------------------------------------------ intrinsics
// Blocks the calling fiber until every thread of the block has arrived.
void sync_block();

// The warp-synchronous exchange behind every shuffle: the calling lane posts `value`, waits for
// all lanes of `mask`, and returns the value posted by `source_lane`. `op` names the intrinsic,
// so that lanes meeting at different intrinsics are reported instead of silently paired.
uint64_t warp_exchange(unsigned mask, uint64_t value, int source_lane, const char* op);

// The lane of the calling thread within its warp (threads are numbered x-fastest).
int lane_id();

// Emulated device properties and runtime errors. device_properties() is what
// at::cuda::getCurrentDeviceProperties() returns: one struct per host thread, refreshed at every
// call so that it follows set_sm_count (PyTorch's cached struct never changes).
int sm_count();
cudaDeviceProp* device_properties();
cudaError_t take_last_error(bool clear);
const char* error_string(cudaError_t error);

template <typename T>
T shuffle(unsigned mask, T var, int source_lane, const char* op) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>,
                "shuffles move at most 8 trivially copyable bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &var, sizeof(T));
  bits = warp_exchange(mask, bits, source_lane, op);
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

// The source lane of a shuffle within its `width`-lane segment; out-of-segment sources read the
// caller's own value, as documented for __shfl_up_sync / __shfl_down_sync.
inline int segment_source(int lane, int offset, int width) {
  const int segment = lane - lane % width;
  const int source = lane + offset;
  return (source < segment || source >= segment + width) ? lane : source;
}

}  // namespace nestbatch_emulation

inline void __syncthreads() { nestbatch_emulation::sync_block(); }

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  nestbatch_emulation::warp_exchange(mask, 0, nestbatch_emulation::lane_id(), "__syncwarp");
}

template <typename T>
T __shfl_sync(unsigned mask, T var, int source_lane, int width = warpSize) {
  const int lane = nestbatch_emulation::lane_id();
  const int source = lane - lane % width + ((source_lane % width) + width) % width;
  return nestbatch_emulation::shuffle(mask, var, source, "__shfl_sync");
}

template <typename T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const int lane = nestbatch_emulation::lane_id();
  const int source = nestbatch_emulation::segment_source(lane, -static_cast<int>(delta), width);
  return nestbatch_emulation::shuffle(mask, var, source, "__shfl_up_sync");
}

template <typename T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = warpSize) {
  const int lane = nestbatch_emulation::lane_id();
  const int source = nestbatch_emulation::segment_source(lane, static_cast<int>(delta), width);
  return nestbatch_emulation::shuffle(mask, var, source, "__shfl_down_sync");
}

template <typename T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = warpSize) {
  const int lane = nestbatch_emulation::lane_id();
  const int source = lane ^ lane_mask;
  // Lanes may read earlier segments; a source in a later one (or past the warp) reads the
  // caller's own value.
  const bool later = source >= warpSize || source / width > lane / width;
  return nestbatch_emulation::shuffle(mask, var, later ? lane : source, "__shfl_xor_sync");
}

inline int __popc(unsigned x) { return __builtin_popcount(x); }

// ------------------------------------------------------------------------------------- atomics
// Launches run one at a time and a fiber only yields at a barrier or a warp exchange, so a plain
// read-modify-write is atomic here. Returns the old value, as CUDA's atomics do.
namespace nestbatch_emulation {
template <typename T>
T atomic_max(T* address, T value) {
  const T old = *address;
  if (value > old) *address = value;
  return old;
}
}  // namespace nestbatch_emulation

// Exactly CUDA's overloads, so that a call nvcc rejects (an int64_t slot, which is long on Linux)
// fails here too instead of passing a template.
inline int atomicMax(int* address, int value) {
  return nestbatch_emulation::atomic_max(address, value);
}
inline unsigned atomicMax(unsigned* address, unsigned value) {
  return nestbatch_emulation::atomic_max(address, value);
}
inline long long atomicMax(long long* address, long long value) {
  return nestbatch_emulation::atomic_max(address, value);
}
inline unsigned long long atomicMax(unsigned long long* address, unsigned long long value) {
  return nestbatch_emulation::atomic_max(address, value);
}

// ---------------------------------------------------------------------- CUDA runtime functions
inline cudaError_t cudaGetDevice(int* device) {
  *device = 0;
  return cudaSuccess;
}

inline cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int device) {
  if (device != 0) return cudaErrorInvalidDevice;
  switch (attribute) {
    case cudaDevAttrMultiProcessorCount:
      *value = nestbatch_emulation::sm_count();
      return cudaSuccess;
    case cudaDevAttrMaxThreadsPerBlock:
      *value = 1024;
      return cudaSuccess;
    case cudaDevAttrWarpSize:
      *value = warpSize;
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}

inline cudaError_t cudaGetLastError() { return nestbatch_emulation::take_last_error(true); }
inline cudaError_t cudaPeekAtLastError() { return nestbatch_emulation::take_last_error(false); }
inline const char* cudaGetErrorString(cudaError_t error) {
  return nestbatch_emulation::error_string(error);
}

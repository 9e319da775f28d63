// Shim of <c10/cuda/CUDAStream.h> for the host emulation: one stream, on which launches run
// synchronously, in order.
#pragma once

#include <c10/core/Device.h>
#include <cuda_runtime.h>

namespace c10::cuda {

class CUDAStream {
 public:
  operator cudaStream_t() const { return stream(); }
  cudaStream_t stream() const { return nullptr; }
  c10::Device device() const { return c10::Device(c10::DeviceType::CPU); }
};

inline CUDAStream getCurrentCUDAStream(c10::DeviceIndex = -1) { return CUDAStream(); }

}  // namespace c10::cuda

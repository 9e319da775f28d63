// Shim of <c10/cuda/CUDAGuard.h> for the host emulation: there is one emulated device, whose
// memory is host memory, so the guard only checks that the tensors live on the CPU.
#pragma once

#include <c10/core/Device.h>
#include <c10/util/Exception.h>

namespace c10::cuda {

struct CUDAGuard {
  explicit CUDAGuard(c10::Device device) {
    TORCH_CHECK(device.is_cpu(), "the emulated CUDA kernels run on CPU tensors, got ", device);
  }
  explicit CUDAGuard(c10::DeviceIndex) {}
  CUDAGuard(const CUDAGuard&) = delete;
  CUDAGuard& operator=(const CUDAGuard&) = delete;
};

}  // namespace c10::cuda

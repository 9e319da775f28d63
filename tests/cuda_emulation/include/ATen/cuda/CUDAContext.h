// Shim of <ATen/cuda/CUDAContext.h> for the host emulation: only the cached device properties,
// whose SM count follows the emulated one (set_sm_count, NESTBATCH_EMULATED_SMS) at every call.
// csrc/common.cuh declares the same function itself; engine.cpp defines it.
#pragma once

#include <cuda_runtime.h>

namespace at::cuda {

cudaDeviceProp* getCurrentDeviceProperties();

}  // namespace at::cuda

// Shim of <c10/cuda/CUDAException.h> for the host emulation: the checks read the emulated
// runtime's error state, so a rejected launch raises exactly where it would on a GPU.
#pragma once

#include <c10/util/Exception.h>
#include <cuda_runtime.h>

#define C10_CUDA_CHECK(EXPR)                                                   \
  do {                                                                         \
    const cudaError_t nestbatch_emulation_error = (EXPR);                      \
    TORCH_CHECK(nestbatch_emulation_error == cudaSuccess, "CUDA error: ",      \
                cudaGetErrorString(nestbatch_emulation_error), " (emulated)"); \
  } while (0)

#define C10_CUDA_KERNEL_LAUNCH_CHECK() C10_CUDA_CHECK(cudaGetLastError())

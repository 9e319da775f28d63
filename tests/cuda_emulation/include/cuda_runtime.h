// Shim of <cuda_runtime.h> for the host emulation of the CUDA execution model: the real kernel
// sources of csrc/ include this (it comes first on the include path) and compile with g++.
#pragma once

#include "nestbatch_emulation/engine.h"

// Execution-space qualifiers: every function is an ordinary host function.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)

// Shared memory is a function-static array. Blocks run one after another and launches are
// serialized, so at any time the array belongs to the one block that runs: it is that block's
// shared memory. (Its initial content is what the previous block left, where a GPU's is
// undefined: reads of shared memory before any write are not caught.)
#define __shared__ static

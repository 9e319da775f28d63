// Operators of the emulation itself (torch.ops.nestbatch_emulation.*): its settings and counters,
// and small kernels that check the engine (barriers, shuffles, builtin variables) and its error
// reports (divergent barriers, deadlocks, misaligned vector pointers, rejected launches).
//
// Written like the kernels of csrc/, with CUDA launch syntax: the builder rewrites this file too.
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/empty_like.h>
#include <ATen/ops/zeros.h>
#include <c10/cuda/CUDAException.h>
#include <cuda_runtime.h>
#include <torch/library.h>

#include <string>

#include "nestbatch_emulation/control.h"

namespace nestbatch_emulation {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kShuffleColumns = 8;

// Row t of `out` holds what thread t received from eight shuffles of the value 100 * t.
__global__ void shuffle_kernel(int* out) {
  const int t = static_cast<int>(threadIdx.x);
  const int v = 100 * t;
  int* row = out + t * kShuffleColumns;
  row[0] = __shfl_up_sync(kFull, v, 1);
  row[1] = __shfl_up_sync(kFull, v, 5);
  row[2] = __shfl_down_sync(kFull, v, 3);
  row[3] = __shfl_xor_sync(kFull, v, 6);
  row[4] = __shfl_sync(kFull, v, 7);
  row[5] = __shfl_up_sync(kFull, v, 2, 8);
  row[6] = __shfl_down_sync(kFull, v, 2, 8);
  // 64-bit values and a source lane beyond the warp (taken modulo the width).
  row[7] = static_cast<int>(__shfl_sync(kFull, static_cast<int64_t>(v) << 32, 33) >> 32);
}

// Reverses every block's slice of `in` through shared memory. Without the barrier, a thread reads
// a slot that another thread may not have written yet: a race, whose outcome depends on the order
// in which the threads run.
__global__ void block_reverse_kernel(const int* in, int* out, bool barrier) {
  __shared__ int tile[1024];
  const int n = static_cast<int>(blockDim.x);
  const int t = static_cast<int>(threadIdx.x);
  const int64_t base = static_cast<int64_t>(blockIdx.x) * n;
  tile[t] = in[base + t];
  if (barrier) __syncthreads();
  out[base + t] = tile[n - 1 - t];
}

// Every thread writes its linear block and thread index, from the builtin variables.
__global__ void thread_ids_kernel(int* out) {
  const int block = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
  const int thread =
      static_cast<int>(threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z));
  const int threads = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  out[2 * (block * threads + thread)] = block;
  out[2 * (block * threads + thread) + 1] = thread;
}

__global__ void divergent_barrier_kernel(int participants) {
  if (static_cast<int>(threadIdx.x) < participants) __syncthreads();
}

// Half of every warp shuffles while the other half waits at the block barrier.
__global__ void warp_deadlock_kernel() {
  if (threadIdx.x % 32 < 16) {
    (void)__shfl_up_sync(kFull, 1, 1);
  } else {
    __syncthreads();
  }
}

// Lanes 0-15 exit while lanes 16-31 shuffle with a full mask.
__global__ void exited_lane_kernel(int* out) {
  if (threadIdx.x % 32 < 16) return;
  out[threadIdx.x] = __shfl_up_sync(kFull, static_cast<int>(threadIdx.x), 1);
}

__global__ void copy_units_kernel(const uint4* in, uint4* out) { out[threadIdx.x] = in[threadIdx.x]; }

at::Tensor shuffles() {
  at::Tensor out = at::empty({64, kShuffleColumns}, at::kInt);
  shuffle_kernel<<<1, 64>>>(out.data_ptr<int>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor block_reverse(const at::Tensor& input, int64_t threads, bool barrier) {
  TORCH_CHECK(input.scalar_type() == at::kInt && input.dim() == 1 && threads > 0 &&
                  input.numel() % threads == 0,
              "block_reverse: int32 input whose length is a multiple of the block size");
  const at::Tensor in = input.contiguous();
  at::Tensor out = at::empty_like(in);
  block_reverse_kernel<<<static_cast<unsigned>(in.numel() / threads),
                         static_cast<unsigned>(threads)>>>(in.data_ptr<int>(),
                                                           out.data_ptr<int>(), barrier);
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

at::Tensor thread_ids() {
  const dim3 grid(2, 3, 2);
  const dim3 block(4, 2, 3);
  at::Tensor out = at::empty({12, 24, 2}, at::kInt);
  thread_ids_kernel<<<grid, block, 0, nullptr>>>(out.data_ptr<int>());
  C10_CUDA_KERNEL_LAUNCH_CHECK();
  return out;
}

// The kernels that must fail, by name; a launch that returns is an error of the test.
void expect_failure(const std::string& name) {
  if (name == "divergent_barrier") {
    divergent_barrier_kernel<<<1, 64>>>(16);
  } else if (name == "warp_deadlock") {
    warp_deadlock_kernel<<<1, 64>>>();
  } else if (name == "exited_lane") {
    at::Tensor out = at::zeros({64}, at::kInt);
    exited_lane_kernel<<<1, 64>>>(out.data_ptr<int>());
  } else if (name == "misaligned") {
    at::Tensor buffer = at::zeros({64}, at::kLong);
    const auto* base = reinterpret_cast<const char*>(buffer.data_ptr());
    copy_units_kernel<<<1, 2>>>(reinterpret_cast<const uint4*>(base + 8),
                                reinterpret_cast<uint4*>(buffer.data_ptr()) + 2);
  } else if (name == "empty_grid") {
    copy_units_kernel<<<0, 32>>>(nullptr, nullptr);
  } else if (name == "oversized_block") {
    copy_units_kernel<<<1, 2048>>>(nullptr, nullptr);
  } else {
    TORCH_CHECK(false, "expect_failure: unknown case ", name);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor selftest(const std::string& name, const at::Tensor& input, int64_t arg) {
  if (name == "shuffles") return shuffles();
  if (name == "block_reverse") return block_reverse(input, arg, true);
  if (name == "racy_block_reverse") return block_reverse(input, arg, false);
  if (name == "thread_ids") return thread_ids();
  expect_failure(name);
  TORCH_CHECK(false, "selftest ", name, " was expected to fail but did not");
}

}  // namespace
}  // namespace nestbatch_emulation

TORCH_LIBRARY(nestbatch_emulation, m) {
  m.def("set_sm_count(int count) -> int", &nestbatch_emulation::set_sm_count);
  m.def("set_schedule(str order, int seed) -> str",
        [](std::string order, int64_t seed) { return nestbatch_emulation::set_schedule(order, seed); });
  m.def("state() -> str", &nestbatch_emulation::state_json);
  m.def("reset_stats() -> ()", &nestbatch_emulation::reset_stats);
  m.def("selftest(str name, Tensor input, int arg) -> Tensor",
        [](std::string name, const at::Tensor& input, int64_t arg) {
          return nestbatch_emulation::selftest(name, input, arg);
        });
}

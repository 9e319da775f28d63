// Settings and counters of the emulation engine, for the control operators that tests call
// (torch.ops.nestbatch_emulation.*, registered in emulation_ops.cu).
#pragma once

#include <cstdint>
#include <string>

namespace nestbatch_emulation {

// Overrides the SM count that at::cuda::getCurrentDeviceProperties()->multiProcessorCount and
// cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount) report (the kernels size their grids
// from it); 0 restores the default, which is the environment variable NESTBATCH_EMULATED_SMS when
// set, else 132 (an H100). Takes effect at the next call. Returns the previous override.
int64_t set_sm_count(int64_t count);

// The order in which blocks, and the runnable threads of a block between two barriers, run:
// "forward", "reverse" or "shuffled" (a permutation drawn from `seed` for every pass). A
// correct kernel gives the same result in every order. Returns the previous order.
std::string set_schedule(const std::string& order, int64_t seed);

// Counters, the last launch and the settings, as a JSON object.
std::string state_json();
void reset_stats();

}  // namespace nestbatch_emulation

// Execution engine of the host emulation of the CUDA execution model.
//
// A launch runs its blocks one after another. The threads of a block are fibers: each has its own
// small stack and runs until it reaches __syncthreads() or a warp-synchronous intrinsic, where it
// suspends; once every runnable thread has suspended (or exited), the scheduler releases the warps
// whose lanes have all met at their intrinsic and, failing that, the block barrier, and runs the
// released threads again. A block whose threads can neither run nor be released (a divergent
// barrier, a lane that exited before a shuffle) raises an error naming what every thread waits for,
// instead of hanging.
//
// Fibers are created with makecontext (once per pooled fiber, reused by every block and launch)
// and switched with _setjmp/_longjmp, which, unlike swapcontext, does not save the signal mask
// with a system call: a switch costs nanoseconds, so block scans over long rows stay cheap.
//
// Launches are serialized by a mutex, so the builtin variables and the function-static arrays
// that stand for __shared__ memory belong to the one block that runs.

// A _longjmp to another fiber's stack is what this file is about; the fortified longjmp would
// take it for a jump into a dead frame and abort.
#undef _FORTIFY_SOURCE

#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdlib>
#include <exception>
#include <memory>
#include <mutex>
#include <numeric>
#include <random>
#include <sstream>
#include <utility>
#include <vector>

#include <c10/util/Exception.h>

#include "nestbatch_emulation/control.h"
#include "nestbatch_emulation/engine.h"
#include <ATen/cuda/CUDAContext.h>

uint3 threadIdx{0, 0, 0};
uint3 blockIdx{0, 0, 0};
dim3 blockDim{1, 1, 1};
dim3 gridDim{1, 1, 1};

namespace nestbatch_emulation {
namespace {

constexpr size_t kStackBytes = 256 * 1024;  // mapped lazily: untouched pages cost nothing
constexpr int kDefaultSms = 132;
constexpr unsigned kFullMask = 0xffffffffu;

enum class State : uint8_t { kRunnable, kAtBlockBarrier, kAtWarpBarrier, kExited };
enum class Order : uint8_t { kForward, kReverse, kShuffled };

struct Fiber {
  jmp_buf context;
  void* mapping = nullptr;
  size_t mapping_bytes = 0;
  unsigned thread = 0;  // linear index in the block, x fastest
  State state = State::kRunnable;
  // The warp-synchronous operation the fiber waits in (meaningful in kAtWarpBarrier).
  unsigned mask = 0;
  uint64_t posted = 0;
  int source_lane = 0;
  const char* op = nullptr;
  uint64_t received = 0;

  Fiber() = default;
  Fiber(const Fiber&) = delete;
  Fiber& operator=(const Fiber&) = delete;
  ~Fiber() {
    if (mapping != nullptr) munmap(mapping, mapping_bytes);
  }
};

// One launch in flight (at most one per process: launches hold g_launch_mutex).
struct Launch {
  const KernelSite* site = nullptr;
  ThreadBody body = nullptr;
  void* closure = nullptr;
  unsigned threads = 0;  // per block
  std::vector<Fiber*> fibers;
  Fiber* current = nullptr;
  unsigned exited = 0;
  unsigned at_block_barrier = 0;
  unsigned at_warp_barrier = 0;
  std::exception_ptr error;
};

struct Stats {
  int64_t launches = 0;
  int64_t blocks = 0;
  int64_t threads = 0;
  int64_t block_barriers = 0;  // thread arrivals at __syncthreads
  int64_t warp_syncs = 0;      // thread arrivals at warp-synchronous intrinsics
  int64_t switches = 0;        // fiber suspensions
  std::string last_kernel;
  std::string last_site;
  std::string last_pointee_bytes;
  dim3 last_grid{0, 0, 0};
  dim3 last_block{0, 0, 0};
  // (kernel, pointee bytes) of the latest launches, oldest first: an operator that launches
  // several kernels shows what each of them was instantiated for, not only its last one.
  std::vector<std::pair<std::string, std::string>> recent;
};

constexpr size_t kRecentLaunches = 8;

std::mutex g_launch_mutex;
Launch* g_launch = nullptr;  // the launch in flight, guarded by g_launch_mutex
jmp_buf g_scheduler;         // where suspended fibers return to
jmp_buf g_creator;           // where a new fiber returns to after its first _setjmp
Fiber* g_starting = nullptr;
Stats g_stats;
std::atomic<int> g_sm_override{0};
Order g_order = Order::kForward;
uint64_t g_seed = 0;
thread_local cudaError_t g_last_error = cudaSuccess;
thread_local bool g_in_launch = false;

// ------------------------------------------------------------------------------------ fibers
// Not inlined: the _setjmp must sit in a frame of its own, so that the frames around it keep
// their variables in memory or in the callee-saved registers that the jump restores.
__attribute__((noinline)) void suspend(Fiber* self) {
  ++g_stats.switches;
  if (_setjmp(self->context) == 0) _longjmp(g_scheduler, 1);
}

// Runs one thread of the current block per iteration; between blocks the fiber stays parked in
// suspend() with its thread exited, ready to be resumed for a thread of the next block.
void fiber_main() {
  Fiber* const self = g_starting;
  if (_setjmp(self->context) == 0) _longjmp(g_creator, 1);
  for (;;) {
    Launch& launch = *g_launch;
    ++g_stats.threads;
    try {
      launch.body(launch.closure);
    } catch (...) {
      // Exceptions cannot cross the fiber boundary: the scheduler rethrows this one.
      if (!launch.error) launch.error = std::current_exception();
    }
    self->state = State::kExited;
    ++launch.exited;
    suspend(self);
  }
}

// (Re)starts a fiber on its stack, parked at the top of fiber_main's loop.
void start(Fiber* fiber) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  ucontext_t context;
  TORCH_CHECK(getcontext(&context) == 0, "emulation: getcontext failed");
  context.uc_stack.ss_sp = static_cast<char*>(fiber->mapping) + page;
  context.uc_stack.ss_size = fiber->mapping_bytes - page;
  context.uc_link = nullptr;
  makecontext(&context, fiber_main, 0);
  g_starting = fiber;
  if (_setjmp(g_creator) == 0) setcontext(&context);
}

std::unique_ptr<Fiber> create_fiber() {
  auto fiber = std::make_unique<Fiber>();
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  fiber->mapping_bytes = kStackBytes + page;
  void* mapping = mmap(nullptr, fiber->mapping_bytes, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  TORCH_CHECK(mapping != MAP_FAILED, "emulation: cannot map a fiber stack");
  fiber->mapping = mapping;
  // The lowest page stays inaccessible: a stack overflow faults instead of corrupting memory.
  TORCH_CHECK(mprotect(mapping, page, PROT_NONE) == 0, "emulation: cannot protect a stack");
  start(fiber.get());
  return fiber;
}

// Each host thread keeps its own fibers, so a fiber never resumes on another thread than the one
// whose thread-local storage its frames may have cached.
std::vector<Fiber*>& fiber_pool(unsigned count) {
  thread_local std::vector<std::unique_ptr<Fiber>> owned;
  thread_local std::vector<Fiber*> pool;
  while (owned.size() < count) {
    owned.push_back(create_fiber());
    pool.push_back(owned.back().get());
  }
  return pool;
}

void set_thread_index(unsigned linear) {
  threadIdx.x = linear % blockDim.x;
  threadIdx.y = linear / blockDim.x % blockDim.y;
  threadIdx.z = linear / (blockDim.x * blockDim.y);
}

__attribute__((noinline)) void resume(Launch& launch, Fiber* fiber) {
  set_thread_index(fiber->thread);
  launch.current = fiber;
  if (_setjmp(g_scheduler) == 0) _longjmp(fiber->context, 1);
  launch.current = nullptr;
}

// ------------------------------------------------------------------------------- diagnostics
std::string describe(const Fiber& fiber) {
  switch (fiber.state) {
    case State::kRunnable:
      return "runnable";
    case State::kAtBlockBarrier:
      return "at __syncthreads";
    case State::kAtWarpBarrier: {
      std::ostringstream out;
      out << "at " << fiber.op << " (mask 0x" << std::hex << fiber.mask << ")";
      return out.str();
    }
    case State::kExited:
      return "exited";
  }
  return "?";
}

// "threads 0-15: exited; threads 16-255: at __syncthreads": consecutive threads in the same
// state form one range.
std::string summarize(const Launch& launch) {
  std::ostringstream out;
  unsigned begin = 0;
  for (unsigned t = 1; t <= launch.threads; ++t) {
    const std::string what = describe(*launch.fibers[begin]);
    if (t < launch.threads && describe(*launch.fibers[t]) == what) continue;
    if (begin > 0) out << "; ";
    if (t - 1 > begin) {
      out << "threads " << begin << "-" << t - 1;
    } else {
      out << "thread " << begin;
    }
    out << ": " << what;
    begin = t;
  }
  return out.str();
}

std::string where(const Launch& launch) {
  std::ostringstream out;
  out << "emulated kernel " << launch.site->kernel << " (launched at " << launch.site->file << ":"
      << launch.site->line << "), block (" << blockIdx.x << ", " << blockIdx.y << ", "
      << blockIdx.z << ")";
  return out.str();
}

// Puts every fiber of the block back at the start of its loop: after an error, some of them are
// suspended in the middle of the kernel (whose frames hold nothing that needs destroying).
void abandon_block(Launch& launch) {
  for (unsigned t = 0; t < launch.threads; ++t) start(launch.fibers[t]);
}

[[noreturn]] void fail_block(Launch& launch, const std::string& message) {
  const std::string full = where(launch) + ": " + message + ". Thread states: " +
                           summarize(launch);
  abandon_block(launch);
  C10_THROW_ERROR(Error, full);
}

// ---------------------------------------------------------------------------- warp barriers
unsigned lanes_in_warp(const Launch& launch, unsigned warp) {
  return std::min(32u, launch.threads - warp * 32);
}

// Whether every lane of `group` (the mask of `lane`'s operation, within the warp) waits at the
// same operation; raises where the group can never meet.
bool group_ready(Launch& launch, unsigned warp, unsigned lane, unsigned group) {
  const Fiber& first = *launch.fibers[warp * 32 + lane];
  if (((first.mask >> lane) & 1u) == 0) {
    fail_block(launch, "lane " + std::to_string(lane) + " of warp " + std::to_string(warp) +
                           " called " + first.op + " with a mask that does not include it");
  }
  bool ready = true;
  for (unsigned other = 0; other < 32; ++other) {
    if (((group >> other) & 1u) == 0) continue;
    const Fiber& peer = *launch.fibers[warp * 32 + other];
    if (peer.state == State::kExited) {
      fail_block(launch, "lane " + std::to_string(other) + " of warp " + std::to_string(warp) +
                             " exited before joining " + first.op + " of lane " +
                             std::to_string(lane) + ", whose mask includes it");
    }
    if (peer.state != State::kAtWarpBarrier) {
      ready = false;
      continue;
    }
    if (peer.mask != first.mask || peer.op != first.op) {
      fail_block(launch, "lanes of warp " + std::to_string(warp) +
                             " met at different warp-synchronous operations (" + first.op +
                             ", " + peer.op + ") or masks");
    }
  }
  return ready;
}

// Completes the exchange of a group whose lanes have all posted, and makes them runnable.
void release_group(Launch& launch, unsigned warp, unsigned group) {
  for (unsigned lane = 0; lane < 32; ++lane) {
    if (((group >> lane) & 1u) == 0) continue;
    Fiber& fiber = *launch.fibers[warp * 32 + lane];
    const int source = fiber.source_lane;
    if (source < 0 || source >= 32 || ((group >> source) & 1u) == 0) {
      fail_block(launch, "lane " + std::to_string(lane) + " of warp " + std::to_string(warp) +
                             " reads lane " + std::to_string(source) + " outside the mask of " +
                             fiber.op);
    }
    fiber.received = launch.fibers[warp * 32 + source]->posted;
  }
  for (unsigned lane = 0; lane < 32; ++lane) {
    if (((group >> lane) & 1u) == 0) continue;
    launch.fibers[warp * 32 + lane]->state = State::kRunnable;
    --launch.at_warp_barrier;
  }
}

bool release_warps(Launch& launch) {
  if (launch.at_warp_barrier == 0) return false;
  bool released = false;
  for (unsigned warp = 0; warp * 32 < launch.threads; ++warp) {
    const unsigned lanes = lanes_in_warp(launch, warp);
    const unsigned existing = lanes == 32 ? kFullMask : (1u << lanes) - 1;
    for (unsigned lane = 0; lane < lanes; ++lane) {
      const Fiber& fiber = *launch.fibers[warp * 32 + lane];
      if (fiber.state != State::kAtWarpBarrier) continue;
      const unsigned group = fiber.mask & existing;
      if (group_ready(launch, warp, lane, group)) {
        release_group(launch, warp, group);
        released = true;
      }
    }
  }
  return released;
}

// ------------------------------------------------------------------------------- scheduling
std::vector<unsigned> pass_order(unsigned count, std::mt19937_64& rng) {
  std::vector<unsigned> order(count);
  std::iota(order.begin(), order.end(), 0u);
  if (g_order == Order::kReverse) std::reverse(order.begin(), order.end());
  if (g_order == Order::kShuffled) std::shuffle(order.begin(), order.end(), rng);
  return order;
}

void run_block(Launch& launch, std::mt19937_64& rng) {
  for (unsigned t = 0; t < launch.threads; ++t) {
    launch.fibers[t]->thread = t;
    launch.fibers[t]->state = State::kRunnable;
  }
  launch.exited = launch.at_block_barrier = launch.at_warp_barrier = 0;
  std::vector<unsigned> order = pass_order(launch.threads, rng);
  for (;;) {
    for (unsigned t : order) {
      Fiber* fiber = launch.fibers[t];
      if (fiber->state != State::kRunnable) continue;
      resume(launch, fiber);
      if (launch.error) {
        const std::exception_ptr error = launch.error;
        abandon_block(launch);
        std::rethrow_exception(error);
      }
    }
    if (launch.exited == launch.threads) return;
    if (release_warps(launch)) continue;
    if (launch.at_block_barrier > 0 && launch.at_block_barrier + launch.exited == launch.threads) {
      if (launch.exited > 0) {
        fail_block(launch,
                   "divergent __syncthreads: some threads exited while others wait at it (a hang "
                   "or undefined behaviour on a GPU)");
      }
      for (unsigned t = 0; t < launch.threads; ++t) launch.fibers[t]->state = State::kRunnable;
      launch.at_block_barrier = 0;
    } else {
      fail_block(launch, "deadlock: no thread can run and no barrier can be released");
    }
    if (g_order == Order::kShuffled) order = pass_order(launch.threads, rng);
  }
}

// Blocks in schedule order. The shuffled order visits block (offset + i * stride) mod count with
// a stride coprime to count: a permutation that needs no table, whatever the grid size.
uint64_t block_at(uint64_t i, uint64_t count, uint64_t stride, uint64_t offset) {
  switch (g_order) {
    case Order::kForward:
      return i;
    case Order::kReverse:
      return count - 1 - i;
    case Order::kShuffled:
      return static_cast<uint64_t>((static_cast<unsigned __int128>(i) * stride + offset) % count);
  }
  return i;
}

uint64_t coprime_stride(uint64_t count, std::mt19937_64& rng) {
  if (count <= 1) return 1;
  uint64_t stride = rng() % count;
  while (std::gcd(stride, count) != 1) stride = (stride + 1) % count;
  return stride;
}

// The limits of compute capability 9.0 (what cudaErrorInvalidConfiguration reports).
bool valid(const LaunchConfig& config) {
  const dim3& g = config.grid;
  const dim3& b = config.block;
  const uint64_t threads = static_cast<uint64_t>(b.x) * b.y * b.z;
  const bool grid_ok = g.x >= 1 && g.y >= 1 && g.z >= 1 && g.x <= 2147483647u && g.y <= 65535 &&
                       g.z <= 65535;
  const bool block_ok = threads >= 1 && threads <= 1024 && b.x <= 1024 && b.y <= 1024 && b.z <= 64;
  return grid_ok && block_ok && config.shared_bytes <= 48 * 1024;
}

void record_launch(const KernelSite& site, const LaunchConfig& config, std::string pointee_bytes) {
  ++g_stats.launches;
  g_stats.last_kernel = site.kernel;
  g_stats.last_site = std::string(site.file) + ":" + std::to_string(site.line);
  g_stats.last_pointee_bytes = std::move(pointee_bytes);
  g_stats.last_grid = config.grid;
  g_stats.last_block = config.block;
  if (g_stats.recent.size() == kRecentLaunches) g_stats.recent.erase(g_stats.recent.begin());
  g_stats.recent.emplace_back(g_stats.last_kernel, g_stats.last_pointee_bytes);
}

void run_blocks(Launch& launch, const LaunchConfig& config) {
  const dim3& g = config.grid;
  const uint64_t count = static_cast<uint64_t>(g.x) * g.y * g.z;
  std::mt19937_64 rng(g_seed);
  const uint64_t stride = coprime_stride(count, rng);
  const uint64_t offset = count > 0 ? rng() % count : 0;
  for (uint64_t i = 0; i < count; ++i) {
    const uint64_t linear = block_at(i, count, stride, offset);
    blockIdx.x = static_cast<unsigned>(linear % g.x);
    blockIdx.y = static_cast<unsigned>(linear / g.x % g.y);
    blockIdx.z = static_cast<unsigned>(linear / (static_cast<uint64_t>(g.x) * g.y));
    ++g_stats.blocks;
    run_block(launch, rng);
  }
}

Launch& active(const char* intrinsic) {
  TORCH_CHECK(g_launch != nullptr && g_launch->current != nullptr, "emulation: ", intrinsic,
              " called outside a kernel");
  return *g_launch;
}

}  // namespace

// --------------------------------------------------------------------------------- the engine
void run_grid(const KernelSite& site, const LaunchConfig& config, ThreadBody body, void* closure,
              std::string pointee_bytes, const std::string& argument_error) {
  TORCH_CHECK(!g_in_launch, "emulation: ", site.kernel,
              " launched from inside a kernel (dynamic parallelism is not emulated)");
  if (!valid(config)) {
    // A rejected launch runs nothing and leaves an error for cudaGetLastError, as on a GPU.
    g_last_error = cudaErrorInvalidConfiguration;
    return;
  }
  TORCH_CHECK(argument_error.empty(), "emulated kernel ", site.kernel, " (launched at ", site.file,
              ":", site.line, "): ", argument_error,
              "; its first access would fault on a GPU (cudaErrorMisalignedAddress)");
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  record_launch(site, config, std::move(pointee_bytes));
  Launch launch;
  launch.site = &site;
  launch.body = body;
  launch.closure = closure;
  launch.threads = config.block.x * config.block.y * config.block.z;
  const std::vector<Fiber*>& pool = fiber_pool(launch.threads);
  launch.fibers.assign(pool.begin(), pool.begin() + launch.threads);
  gridDim = config.grid;
  blockDim = config.block;
  g_launch = &launch;
  g_in_launch = true;
  try {
    run_blocks(launch, config);
  } catch (...) {
    g_launch = nullptr;
    g_in_launch = false;
    throw;
  }
  g_launch = nullptr;
  g_in_launch = false;
}

void sync_block() {
  Launch& launch = active("__syncthreads");
  Fiber* fiber = launch.current;
  fiber->state = State::kAtBlockBarrier;
  ++launch.at_block_barrier;
  ++g_stats.block_barriers;
  suspend(fiber);
}

uint64_t warp_exchange(unsigned mask, uint64_t value, int source_lane, const char* op) {
  Launch& launch = active(op);
  Fiber* fiber = launch.current;
  fiber->state = State::kAtWarpBarrier;
  fiber->mask = mask;
  fiber->posted = value;
  fiber->source_lane = source_lane;
  fiber->op = op;
  ++launch.at_warp_barrier;
  ++g_stats.warp_syncs;
  suspend(fiber);
  return fiber->received;
}

int lane_id() { return static_cast<int>(active("a warp intrinsic").current->thread % 32); }

int sm_count() {
  const int forced = g_sm_override.load();
  if (forced > 0) return forced;
  if (const char* env = std::getenv("NESTBATCH_EMULATED_SMS")) {
    const int parsed = std::atoi(env);
    if (parsed > 0) return parsed;
  }
  return kDefaultSms;
}

cudaDeviceProp* device_properties() {
  thread_local cudaDeviceProp properties{};
  std::strncpy(properties.name, "nestbatch emulated device", sizeof(properties.name) - 1);
  properties.multiProcessorCount = sm_count();
  properties.maxThreadsPerBlock = 1024;
  properties.maxThreadsPerMultiProcessor = 2048;
  properties.warpSize = warpSize;
  return &properties;
}

cudaError_t take_last_error(bool clear) {
  const cudaError_t error = g_last_error;
  if (clear) g_last_error = cudaSuccess;
  return error;
}

const char* error_string(cudaError_t error) {
  switch (error) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidDevice:
      return "invalid device ordinal";
    case cudaErrorMisalignedAddress:
      return "misaligned address";
  }
  return "unknown error";
}

// --------------------------------------------------------------------------------- controls
int64_t set_sm_count(int64_t count) {
  TORCH_CHECK(count >= 0 && count <= 100000, "emulation: SM count must be in [0, 100000]");
  return g_sm_override.exchange(static_cast<int>(count));
}

std::string set_schedule(const std::string& order, int64_t seed) {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  static const char* const kNames[] = {"forward", "reverse", "shuffled"};
  const std::string previous = kNames[static_cast<int>(g_order)];
  for (int i = 0; i < 3; ++i) {
    if (order == kNames[i]) {
      g_order = static_cast<Order>(i);
      g_seed = static_cast<uint64_t>(seed);
      return previous;
    }
  }
  C10_THROW_ERROR(Error, "emulation: unknown schedule '" + order +
                             "' (forward, reverse or shuffled)");
}

namespace {

std::string json_string(const std::string& text) {
  std::ostringstream out;
  out << '"';
  for (const char c : text) {
    if (c == '"' || c == '\\') {
      out << '\\' << c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out << "\\u00" << "0123456789abcdef"[(c >> 4) & 0xf] << "0123456789abcdef"[c & 0xf];
    } else {
      out << c;
    }
  }
  out << '"';
  return out.str();
}

std::string json_dim3(const dim3& d) {
  return "[" + std::to_string(d.x) + ", " + std::to_string(d.y) + ", " + std::to_string(d.z) +
         "]";
}

// "4,8," (how the launch lists the pointee sizes) as the JSON array [4,8].
std::string json_sizes(std::string sizes) {
  if (!sizes.empty() && sizes.back() == ',') sizes.pop_back();
  return "[" + sizes + "]";
}

}  // namespace

std::string state_json() {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  static const char* const kNames[] = {"forward", "reverse", "shuffled"};
  std::ostringstream recent;
  const char* separator = "";
  for (const auto& [kernel, bytes] : g_stats.recent) {
    recent << separator << "{\"kernel\": " << json_string(kernel)
           << ", \"pointee_bytes\": " << json_sizes(bytes) << "}";
    separator = ", ";
  }
  std::ostringstream out;
  out << "{\"launches\": " << g_stats.launches << ", \"blocks\": " << g_stats.blocks
      << ", \"threads\": " << g_stats.threads << ", \"block_barriers\": " << g_stats.block_barriers
      << ", \"warp_syncs\": " << g_stats.warp_syncs << ", \"switches\": " << g_stats.switches
      << ", \"last_kernel\": " << json_string(g_stats.last_kernel)
      << ", \"last_site\": " << json_string(g_stats.last_site)
      << ", \"last_pointee_bytes\": " << json_sizes(g_stats.last_pointee_bytes)
      << ", \"last_grid\": " << json_dim3(g_stats.last_grid)
      << ", \"last_block\": " << json_dim3(g_stats.last_block) << ", \"sm_count\": " << sm_count()
      << ", \"schedule\": " << json_string(kNames[static_cast<int>(g_order)])
      << ", \"recent_launches\": [" << recent.str() << "]}";
  return out.str();
}

void reset_stats() {
  std::lock_guard<std::mutex> lock(g_launch_mutex);
  g_stats = Stats{};
}

}  // namespace nestbatch_emulation

// The accessor that csrc/common.cuh declares (libtorch_cuda defines it on a GPU build). Hidden,
// like the whole library, so it never interposes with PyTorch's own in a CUDA-enabled process.
cudaDeviceProp* at::cuda::getCurrentDeviceProperties() {
  return nestbatch_emulation::device_properties();
}

// A CUDA emulator for the CPU: runs the library's kernels, unchanged, on machines without a GPU, so
// that the CUDA tests execute (not only compile) in CI.
//
// What it does
//   * Each kernel launch runs at once (streams are ignored; every call is synchronous). Blocks run
//     one after another; the threads of a block run as cooperative fibers on one host
//     thread, switching only at __syncthreads, __syncwarp and warp shuffles. The scheduler advances
//     one warp at a time, picked at random (COUPLEDQK_EMULATOR_ORDER=random, the default; the seed
//     is COUPLEDQK_EMULATOR_SEED), so warps drift apart between block barriers, and runs the lanes
//     in a random order; `forward` runs warp 0 as far as it can go before warp 1 starts (and lanes
//     in order), `reverse` the other way round. A missing barrier then shows up as a wrong or NaN
//     result instead of passing by luck.
//   * Dynamic shared memory is a fresh allocation of exactly the launch's size per block, filled
//     with 0xFF (NaN) first: reading it before writing it poisons the result, and reading past its
//     end is caught by AddressSanitizer when the tests are built with it.
//   * Launches are checked as the hardware checks them: grid and block sizes, and dynamic shared
//     memory above 48 KiB only after cudaFuncSetAttribute(MaxDynamicSharedMemorySize) raised the
//     kernel's limit (at most the sm_90 opt-in limit, 227 KiB). A refused launch runs nothing and
//     leaves the error for cudaGetLastError, as the runtime does.
//   * Device memory is host memory from malloc, NaN-filled (0xFF) when allocated, and tracked:
//     cudaMemcpy/cudaMemset/cuBLAS check that their device ranges lie inside one live allocation and
//     that host ranges do not.
//   * A barrier no thread can pass (threads of a block waiting at different barriers) aborts the
//     program with the waiting threads' indices, as a hang on the hardware would be a bug.
//
// What it does not emulate: the memory model (everything is sequentially consistent), timing and
// performance, register limits and __launch_bounds__, the real tensor-core fragment layouts (the
// wmma API is opaque, so code that uses it correctly does not depend on them), and asynchronous
// execution. Passing here is necessary, not sufficient: the hardware run is scripts/gpu-check.
#pragma once


#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define COUPLEDQK_EMULATOR_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COUPLEDQK_EMULATOR_ASAN 1
#endif
#endif
#ifndef COUPLEDQK_EMULATOR_ASAN
#define COUPLEDQK_EMULATOR_ASAN 0
#endif
#if COUPLEDQK_EMULATOR_ASAN
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#endif

#define COUPLEDQK_CUDA_EMULATOR 1

// ---- CUDA language keywords ------------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static
#define __constant__ static
#define __align__(n) alignas(n)

// ---- vector types ------------------------------------------------------------------------------------
struct uint3 {
  unsigned x, y, z;
};
struct dim3 {
  unsigned x = 1, y = 1, z = 1;
  constexpr dim3(unsigned vx = 1, unsigned vy = 1, unsigned vz = 1) : x(vx), y(vy), z(vz) {}
  constexpr dim3(uint3 v) : x(v.x), y(v.y), z(v.z) {}
  constexpr operator uint3() const { return uint3{x, y, z}; }
};
struct alignas(16) float4 {
  float x, y, z, w;
};
struct alignas(8) float2 {
  float x, y;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline float2 make_float2(float x, float y) { return float2{x, y}; }

// The built-in variables of the running thread (set by the scheduler before it resumes a fiber).
inline thread_local uint3 threadIdx{0, 0, 0};
inline thread_local uint3 blockIdx{0, 0, 0};
inline thread_local dim3 blockDim{1, 1, 1};
inline thread_local dim3 gridDim{1, 1, 1};
constexpr int warpSize = 32;

// ---- runtime error codes (the subset the library uses) ----------------------------------------------
enum cudaError {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidConfiguration = 9,
  cudaErrorInvalidDevicePointer = 17,
  cudaErrorInvalidMemcpyDirection = 21,
  cudaErrorInsufficientDriver = 35,
  cudaErrorNoDevice = 100,
  cudaErrorInvalidDevice = 101,
  cudaErrorLaunchFailure = 719,
};
typedef cudaError cudaError_t;

namespace coupledqk_emulator {

[[noreturn]] inline void fatal(const std::string& what) {
  std::fprintf(stderr, "coupledqk CUDA emulator: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// ---- the sticky "last error" ---------------------------------------------------------------------------
inline cudaError_t& last_error() {
  static thread_local cudaError_t e = cudaSuccess;
  return e;
}
inline cudaError_t fail(cudaError_t e, const std::string& why) {
  if (std::getenv("COUPLEDQK_EMULATOR_VERBOSE")) std::fprintf(stderr, "coupledqk CUDA emulator: %s\n", why.c_str());
  last_error() = e;
  return e;
}

// ---- device memory -------------------------------------------------------------------------------------
struct Memory {
  std::map<std::uintptr_t, std::size_t> live;  // start -> bytes
  static Memory& get() {
    static Memory m;
    return m;
  }
  // The allocation containing [p, p + n), or null.
  const std::pair<const std::uintptr_t, std::size_t>* find(const void* p, std::size_t n) const {
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = live.upper_bound(a);
    if (it == live.begin()) return nullptr;
    --it;
    if (a < it->first || a + n > it->first + std::max<std::size_t>(it->second, 1)) return nullptr;
    return &*it;
  }
  bool device(const void* p, std::size_t n) const { return find(p, n) != nullptr; }
  // True when no byte of [p, p + n) is device memory.
  bool host(const void* p, std::size_t n) const {
    if (n == 0) return true;
    const auto a = reinterpret_cast<std::uintptr_t>(p);
    auto it = live.lower_bound(a);
    if (it != live.end() && it->first < a + n) return false;
    if (it == live.begin()) return true;
    --it;
    return it->first + it->second <= a;
  }
};

inline cudaError_t device_malloc(void** p, std::size_t bytes) {
  if (p == nullptr) return fail(cudaErrorInvalidValue, "cudaMalloc: null result pointer");
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  // 256-byte aligned as cudaMalloc's, and exactly `bytes` long so that AddressSanitizer (when the
  // tests are built with it) reports the first byte past the end.
  void* q = nullptr;
  if (posix_memalign(&q, 256, bytes) != 0 || q == nullptr)
    return fail(cudaErrorMemoryAllocation, "cudaMalloc: out of host memory");
  std::memset(q, 0xFF, bytes);  // NaN: code that reads memory it never wrote sees it
  Memory::get().live[reinterpret_cast<std::uintptr_t>(q)] = bytes;
  *p = q;
  return cudaSuccess;
}
inline cudaError_t device_free(void* p) {
  if (p == nullptr) return cudaSuccess;
  auto& live = Memory::get().live;
  auto it = live.find(reinterpret_cast<std::uintptr_t>(p));
  if (it == live.end()) return fail(cudaErrorInvalidDevicePointer, "cudaFree: not the start of a device allocation");
  live.erase(it);
  std::free(p);
  return cudaSuccess;
}
inline void require_device_range(const void* p, std::size_t n, const char* who) {
  if (n > 0 && !Memory::get().device(p, n))
    fatal(std::string(who) + ": [" + std::to_string(reinterpret_cast<std::uintptr_t>(p)) + ", +" + std::to_string(n) +
          " bytes) is not inside one device allocation");
}

// ---- launch configuration checks -------------------------------------------------------------------------
constexpr std::size_t default_dynamic_smem = 48 * 1024;
constexpr std::size_t optin_dynamic_smem = 232448;  // sm_90: 227 KiB

inline std::map<const void*, std::size_t>& smem_limits() {
  static std::map<const void*, std::size_t> m;
  return m;
}
inline std::size_t smem_limit(const void* kernel) {
  const auto it = smem_limits().find(kernel);
  return it == smem_limits().end() ? default_dynamic_smem : it->second;
}

inline int sm_count() {
  const char* s = std::getenv("COUPLEDQK_EMULATOR_SMS");
  const int n = s ? std::atoi(s) : 4;
  return n > 0 ? n : 4;
}

// ---- fibers: the threads of one block ------------------------------------------------------------------
// ---- execution contexts -------------------------------------------------------------------------------------
// x86-64: a minimal switch that saves the callee-saved registers, MXCSR and the x87 control word on
// the old stack and restores them from the new one (no system call, unlike swapcontext, which
// saves the signal mask). Elsewhere, or with COUPLEDQK_EMULATOR_UCONTEXT: ucontext.
#if defined(__x86_64__) && !defined(COUPLEDQK_EMULATOR_UCONTEXT)
extern "C" void coupledqk_emulator_switch(void** save_sp, void* load_sp);
asm(R"(
  .text
  .weak coupledqk_emulator_switch
  .type coupledqk_emulator_switch, @function
coupledqk_emulator_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size coupledqk_emulator_switch, .-coupledqk_emulator_switch
)");

struct Context {
  void* sp = nullptr;
};
inline void switch_context(Context& from, Context& to) { coupledqk_emulator_switch(&from.sp, to.sp); }
// A context that starts entry() on [stack, stack + size) at its first switch.
inline void make_context(Context& c, char* stack, std::size_t size, void (*entry)()) {
#if COUPLEDQK_EMULATOR_ASAN
  ASAN_UNPOISON_MEMORY_REGION(stack, size);  // a reused stack keeps its last frames' redzones
#endif
  auto top = (reinterpret_cast<std::uintptr_t>(stack) + size) & ~std::uintptr_t(15);
  auto* slot = reinterpret_cast<std::uint64_t*>(top);
  std::uint32_t mxcsr = 0;
  std::uint16_t fpcw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpcw));
  slot[-1] = 0;                                      // entry's return address: it never returns
  slot[-2] = reinterpret_cast<std::uintptr_t>(entry);  // popped by the switch's ret
  for (int r = 3; r <= 8; ++r) slot[-r] = 0;        // rbp, rbx, r12-r15
  slot[-9] = std::uint64_t(mxcsr) | (std::uint64_t(fpcw) << 32);
  c.sp = slot - 9;
}
#else
}  // namespace coupledqk_emulator
#include <ucontext.h>
namespace coupledqk_emulator {
struct Context {
  ucontext_t uc{};
};
inline void switch_context(Context& from, Context& to) { swapcontext(&from.uc, &to.uc); }
// getcontext returns twice in the compiler's eyes: kept out of the callers (-Wclobbered).
[[gnu::noinline]] inline void make_context(Context& c, char* stack, std::size_t size, void (*entry)()) {
#if COUPLEDQK_EMULATOR_ASAN
  ASAN_UNPOISON_MEMORY_REGION(stack, size);  // a reused stack keeps its last frames' redzones
#endif
  getcontext(&c.uc);
  c.uc.uc_stack.ss_sp = stack;
  c.uc.uc_stack.ss_size = size;
  c.uc.uc_link = nullptr;
  makecontext(&c.uc, entry, 0);
}
#endif

enum class State { runnable, block_barrier, warp_barrier, done };

struct Fiber {
  Context context;
  char* stack = nullptr;
  uint3 tid{};
  int linear = 0;
  State state = State::runnable;
  void* fake_stack = nullptr;  // ASan bookkeeping
};

struct Block {
  std::function<void()> body;
  std::vector<Fiber> fibers;
  Context scheduler;
  Fiber* current = nullptr;
  std::unique_ptr<unsigned char[]> shared;  // dynamic shared memory of this block
  std::size_t shared_bytes = 0;
  std::vector<std::uint64_t> exchange;  // warp shuffles: one slot per thread
  const void* scheduler_stack_bottom = nullptr;
  std::size_t scheduler_stack_size = 0;
};

inline thread_local Block* g_block = nullptr;

inline std::size_t stack_bytes() { return COUPLEDQK_EMULATOR_ASAN ? 1u << 20 : 256u << 10; }

// Stacks for up to 1024 fibers, allocated once and reused by every block.
inline std::vector<std::unique_ptr<char[]>>& stacks() {
  static thread_local std::vector<std::unique_ptr<char[]>> s;
  return s;
}

inline void start_switch(void** fake, const void* bottom, std::size_t size) {
#if COUPLEDQK_EMULATOR_ASAN
  __sanitizer_start_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}
inline void finish_switch(void* fake, const void** bottom, std::size_t* size) {
#if COUPLEDQK_EMULATOR_ASAN
  __sanitizer_finish_switch_fiber(fake, bottom, size);
#else
  (void)fake, (void)bottom, (void)size;
#endif
}

// Back to the scheduler from the running fiber.
inline void yield_to_scheduler(State s) {
  Block* b = g_block;
  Fiber* f = b->current;
  f->state = s;
  start_switch(&f->fake_stack, b->scheduler_stack_bottom, b->scheduler_stack_size);
  switch_context(f->context, b->scheduler);
  finish_switch(f->fake_stack, nullptr, nullptr);
}

inline void fiber_entry() {
  Block* b = g_block;
  finish_switch(nullptr, &b->scheduler_stack_bottom, &b->scheduler_stack_size);
  b->body();
  Fiber* f = b->current;
  f->state = State::done;
  start_switch(nullptr, b->scheduler_stack_bottom, b->scheduler_stack_size);  // this stack is done
  switch_context(f->context, b->scheduler);  // never resumed
  fatal("a finished thread was resumed");
}

// Scheduling order between barriers.
struct Order {
  enum Mode { forward, reverse, random } mode = random;
  std::uint64_t seed = 0x9E3779B97F4A7C15ull;
  static Order& get() {
    static Order o = [] {
      Order r;
      if (const char* m = std::getenv("COUPLEDQK_EMULATOR_ORDER")) {
        const std::string s(m);
        if (s == "forward") r.mode = forward;
        else if (s == "reverse") r.mode = reverse;
        else if (s == "random") r.mode = random;
        else fatal("COUPLEDQK_EMULATOR_ORDER='" + s + "'; accepted: forward, reverse, random");
      }
      if (const char* v = std::getenv("COUPLEDQK_EMULATOR_SEED")) r.seed = std::strtoull(v, nullptr, 10) * 0x9E3779B97F4A7C15ull + 1;
      return r;
    }();
    return o;
  }
};
inline std::uint64_t splitmix(std::uint64_t& s) {
  std::uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline std::string describe_waiters(const Block& b) {
  std::string s;
  int shown = 0;
  for (const Fiber& f : b.fibers) {
    if (f.state == State::done) continue;
    if (shown++ == 16) {
      s += " ...";
      break;
    }
    s += " thread " + std::to_string(f.linear) + (f.state == State::block_barrier ? " at __syncthreads;" : " at a warp barrier;");
  }
  return s;
}

inline std::uint64_t& launch_counter() {
  static thread_local std::uint64_t n = 0;
  return n;
}

// Runs one block to completion.
inline void run_block(Block& b, const dim3& block, std::uint64_t rng) {
  const int n = static_cast<int>(block.x * block.y * block.z);
  auto& st = stacks();
  while (static_cast<int>(st.size()) < n) st.emplace_back(new char[stack_bytes()]);
  b.fibers.assign(static_cast<std::size_t>(n), Fiber{});
  b.exchange.assign(static_cast<std::size_t>(n), 0);
  for (int i = 0; i < n; ++i) {
    Fiber& f = b.fibers[static_cast<std::size_t>(i)];
    f.linear = i;
    f.tid = uint3{static_cast<unsigned>(i) % block.x, (static_cast<unsigned>(i) / block.x) % block.y,
                  static_cast<unsigned>(i) / (block.x * block.y)};
    f.stack = st[static_cast<std::size_t>(i)].get();
    make_context(f.context, f.stack, stack_bytes(), fiber_entry);
  }
  const Order& mode = Order::get();
  const int warps = (n + 31) / 32;
  const auto lanes_end = [n](int w) { return std::min(n, w * 32 + 32); };
  const auto fiber = [&b](int i) -> Fiber& { return b.fibers[static_cast<std::size_t>(i)]; };
  // A warp whose live lanes all wait at a warp barrier goes on.
  const auto release_warp = [&](int w) {
    bool all = true, any = false;
    for (int i = w * 32; i < lanes_end(w); ++i) {
      const State s = fiber(i).state;
      if (s == State::done) continue;
      if (s != State::warp_barrier) all = false;
      else any = true;
    }
    if (all && any)
      for (int i = w * 32; i < lanes_end(w); ++i)
        if (fiber(i).state == State::warp_barrier) fiber(i).state = State::runnable;
  };
  std::vector<int> ready, lanes;
  int live = n;
  while (live > 0) {
    // One step: pick a warp with runnable lanes (the lowest in `forward` mode, so that warp 0 runs
    // as far as it can before warp 1 starts; the highest in `reverse`; any in `random`), run each of
    // its runnable lanes until it blocks (lane order likewise), then let the warp past a warp
    // barrier if all its lanes reached it. Warps drift apart as they would on the hardware, so a
    // missing __syncthreads between warps that share memory shows up.
    ready.clear();
    for (int w = 0; w < warps; ++w)
      for (int i = w * 32; i < lanes_end(w); ++i)
        if (fiber(i).state == State::runnable) {
          ready.push_back(w);
          break;
        }
    if (!ready.empty()) {
      const int w = mode.mode == Order::forward   ? ready.front()
                    : mode.mode == Order::reverse ? ready.back()
                                                  : ready[splitmix(rng) % ready.size()];
      lanes.clear();
      for (int i = w * 32; i < lanes_end(w); ++i)
        if (fiber(i).state == State::runnable) lanes.push_back(i);
      if (mode.mode == Order::reverse) std::reverse(lanes.begin(), lanes.end());
      if (mode.mode == Order::random)
        for (std::size_t i = lanes.size(); i > 1; --i) std::swap(lanes[i - 1], lanes[splitmix(rng) % i]);
      for (int i : lanes) {
        Fiber& f = fiber(i);
        b.current = &f;
        threadIdx = f.tid;
        start_switch(&f.fake_stack, f.stack, stack_bytes());
        switch_context(b.scheduler, f.context);
        finish_switch(f.fake_stack, nullptr, nullptr);
        if (f.state == State::done) --live;
      }
      release_warp(w);
      continue;
    }
    // Nothing runnable: every live thread waits at __syncthreads, or this is a deadlock.
    bool all_block = true;
    for (const Fiber& f : b.fibers)
      if (f.state != State::done && f.state != State::block_barrier) all_block = false;
    if (!all_block)
      fatal("deadlock in block (" + std::to_string(blockIdx.x) + "," + std::to_string(blockIdx.y) + "," +
            std::to_string(blockIdx.z) + "): threads wait at barriers no thread can pass:" + describe_waiters(b));
    for (Fiber& f : b.fibers)
      if (f.state == State::block_barrier) f.state = State::runnable;
  }
}

// Runs kernel(args...) over the grid.
template <class... Params>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, dim3 block, std::size_t smem, std::tuple<Params...> args) {
  if (g_block != nullptr) fatal("a kernel launched another kernel (dynamic parallelism is not emulated)");
  const unsigned long long threads = 1ull * block.x * block.y * block.z;
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 2147483647u)
    return fail(cudaErrorInvalidConfiguration, "launch: grid (" + std::to_string(grid.x) + "," + std::to_string(grid.y) +
                                                   "," + std::to_string(grid.z) + ") is out of range");
  if (threads == 0 || threads > 1024 || block.z > 64)
    return fail(cudaErrorInvalidConfiguration, "launch: block of " + std::to_string(threads) + " threads; accepted 1..1024");
  const void* key = reinterpret_cast<const void*>(kernel);
  if (smem > smem_limit(key))
    return fail(cudaErrorInvalidValue, "launch: " + std::to_string(smem) + " bytes of dynamic shared memory above the kernel's limit " +
                                           std::to_string(smem_limit(key)) + " (raise it with cudaFuncSetAttribute)");
  const std::uint64_t launch_id = ++launch_counter();
  Block b;
  b.body = [&] { std::apply(kernel, args); };
  b.shared_bytes = smem;
  gridDim = grid;
  blockDim = block;
  g_block = &b;
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        blockIdx = uint3{x, y, z};
        // a fresh, poisoned dynamic shared memory per block (exact size: ASan sees overruns)
        b.shared.reset(smem > 0 ? new unsigned char[smem] : nullptr);
        if (smem > 0) std::memset(b.shared.get(), 0xFF, smem);
        std::uint64_t rng = Order::get().seed ^ (launch_id * 0xD1B54A32D192ED03ull) ^
                            ((std::uint64_t(z) << 42) + (std::uint64_t(y) << 21) + x);
        run_block(b, block, splitmix(rng));
      }
  g_block = nullptr;
  b.shared.reset();
  return cudaSuccess;
}

inline Block& current_block(const char* what) {
  if (g_block == nullptr) fatal(std::string(what) + " called outside a kernel");
  return *g_block;
}

template <class T>
T* dynamic_shared() {
  Block& b = current_block("extern __shared__");
  return reinterpret_cast<T*>(b.shared.get());
}

inline void sync_block() {
  current_block("__syncthreads");
  yield_to_scheduler(State::block_barrier);
}
inline void sync_warp() {
  current_block("__syncwarp");
  yield_to_scheduler(State::warp_barrier);
}

template <class T>
T shuffle_xor(T v, int lane_mask, int width) {
  static_assert(sizeof(T) <= 8, "shuffle of a type wider than 8 bytes");
  Block& b = current_block("__shfl_xor_sync");
  const int me = b.current->linear;
  std::uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  b.exchange[static_cast<std::size_t>(me)] = bits;
  sync_warp();
  const int lane = me % 32, base = me - lane;
  const int seg = lane - lane % width;
  int src = lane ^ lane_mask;
  if (src < seg || src >= seg + width) src = lane;
  if (base + src >= static_cast<int>(b.fibers.size()) || b.fibers[static_cast<std::size_t>(base + src)].state == State::done)
    fatal("__shfl_xor_sync from lane " + std::to_string(src) + ", which has exited or does not exist");
  bits = b.exchange[static_cast<std::size_t>(base + src)];
  sync_warp();  // nobody overwrites its slot before everyone has read
  T out;
  std::memcpy(&out, &bits, sizeof(T));
  return out;
}

}  // namespace coupledqk_emulator

// ---- device functions ---------------------------------------------------------------------------------------
inline void __syncthreads() { coupledqk_emulator::sync_block(); }
inline void __syncwarp(unsigned mask = 0xffffffffu) {
  if (mask != 0xffffffffu) coupledqk_emulator::fatal("__syncwarp with a partial mask is not emulated");
  coupledqk_emulator::sync_warp();
}
template <class T>
inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
  if (mask != 0xffffffffu) coupledqk_emulator::fatal("__shfl_xor_sync with a partial mask is not emulated");
  return coupledqk_emulator::shuffle_xor(v, lane_mask, width);
}
[[noreturn]] inline void __trap() { coupledqk_emulator::fatal("__trap() in a kernel"); }

// One host thread runs every block: atomics are plain read-modify-writes. (One template for the
// types CUDA's atomicAdd takes; the value converts to the pointee as in CUDA's overloads.)
namespace coupledqk_emulator {
template <class T>
struct identity {
  using type = T;
};
}  // namespace coupledqk_emulator
template <class T, class = std::enable_if_t<std::is_same_v<T, float> || std::is_same_v<T, double> ||
                                            std::is_same_v<T, int> || std::is_same_v<T, unsigned> ||
                                            std::is_same_v<T, unsigned long long>>>
inline T atomicAdd(T* p, typename coupledqk_emulator::identity<T>::type v) {
  const T old = *p;
  *p = old + v;
  return old;
}

// cpu_cuda.h: CUDA C++'s built-ins on one CPU thread, for ortlab.cuda.cpu (the CPU runner).
//
// A block's threads are coroutines (one stack each, started by POSIX ucontext, switched by
// _setjmp/_longjmp) that the scheduler resumes in a fixed order; each runs until it reaches
// __syncthreads() or a warp operation, or returns, so the schedule between two barriers is
// deterministic (thread 0 first, or the reverse order). Blocks run one after another (the reverse
// schedule runs them last to first too).
// Pointer parameters become ortlab_cpu::ptr<T>, which checks every index against its array's size;
// fixed-size arrays (__shared__ and local) are checked by GCC's -fsanitize=bounds, whose handler is
// defined below. Every other load and store of the kernel is seen by cpu_checks.h (compiled with
// -fsanitize=thread, whose callbacks it defines): accesses through derived pointers, races inside a
// warp, lock-step warps. A failure stops the launch and is reported with the thread and block.
// The runtime's own functions are ORTLAB_RT: not instrumented.
#pragma once
#include <cmath>
#include <math.h>  // expf, sqrtf, fmaxf... in the global namespace, as CUDA has them
#include <cstddef>
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <type_traits>
#include <vector>
#include <dlfcn.h>
#include <setjmp.h>
#include <sys/mman.h>
#include <ucontext.h>

#define ORTLAB_RT __attribute__((no_sanitize("thread")))

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
// static shared arrays live in one section, so that their accesses can be told apart
#define __shared__ static __attribute__((section("ortlab_shared")))

struct uint3 { unsigned x, y, z; };
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
constexpr int warpSize = 32;

namespace ortlab_cpu {

enum State { READY, AT_BARRIER, AT_WARP, AT_STEP, DONE };
enum WarpOp { SHFL, SHFL_UP, SHFL_DOWN, SHFL_XOR, SYNCWARP, BALLOT };
constexpr const char* kWarpOpNames[] = {"__shfl_sync", "__shfl_up_sync", "__shfl_down_sync",
                                        "__shfl_xor_sync", "__syncwarp", "__ballot_sync"};
constexpr std::size_t kStackBytes = 128 * 1024;  // a thread's locals live here

struct Launch {
  ucontext_t scheduler;               // where a thread's first start returns from
  jmp_buf scheduler_jump;             // where every later switch back to the scheduler lands
  struct Jump { jmp_buf env; };
  std::vector<Jump> thread_jumps;     // where each started thread resumes
  std::vector<char> started;
  std::vector<ucontext_t> contexts;
  std::vector<State> states;
  std::vector<std::unique_ptr<char[]>> stacks;  // one per thread, not zero-filled
  std::function<void()> body;
  int current = 0;
  bool failed = false;
  char error[1024] = {0};
  int reverse = 0, lockstep = 0, lost_updates = 0;
  // a warp operation: what each thread brought to it, and what it takes away
  struct WarpCall { WarpOp op; unsigned mask; unsigned long long value; int arg, width; unsigned seq; };
  std::vector<WarpCall> warp_calls;
  std::vector<unsigned long long> warp_results;
  std::vector<unsigned> warp_seq;  // how many warp operations each thread has reached in this block
  std::vector<unsigned> warp_stamp;  // each warp's synchronization epoch (cpu_checks.h)
  unsigned block_stamp = 0;  // the block's: a new one at each __syncthreads()
  unsigned stamps = 0;
};

inline Launch* launch_state = nullptr;

// Switch from the current thread back to the scheduler; returns when the scheduler resumes it.
// ucontext starts a thread on its own stack; every later switch is _setjmp/_longjmp, which unlike
// swapcontext saves no signal mask, so a switch costs no system call.
ORTLAB_RT inline void yield_to_scheduler() {
  Launch& L = *launch_state;
  if (!_setjmp(L.thread_jumps[L.current].env)) _longjmp(L.scheduler_jump, 1);
}

// Record the first failure and hand control back to the scheduler for good.
ORTLAB_RT inline void fail(const char* what) {
  Launch& L = *launch_state;
  if (!L.failed) {
    L.failed = true;
    std::snprintf(L.error, sizeof L.error, "thread (%u, %u, %u) of block (%u, %u, %u): %s", threadIdx.x,
                  threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z, what);
  }
  yield_to_scheduler();
}

ORTLAB_RT inline void syncthreads() {
  Launch& L = *launch_state;
  L.states[L.current] = AT_BARRIER;
  yield_to_scheduler();
}

// A warp operation: the thread leaves its value and waits until every thread of its warp has
// reached a warp operation; the scheduler then computes every lane's result at once (so no lane
// reads a value that a faster lane has already replaced) and resumes them.
template <class T>
ORTLAB_RT T warp_op(WarpOp op, unsigned mask, T value, int arg, int width) {
  static_assert(std::is_trivially_copyable<T>::value && sizeof(T) <= 8,
                "the CPU runner's warp operations take values of at most 8 bytes");
  Launch& L = *launch_state;
  const int t = L.current;
  unsigned long long bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  L.warp_calls[t] = {op, mask, bits, arg, width, L.warp_seq[t]++};
  L.states[t] = AT_WARP;
  yield_to_scheduler();
  T result;
  std::memcpy(&result, &L.warp_results[t], sizeof(T));
  return result;
}

// A pointer parameter that knows how many elements its array has.
template <class T>
struct ptr {
  using element = T;
  T* base;
  std::ptrdiff_t size;
  const char* name;
  std::ptrdiff_t offset = 0;

  T* check(std::ptrdiff_t i) const {
    std::ptrdiff_t at = offset + i;
    if (at < 0 || at >= size) {
      char what[256];
      std::snprintf(what, sizeof what, "%s[%td] is out of bounds (%s has %td elements)", name, at, name, size);
      fail(what);
    }
    return base + at;
  }
  T& operator[](std::ptrdiff_t i) const { return *check(i); }
  T& operator*() const { return *check(0); }
  T* operator->() const { return check(0); }
  ptr operator+(std::ptrdiff_t k) const { return {base, size, name, offset + k}; }
  ptr operator-(std::ptrdiff_t k) const { return {base, size, name, offset - k}; }
  ptr& operator+=(std::ptrdiff_t k) { offset += k; return *this; }
  ptr& operator-=(std::ptrdiff_t k) { offset -= k; return *this; }
  ptr& operator++() { ++offset; return *this; }
  ptr& operator--() { --offset; return *this; }
  operator T*() const { return base + offset; }  // unchecked from here on (a device function's T*)
  // (float*)x of a const float* parameter x: what const_cast gives (a write through it lands)
  template <class U, class = std::enable_if_t<std::is_same<const U, T>::value && !std::is_same<U, T>::value>>
  explicit operator U*() const { return const_cast<U*>(base + offset); }
};

// const_cast<float*>(x) of a pointer parameter x: cpu.py makes it const_cast<float*>(raw(x)).
template <class V> struct is_ptr : std::false_type {};
template <class T> struct is_ptr<ptr<T>> : std::true_type {};
template <class V>
decltype(auto) raw(V&& v) {
  if constexpr (is_ptr<std::decay_t<V>>::value)
    return static_cast<typename std::decay_t<V>::element*>(v);
  else
    return std::forward<V>(v);
}

}  // namespace ortlab_cpu
#include "cpu_checks.h"
namespace ortlab_cpu {

ORTLAB_RT inline void trampoline() {
  Launch& L = *launch_state;
  L.body();
  L.states[L.current] = DONE;
  _longjmp(L.scheduler_jump, 1);  // never returns through uc_link: the scheduler's context is stale
}

ORTLAB_RT inline bool warp_fail(Launch& L, const char* what) {
  std::snprintf(L.error, sizeof L.error, "thread (%u, %u, %u) of block (%u, %u, %u): %s", threadIdx.x, threadIdx.y,
                threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z, what);
  L.failed = true;
  return false;
}

// Complete the warp operations that all present lanes of a warp have reached: true if any was.
// `strict`: a warp some of whose lanes wait at an operation while others cannot reach it is an error.
ORTLAB_RT inline bool release_warps(Launch& L, int n, dim3 block, bool strict) {
  bool released = false;
  char what[400];
  for (int first = 0; first < n && !L.failed; first += 32) {
    const int lanes = n - first < 32 ? n - first : 32;
    int waiting = -1, other = -1;
    for (int t = first; t < first + lanes; ++t) (L.states[t] == AT_WARP ? waiting : other) = t;
    if (waiting < 0) continue;
    threadIdx = {waiting % block.x, (waiting / block.x) % block.y, waiting / (block.x * block.y)};
    const Launch::WarpCall& w = L.warp_calls[waiting];
    if (other >= 0) {
      if (!strict) continue;
      std::snprintf(what, sizeof what, "waits at %s while thread %d of its warp %s (every thread of a warp "
                    "must reach each warp operation: the CPU runner models full-warp operations only)",
                    kWarpOpNames[w.op], other,
                    L.states[other] == DONE ? "has returned" : "waits at __syncthreads()");
      return warp_fail(L, what);
    }
    const unsigned present = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1;
    for (int t = first; t < first + lanes; ++t) {
      const Launch::WarpCall& c = L.warp_calls[t];
      if (c.op != w.op || c.seq != w.seq) {
        std::snprintf(what, sizeof what, "reached %s (its warp operation number %u) while thread %d of its warp "
                      "reached %s (number %u): a warp's threads must meet at the same operation",
                      kWarpOpNames[w.op], w.seq + 1, t, kWarpOpNames[c.op], c.seq + 1);
        return warp_fail(L, what);
      }
      if ((c.mask & present) != present) {
        std::snprintf(what, sizeof what, "%s with mask 0x%08x, which leaves out lanes of its warp: the CPU "
                      "runner models full-warp operations only (every present lane in the mask)",
                      kWarpOpNames[c.op], c.mask);
        threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
        return warp_fail(L, what);
      }
      if (c.op != SYNCWARP && c.op != BALLOT && (c.width < 1 || c.width > 32 || (c.width & (c.width - 1)))) {
        std::snprintf(what, sizeof what, "%s with width %d: width must be a power of 2 from 1 to 32",
                      kWarpOpNames[c.op], c.width);
        threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
        return warp_fail(L, what);
      }
    }
    unsigned long long ballot = 0;
    for (int t = first; t < first + lanes; ++t) if (L.warp_calls[t].value) ballot |= 1ull << (t - first);
    for (int t = first; t < first + lanes; ++t) {
      const Launch::WarpCall& c = L.warp_calls[t];
      const int lane = t - first, group = lane / (c.width > 0 ? c.width : 32) * c.width;
      int src = lane;
      switch (c.op) {
        case SHFL: src = group + ((c.arg % c.width) + c.width) % c.width; break;
        case SHFL_UP: src = lane - group >= c.arg ? lane - c.arg : lane; break;
        case SHFL_DOWN: src = lane - group + c.arg < c.width ? lane + c.arg : lane; break;
        case SHFL_XOR: src = lane ^ c.arg; if (src >= group + c.width) src = lane; break;
        default: break;
      }
      if (src < 0 || src >= lanes) {
        std::snprintf(what, sizeof what, "%s: lane %d reads lane %d, which is not a thread of this block "
                      "(its last warp has %d threads)", kWarpOpNames[c.op], lane, src, lanes);
        threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
        return warp_fail(L, what);
      }
      L.warp_results[t] = c.op == BALLOT ? ballot : L.warp_calls[first + src].value;
    }
    for (int t = first; t < first + lanes; ++t) L.states[t] = READY;
    L.warp_stamp[first / 32] = ++L.stamps;  // a new epoch for the race checks
    released = true;
  }
  return released;
}

// Run each ready thread of warp `first` (in schedule order) until it blocks; in lock step, again
// while lanes wait at a memory step (each lane's next access happens after every lane's current one).
ORTLAB_RT inline void run_warp(Launch& L, int first, int lanes, dim3 block) {
  for (bool stepped = true; stepped && !L.failed;) {
    for (int k = 0; k < lanes && !L.failed; ++k) {
      int t = L.reverse ? first + lanes - 1 - k : first + k;
      if (L.states[t] != READY) continue;
      L.current = t;
      threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
      if (!_setjmp(L.scheduler_jump)) {
        if (L.started[t]) _longjmp(L.thread_jumps[t].env, 1);
        L.started[t] = 1;
        swapcontext(&L.scheduler, &L.contexts[t]);
      }
    }
    stepped = false;
    for (int t = first; t < first + lanes; ++t)
      if (L.states[t] == AT_STEP) { L.states[t] = READY; stepped = true; }
  }
}

// Run one block to its end: every thread to its next barrier, warp by warp, then the next barrier.
ORTLAB_RT inline void run_block(Launch& L, int n, dim3 block) {
  for (int t = 0; t < n; ++t) {
    getcontext(&L.contexts[t]);
    L.contexts[t].uc_stack.ss_sp = L.stacks[t].get();
    L.contexts[t].uc_stack.ss_size = kStackBytes;
    L.contexts[t].uc_link = &L.scheduler;
    makecontext(&L.contexts[t], trampoline, 0);
    L.states[t] = READY;
    L.started[t] = 0;
  }
  L.warp_seq.assign(n, 0);
  const int warps = (n + 31) / 32;
  for (int barrier = 0; !L.failed; ++barrier) {
    for (auto& stamp : L.warp_stamp) stamp = ++L.stamps;  // a barrier orders every warp's accesses
    L.block_stamp = ++L.stamps;
    do {  // run every ready thread to its next barrier; then complete the warp operations reached
      for (int k = 0; k < warps && !L.failed; ++k) {
        int first = 32 * (L.reverse ? warps - 1 - k : k);
        run_warp(L, first, n - first < 32 ? n - first : 32, block);
      }
    } while (!L.failed && release_warps(L, n, block, false));
    if (!L.failed) release_warps(L, n, block, true);  // a warp still waiting can never complete
    if (L.failed) return;
    int done = 0, waiting = -1, finished = -1;
    for (int t = 0; t < n; ++t) {
      if (L.states[t] == DONE) { ++done; finished = t; }
      else if (waiting < 0) waiting = t;
    }
    if (done == n) return;
    if (done > 0) {
      std::snprintf(L.error, sizeof L.error,
                    "block (%u, %u, %u): thread %d returned while thread %d waits at __syncthreads() "
                    "number %d (every thread of a block must reach each barrier)",
                    blockIdx.x, blockIdx.y, blockIdx.z, finished, waiting, barrier + 1);
      L.failed = true;
      return;
    }
    for (int t = 0; t < n; ++t) L.states[t] = READY;
  }
}

// Run `body` as every thread of every block on copies of the arguments (cpu_checks.h's Memory); 0 on
// success, 1 with `error` filled on a failure. `schedule`: bit 0 the reverse order, bit 1 a look for
// lost updates (cpu_checks.h, note_lost_update; each array's written flag gets bit 1 where one was seen).
ORTLAB_RT inline int run(dim3 grid, dim3 block, int schedule, int lockstep, std::size_t shared_bytes,
                         const Arguments& args, std::function<void()> body, char* error, int error_size) {
  Launch L;
  launch_state = &L;
  L.body = std::move(body);
  L.reverse = schedule & 1;
  L.lost_updates = (schedule >> 1) & 1;
  L.lockstep = lockstep;
  const int n = block.x * block.y * block.z;
  L.contexts.resize(n);
  L.states.resize(n);
  L.stacks.resize(n);
  L.warp_calls.resize(n);
  L.thread_jumps.resize(n);
  L.started.resize(n);
  L.warp_results.resize(n);
  L.warp_stamp.assign((n + 31) / 32, 0);
  for (auto& stack : L.stacks) stack.reset(new char[kStackBytes]);
  gridDim = grid;
  blockDim = block;
  Memory memory(args, shared_bytes);
  if (memory.ready(L)) {
    const unsigned long long blocks = 1ull * grid.x * grid.y * grid.z;
    for (unsigned long long k = 0; k < blocks && !L.failed; ++k) {
      unsigned long long b = L.reverse ? blocks - 1 - k : k;
      blockIdx = {unsigned(b % grid.x), unsigned(b / grid.x % grid.y), unsigned(b / (1ull * grid.x * grid.y))};
      run_block(L, n, block);
    }
    if (!L.failed) memory.copy_back(L);
  }
  std::snprintf(error, error_size, "%s", L.error);
  launch_state = nullptr;
  return L.failed ? 1 : 0;
}

// GCC's -fsanitize=bounds calls these for an index outside a fixed-size array (the layouts are
// UBSan's: a source location, then type descriptors whose name follows two 16-bit fields).
struct SourceLocation { const char* file; unsigned line, column; };
struct TypeDescriptor { unsigned short kind, info; char name[1]; };
struct OutOfBoundsData { SourceLocation location; TypeDescriptor* array_type; TypeDescriptor* index_type; };

ORTLAB_RT inline void out_of_bounds(OutOfBoundsData* data, void* index) {
  char what[256];
  bool is_signed = data->index_type->info & 1;
  long long value = is_signed ? (long long)(std::intptr_t)index : (long long)(std::uintptr_t)index;
  std::snprintf(what, sizeof what, "%s line %u, column %u: index %lld is out of bounds for type %s",
                data->location.file, data->location.line, data->location.column, value,
                data->array_type->name);
  fail(what);
}

}  // namespace ortlab_cpu

extern "C" ORTLAB_RT void __ubsan_handle_out_of_bounds(ortlab_cpu::OutOfBoundsData* d, void* i) {
  ortlab_cpu::out_of_bounds(d, i);
}
extern "C" ORTLAB_RT void __ubsan_handle_out_of_bounds_abort(ortlab_cpu::OutOfBoundsData* d, void* i) {
  ortlab_cpu::out_of_bounds(d, i);
}

inline void __syncthreads() { ortlab_cpu::syncthreads(); }

// Warp operations: each is a barrier of the thread's warp (32 consecutive threads of the block's
// x-fastest order), as on the GPU for a full mask; see ortlab_cpu::warp_op.
template <class T> T __shfl_sync(unsigned mask, T v, int src, int width = warpSize) {
  return ortlab_cpu::warp_op(ortlab_cpu::SHFL, mask, v, src, width);
}
template <class T> T __shfl_up_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  return ortlab_cpu::warp_op(ortlab_cpu::SHFL_UP, mask, v, (int)delta, width);
}
template <class T> T __shfl_down_sync(unsigned mask, T v, unsigned delta, int width = warpSize) {
  return ortlab_cpu::warp_op(ortlab_cpu::SHFL_DOWN, mask, v, (int)delta, width);
}
template <class T> T __shfl_xor_sync(unsigned mask, T v, int lane_mask, int width = warpSize) {
  return ortlab_cpu::warp_op(ortlab_cpu::SHFL_XOR, mask, v, lane_mask, width);
}
inline void __syncwarp(unsigned mask = 0xffffffffu) { ortlab_cpu::warp_op(ortlab_cpu::SYNCWARP, mask, 0, 0, 32); }
inline unsigned __ballot_sync(unsigned mask, int predicate) {
  return (unsigned)ortlab_cpu::warp_op(ortlab_cpu::BALLOT, mask, (unsigned long long)(predicate != 0), 0, 32);
}
inline int __any_sync(unsigned mask, int predicate) { return __ballot_sync(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
  unsigned b = __ballot_sync(mask, predicate);
  return b == __ballot_sync(mask, 1);
}

// Atomics: threads never run at the same time here, so a read-modify-write is atomic. Each is
// checked like any access (cpu_checks.h) but is never part of a race.
namespace ortlab_cpu {
template <class T, class F>
ORTLAB_RT T atomic(T* a, void* pc, F update) {
  atomic_access(a, sizeof(T), pc);
  T old = *a;
  *a = update(old);
  return old;
}
}  // namespace ortlab_cpu
#define ORTLAB_ATOMIC(name, expr)                                                                           \
  template <class T> ORTLAB_RT T name(T* a, T v) {                                                          \
    return ortlab_cpu::atomic(a, __builtin_return_address(0), [v](T old) { return expr; }); }               \
  template <class T> ORTLAB_RT T name(ortlab_cpu::ptr<T> a, T v) {                                          \
    return ortlab_cpu::atomic(a.check(0), __builtin_return_address(0), [v](T old) { return expr; }); }
ORTLAB_ATOMIC(atomicAdd, old + v)
ORTLAB_ATOMIC(atomicSub, old - v)
ORTLAB_ATOMIC(atomicMax, old > v ? old : v)
ORTLAB_ATOMIC(atomicMin, old < v ? old : v)
ORTLAB_ATOMIC(atomicExch, v)
#undef ORTLAB_ATOMIC
template <class T> ORTLAB_RT T atomicCAS(T* a, T compare, T v) {
  return ortlab_cpu::atomic(a, __builtin_return_address(0), [=](T old) { return old == compare ? v : old; });
}

// A few of CUDA's math functions that the C++ library lacks.
inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float x, float y) { return x / y; }
inline float rsqrtf(float x) { return 1.0f / std::sqrt(x); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }
inline float __int_as_float(int i) { float f; std::memcpy(&f, &i, sizeof f); return f; }
inline int __float_as_int(float f) { int i; std::memcpy(&i, &f, sizeof i); return i; }
inline float __uint_as_float(unsigned i) { float f; std::memcpy(&f, &i, sizeof f); return f; }
inline unsigned __float_as_uint(float f) { unsigned i; std::memcpy(&i, &f, sizeof i); return i; }

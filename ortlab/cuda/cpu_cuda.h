// cpu_cuda.h: CUDA C++'s built-ins on one CPU thread, for ortlab.cuda.cpu (the CPU runner).
//
// A block's threads are coroutines (POSIX ucontext, one stack each) that the scheduler resumes in a
// fixed order; each runs until it reaches __syncthreads() or returns, so the schedule between two
// barriers is deterministic (thread 0 first, or the reverse order). Blocks run one after another.
// Pointer parameters become ortlab_cpu::ptr<T>, which checks every index against its array's size;
// fixed-size arrays (__shared__ and local) are checked by GCC's -fsanitize=bounds, whose handler is
// defined below. A failure stops the launch and is reported with the thread and block.
#pragma once
#include <cmath>
#include <math.h>  // expf, sqrtf, fmaxf... in the global namespace, as CUDA has them
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <vector>
#include <ucontext.h>

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __noinline__
#define __launch_bounds__(...)
#define __shared__ static

struct uint3 { unsigned x, y, z; };
struct dim3 {
  unsigned x, y, z;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;
constexpr int warpSize = 32;

namespace ortlab_cpu {

enum State { READY, AT_BARRIER, DONE };
constexpr std::size_t kStackBytes = 128 * 1024;  // a thread's locals live here

struct Launch {
  ucontext_t scheduler;
  std::vector<ucontext_t> contexts;
  std::vector<State> states;
  std::vector<std::unique_ptr<char[]>> stacks;  // one per thread, not zero-filled
  std::function<void()> body;
  int current = 0;
  bool failed = false;
  char error[512] = {0};
  std::vector<char> dynamic_shared;
};

inline Launch* launch_state = nullptr;

// Record the first failure and hand control back to the scheduler for good.
inline void fail(const char* what) {
  Launch& L = *launch_state;
  if (!L.failed) {
    L.failed = true;
    std::snprintf(L.error, sizeof L.error, "thread (%u, %u, %u) of block (%u, %u, %u): %s", threadIdx.x,
                  threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z, what);
  }
  swapcontext(&L.contexts[L.current], &L.scheduler);
}

inline void syncthreads() {
  Launch& L = *launch_state;
  L.states[L.current] = AT_BARRIER;
  swapcontext(&L.contexts[L.current], &L.scheduler);
}

// A pointer parameter that knows how many elements its array has.
template <class T>
struct ptr {
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
};

template <class T>
ptr<T> dynamic_shared(const char* name) {
  Launch& L = *launch_state;
  return {reinterpret_cast<T*>(L.dynamic_shared.data()),
          static_cast<std::ptrdiff_t>(L.dynamic_shared.size() / sizeof(T)), name};
}

inline void trampoline() {
  Launch& L = *launch_state;
  L.body();
  L.states[L.current] = DONE;  // uc_link returns to the scheduler
}

// Run `body` as every thread of every block; 0 on success, 1 with `error` filled on a failure.
inline int run(dim3 grid, dim3 block, int reverse, std::size_t shared_bytes, std::function<void()> body,
               char* error, int error_size) {
  Launch L;
  launch_state = &L;
  L.body = std::move(body);
  L.dynamic_shared.assign(shared_bytes, 0);
  const int n = block.x * block.y * block.z;
  L.contexts.resize(n);
  L.states.resize(n);
  L.stacks.resize(n);
  for (auto& stack : L.stacks) stack.reset(new char[kStackBytes]);
  gridDim = grid;
  blockDim = block;
  for (unsigned bz = 0; bz < grid.z && !L.failed; ++bz)
    for (unsigned by = 0; by < grid.y && !L.failed; ++by)
      for (unsigned bx = 0; bx < grid.x && !L.failed; ++bx) {
        blockIdx = {bx, by, bz};
        for (int t = 0; t < n; ++t) {
          getcontext(&L.contexts[t]);
          L.contexts[t].uc_stack.ss_sp = L.stacks[t].get();
          L.contexts[t].uc_stack.ss_size = kStackBytes;
          L.contexts[t].uc_link = &L.scheduler;
          makecontext(&L.contexts[t], trampoline, 0);
          L.states[t] = READY;
        }
        for (int barrier = 0; !L.failed; ++barrier) {
          for (int k = 0; k < n && !L.failed; ++k) {
            int t = reverse ? n - 1 - k : k;
            if (L.states[t] != READY) continue;
            L.current = t;
            threadIdx = {t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
            swapcontext(&L.scheduler, &L.contexts[t]);
          }
          if (L.failed) break;
          int done = 0, waiting = -1, finished = -1;
          for (int t = 0; t < n; ++t) {
            if (L.states[t] == DONE) { ++done; finished = t; }
            else if (waiting < 0) waiting = t;
          }
          if (done == n) break;
          if (done > 0) {
            std::snprintf(L.error, sizeof L.error,
                          "block (%u, %u, %u): thread %d returned while thread %d waits at __syncthreads() "
                          "number %d (every thread of a block must reach each barrier)",
                          bx, by, bz, finished, waiting, barrier + 1);
            L.failed = true;
            break;
          }
          for (int t = 0; t < n; ++t) L.states[t] = READY;
        }
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

inline void out_of_bounds(OutOfBoundsData* data, void* index) {
  char what[256];
  bool is_signed = data->index_type->info & 1;
  long long value = is_signed ? (long long)(std::intptr_t)index : (long long)(std::uintptr_t)index;
  std::snprintf(what, sizeof what, "%s line %u, column %u: index %lld is out of bounds for type %s",
                data->location.file, data->location.line, data->location.column, value,
                data->array_type->name);
  fail(what);
}

}  // namespace ortlab_cpu

extern "C" void __ubsan_handle_out_of_bounds(ortlab_cpu::OutOfBoundsData* d, void* i) {
  ortlab_cpu::out_of_bounds(d, i);
}
extern "C" void __ubsan_handle_out_of_bounds_abort(ortlab_cpu::OutOfBoundsData* d, void* i) {
  ortlab_cpu::out_of_bounds(d, i);
}

inline void __syncthreads() { ortlab_cpu::syncthreads(); }

// Atomics: threads never run at the same time here, so a read-modify-write is atomic.
template <class T> T atomicAdd(T* a, T v) { T old = *a; *a = old + v; return old; }
template <class T> T atomicSub(T* a, T v) { T old = *a; *a = old - v; return old; }
template <class T> T atomicMax(T* a, T v) { T old = *a; *a = old > v ? old : v; return old; }
template <class T> T atomicMin(T* a, T v) { T old = *a; *a = old < v ? old : v; return old; }
template <class T> T atomicExch(T* a, T v) { T old = *a; *a = v; return old; }
template <class T> T atomicCAS(T* a, T compare, T v) { T old = *a; if (old == compare) *a = v; return old; }
template <class T> T atomicAdd(ortlab_cpu::ptr<T> a, T v) { return atomicAdd(a.check(0), v); }
template <class T> T atomicMax(ortlab_cpu::ptr<T> a, T v) { return atomicMax(a.check(0), v); }
template <class T> T atomicMin(ortlab_cpu::ptr<T> a, T v) { return atomicMin(a.check(0), v); }

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

// cpu_checks.h: the CPU runner's view of every load and store of a kernel (part of cpu_cuda.h).
//
// The kernel is compiled with -fsanitize=thread, so GCC calls __tsan_read4(address) (and so on)
// before each access that is not to a local kept in a register; the runner links no ThreadSanitizer
// and defines those callbacks here. They see what ptr<T> cannot: accesses through pointers derived
// from a parameter (o + 64, &o[0], a __device__ function's float*) and through volatile pointers
// into shared memory. With them the runner
//   - places each pointer argument (and the dynamic shared memory) in a copy of its own, between
//     two unmapped gaps of at least 64 MiB, so that an access outside it stops the launch naming the
//     array and the index (and never lands in a neighbouring array);
//   - notes which arrays were written (a write through const_cast lands, as on a GPU);
//   - keeps static __shared__ arrays in one section between two guards, so that an index past them
//     through a pointer stops the launch;
//   - looks for races between the lanes of one warp on shared memory (the hazard racecheck reports):
//     a lane that reads what another lane of its warp wrote, or writes what it read, with no
//     __syncwarp() or __syncthreads() between; one through a volatile access stops the launch;
//   - or, with warps="lockstep", runs the lanes of a warp one memory access at a time together.
// Accesses by the runtime itself are not instrumented (ORTLAB_RT).
#pragma once

extern "C" char __start_ortlab_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char __stop_ortlab_shared[] __attribute__((weak, visibility("hidden")));
extern "C" char ortlab_shared_guard_high[];  // defined after the kernel's source (cpu.py), this before it
static char ortlab_shared_guard_low[16384] __attribute__((section("ortlab_shared"), used));

namespace ortlab_cpu {

constexpr std::size_t kGuardBytes = sizeof ortlab_shared_guard_low;
constexpr std::size_t kGapBytes = std::size_t(64) << 20;

// A kernel parameter as the launch wrapper describes it.
struct ParamInfo { const char* name; unsigned elem; int pointer; int is_const; };
// The launch's arguments: each pointer's data and element count, whether the caller's array may be
// written, and (filled on success) whether the kernel wrote it.
struct Arguments { void** data; const long long* sizes; const int* writable; int* written;
                   const ParamInfo* params; int count; };

// Per element of a pointer argument, for the lost-update check (schedule_differences): the thread
// (index in the grid + 1) that last wrote it and the epochs it wrote in, and the thread that last
// read it while that write was not ordered before the read.
struct Written { unsigned thread, warp_stamp, block_stamp, stale_reader; };

// One array the kernel may reach: a pointer argument's copy, or the dynamic shared memory (the last).
struct Region {
  char* data = nullptr;
  std::size_t bytes = 0;
  unsigned elem = 1;
  const char* name = "";
  bool is_const = false, written = false, shared = false;
  unsigned writer[6] = {0};  // the thread and block that first wrote a const array
  std::size_t writer_pc = 0;
  Written* history = nullptr;  // per element, with a launch that looks for lost updates
  bool lost_update = false;    // a thread wrote back what it read from an unordered write
};

struct Access { int thread; unsigned stamp; unsigned pc; unsigned char vol; };
struct Shadow { Access write, read, other_read; };  // per byte of shared memory

struct Checks {
  char* arena_lo = nullptr;
  char* arena_hi = nullptr;
  std::vector<Region> regions;
  Shadow* shadow = nullptr;
  std::size_t static_bytes = 0, shadow_bytes = 0;
  char* library = nullptr;  // where this library is loaded: pcs are reported as offsets into it
};

inline Checks* checks = nullptr;

ORTLAB_RT inline std::size_t pc_offset(const Checks& c, void* pc) {
  return pc && c.library ? static_cast<std::size_t>(static_cast<char*>(pc) - c.library) - 1 : 0;
}

ORTLAB_RT inline void step() {  // warps="lockstep": wait until every lane of the warp got here
  Launch& L = *launch_state;
  L.states[L.current] = AT_STEP;
  yield_to_scheduler();
}

// What an access outside every region but near `r` is: r's name and the index it reached. Farther from
// every array than its own size (and 1 MiB), the array the pointer came from cannot be told (an index
// far past one array may land in the gap of another): say so, naming the nearest.
ORTLAB_RT inline void outside(const Checks& c, const Region& r, char* a, bool write, void* pc) {
  char what[400];
  const std::size_t away = a < r.data ? r.data - a : a - (r.data + r.bytes);
  if (away > std::max(r.bytes, std::size_t(1) << 20)) {
    std::snprintf(what, sizeof what, "an address %zu bytes %s %s, the nearest array, is out of bounds of every "
                  "array of the launch: %s through a pointer at @pc:0x%zx@ (an index far outside its array)", away,
                  a < r.data ? "before" : "past the end of", r.name, write ? "written" : "read", pc_offset(c, pc));
    return fail(what);
  }
  std::ptrdiff_t at = a - r.data, index = (at >= 0 ? at : at - (std::ptrdiff_t)r.elem + 1) / (std::ptrdiff_t)r.elem;
  std::snprintf(what, sizeof what, "%s[%td] is out of bounds (%s has %zu elements): %s through a pointer at "
                "@pc:0x%zx@", r.name, index, r.name, r.bytes / r.elem, write ? "written" : "read", pc_offset(c, pc));
  fail(what);
}

// Name the shared memory at `a` for a message: name[index], or a marker cpu.py resolves.
ORTLAB_RT inline void shared_name(const Checks& c, char* a, unsigned size, char* out, std::size_t n) {
  const Region& r = c.regions.back();
  if (a >= r.data && a < r.data + r.bytes) std::snprintf(out, n, "%s[%td]", r.name, (a - r.data) / size);
  else std::snprintf(out, n, "@shared:0x%zx:%u@", static_cast<std::size_t>(a - c.library), size);
}

ORTLAB_RT inline void hazard(const Checks& c, const Access& other, bool write, char* a, unsigned size,
                             unsigned where) {
  Launch& L = *launch_state;
  char name[120], what[600];
  shared_name(c, a, size, name, sizeof name);
  const unsigned u = other.thread, bx = blockDim.x, by = blockDim.y;
  std::snprintf(what, sizeof what, "@warp-race@ lane %d %s %s at @pc:0x%x@, which thread (%u, %u, %u), lane %u of "
                "the same warp, %s at @pc:0x%x@, with no __syncwarp() or __syncthreads() between them",
                L.current % 32, write ? "writes" : "reads", name, where, u % bx, u / bx % by, u / (bx * by), u % 32,
                write ? "read" : "wrote", other.pc);
  fail(what);
}

// The race check of one access to shared memory, `at` bytes into the shadow (warps="independent").
ORTLAB_RT inline void race(Checks& c, std::size_t at, char* a, unsigned size, bool write, bool vol, void* pc) {
  Launch& L = *launch_state;
  const int t = L.current;
  const unsigned stamp = L.warp_stamp[t / 32], where = static_cast<unsigned>(pc_offset(c, pc));
  const Access now{t, stamp, where, vol};
  for (unsigned k = 0; k < size && at + k < c.shadow_bytes; ++k) {
    Shadow& s = c.shadow[at + k];
    const Access* other = nullptr;  // the same epoch of the same warp, another lane, one of them a write
    if (!write && s.write.stamp == stamp && s.write.thread != t) other = &s.write;
    if (write && s.read.stamp == stamp && s.read.thread != t) other = &s.read;
    if (write && !other && s.other_read.stamp == stamp && s.other_read.thread != t) other = &s.other_read;
    if (other && (vol || other->vol)) return hazard(c, *other, write, a, size, where);
    if (write) s.write = now;
    else if (s.read.stamp == stamp && s.read.thread != t) { s.other_read = s.read; s.read = now; }
    else s.read = now;
  }
}

ORTLAB_RT inline void touch(Checks& c, std::ptrdiff_t at, char* a, unsigned size, bool write, bool vol, void* pc) {
  if (launch_state->lockstep) step();
  else if (at >= 0) race(c, static_cast<std::size_t>(at), a, size, write, vol, pc);
}

// The lost-update check of one plain access to a pointer argument (a launch of schedule_differences):
// a thread that read an element another thread wrote with nothing ordering the two (another block;
// another warp of the block since the last __syncthreads(); another lane of the warp since its last
// __syncwarp() or warp operation), and then writes that element, is a read-modify-write that
// concurrent threads can interleave, losing one update; running threads one after another hides it
// whatever their order (counter[0] += 1 gives the same count in either order), so it is noted here.
ORTLAB_RT inline void note_lost_update(Region& r, char* a, unsigned size, bool write) {
  Launch& L = *launch_state;
  const int n = static_cast<int>(blockDim.x * blockDim.y * blockDim.z);
  const unsigned long long block = blockIdx.x + 1ull * gridDim.x * (blockIdx.y + 1ull * gridDim.y * blockIdx.z);
  const unsigned me = static_cast<unsigned>(block * n + L.current + 1);
  const unsigned warp_stamp = L.warp_stamp[L.current / 32];
  const std::size_t first = (a - r.data) / r.elem, last = (a + size - 1 - r.data) / r.elem;
  for (std::size_t k = first; k <= last; ++k) {
    Written& w = r.history[k];
    if (write) {
      if (w.stale_reader == me) r.lost_update = true;
      w = {me, warp_stamp, L.block_stamp, 0};
    } else if (w.thread && w.thread != me) {
      const unsigned other = w.thread - 1, mine = me - 1;
      const bool same_block = other / n == mine / n, same_warp = same_block && other % n / 32 == mine % n / 32;
      const bool ordered = same_warp ? w.warp_stamp != warp_stamp : same_block && w.block_stamp != L.block_stamp;
      if (!ordered) w.stale_reader = me;
    }
  }
}

ORTLAB_RT inline void arena_access(Checks& c, char* a, unsigned size, bool write, bool vol, void* pc) {
  const Region* near = nullptr;
  std::ptrdiff_t best = PTRDIFF_MAX;
  for (Region& r : c.regions) {
    if (!r.data) continue;
    if (a >= r.data && a + size <= r.data + r.bytes) {
      if (write && !r.written) {
        r.written = true;
        r.writer_pc = pc_offset(c, pc);
        const unsigned w[6] = {threadIdx.x, threadIdx.y, threadIdx.z, blockIdx.x, blockIdx.y, blockIdx.z};
        std::memcpy(r.writer, w, sizeof w);
      }
      if (r.history && launch_state->lost_updates) note_lost_update(r, a, size, write);
      return touch(c, r.shared ? std::ptrdiff_t(c.static_bytes + (a - r.data)) : -1, a, size, write, vol, pc);
    }
    std::ptrdiff_t d = a < r.data ? r.data - a : a - (r.data + r.bytes);
    if (d < best) { best = d; near = &r; }
  }
  if (near) outside(c, *near, a, write, pc);
}

ORTLAB_RT inline void static_access(Checks& c, char* a, unsigned size, bool write, bool vol, void* pc) {
  char* high = ortlab_shared_guard_high;
  if ((a >= ortlab_shared_guard_low && a < ortlab_shared_guard_low + kGuardBytes) ||
      (a + size > high && a < high + kGuardBytes)) {
    char what[200];
    std::snprintf(what, sizeof what, "@past-shared:0x%zx:%u@ (%s through a pointer at @pc:0x%zx@)",
                  static_cast<std::size_t>(a - c.library), size, write ? "written" : "read", pc_offset(c, pc));
    return fail(what);
  }
  touch(c, a - __start_ortlab_shared, a, size, write, vol, pc);
}

// Every instrumented load and store of the kernel comes here.
ORTLAB_RT inline void access(void* address, unsigned size, bool write, bool vol, void* pc) {
  Checks* c = checks;
  char* a = static_cast<char*>(address);
  if (!c || !launch_state) return;
  if (a >= c->arena_lo && a < c->arena_hi) arena_access(*c, a, size, write, vol, pc);
  else if (a >= __start_ortlab_shared && a < __stop_ortlab_shared) static_access(*c, a, size, write, vol, pc);
}

// An atomic read-modify-write: checked and stepped, but never a race.
ORTLAB_RT inline void atomic_access(void* address, unsigned size, void* pc) {
  Checks* c = checks;
  char* a = static_cast<char*>(address);
  if (!c || !launch_state) return;
  if (a >= c->arena_lo && a < c->arena_hi) {
    const bool lockstep = launch_state->lockstep;
    launch_state->lockstep = 0;  // no race check below: one step at most
    const bool looking = launch_state->lost_updates;
    launch_state->lost_updates = 0;  // nor a lost update: an atomic loses none
    arena_access(*c, a, size, true, false, pc);
    launch_state->lost_updates = looking;
    launch_state->lockstep = lockstep;
    if (lockstep) step();
  } else if (a >= __start_ortlab_shared && a < __stop_ortlab_shared && launch_state->lockstep) {
    step();
  }
}

ORTLAB_RT inline std::size_t whole_pages(std::size_t bytes) { return (bytes + 4095) / 4096 * 4096; }

// The launch's copies of its arrays (and its dynamic shared memory), set up and torn down.
struct Memory {
  Checks c;
  const Arguments& args;
  std::size_t total = 0, gap = kGapBytes;

  ORTLAB_RT Memory(const Arguments& a, std::size_t shared_bytes) : args(a) {
    c.regions.resize(a.count + 1);
    for (int k = 0; k < a.count; ++k) {
      if (!a.params[k].pointer) continue;
      Region& r = c.regions[k];
      r.name = a.params[k].name;
      r.elem = a.params[k].elem;
      r.bytes = static_cast<std::size_t>(a.sizes[k]) * r.elem;
      r.is_const = a.params[k].is_const;
    }
    Region& s = c.regions.back();
    s.name = "extern __shared__ memory";
    s.bytes = shared_bytes;
    s.shared = true;
    for (const Region& r : c.regions) gap = std::max(gap, whole_pages(r.bytes));
    for (int k = 0; k <= a.count; ++k)
      if (k == a.count || a.params[k].pointer) total += 2 * gap + whole_pages(c.regions[k].bytes);
    c.static_bytes = __stop_ortlab_shared - __start_ortlab_shared;
    c.shadow_bytes = c.static_bytes + shared_bytes;
    Dl_info info;
    if (dladdr(reinterpret_cast<void*>(&whole_pages), &info)) c.library = static_cast<char*>(info.dli_fbase);
  }

  // Map the copies; false (with the launch's error) when the address space is not there.
  ORTLAB_RT bool ready(Launch& L) {
    void* base = mmap(nullptr, total, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    c.shadow = static_cast<Shadow*>(std::calloc(c.shadow_bytes ? c.shadow_bytes : 1, sizeof(Shadow)));
    if (base == MAP_FAILED || !c.shadow) {
      std::snprintf(L.error, sizeof L.error, "the CPU runner could not reserve %zu bytes of address space for "
                    "the launch's arrays", total);
      L.failed = true;
      return false;
    }
    c.arena_lo = static_cast<char*>(base);
    c.arena_hi = c.arena_lo + total;
    char* at = c.arena_lo;
    for (int k = 0; k <= args.count; ++k) {
      if (k < args.count && !args.params[k].pointer) continue;
      Region& r = c.regions[k];
      r.data = at + gap;
      if (r.bytes && mprotect(r.data, whole_pages(r.bytes), PROT_READ | PROT_WRITE) != 0) {
        std::snprintf(L.error, sizeof L.error, "the CPU runner could not map %zu bytes for %s", r.bytes, r.name);
        L.failed = true;
        return false;
      }
      if (k < args.count && r.bytes) std::memcpy(r.data, args.data[k], r.bytes);
      at += 2 * gap + whole_pages(r.bytes);
    }
    for (int k = 0; k < args.count && L.lost_updates; ++k) {
      Region& r = c.regions[k];
      if (!args.params[k].pointer || !r.bytes) continue;
      r.history = static_cast<Written*>(std::calloc(r.bytes / r.elem, sizeof(Written)));
      if (!r.history) {
        std::snprintf(L.error, sizeof L.error, "the CPU runner could not allocate the access history of %s", r.name);
        L.failed = true;
        return false;
      }
    }
    checks = &c;
    return true;
  }

  // After a launch that succeeded: write back every array the kernel may have changed.
  ORTLAB_RT void copy_back(Launch& L) {
    for (int k = 0; k < args.count; ++k) {
      const Region& r = c.regions[k];
      if (!args.params[k].pointer || (r.is_const && !r.written)) continue;
      if (!args.writable[k]) {
        std::snprintf(L.error, sizeof L.error, "thread (%u, %u, %u) of block (%u, %u, %u) wrote %s, a const "
                      "parameter, at @pc:0x%zx@ (through const_cast): on a GPU the write lands, and it does here, "
                      "but the array passed for %s is read-only: pass a writable array (or do not write through "
                      "a const pointer)", r.writer[0], r.writer[1], r.writer[2], r.writer[3], r.writer[4],
                      r.writer[5], r.name, r.writer_pc, r.name);
        L.failed = true;
        return;
      }
    }
    for (int k = 0; k < args.count; ++k) {
      const Region& r = c.regions[k];
      if (!args.params[k].pointer) continue;
      args.written[k] = int(r.written) | (r.lost_update ? 2 : 0);
      if ((!r.is_const || r.written) && r.bytes) std::memcpy(args.data[k], r.data, r.bytes);
    }
  }

  ORTLAB_RT ~Memory() {
    checks = nullptr;
    if (c.arena_lo) munmap(c.arena_lo, total);
    std::free(c.shadow);
    for (Region& r : c.regions) std::free(r.history);
  }
};

template <class T>
ORTLAB_RT ptr<T> dynamic_shared(const char* name) {
  Region& r = checks->regions.back();
  r.name = name;
  r.elem = sizeof(T);
  return {reinterpret_cast<T*>(r.data), static_cast<std::ptrdiff_t>(r.bytes / sizeof(T)), name};
}

// The copy of pointer argument k, as the launch wrapper hands it to the kernel.
template <class T>
ORTLAB_RT ptr<T> argument(int k, const char* name) {
  const Region& r = checks->regions[k];
  return {reinterpret_cast<T*>(r.data), static_cast<std::ptrdiff_t>(r.bytes / sizeof(T)), name};
}

}  // namespace ortlab_cpu

#define ORTLAB_TSAN(n)                                                                                         \
  extern "C" ORTLAB_RT void __tsan_read##n(void* a) {                                                         \
    ortlab_cpu::access(a, n, false, false, __builtin_return_address(0)); }                                    \
  extern "C" ORTLAB_RT void __tsan_write##n(void* a) {                                                        \
    ortlab_cpu::access(a, n, true, false, __builtin_return_address(0)); }                                     \
  extern "C" ORTLAB_RT void __tsan_unaligned_read##n(void* a) {                                               \
    ortlab_cpu::access(a, n, false, false, __builtin_return_address(0)); }                                    \
  extern "C" ORTLAB_RT void __tsan_unaligned_write##n(void* a) {                                              \
    ortlab_cpu::access(a, n, true, false, __builtin_return_address(0)); }                                     \
  extern "C" ORTLAB_RT void __tsan_volatile_read##n(void* a) {                                                \
    ortlab_cpu::access(a, n, false, true, __builtin_return_address(0)); }                                     \
  extern "C" ORTLAB_RT void __tsan_volatile_write##n(void* a) {                                               \
    ortlab_cpu::access(a, n, true, true, __builtin_return_address(0)); }
ORTLAB_TSAN(1)
ORTLAB_TSAN(2)
ORTLAB_TSAN(4)
ORTLAB_TSAN(8)
ORTLAB_TSAN(16)
#undef ORTLAB_TSAN
extern "C" ORTLAB_RT void __tsan_read_range(void* a, unsigned long n) {
  ortlab_cpu::access(a, static_cast<unsigned>(n), false, false, __builtin_return_address(0));
}
extern "C" ORTLAB_RT void __tsan_write_range(void* a, unsigned long n) {
  ortlab_cpu::access(a, static_cast<unsigned>(n), true, false, __builtin_return_address(0));
}
extern "C" ORTLAB_RT void __tsan_init() {}
extern "C" ORTLAB_RT void __tsan_func_entry(void*) {}
extern "C" ORTLAB_RT void __tsan_func_exit() {}
extern "C" ORTLAB_RT void __tsan_vptr_update(void**, void*) {}
extern "C" ORTLAB_RT void __tsan_vptr_read(void**) {}

"""ortlab.cuda: CUDA C++ compiled by NVIDIA's own compilers, and what the result costs an SM, without a GPU.

ORT's CUDA execution provider runs kernels written in CUDA C++ (onnxruntime/core/providers/cuda/,
e.g. cu_inc/common.cuh and reduction/reduction_functions.cu); a learner can compile such kernels here
on a CPU-only machine and read what the GPU would be handed:

    compile(source, arch="sm_80", options=())   NVRTC (libnvrtc, through ctypes) -> PTX; ptxas -> cubin
                                                and each kernel's registers, shared / constant / local
                                                bytes and spills (compiler.py, nvrtc.py, ptxas.py)
    occupancy(resources, block_size, arch)      blocks and warps per SM and the limiting resource, the
                                                arithmetic of cudaOccupancyMaxActiveBlocksPerMultiprocessor
                                                (occupancy.py), with NVIDIA's limits per architecture
                                                as plain data (archs.py)

    cpu_kernel(source, name)                    the same source compiled by g++ for the CPU runner
    cpu_kernels(source, names)                  several kernels of one source, one g++ build
    launch(kernel, grid, block, *args,          run it on numpy arrays, bounds-checked, deterministic,
           shared_bytes=0, warps="independent") in a worker process stopped after `timeout` s
    schedule_differences(kernel, grid, ...)     the arrays a race changes: between two barriers of a
                                                block, or between two blocks, and lost updates (a
                                                read-modify-write that no order shows) (cpu.py)

Design of the CPU runner (cpu.py, cpu_cuda.h)
---------------------------------------------
Goal: run the same CUDA C++ kernel source on CPU arrays, to check its results against numpy before a
GPU is at hand, and to catch the two bugs a GPU hides best: out-of-bounds accesses and races
around `__syncthreads()`.

- One C++ source per kernel: the header `cpu_cuda.h`, then the kernel's text with two rewrites
  that keep its line numbers (pointer parameters become checked pointers; `extern __shared__ T s[]`
  becomes a checked pointer to the launch's dynamic shared memory), then a generated `extern "C"`
  entry point. The header defines `__global__`, `__device__`, `__forceinline__` and
  `__launch_bounds__(...)` away, `dim3`, the built-ins `threadIdx`, `blockIdx`, `blockDim`,
  `gridDim` as variables the scheduler sets, `__shared__` as `static` (one copy, since blocks run
  one after another), the atomics as plain read-modify-writes (threads never run at once), and
  `__syncthreads()` as a switch back to the scheduler. g++ (which the set-up already needs for
  ORTModule's extensions) builds it once per source into a shared library loaded with ctypes.
- Schedule: blocks run one after another; the threads of a block are coroutines (one stack each,
  started with ucontext and switched with _setjmp/_longjmp, which make no system call) resumed in a
  fixed order, thread 0 first (or the reverse), each until it reaches
  `__syncthreads()` or returns. A barrier is complete when every thread of the block has reached
  it; a thread that returns while others wait at a barrier is reported (a divergent barrier).
  Deterministic, so a result never depends on the run; running both orders on copies of the
  inputs shows a race between two barriers as a difference between the results, and the forward
  run notes a thread that writes back what it read from a write nothing orders before the read (a
  lost update on a GPU: `counter[0] += 1` by two blocks, which both orders count right).
- Bounds: each pointer parameter is an `ortlab_cpu::ptr<T>` that knows its array's size; an index
  outside it stops the launch with the thread, block, parameter and index instead of corrupting
  memory. Every other access (through a pointer derived from a parameter, `o + 64`, `&o[0]`, a
  `__device__` function's `float*`, a `volatile` pointer) is seen by the load and store hooks GCC's
  -fsanitize=thread inserts, defined in `cpu_checks.h` (no ThreadSanitizer runtime): each array sits
  in its own block between unmapped guards, copied back only when the launch succeeds. Fixed-size
  arrays (`__shared__` and local) are checked by GCC's -fsanitize=bounds, whose handler (defined in
  the header, not libubsan) reports the source line. `__launch_bounds__(n)` is enforced as a GPU
  enforces it.
- Warps: the warp operations `__shfl_sync`, `__shfl_up_sync`, `__shfl_down_sync`, `__shfl_xor_sync`,
  `__syncwarp`, `__ballot_sync`, `__any_sync`, `__all_sync` are barriers of the thread's warp (32
  consecutive threads in x-fastest order): a thread leaves its value and waits; once all of the
  warp's threads wait at the same operation, every lane's result is computed at once and they go on.
  Modelled with the Programming Guide's rules for `width` and lanes past a group's edge. Refused with
  an OrtlabError: a mask that leaves out a present lane (partial-warp operations are not modelled), a
  warp whose threads meet at different operations or where one returned or waits at
  `__syncthreads()`, a lane reading a lane the block does not have. Outside warp operations the
  threads of a warp run one after another like any others (`warps="independent"`, as GPUs since Volta
  may), and a `volatile` shared-memory race between lanes of one warp with no `__syncwarp()` between
  stops the launch as racecheck reports it; `warps="lockstep"` runs a warp's lanes one memory access
  at a time together, as GPUs before Volta did (cpu.py says why "independent" is the default).
- Time limit: `launch` sends the kernel's library path and copies of its arrays to a worker
  process (forked once, reused; a socket carries requests and answers) and kills the worker after
  `timeout` seconds (10 by default): native code that never returns cannot be stopped inside this
  process (a thread cannot be killed), a process can. The next launch forks a new worker. A kernel
  that crashes the worker (a thread's locals past its 128 KiB stack) is an OrtlabError too. Costs a
  copy of the arrays each way (about 1 ms for small ones); `timeout=None` runs in-process. The
  worker's stdout (a kernel's printf) is the one this process had when the worker was forked.
- Not modelled: partial-warp masks, `__match_*`/`__reduce_*_sync`, cooperative groups, memory fences
  and the memory model, streams, textures, timing.
"""
from ortlab.cuda.archs import ARCHS, ArchLimits, arch_limits
from ortlab.cuda.compiler import CompileResult, clear_cache, compile
from ortlab.cuda.cpu import CpuKernel, cpu_kernel, cpu_kernels, launch, schedule_differences
from ortlab.cuda.nvrtc import CudaCompileError, Diagnostic
from ortlab.cuda.occupancy import Occupancy, occupancy
from ortlab.cuda.ptxas import KernelResources

__all__ = ["ARCHS", "ArchLimits", "CompileResult", "CpuKernel", "CudaCompileError", "Diagnostic",
           "KernelResources", "Occupancy", "arch_limits", "clear_cache", "compile", "cpu_kernel", "cpu_kernels",
           "launch", "occupancy", "schedule_differences"]

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
    launch(kernel, grid, block, *args)          run it on numpy arrays, bounds-checked, deterministic
    schedule_differences(kernel, grid, ...)     the arrays a race between two barriers changes (cpu.py)

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
- Schedule: blocks run one after another; the threads of a block are coroutines (ucontext, one
  stack each) resumed in a fixed order, thread 0 first (or the reverse), each until it reaches
  `__syncthreads()` or returns. A barrier is complete when every thread of the block has reached
  it; a thread that returns while others wait at a barrier is reported (a divergent barrier).
  Deterministic, so a result never depends on the run; running both orders on copies of the
  inputs shows a race between two barriers as a difference between the results.
- Bounds: each pointer parameter is an `ortlab_cpu::ptr<T>` that knows its array's size; an index
  outside it stops the launch with the thread, block, parameter and index instead of corrupting
  memory. Fixed-size arrays (`__shared__` and local) are checked by GCC's -fsanitize=bounds, whose
  handler (defined in the header, not libubsan) reports the source line.
- Not modelled: warps (`__shfl_sync`, `__ballot_sync`), memory fences, streams, textures, timing.
"""
from ortlab.cuda.archs import ARCHS, ArchLimits, arch_limits
from ortlab.cuda.compiler import CompileResult, clear_cache, compile
from ortlab.cuda.cpu import CpuKernel, cpu_kernel, launch, schedule_differences
from ortlab.cuda.nvrtc import CudaCompileError, Diagnostic
from ortlab.cuda.occupancy import Occupancy, occupancy
from ortlab.cuda.ptxas import KernelResources

__all__ = ["ARCHS", "ArchLimits", "CompileResult", "CpuKernel", "CudaCompileError", "Diagnostic",
           "KernelResources", "Occupancy", "arch_limits", "clear_cache", "compile", "cpu_kernel", "launch",
           "occupancy", "schedule_differences"]

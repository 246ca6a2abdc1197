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

Design note: a CPU runner, `launch(kernel, grid, block, *args)` (not built yet)
-------------------------------------------------------------------------------
Goal: run the same CUDA C++ kernel source on CPU arrays, to check its results against numpy before a
GPU is at hand, and to catch the two bugs a GPU hides best: out-of-bounds accesses and races
around `__syncthreads()`.

- One C++ source per kernel: a small header (`cpu_cuda.h`) followed by the kernel's text unchanged.
  The header defines `__global__`, `__device__`, `__forceinline__` and `__launch_bounds__(...)` away,
  `dim3`, the built-ins `threadIdx`, `blockIdx`, `blockDim`, `gridDim` as thread-local variables
  the runner sets, `__shared__` as a per-block arena, the atomics (`atomicAdd`...) as plain
  read-modify-writes (threads of a block never run at once, see below), and `__syncthreads()` as
  a yield to the scheduler. It is compiled by g++ (which the set-up already needs for ORTModule's
  extensions) into a shared library, cached by a hash of the source, like kernels.cpp_extension.
- Schedule: blocks run one after another; the threads of a block are user-level coroutines
  (ucontext, one small stack each) run in a fixed order, thread 0 first, each until it reaches
  `__syncthreads()` or returns. A barrier is complete when every thread of the block has reached it;
  a thread that returns while others wait at a barrier is reported (a divergent barrier, undefined
  behaviour on a GPU). The schedule is deterministic, so a result never depends on the run; a
  second schedule (threads in reverse order) run on a copy of the inputs shows a race between two
  barriers as a difference between the two results.
- Bounds: each pointer argument is wrapped in a checked pointer type that knows its array's size;
  an index outside it stops the launch with the kernel, thread, block and index, instead of
  corrupting memory. `__shared__` arrays are checked the same way.
- Python side: `launch(kernel, grid, block, *args)` with numpy arrays (passed by pointer, dtype
  checked against the kernel's parameter types read from the source) and scalars; `kernel` is a
  `compile`-like result for one source and one kernel name.
"""
from ortlab.cuda.archs import ARCHS, ArchLimits, arch_limits
from ortlab.cuda.compiler import CompileResult, clear_cache, compile
from ortlab.cuda.nvrtc import CudaCompileError, Diagnostic
from ortlab.cuda.occupancy import Occupancy, occupancy
from ortlab.cuda.ptxas import KernelResources

__all__ = ["ARCHS", "ArchLimits", "CompileResult", "CudaCompileError", "Diagnostic", "KernelResources",
           "Occupancy", "arch_limits", "clear_cache", "compile", "occupancy"]

"""Launchers: `launch(kernel, grid, block, *args)` for the kernels of one registered source, on the CPU
runner or on a GPU through CuPy, with the arrays' module (`xp`) and the geometry limits a caller sizes
its grids by.

ORT's CUDA kernels are launched by host code that picks the grid and block and passes device pointers
(onnxruntime/core/providers/cuda/cu_inc/common.cuh, GridDim); ortlab's op-level functions (op_kernels.py)
do the same through a launcher, so one launch recipe runs on either machine:

    CpuLauncher(source)            the source built once per process by g++ (ortlab.cuda.cpu_kernels),
                                   numpy arrays, run by ortlab.cuda.launch (bounds-checked, deterministic)
    CupyLauncher(source, cubin)    the cubin loaded by CuPy; numpy arguments are copied to the device and
                                   written back after the launch (the GPU check's convention), CuPy arrays
                                   are used where they are (the device EP's); scalars typed by the signature
"""
import functools
import os
import tempfile

import numpy as np

from ortlab.cuda import kernels
from ortlab.cuda.cpu import cpu_kernels, launch, parse_params
from ortlab.errors import OrtlabError

CPU_RUNNER = "CPU runner: CUDA C++ compiled by g++ with CUDA's thread semantics"


@functools.lru_cache(maxsize=None)
def built(source):
    """{kernel: CpuKernel} of registered source `source`, one g++ build per process (and per disk cache)."""
    if source not in kernels.SOURCES:
        raise OrtlabError(f"no CUDA source named {source!r}; registered: {sorted(kernels.SOURCES)}")
    return cpu_kernels(kernels.source(source), kernels.SOURCES[source].kernels)


class CpuLauncher:
    """The kernels of `source` on the CPU runner. `block` is the block size row kernels use at most and
    `max_grid` the most blocks a grid-stride kernel gets: small here, so the loops run more than once."""

    xp = np
    label = CPU_RUNNER

    def __init__(self, source, block=128, max_grid=8):
        self.source, self.block, self.max_grid = source, block, max_grid
        self.kernels = built(source)

    def __call__(self, kernel, grid, block, *args):
        if kernel not in self.kernels:
            raise OrtlabError(f"source {self.source!r} has no kernel {kernel!r}; it has {sorted(self.kernels)}")
        launch(self.kernels[kernel], grid, block, *args)

    def to_numpy(self, array):
        return np.asarray(array)


class CupyLauncher:
    """The kernels of `source` from `cubin` (compiled for this GPU), launched through CuPy's RawModule."""

    def __init__(self, source, cubin, block=256, max_grid=4096):
        import cupy  # optional: cupy

        self.cupy, self.xp = cupy, cupy
        self.source, self.block, self.max_grid = source, block, max_grid
        work = tempfile.mkdtemp(prefix="ortlab-cuda-")
        path = os.path.join(work, f"{source}.cubin")
        with open(path, "wb") as f:
            f.write(cubin)
        self.module = cupy.RawModule(path=path)
        self.text = kernels.source(source)
        self.label = "CUDA C++ compiled by NVRTC + ptxas, launched through CuPy"

    def __call__(self, kernel, grid, block, *args):
        cupy = self.cupy
        params = parse_params(self.text, kernel)
        if len(params) != len(args):
            raise OrtlabError(f"{kernel} takes {len(params)} arguments, got {len(args)}")
        device = [(cupy.asarray(a) if isinstance(a, np.ndarray) else a) if p.pointer else p.dtype(a)
                  for p, a in zip(params, args)]
        self.module.get_function(kernel)((int(grid),), (int(block),), tuple(device))
        cupy.cuda.Device().synchronize()
        for p, a, d in zip(params, args, device):
            if p.pointer and not p.const and isinstance(a, np.ndarray):
                np.copyto(a, cupy.asnumpy(d))

    def to_numpy(self, array):
        return array if isinstance(array, np.ndarray) else self.cupy.asnumpy(array)

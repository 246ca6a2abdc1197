"""Triton kernels for ORT's training ops, with numpy references and an OpTester.

`run(op_type, *inputs, domain="", **attributes)` executes a kernel on numpy inputs (Triton's
interpreter on CPU, compiled on a GPU: ortlab.env chooses); `op_test` compares it with ORT's
own kernel for the same op. Kernels register themselves with `@register_kernel`.

The op kernels live in ortlab.triton_kernels.ops (one module per op family; the numpy maths of every op is
ortlab.ops.reference); the tools stand apart: kernel_def (what a kernel declares), registry (KERNELS),
executor (launching and running one), op_tester, roofline, optimization. The GPU check is
ortlab.benchmarks.kernels.

Importing this package loads neither torch nor Triton (ortlab.ops.reference is plain
numpy): the names below are imported on first use, together with ortlab.env (which sets
TRITON_INTERPRET first) and ortlab's own kernels.
"""
import importlib

_HOMES = {"Arg": "kernel_def", "Kernel": "kernel_def", "KernelInputError": "kernel_def",
          "KERNELS": "registry", "KernelNotFound": "registry", "get_kernel": "registry",
          "register_kernel": "registry", "registered": "registry", "unregister_kernel": "registry",
          "count_launches": "executor", "launch": "executor", "run": "executor",
          "run_reference": "executor", "op_test": "op_tester"}

__all__ = sorted(_HOMES)


def __getattr__(name):
    """`ortlab.triton_kernels.run` and the other public names, imported from their modules on first use."""
    if name not in _HOMES:
        raise AttributeError(f"module 'ortlab.triton_kernels' has no attribute {name!r}")
    importlib.import_module(f"{__name__}.registry").load_builtin_kernels()
    for public, home in _HOMES.items():
        globals()[public] = getattr(importlib.import_module(f"{__name__}.{home}"), public)
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(_HOMES))

"""ortlab's op kernels: one module per op family, each with its Triton kernels and the Kernel
classes that launch them, registered with @register_kernel when the module is imported.

reference.py holds the numpy maths of every op (plain numpy, shared with onnx.reference through
ortlab.ops.contrib_ops) and rows.py the row layouts; neither imports torch or Triton, and
neither does this file. `load()` imports every module here; the kernel registry calls it on first
use, as ORT's CPU execution provider fills its kernel registry the first time it is asked for it
(onnxruntime/core/providers/cpu/cpu_execution_provider.cc, GetCpuKernelRegistry). A kernel in a
new module of this package is registered, tested and benched with no other edit.
"""
import importlib
import pkgutil


def load():
    """Import every module of this package (the op modules register their kernels)."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")

"""Launching Triton kernels, and running a registered kernel on numpy inputs.

Mirrors what onnxruntime/core/framework/sequential_executor.cc does around OpKernel::Compute
for one node: inputs checked against the kernel definition, placed on the kernel's device,
Compute called, outputs handed back. Under Triton's interpreter (no GPU) the tensors live on
the CPU; on a GPU they are copied to it and back.
"""
import contextlib
import types

from ortlab.env import kernel_device  # first: ortlab.env sets TRITON_INTERPRET before Triton loads

import numpy as np  # noqa: E402
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
import triton.language.standard  # noqa: E402
from triton.runtime.errors import InterpreterError  # noqa: E402
from triton.runtime.interpreter import InterpretedFunction  # noqa: E402

from ortlab.errors import OrtlabError  # noqa: E402
from ortlab.env import TRITON_INTERPRET, triton_mode  # noqa: E402
from ortlab.triton_kernels.registry import get_kernel  # noqa: E402

LAUNCHES = []


class TritonImportOrderError(OrtlabError):
    """Triton was imported before ortlab on a machine without a GPU: its own helpers are compiled-mode."""


def helpers_interpreted():
    """False when, under the interpreter, Triton's own @triton.jit helpers (tl.max, tl.sum, tl.softmax, in
    triton/language/standard.py) are compiled-mode functions. They are decorated once, when triton is first
    imported, and Triton reads TRITON_INTERPRET at that moment: imported before ortlab set it, they stay
    compiled-mode, and a kernel that calls one fails with Triton's "Cannot call @triton.jit'd outside of the
    scope of a kernel" (a kernel that calls none of them still runs)."""
    return not triton_mode().startswith("interpreter") or isinstance(triton.language.standard.max,
                                                                     InterpretedFunction)


def interpretable(kernel_fn):
    """`kernel_fn` ready for Triton 3.2's interpreter. Its launch tests every global of the kernel's module with
    `value in [tl, tl.core]`, and a numpy array there (a notebook holds some) makes that test raise numpy's "The
    truth value of an array ... is ambiguous". Under the interpreter, a kernel whose module holds such a value
    runs as a copy of itself whose globals leave out what that test cannot compare (a kernel cannot use them:
    Triton reads only constexprs and other kernels from its globals); any other kernel is returned as it is."""
    body = getattr(kernel_fn, "fn", None)
    if not triton_mode().startswith("interpreter") or not isinstance(body, types.FunctionType):
        return kernel_fn
    plain = {k: v for k, v in body.__globals__.items() if _comparable(v)}
    if len(plain) == len(body.__globals__):
        return kernel_fn
    copy = types.FunctionType(body.__code__, plain, body.__name__, body.__defaults__, body.__closure__)
    copy.__kwdefaults__, copy.__annotations__ = body.__kwdefaults__, dict(body.__annotations__)
    copy.__qualname__, copy.__module__, copy.__doc__ = body.__qualname__, body.__module__, body.__doc__
    return triton.jit(copy)


def _comparable(value):
    """Whether the interpreter's `value in [tl, tl.core]` gives a bool for `value`."""
    try:
        return isinstance(value in (tl, tl.core), bool)
    except Exception:  # a value whose == gives an array, or raises
        return False


def launch(kernel_fn, grid, *args, **meta):
    """Launch a @triton.jit kernel on `grid` programs and record it (name, grid)."""
    grid = tuple(int(g) for g in (grid if isinstance(grid, tuple) else (grid,)))
    LAUNCHES.append((kernel_fn.fn.__name__ if hasattr(kernel_fn, "fn") else str(kernel_fn), grid))
    try:
        interpretable(kernel_fn)[grid](*args, **meta)
    except InterpreterError as error:
        if helpers_interpreted() or "outside of the scope of a kernel" not in str(error):
            raise
        raise TritonImportOrderError(
            "triton was imported before ortlab (or before TRITON_INTERPRET=1 was set), so Triton's own "
            "helpers (tl.max, tl.sum, ...) were built for a GPU and cannot run in the interpreter on this "
            f"CPU. Restart the kernel and import ortlab before triton, or set {TRITON_INTERPRET}=1 in the "
            "environment before Python starts.") from None


@contextlib.contextmanager
def count_launches():
    """`with count_launches() as launches:` collects the (kernel name, grid) of each launch."""
    start = len(LAUNCHES)
    recorded = []
    try:
        yield recorded
    finally:
        recorded.extend(LAUNCHES[start:])
        del LAUNCHES[start:]


def block_size(n, at_least=16):
    """The power of two a block of `n` elements needs (tl.arange wants powers of two)."""
    return max(at_least, triton.next_power_of_2(int(n)))


def to_device(array):
    if array is None:
        return None
    return torch.from_numpy(np.ascontiguousarray(array)).to(kernel_device())


def to_numpy(tensor):
    return tensor.detach().cpu().numpy()


def bind(op_type, inputs, domain="", **attributes):
    """The kernel for an op with its attributes bound, and the inputs checked against its
    declaration (as numpy arrays, absent optional inputs as None): (kernel, arrays)."""
    kernel = get_kernel(op_type, domain)(**attributes)
    return kernel, kernel.validate([None if a is None else np.asarray(a) for a in inputs])


def run(op_type, *inputs, domain="", **attributes):
    """Execute ortlab's Triton kernel for an op on numpy inputs; returns a tuple of numpy arrays.

    Wrong input counts, dtypes, ranks or shapes raise KernelInputError (an OrtlabError)
    naming the op and the input. Absent optional inputs may be left off or passed as None.
    """
    kernel, arrays = bind(op_type, inputs, domain, **attributes)
    outputs = kernel.compute(*[to_device(a) for a in arrays])
    return tuple(to_numpy(o) for o in outputs)


def run_reference(op_type, *inputs, domain="", **attributes):
    """The kernel's numpy reference on the same inputs, after the same checks."""
    kernel, arrays = bind(op_type, inputs, domain, **attributes)
    return tuple(np.asarray(o) for o in kernel.reference(*arrays))

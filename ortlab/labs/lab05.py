"""Checks and helpers for lab05_kernel: write GeluGrad's maths in a Triton kernel, register the
kernel, and pass the OpTester against ORT's own GeluGrad.

The checks launch the learner's kernel on shapes chosen to catch the usual mistakes: an exact
multiple of the block, a 2-D input, lengths with a tail (the last program's block runs past the
end), and a tail longer than one block. A failure names the shape and, for a tail, says so.
"""
import triton

from ortlab.kernels import get_kernel, op_test, register_kernel
from ortlab.kernels.gelu import GeluGrad
from ortlab.kernels.launch import launch
from ortlab.kernels.op_tester import OpTestFailure
from ortlab.labs.checks import CheckFailed, check

MS = "com.microsoft"
BLOCK = 256
SHAPES = [(1024,), (3, 64), (1000,), (2, 333)]


def inputs_for(shape, seed=0):
    import numpy as np

    rng = np.random.default_rng(seed)
    return [rng.standard_normal(shape).astype(np.float32) * 3 for _ in range(2)]  # dY, X


def where_it_fails(shape):
    n = 1
    for d in shape:
        n *= d
    if n % BLOCK:
        return (f" ({n} elements is not a multiple of BLOCK={BLOCK}: the last program's "
                f"{n % BLOCK} valid lanes form a tail; are loads and stores masked with `mask`?)")
    return ""


def kernel_class_for(kernel_fn):
    """A GeluGrad kernel class whose compute launches `kernel_fn` (the scaffold's signature)."""
    class LabGeluGrad(GeluGrad):
        def compute(self, dy, x):
            import torch

            dx = torch.empty_like(x)
            launch(kernel_fn, triton.cdiv(x.numel(), BLOCK), dy, x, dx, x.numel(), BLOCK=BLOCK)
            return (dx,)

    return LabGeluGrad


def op_test_shapes():
    """op_test the registered GeluGrad on SHAPES; None, or why it failed."""
    for shape in SHAPES:
        try:
            op_test("GeluGrad", inputs_for(shape), domain=MS)
        except NotImplementedError:
            raise
        except Exception as error:  # Triton's interpreter wraps what the kernel raised
            unfinished = unwrap_not_implemented(error)
            if unfinished is not None:
                raise unfinished from None
            if not isinstance(error, OpTestFailure):
                raise
            failure = error
            detail = str(failure).splitlines()[1].strip()
            return f"for shape {shape}{where_it_fails(shape)}: {detail}"
    return None


def unwrap_not_implemented(error):
    """The NotImplementedError a lab stub raised inside a kernel, if that is what `error` is."""
    seen = error
    while seen is not None:
        if isinstance(seen, NotImplementedError):
            return seen
        seen = seen.__cause__ or seen.__context__
    if "NotImplementedError(" in str(error):
        return NotImplementedError(str(error).split("NotImplementedError(", 1)[1].strip("\"')"))
    return None


def with_kernel(kernel_cls, test):
    """Run test() with kernel_cls registered for GeluGrad, then put back what was there."""
    before = get_kernel("GeluGrad", MS)
    register_kernel(kernel_cls, override=True)
    try:
        return test()
    finally:
        register_kernel(before, override=True)


def check_gelu_grad(kernel_fn):
    """Exercise 'gelu_grad': kernel_fn(dy_ptr, x_ptr, dx_ptr, n, BLOCK) computes GeluGrad."""
    def test():
        if not hasattr(kernel_fn, "fn") and not hasattr(kernel_fn, "run"):
            raise CheckFailed("gelu_grad_kernel must be decorated with @triton.jit")
        return with_kernel(kernel_class_for(kernel_fn), op_test_shapes)

    check("gelu_grad", test)


def check_registered():
    """Exercise 'register': the kernel registered for com.microsoft::GeluGrad is the learner's
    class (not the built-in) and passes op_test on every shape."""
    def test():
        cls = get_kernel("GeluGrad", MS)
        if cls is GeluGrad:
            raise CheckFailed("com.microsoft::GeluGrad is still ortlab's built-in kernel: decorate "
                              "your class with @register_kernel(override=True)")
        if (cls.op_type, cls.domain) != ("GeluGrad", MS):
            raise CheckFailed(f"your class declares {cls.domain}::{cls.op_type}")
        return op_test_shapes()

    check("register", test)


def restore_builtin():
    """Put ortlab's own GeluGrad kernel back in the registry."""
    register_kernel(GeluGrad, override=True)
    return get_kernel("GeluGrad", MS)


def op_test_report(shape):
    """The op_test table for the registered GeluGrad on one shape, or why it could not run."""
    from ortlab.viz import Table

    try:
        return Table.from_dicts(op_test("GeluGrad", inputs_for(shape), domain=MS).summary())
    except Exception as error:
        unfinished = unwrap_not_implemented(error)
        return f"not run: {unfinished if unfinished is not None else str(error).splitlines()[0]}"

"""Checks and helpers for lab05_kernel: write GeluGrad's maths in a Triton kernel, register the
kernel, and pass the OpTester against ORT's own GeluGrad.

The checks launch the learner's kernel on shapes chosen to catch the usual mistakes: an exact
multiple of the block, a 2-D input, lengths with a tail (the last program's block runs past the
end), and a tail longer than one block. A failure names the shape and, for a tail, says so.

Under Triton's interpreter (CPU) a load or store past the end of a tensor reads or corrupts the
process's own memory (glibc then aborts: "double free or corruption"). `bounds_checked()` checks
every address a load or store touches against the tensors handed to the launch, before the access,
so such a kernel fails its check with a message instead of killing the kernel.

The learner's kernel runs here (probes `run_kernel`, `registered_facts`); its outputs are compared
with ORT's GeluGrad by the checks in ortlab.labs.judges.lab05.
"""
import contextlib
import os

import numpy as np
from ortlab import env  # noqa: F401 - before triton: it sets TRITON_INTERPRET (no GPU), which Triton reads once
import triton

from ortlab.errors import OrtlabError
from ortlab.onnx_defs import MS_DOMAIN as MS, op_key, op_name
from ortlab.triton_kernels import get_kernel, launch, op_test, register_kernel
from ortlab.triton_kernels.executor import to_device
from ortlab.triton_kernels.ops.gelu import GeluGrad
from ortlab.labs.checks import CheckFailed, describe, judge
from ortlab.labs.remote import learner, probe
from ortlab.viz import Table

BLOCK = 256
SHAPES = [(1024,), (3, 64), (1000,), (2, 333)]


def inputs_for(shape, seed=0):
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


class OutOfBounds(OrtlabError):
    """A kernel under Triton's interpreter loaded or stored outside the tensors it was given."""


class _Bounds:
    """The tensors of the launch being interpreted, and what the launches were (grid, BLOCK)."""

    def __init__(self):
        self.ranges = []    # (name, first byte, end byte, element size) of each tensor argument
        self.launches = []  # (grid, BLOCK or None) of each launch


def _extent(tensor):
    """(first byte, end byte) a tensor's elements occupy."""
    start = tensor.data_ptr()
    if tensor.numel() == 0:
        return start, start
    last = sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))
    return start, start + (last + 1) * tensor.element_size()


def _violation(bounds, addresses, item, verb):
    """None when every address lies in one tensor argument; else OutOfBounds saying where it went."""
    if addresses.size == 0 or not bounds.ranges:
        return None
    # The tensor this access is meant for: the one most of its lanes fall in (ties: the first lane's)
    first = int(addresses[0])
    inside = [(int(((addresses >= r[1]) & (addresses + item <= r[2])).sum()), r[1] <= first < r[2], r)
              for r in bounds.ranges]
    count, _, home = max(inside, key=lambda t: (t[0], t[1]))
    if count == 0:  # no lane in any tensor: blame the one just before the block
        before = [r for r in bounds.ranges if r[2] <= first]
        home = max(before, key=lambda r: r[2]) if before else min(bounds.ranges, key=lambda r: r[1])
    name, lo, hi, size = home
    outside = addresses[(addresses < lo) | (addresses + item > hi)]
    if outside.size == 0:
        return None
    n = (hi - lo) // size
    index = (outside.astype(np.int64) - lo) // size
    where = (f"elements {int(index.min())} to {int(index.max())}" if index.min() != index.max()
             else f"element {int(index.min())}")
    side = "past the end of" if index.min() >= n else "before the start of" if index.max() < 0 else "outside"
    from triton.runtime.interpreter import interpreter_builder  # heavy: triton

    program = getattr(interpreter_builder, "grid_idx", None)
    program = f"; in program {program[0]}" if program else ""
    if side == "past the end of" and int(index.min()) == n:  # the usual: the last block's tail
        advice = "mask the tail (offsets < n) in every tl.load and tl.store"
    else:
        advice = ("check the offsets added to the pointer: a program's block covers elements "
                  "pid * BLOCK + tl.arange(0, BLOCK), masked with offsets < n")
    return OutOfBounds(f"your kernel {verb} {side} the tensor {name} ({where}; it has {n}{program}): {advice}")


_ACTIVE = []


@contextlib.contextmanager
def bounds_checked():
    """Within the block, Triton's interpreter checks each load and store against the bounds of
    the launch's tensor arguments and raises OutOfBounds before touching memory outside them.
    Yields a _Bounds whose .launches lists (grid, BLOCK) of each launch. No effect on a GPU."""
    from triton.runtime import interpreter as ti  # heavy: triton

    bounds = _Bounds()
    if _ACTIVE:  # nested: the outer block is already checking
        yield _ACTIVE[-1]
        return
    originals = (ti.GridExecutor._init_args_hst, ti.InterpreterBuilder.create_masked_load,
                 ti.InterpreterBuilder.create_masked_store)
    init_args, masked_load, masked_store = originals

    def init_args_hst(self, args_dev, kwargs):
        args_hst, kwargs_hst = init_args(self, args_dev, kwargs)
        named = list(zip(self.arg_names, args_hst)) + list(kwargs_hst.items())
        bounds.ranges = [(name, *_extent(t), t.element_size()) for name, t in named if hasattr(t, "data_ptr")]
        grid = self.grid if isinstance(self.grid, tuple) else (self.grid,)
        bounds.launches.append((tuple(grid), kwargs.get("BLOCK")))
        return args_hst, kwargs_hst

    def check(ptrs, mask, verb):
        item = np.dtype(ti._get_np_dtype(ptrs.get_element_ty())).itemsize
        addresses = np.asarray(ptrs.data)
        active = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
        problem = _violation(bounds, addresses[active].astype(np.uint64).astype(np.int64), item, verb)
        if problem is not None:
            raise problem

    def load(self, ptrs, mask, other, *rest):
        check(ptrs, mask, "read")
        return masked_load(self, ptrs, mask, other, *rest)

    def store(self, ptrs, value, mask, *rest):
        check(ptrs, mask, "wrote")
        return masked_store(self, ptrs, value, mask, *rest)

    ti.GridExecutor._init_args_hst = init_args_hst
    ti.InterpreterBuilder.create_masked_load = load
    ti.InterpreterBuilder.create_masked_store = store
    _ACTIVE.append(bounds)
    try:
        yield bounds
    finally:
        _ACTIVE.pop()
        (ti.GridExecutor._init_args_hst, ti.InterpreterBuilder.create_masked_load,
         ti.InterpreterBuilder.create_masked_store) = originals


def in_chain(error, cls):
    """The first exception of type `cls` in `error`'s chain (causes and contexts), or None."""
    seen = error
    while seen is not None:
        if isinstance(seen, cls):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def out_of_bounds(error):
    """The OutOfBounds a checked launch raised, if that is what `error` is (or wraps)."""
    return in_chain(error, OutOfBounds)


def kernel_class_for(kernel_fn):
    """A GeluGrad kernel class whose compute launches `kernel_fn` (the scaffold's signature)."""
    class LabGeluGrad(GeluGrad):
        def compute(self, dy, x):
            import torch  # heavy: torch

            dx = torch.empty_like(x)
            launch(kernel_fn, triton.cdiv(x.numel(), BLOCK), dy, x, dx, x.numel(), BLOCK=BLOCK)
            return (dx,)

    return LabGeluGrad


def kernel_problem(error, shape):
    """What a failed launch tells the learner: a stub's NotImplementedError is raised again (the
    exercise is not done), an out-of-bounds access becomes a message, anything else None."""
    unfinished = unwrap_not_implemented(error)
    if unfinished is not None:
        raise unfinished from None
    outside = out_of_bounds(error)
    return f"for shape {shape}: {outside}" if outside is not None else None


def unwrap_not_implemented(error):
    """The NotImplementedError a lab stub raised inside a kernel, if that is what `error` is."""
    found = in_chain(error, NotImplementedError)
    if found is not None:
        return found
    if "NotImplementedError(" in str(error):
        return NotImplementedError(str(error).split("NotImplementedError(", 1)[1].strip("\"')"))
    return None


@probe
def kernel_facts(kernel_fn):
    """Whether the learner's kernel is a Triton kernel (decorated with @triton.jit)."""
    return {"jit": hasattr(kernel_fn, "fn") or hasattr(kernel_fn, "run")}


@probe
def run_kernel(kernel_fn, shape):
    """What GeluGrad's compute returns on inputs_for(shape), loads and stores bounds-checked: with the
    learner's kernel launched by the scaffold's class, or (kernel_fn None) with the registered class.
    A str says where the kernel went out of bounds."""
    cls = kernel_class_for(kernel_fn) if kernel_fn is not None else get_kernel("GeluGrad", MS)
    shape = tuple(shape)
    dy, x = (to_device(a) for a in inputs_for(shape))
    try:
        with bounds_checked():
            return cls().compute(dy, x)
    except NotImplementedError:
        raise
    except Exception as error:  # Triton's interpreter wraps what the kernel raised
        outside = kernel_problem(error, shape)
        if outside is not None:
            return outside
        raise


@probe
def registered_facts():
    """The kernel class registered for com.microsoft:GeluGrad: whether it is still the built-in, the op
    it declares, and what is wrong with its compute (compute_mistake), if anything."""
    cls = get_kernel("GeluGrad", MS)
    facts = {"builtin": cls is GeluGrad, "declares": op_name(cls.op_type, cls.domain),
             "is_gelu_grad": op_key(cls.op_type, cls.domain) == ("GeluGrad", MS), "mistake": None}
    if facts["builtin"] or not facts["is_gelu_grad"]:
        return facts
    try:
        facts["mistake"] = compute_mistake(cls)
    except CheckFailed as exc:
        facts["mistake"] = str(exc)
    return facts


def check_gelu_grad(kernel_fn):
    """Exercise 'gelu_grad': kernel_fn(dy_ptr, x_ptr, dx_ptr, n, BLOCK) computes GeluGrad."""
    judge("gelu_grad", "lab05.gelu_grad", learner(kernel_fn))


def check_registered():
    """Exercise 'register': the kernel registered for com.microsoft:GeluGrad is the learner's
    class (not the built-in) and passes op_test on every shape."""
    judge("register", "lab05.register")


def compute_mistake(cls, shape=(1000,)):
    """Run cls().compute once on a shape with a tail; None, or what is wrong with what it returns
    or with the grid it launches."""
    import torch  # heavy: torch

    dy, x = (to_device(a) for a in inputs_for(shape))
    n = x.numel()
    try:
        with bounds_checked() as bounds:
            outputs = cls().compute(dy, x)
    except NotImplementedError:
        raise
    except Exception as error:
        outside = kernel_problem(error, shape)
        if outside is not None:
            return outside
        raise CheckFailed(f"compute(dy, x) raised {type(error).__name__}: "
                          f"{(str(error).strip().splitlines() or [''])[0][:160]}") from None
    if isinstance(outputs, torch.Tensor):
        return (f"compute returned a bare tensor ({describe(outputs)}); return a tuple of outputs, "
                "one per declared output: `return (dx,)`")
    if not isinstance(outputs, (tuple, list)) or len(outputs) != 1 or not isinstance(outputs[0], torch.Tensor):
        return f"compute returned {describe(outputs)}; return a tuple holding one tensor: `return (dx,)`"
    if not interpreted():  # compiled launches bypass the interpreter: op_test's comparison decides
        return None
    if not bounds.launches:
        return "compute launched no kernel: call launch(gelu_grad_kernel, grid, dy, x, dx, n, BLOCK=BLOCK)"
    covered = 0
    for grid, block in bounds.launches:
        programs = 1
        for g in grid:
            programs *= int(g)
        covered = max(covered, programs * int(block or BLOCK))
    if covered < n:
        programs, block = covered // int(bounds.launches[-1][1] or BLOCK), bounds.launches[-1][1] or BLOCK
        return (f"for shape {shape}: the grid is too small: {programs} program(s) of BLOCK={block} cover "
                f"{covered} of the {n} elements, so the tail is never computed; launch "
                f"triton.cdiv(n, BLOCK) = {triton.cdiv(n, block)} programs")
    return None


def interpreted():
    """True when Triton's interpreter runs the kernels (no GPU): only then are launches and bounds seen."""
    return os.environ.get("TRITON_INTERPRET") == "1"


def restore_builtin():
    """Put ortlab's own GeluGrad kernel back in the registry."""
    register_kernel(GeluGrad, override=True)
    return get_kernel("GeluGrad", MS)


def op_test_report(shape):
    """The op_test table for the registered GeluGrad on one shape, or why it could not run."""
    try:
        with bounds_checked():
            return Table.from_dicts(op_test("GeluGrad", inputs_for(shape), domain=MS).summary())
    except Exception as error:
        found = unwrap_not_implemented(error) or out_of_bounds(error)
        return f"not run: {found if found is not None else str(error).splitlines()[0]}"

"""Exercises of the walkthrough L1_06_cuda_programming: a row-wise Triton kernel (softmax, one program per row)
and a scatter-add with atomics (GatherGrad, one program per index).

The learner's kernel runs here, in the learner's process, under Triton's interpreter when there is no GPU, with
every load, store and atomic add checked against the launch's tensors (lab05's bounds_checked, plus the atomic
adds, which it does not watch); its output comes back as data. The checks live in ortlab.labs.judges.l1_06 and
compare with ORT 1.19.2's own CPU kernels (Softmax-13, com.microsoft GatherGrad: softmax.cc,
orttraining/orttraining/training_ops/cpu/tensor/gather_grad.cc); the reference answers are in
solutions/walkthroughs/L1_06_cuda_programming.py, outside the package.
"""
import contextlib

import numpy as np
from ortlab import env  # noqa: F401 - before triton: it sets TRITON_INTERPRET (no GPU), which Triton reads once
import triton

from ortlab.triton_kernels import launch
from ortlab.triton_kernels.executor import interpretable, to_device, to_numpy
from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.lab05 import OutOfBounds, bounds_checked, interpreted, kernel_problem
from ortlab.labs.remote import learner, probe

SOFTMAX_SHAPES = ((4, 37), (3, 128), (2, 1000), (5, 1))
GATHER_CASES = (  # (rows of dX, columns, indices): dY has one row of `columns` per index
    (6, 5, [[1, 4, 1], [1, 0, 5]]),
    (10, 37, [7, 2, 7, 9, 0, 7, 2]),
    (4, 16, [3, 3, 3, 3, 0]),
)


def block_for(n_cols):
    """The block a row of `n_cols` gets: the next power of two, at least 16 (tl.arange wants powers of two)."""
    return max(16, triton.next_power_of_2(int(n_cols)))


# --- the data the checks use ----------------------------------------------------------------------------------

def softmax_input(shape, seed=0):
    """x (rows, cols) float32: row 0 near +100 (exp overflows float32 past 88.7), row 1 near -120 (exp underflows
    to 0), the other rows near 0."""
    rows, cols = shape
    x = np.random.default_rng(seed).standard_normal(shape).astype(np.float32) * 4
    shifts = np.zeros(rows, np.float32)
    shifts[:2] = (100.0, -120.0)[:rows]
    return x + shifts[:, None]


def softmax_cases():
    """What the check of 'softmax_rows' launches: one row per shape (not the values)."""
    rows = []
    for shape in SOFTMAX_SHAPES:
        x = softmax_input(shape)
        block = block_for(shape[1])
        rows.append({"x shape": str(shape), "grid (programs)": shape[0], "BLOCK": block,
                     "masked lanes per program": block - shape[1],
                     "row 0 values": f"{x[0].min():.0f} .. {x[0].max():.0f}",
                     "row 1 values": f"{x[1].min():.0f} .. {x[1].max():.0f}" if shape[0] > 1 else "-"})
    return rows


def gather_inputs(case, seed=0):
    """(dX's shape as an int64 array, indices int64, dY float32) of one GATHER_CASES entry."""
    rows, cols, indices = case
    indices = np.asarray(indices, np.int64)
    dy = np.random.default_rng(seed).standard_normal(indices.shape + (cols,)).astype(np.float32)
    return np.array([rows, cols], np.int64), indices, dy


def gather_cases():
    """What the check of 'gather_grad' launches: one row per case."""
    out = []
    for case in GATHER_CASES:
        shape, indices, dy = gather_inputs(case)
        counts = np.bincount(indices.reshape(-1), minlength=int(shape[0]))
        repeated = {int(i): int(c) for i, c in enumerate(counts) if c > 1}
        out.append({"dX shape": str(tuple(int(d) for d in shape)), "indices": str(indices.tolist()),
                    "dY shape": str(dy.shape), "grid (programs)": indices.size, "BLOCK": block_for(case[1]),
                    "rows hit more than once": ", ".join(f"{i} ({c}x)" for i, c in repeated.items()) or "-"})
    return out


# --- running the learner's kernel ------------------------------------------------------------------------------

def launchable(fn):
    """The learner's @triton.jit kernel, ready for Triton's interpreter (triton_kernels.executor.interpretable)."""
    if not (hasattr(fn, "fn") or hasattr(fn, "run")):
        raise CheckFailed(f"give the kernel itself, a function decorated with @triton.jit, not {type(fn).__name__}")
    return interpretable(fn)


def _tensor_at(ranges, addresses):
    """The name of the launch's tensor most of `addresses` fall in, or None."""
    best, count = None, 0
    for name, lo, hi, _ in ranges:
        inside = int(((addresses >= lo) & (addresses < hi)).sum())
        if inside > count:
            best, count = name, inside
    return best


@contextlib.contextmanager
def watched():
    """lab05's bounds_checked, plus the atomic adds checked the same way (an add outside every tensor raises
    lab05's OutOfBounds instead of corrupting memory), and what the kernel moved: yields {"reads": the names of
    the tensors it loaded from, "loaded" / "stored": {name: elements loaded / stored, over all programs},
    "order": the tensor arguments' names in launch order}. Under Triton's interpreter only (no effect on a GPU)."""
    seen = {"reads": set(), "loaded": {}, "stored": {}, "order": []}
    if not interpreted():
        yield seen
        return
    from triton.runtime import interpreter as ti  # heavy: triton

    with bounds_checked() as bounds:
        load, store = ti.InterpreterBuilder.create_masked_load, ti.InterpreterBuilder.create_masked_store
        rmw = ti.InterpreterBuilder.create_atomic_rmw

        def active(ptrs, mask):
            addresses = np.asarray(ptrs.data).astype(np.uint64).astype(np.int64)
            on = np.broadcast_to(np.asarray(mask.data, dtype=bool), addresses.shape)
            return addresses[on]

        def count(kind, ptrs, mask):
            seen["order"] = [r[0] for r in bounds.ranges]
            addresses = active(ptrs, mask)
            name = _tensor_at(bounds.ranges, addresses)
            if name:
                seen[kind][name] = seen[kind].get(name, 0) + int(addresses.size)
            return name

        def masked_load(self, ptrs, mask, other, *rest):
            result = load(self, ptrs, mask, other, *rest)  # bounds-checked first
            name = count("loaded", ptrs, mask)
            if name:
                seen["reads"].add(name)
            return result

        def masked_store(self, ptrs, value, mask, *rest):
            result = store(self, ptrs, value, mask, *rest)  # bounds-checked first
            count("stored", ptrs, mask)
            return result

        def atomic_rmw(self, op, ptr, val, mask, *rest):
            addresses = active(ptr, mask)
            if addresses.size and bounds.ranges:
                item = np.dtype(ti._get_np_dtype(ptr.get_element_ty())).itemsize
                home = _tensor_at(bounds.ranges, addresses)
                name, lo, hi, size = next(r for r in bounds.ranges if r[0] == home) if home else bounds.ranges[-1]
                outside = addresses[(addresses < lo) | (addresses + item > hi)]
                if outside.size:
                    index = (outside - lo) // size
                    program = (getattr(ti.interpreter_builder, "grid_idx", None) or (None,))[0]
                    raise OutOfBounds(f"your kernel added atomically outside the tensor {name} (elements "
                                      f"{int(index.min())} to {int(index.max())}; it has {(hi - lo) // size}; "
                                      f"in program {program})")
            return rmw(self, op, ptr, val, mask, *rest)

        ti.InterpreterBuilder.create_masked_load = masked_load
        ti.InterpreterBuilder.create_masked_store = masked_store
        ti.InterpreterBuilder.create_atomic_rmw = atomic_rmw
        try:
            yield seen
        finally:
            (ti.InterpreterBuilder.create_masked_load, ti.InterpreterBuilder.create_masked_store,
             ti.InterpreterBuilder.create_atomic_rmw) = load, store, rmw


def run_watched(fn, grid, args, shape, block):
    """Launch the learner's kernel on `grid` programs (its outputs are written into `args`): what watched() saw
    ({"reads", "loaded", "stored", "order"}), or a str saying where it went out of bounds. A stub's
    NotImplementedError is raised again (not done)."""
    try:
        with watched() as seen, np.errstate(all="ignore"):  # the kernel's own inf and NaN are the check's to name
            launch(fn, grid, *args, BLOCK=block)
    except NotImplementedError:
        raise
    except Exception as error:  # Triton's interpreter wraps what the kernel raised
        outside = kernel_problem(error, shape)
        if outside is not None:
            return outside
        raise
    return seen


@probe
def run_softmax(fn, shape):
    """The learner's kernel on softmax_input(shape), one program per row, BLOCK = block_for(cols): y (NaN where
    no program wrote), or a str saying where it went out of bounds."""
    import torch  # heavy: torch

    shape = tuple(int(d) for d in shape)
    x = to_device(softmax_input(shape))
    y = torch.full(shape, float("nan"), dtype=torch.float32, device=x.device)
    outcome = run_watched(launchable(fn), shape[0], (x, y, shape[1]), shape, block_for(shape[1]))
    return outcome if isinstance(outcome, str) else to_numpy(y)


@probe
def run_gather_grad(fn, case_index):
    """The learner's kernel on GATHER_CASES[case_index], one program per index, into dX of zeros:
    {"dx": dX, "reads": which of "indices", "dy", "dx" it loaded from}, or a str saying where it went out of
    bounds."""
    import torch  # heavy: torch

    case = GATHER_CASES[int(case_index)]
    shape, indices, dy = gather_inputs(case)
    dx = torch.zeros(tuple(int(d) for d in shape), dtype=torch.float32, device=to_device(dy).device)
    args = (to_device(indices.reshape(-1)), to_device(dy.reshape(-1, case[1])), dx, case[1])
    outcome = run_watched(launchable(fn), indices.size, args, tuple(shape), block_for(case[1]))
    if isinstance(outcome, str):
        return outcome
    return {"dx": to_numpy(dx), "reads": canonical(outcome, ("indices", "dy", "dx"))["reads"]}


def canonical(seen, names):
    """What watched() saw, with the kernel's own parameter names replaced by `names` (the tensor arguments in
    launch order): {"reads": [names], "loaded": {name: elements}, "stored": {name: elements}}."""
    rename = dict(zip(seen["order"], names))
    return {"reads": sorted(rename.get(n, n) for n in seen["reads"]),
            "loaded": {rename.get(n, n): c for n, c in seen["loaded"].items()},
            "stored": {rename.get(n, n): c for n, c in seen["stored"].items()}}


def check_softmax_rows(kernel_fn):
    """Exercise 'softmax_rows': kernel_fn(x_ptr, y_ptr, n_cols, BLOCK) writes softmax of each row (one program per
    row), checked against ORT's Softmax on SOFTMAX_SHAPES."""
    judge("softmax_rows", "l1_06.softmax_rows", learner(kernel_fn))


def check_gather_grad(kernel_fn):
    """Exercise 'gather_grad': kernel_fn(indices_ptr, dy_ptr, dx_ptr, n_cols, BLOCK) adds dY's row p into dX's row
    indices[p] (one program per index), checked against ORT's GatherGrad on GATHER_CASES."""
    judge("gather_grad", "l1_06.gather_grad", learner(kernel_fn))

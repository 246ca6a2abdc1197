"""The checks of L1_06's exercises (run where the learner's code cannot reach them).

The learner's Triton kernels run in the learner's process (ortlab.labs.l1_06: bounds-checked under Triton's
interpreter) and send back their output as data. Here it is compared with ORT 1.19.2's own CPU kernels, run as
one-node models (ortlab.session.run_node): Softmax-13 over the last axis (onnxruntime/core/providers/cpu/math/
softmax.cc) and com.microsoft GatherGrad (orttraining/orttraining/training_ops/cpu/tensor/gather_grad.cc). Each
usual mistake is recognised by what it does to the numbers: a masked lane loaded as 0 adds exp(0 - max) to each
row's sum; exp without the row max overflows or underflows float32; a plain store keeps one of several rows
that share an index; a read of dX is a read-modify-write, a race on a GPU even where the interpreter (which runs
one program at a time) gets the sum right.
"""
import numpy as np

from ortlab.labs.checks import CheckFailed, compare
from ortlab.labs.l1_06 import (GATHER_CASES, SOFTMAX_SHAPES, block_for, gather_inputs, run_gather_grad, run_softmax,
                               softmax_input)
from ortlab.session import run_node

MS = "com.microsoft"
TOL = {"rtol": 1e-5, "atol": 1e-6}


def ort_softmax(x):
    """ORT's Softmax (opset 13) over the last axis."""
    return run_node("Softmax", [x], {"axis": -1}, opset=13)[0]


def ort_gather_grad(shape, indices, dy):
    """ORT's GatherGrad (axis 0): dY's rows added into zeros of `shape` at `indices`."""
    return run_node("GatherGrad", [shape, indices, dy], domain=MS)[0]


def _without_advice(text):
    """An out-of-bounds report without lab05's advice (written for element-wise kernels)."""
    return text.split("): ", 1)[0] + ")" if "): " in text else text


def _masked_as_zero(x, block):
    """Softmax as a kernel computes it that loads the masked lanes as 0 and sums them (float32)."""
    pad = block - x.shape[1]
    m = np.maximum(x.max(axis=1, keepdims=True), 0.0 if pad else -np.inf)
    e = np.exp(x - m)
    return e / (e.sum(axis=1, keepdims=True) + pad * np.exp(-m))


def _without_max(x):
    """Softmax computed as exp(x) / sum exp(x) in float32, without the row max."""
    with np.errstate(all="ignore"):
        e = np.exp(x)
        return e / e.sum(axis=1, keepdims=True)


def _not_finite(label, x, y, block):
    """Why y holds inf or NaN: exp without the row max, a max taken over masked lanes loaded as 0, or elements no
    program wrote."""
    rows = sorted({int(r) for r in np.argwhere(~np.isfinite(y))[:, 0]})
    r = rows[0]
    values = f"values {x[r].min():.0f} .. {x[r].max():.0f}"
    if block > x.shape[1] and 0 not in rows and (x[r] < -103).all():
        return (f"{label}: row {r} ({values}) holds NaN: its max came out as 0, from the masked lanes (loaded as "
                "`other`, 0.0 here), so every exp(x - 0) underflows to 0 and the row's sum is 0. Load the masked "
                "lanes as -inf (other=-float('inf')): then they are never the max, and add exp(-inf) = 0")
    if all(not np.isfinite(_without_max(x)[k]).all() for k in rows):
        return (f"{label}: row {r} ({values}) holds {'inf or NaN' if np.isinf(y[r]).any() else 'NaN'}: exp "
                "overflows float32 above 88.7 and underflows to 0 below -103, so a row far from 0 gives inf / inf "
                "or 0 / 0. Subtract the row's max first: softmax(x) = exp(x - max x) / sum exp(x - max x)")
    r, c = (int(i) for i in np.argwhere(~np.isfinite(y))[0])
    return (f"{label}: y[{r}, {c}] was never written (it still holds the NaN it was filled with): program "
            "`row = tl.program_id(0)` writes row `row`, every lane with cols < n_cols")


def softmax_rows(remote, fn):
    for shape in SOFTMAX_SHAPES:
        block = block_for(shape[1])
        label = f"for x of shape {shape} (BLOCK={block}, {block - shape[1]} masked lane(s) per program)"
        y = remote.call(run_softmax, fn, list(shape))
        if isinstance(y, str):
            where = _without_advice(y.split(": ", 1)[-1])
            if " read " in where:
                advice = ("program `row` reads x_ptr + row * n_cols + cols with cols = tl.arange(0, BLOCK), masked "
                          "with cols < n_cols: BLOCK is the block's padded width, not the row's length")
            else:
                advice = ("mask the store as the load (mask = cols < n_cols): lanes past the row's end belong to the "
                          "next row, or lie past the end of y; and start row `row` at y_ptr + row * n_cols")
            raise CheckFailed(f"{label}: {where}: {advice}")
        if not isinstance(y, np.ndarray) or y.shape != shape:
            raise CheckFailed(f"{label}: the kernel's output is not y of shape {shape}")
        x = softmax_input(shape)
        truth = ort_softmax(x)
        if not np.isfinite(y).all():
            raise CheckFailed(_not_finite(label, x, y, block))
        if compare(y, truth, what="y", **TOL) is None:
            continue
        if block > shape[1] and compare(y, _masked_as_zero(x, block), rtol=1e-4, atol=1e-6) is None:
            raise CheckFailed(f"{label}: each row's sum also counts the {block - shape[1]} masked lanes: a masked "
                              "load gives `other` (0.0 here) in the lanes past the row, and exp(0 - max) is not 0. "
                              "Load them as -inf (other=-float('inf')), so they add exp(-inf) = 0 and cannot be the "
                              "max")
        raise CheckFailed(f"{label}, compared with ORT's Softmax: {compare(y, truth, what='y', **TOL)}")
    return None


def _last_write_wins(shape, indices, dy):
    dx = np.zeros(tuple(int(d) for d in shape), np.float32)
    for p, row in enumerate(indices.reshape(-1)):
        dx[row] = dy.reshape(indices.size, -1)[p]
    return dx


def _row_p_to_row_p(shape, indices, dy):
    dx = np.zeros(tuple(int(d) for d in shape), np.float32)
    flat = dy.reshape(indices.size, -1)
    for p in range(min(indices.size, dx.shape[0])):
        dx[p] += flat[p]
    return dx


def gather_grad(remote, fn):
    for k, case in enumerate(GATHER_CASES):
        shape, indices, dy = gather_inputs(case)
        block = block_for(case[1])
        label = (f"for indices {indices.tolist()} into dX of shape {tuple(int(d) for d in shape)} "
                 f"(BLOCK={block})")
        got = remote.call(run_gather_grad, fn, k)
        if isinstance(got, str):
            where = _without_advice(got.split(": ", 1)[-1])
            raise CheckFailed(f"{label}: {where}: program p reads dY's row p (dy_ptr + p * n_cols + cols) and adds "
                              "into dX's row indices[p] (dx_ptr + indices[p] * n_cols + cols); mask every load and "
                              "add with cols < n_cols")
        if not isinstance(got, dict) or not isinstance(got.get("dx"), np.ndarray):
            raise CheckFailed(f"{label}: the kernel's output is not dX")
        dx, truth = got["dx"], ort_gather_grad(shape, indices, dy)
        reason = compare(dx, truth, what="dX", **TOL)
        if reason is None:
            if "dx" in got.get("reads", []):
                raise CheckFailed(f"{label}: your kernel reads dX (a tl.load from dx_ptr) and writes the sum back: "
                                  "right here, where the interpreter runs one program at a time, but on a GPU two "
                                  "programs with the same index read the same old row, and one add is lost (a "
                                  "race). Add with tl.atomic_add(dx_ptr + ..., dy, mask=...), which reads, adds and "
                                  "writes as one step")
            continue
        repeated = [int(i) for i in np.unique(indices) if (indices == i).sum() > 1]
        if repeated and compare(dx, _last_write_wins(shape, indices, dy), **TOL) is None:
            i = repeated[0]
            raise CheckFailed(f"{label}: index {i} appears {int((indices == i).sum())} times, and dX's row {i} holds "
                              "only the last of those dY rows, not their sum: several programs write that row, so "
                              "each must add into it atomically (tl.atomic_add), not store")
        if compare(dx, _row_p_to_row_p(shape, indices, dy), **TOL) is None:
            raise CheckFailed(f"{label}: dY's row p went to dX's row p; it belongs in row indices[p]: load the "
                              "index first (tl.load(indices_ptr + p))")
        raise CheckFailed(f"{label}, compared with ORT's GatherGrad: {reason}")
    return None

"""The checks of L3_01's exercises (run where the learner's code cannot reach them).

'skip_layer_norm': the learner's Triton kernel ran in the learner's process under Triton's interpreter (ortlab.labs
.l3_01); its y is compared here with ORT 1.19.2's com.microsoft SkipLayerNormalization (onnxruntime/contrib_ops/
cpu/skip_layer_norm.cc, the op ORT's SkipLayerNormFusion makes of the residual Add and LayerNormalization), and
the elements it loaded and stored with what a fused kernel moves: x and skip read once, y written once. Each usual
mistake is recognised by its numbers: the masked lanes counted in the variance, a mean or variance divided by
BLOCK, the unbiased variance.

'block_sum': the learner's __device__ function is compiled with ROW_STATS (NVRTC + ptxas for sm_80 and sm_90),
run on the CPU runner in a process of its own (ortlab.labs.cpu_runner, through lab10's judge) with the threads
first to last and last to first, and every thread's result compared with ORT's ReduceSum and ReduceSumSquare of
its row; a total that only lane 0 holds (a __shfl_down_sync tree) and a warp's sum where the block's is due (the
cross-warp step missing) are named.
"""
import numpy as np

from ortlab.labs import cpu_runner
from ortlab.labs.checks import CheckFailed, compare
from ortlab.labs.l1_06 import block_for
from ortlab.labs.l3_01 import (EPSILON, HIDDEN_STATS, ROW_STATS, SEEN_STATS, SKIP_SHAPES, run_skip_layer_norm,
                               skip_inputs, stats_input, with_row_stats)

MS = "com.microsoft"
TOL = {"rtol": 1e-4, "atol": 1e-5}


# --- 'skip_layer_norm' -----------------------------------------------------------------------------------------

def ort_skip_layer_norm(x, skip, gamma, beta):
    """ORT's SkipLayerNormalization: LayerNorm(x + skip) * gamma + beta over the last axis (its output 0)."""
    from ortlab.session import run_node  # heavy: onnxruntime (not loaded before the notebook's later sections)

    return run_node("SkipLayerNormalization", [x, skip, gamma, beta], {"epsilon": EPSILON}, domain=MS)[0]


def _normalized(s, gamma, beta, mean, var):
    return ((s - mean) / np.sqrt(var + EPSILON) * gamma + beta).astype(np.float32)


def _mistake(y, inputs, block):
    """The name of the usual mistake whose numbers y has, or None."""
    x, skip, gamma, beta = (a.astype(np.float64) for a in inputs)
    s, n = x + skip, x.shape[1]
    mean = s.mean(axis=1, keepdims=True)
    centered = ((s - mean) ** 2).sum(axis=1, keepdims=True)
    by_block = s.sum(axis=1, keepdims=True) / block
    models = {"masked": _normalized(s, gamma, beta, mean, (centered + (block - n) * mean ** 2) / n),
              "block": _normalized(s, gamma, beta, by_block, ((s - by_block) ** 2).sum(axis=1, keepdims=True) / block),
              "unbiased": _normalized(s, gamma, beta, mean, centered / (n - 1)),
              "no skip": _normalized(x, gamma, beta, x.mean(axis=1, keepdims=True), x.var(axis=1, keepdims=True))}
    for name, model in models.items():
        if (name not in ("masked", "block") or block > n) and compare(y, model, **TOL) is None:
            return name
    return None


MISTAKES = {
    "masked": "the variance counts the {pad} masked lanes: a masked load gives `other` (0.0) there, so s - mean is "
              "-mean in those lanes and adds mean^2 to the sum of squares. Center only the row's lanes: "
              "tl.where(mask, s - mean, 0.0)",
    "block": "the mean and the variance are divided by BLOCK ({block}), not by the row's length n_cols ({n}): the "
             "masked lanes are no elements of the row",
    "unbiased": "the variance is divided by n_cols - 1: LayerNorm (and SkipLayerNormalization) normalises with the "
                "biased variance, sum((s - mean)^2) / n_cols",
    "no skip": "y is the LayerNorm of x alone: the kernel normalises s = x + skip (the residual Add it fuses)",
}


def skip_layer_norm(remote, fn):
    for shape in SKIP_SHAPES:
        rows, cols = shape
        block = block_for(cols)
        label = f"for x and skip of shape {shape} (BLOCK={block}, {block - cols} masked lane(s) per program)"
        got = remote.call(run_skip_layer_norm, fn, list(shape))
        if isinstance(got, str):
            where = got.split(": ", 1)[-1]
            where = where.split("): ", 1)[0] + ")" if "): " in where else where
            raise CheckFailed(f"{label}: {where}: program `row` reads and writes row * n_cols + cols for cols = "
                              "tl.arange(0, BLOCK) masked with cols < n_cols, and gamma and beta at cols (one per "
                              "column, shared by every row), every load and store masked")
        y = got.get("y") if isinstance(got, dict) else None
        if not isinstance(y, np.ndarray) or y.shape != shape:
            raise CheckFailed(f"{label}: the kernel's output is not y of shape {shape}")
        if np.isnan(y).any():
            r, c = (int(i) for i in np.argwhere(np.isnan(y))[0])
            raise CheckFailed(f"{label}: y[{r}, {c}] is NaN (never written, or a 0 / 0): program `row` writes "
                              "every lane of row `row` with cols < n_cols")
        inputs = skip_inputs(shape)
        truth = ort_skip_layer_norm(*inputs)
        reason = compare(y, truth, what="y", **TOL)
        if reason is not None:
            found = _mistake(y, inputs, block)
            if found:
                raise CheckFailed(f"{label}: {MISTAKES[found].format(pad=block - cols, block=block, n=cols)}")
            raise CheckFailed(f"{label}, compared with ORT's SkipLayerNormalization: {reason}. y = (s - mean) / "
                              "sqrt(var + eps) * gamma + beta, with s = x + skip, over the row's n_cols elements")
        traffic = _traffic(got.get("loaded", {}), got.get("stored", {}), rows * cols)
        if traffic:
            raise CheckFailed(f"{label}: y is right, but {traffic}")
    return None


def _traffic(loaded, stored, n):
    """What a kernel moved beyond a fused one (x and skip read once, y written once), or None. Empty counts (a GPU,
    no interpreter to watch) say nothing."""
    if not loaded and not stored:
        return None
    for name in ("x", "skip"):
        if loaded.get(name, 0) > n:
            return (f"your kernel read {name} {loaded[name] / n:g} times: a fused kernel keeps the row of s = x + skip "
                    "in registers from its one load to the store of y. Each extra pass over memory costs what the "
                    "fusion saves")
    if loaded.get("y", 0) or stored.get("y", 0) > n:
        return (f"your kernel stored {stored.get('y', 0) / n:g} row(s) of y per row and loaded "
                f"{loaded.get('y', 0) / n:g} back: s went to memory and back, the traffic of the unfused Add then "
                "LayerNorm. Keep s in registers and store y once")
    return None


# --- 'block_sum' -----------------------------------------------------------------------------------------------

def ort_row_stats(x):
    """(ORT's ReduceSum, ORT's ReduceSumSquare) of each row (opset 13 and 13: axes as an input for ReduceSum, an
    attribute for ReduceSumSquare)."""
    from ortlab.session import run_node  # heavy: onnxruntime, as above

    sums = run_node("ReduceSum", [x, np.array([1], np.int64)], {"keepdims": 0}, opset=13)[0]
    squares = run_node("ReduceSumSquare", [x], {"axes": [1], "keepdims": 0}, opset=13)[0]
    return sums, squares


def _warp_sums(x, block):
    """[row, warp]: the sum of the elements the threads of each warp added (thread t adds columns t, t + block...)."""
    rows, cols = x.shape
    warp_of = (np.arange(cols) % block) // 32
    return np.stack([np.bincount(warp_of, weights=x[r].astype(np.float64), minlength=block // 32) for r in range(rows)])


def _wrong(got, want, x, block, label):
    """Why every thread did not get its row's total: the first call's results (got: rows x block)."""
    close = np.isclose(got, want[:, None], rtol=1e-4, atol=1e-3)
    lanes = np.arange(block) % 32 == 0
    if close[:, lanes].all() and not close.all():
        t = int(np.argwhere(~close)[0][1])
        return (f"{label}: threads whose lane is 0 got the total, the others did not (thread {t}: {got[0, t]:.6g}, "
                f"the row's sum {want[0]:.6g}): a __shfl_down_sync tree leaves the sum in lane 0 only; "
                "__shfl_xor_sync (the butterfly) leaves it in every lane, and every thread must return the total")
    if block > 32 and np.allclose(got, np.repeat(_warp_sums(x, block), 32, axis=1), rtol=1e-4, atol=1e-3):
        return (f"{label}: each thread got its warp's sum, not the block's: with {block // 32} warps, the warps' sums "
                "must meet too: lane 0 of each warp writes it to slots[warp], and after a __syncthreads() a warp sums "
                "the slots")
    r, t = (int(i) for i in np.argwhere(~close)[0])
    if np.allclose(got[r], got[r, 0], rtol=1e-6, atol=1e-6):
        warps = block // 32
        return (f"{label}: every thread of row {r} got {got[r, 0]:.6g}, not the row's sum {want[r]:.6g}: the warps' "
                f"sums were combined wrongly. With {warps} warp(s), only slots[0] to slots[{warps - 1}] hold this "
                "call's sums; the other slots hold whatever an earlier block or call left there, so a lane past "
                "them must add 0")
    return (f"{label}: thread {t} of row {r} got {got[r, t]:.6g}; the row's sum is {want[r]:.6g} (ORT's ReduceSum): "
            "every thread must return the sum over the whole block")


def block_sum(remote, fn):
    from ortlab.labs.judges.lab10 import learner_source, on_cpu_runner, prepared  # heavy: onnxruntime, as above

    source = with_row_stats(learner_source(remote, fn, "my_block_sum_source()"))
    prepared(source, ROW_STATS)  # the kernel found, and NVRTC + ptxas compile it for sm_80 and sm_90
    cases = SEEN_STATS + HIDDEN_STATS
    runs = []
    for rows, cols, block in cases:
        for schedule in ("forward", "reverse"):
            runs.append(cpu_runner.Launch(rows, block, (stats_input(rows, cols), np.full(2 * rows * block, np.nan,
                                                                                         np.float32), cols),
                                          out=1, schedule=schedule))
    results = on_cpu_runner(source, ROW_STATS, runs)
    for k, (rows, cols, block) in enumerate(cases):
        label = (f"for {rows} row(s) of {cols} with {block} threads per block"
                 f"{' (a shape the notebook does not show)' if (rows, cols, block) not in SEEN_STATS else ''}")
        pair = []
        for result in results[2 * k:2 * k + 2]:
            if isinstance(result, str):
                raise CheckFailed(f"{label}: {result}")
            if not isinstance(result, np.ndarray) or result.shape != (2 * rows * block,):
                raise CheckFailed(f"{label}: the CPU runner's process gave a malformed answer")
            pair.append(result.reshape(rows, 2, block))
        forward, reverse = pair
        if not np.allclose(forward, reverse, rtol=1e-5, atol=1e-4, equal_nan=True):
            first = not np.allclose(forward[:, 0], reverse[:, 0], rtol=1e-5, atol=1e-4, equal_nan=True)
            which = "in its first call" if first else "in its second call"
            raise CheckFailed(f"{label}: a race: what block_sum returns {which} changes with the order the "
                              "threads run between barriers. Every thread must pass a __syncthreads() after the "
                              "warps' sums are in `slots` and before any thread reads them, and (the kernel calls "
                              "block_sum twice with the same slots) another between the last read of the slots and "
                              "the next write to them")
        x = stats_input(rows, cols)
        sums, squares = ort_row_stats(x)
        if not np.isfinite(forward).all() or not np.allclose(forward[:, 0], sums[:, None], rtol=1e-4, atol=1e-3):
            raise CheckFailed(_wrong(forward[:, 0], sums, x, block, label))
        if not np.allclose(forward[:, 1], squares[:, None], rtol=1e-4, atol=1e-3):
            raise CheckFailed(_wrong(forward[:, 1], squares, x * x, block, f"{label}, in the second call"))
    return None

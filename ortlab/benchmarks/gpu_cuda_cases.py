"""The launches of ortlab/cuda/kernels/*.cu that the GPU check runs, each beside a numpy reference.

A `KernelCase` builds its inputs at a size ("small": the CPU runner's, "large": a GPU's), runs its
kernels through a `launch(kernel, grid, block, *args)` of one source (arrays are written in place,
as `ortlab.cuda.launch` does: the CPU runner, or CuPy on a GPU) and names the outputs to compare
with `reference(arrays)`, computed in float64 (exactly where the kernel's float32 arithmetic is
reproducible: Dropout, DropoutGrad, the sorted GatherGrad's order). The geometry has tails (columns
not a multiple of the block) and grids smaller than the rows, so grid-stride loops run more than once.
"""
from dataclasses import dataclass

import numpy as np

SIZES = {
    "small": {"rows": 37, "cols": 300, "grid": 8, "block": 128, "mean_block": 96,
              "gather": ((7, 5, 3), (12,))},
    "large": {"rows": 4099, "cols": 1000, "grid": 264, "block": 256, "mean_block": 1024,
              "gather": ((8, 500, 33), (600,))},
}
RATIO, SEED, EPSILON, IGNORE_INDEX = 0.3, 1234, 1e-5, 3


@dataclass(frozen=True)
class KernelCase:
    """One check: `inputs(rng, size) -> arrays`, `run(launch, arrays, size) -> outputs` (the kernels of
    `source`), `reference(arrays) -> outputs`; outputs compared within rtol / atol (0, 0: exactly)."""

    name: str
    source: str
    inputs: object
    run: object
    reference: object
    rtol: float = 0.0
    atol: float = 0.0


CASES = []


def register_case(case):
    CASES.append(case)
    return case


def compare(case, got, expected):
    """Rows {case, output, max abs diff, tolerance, ok} of one case's outputs against its reference."""
    rows = []
    for name, want in expected.items():
        have = np.asarray(got[name])
        want = np.asarray(want)
        if have.shape != want.shape:
            rows.append({"case": case.name, "output": name, "max abs diff": f"shape {have.shape} != {want.shape}",
                         "tolerance": "-", "ok": False})
            continue
        diff = np.abs(have.astype(np.float64) - want.astype(np.float64))
        ok = bool(np.all(diff <= case.atol + case.rtol * np.abs(want.astype(np.float64))))
        rows.append({"case": case.name, "output": name, "max abs diff": float(diff.max()) if diff.size else 0.0,
                     "tolerance": "exact" if case.rtol == case.atol == 0 else f"rtol {case.rtol:g}, atol {case.atol:g}",
                     "ok": ok})
    return rows


def _f32(a):
    return np.ascontiguousarray(a, dtype=np.float32)


# ---- ReduceSum --------------------------------------------------------------------------------
def _matrix(rng, s):
    return {"x": _f32(rng.standard_normal((s["rows"], s["cols"])))}


def _reduce_sum(launch, a, s):
    y = np.zeros(s["rows"], np.float32)
    launch("reduce_sum_last_axis", s["grid"], s["block"], a["x"], y, s["rows"], s["cols"])
    return {"y": y}


register_case(KernelCase("ReduceSum last axis", "reduce_sum", _matrix, _reduce_sum,
                         lambda a: {"y": a["x"].astype(np.float64).sum(axis=1)}, 1e-5, 1e-4))


# ---- Dropout, DropoutGrad ---------------------------------------------------------------------
def _dropout_inputs(rng, s):
    return {"x": _f32(rng.standard_normal((s["rows"], s["cols"]))),
            "mask": np.ascontiguousarray(rng.random((s["rows"], s["cols"])) < 0.7)}


def _scale():
    return np.float32(1) / (np.float32(1) - np.float32(RATIO))


def _dropout_grad(launch, a, s):
    dx = np.zeros_like(a["x"])
    launch("dropout_grad", s["grid"], s["block"], a["x"], a["mask"], dx, RATIO, a["x"].size)
    return {"dx": dx}


register_case(KernelCase("DropoutGrad (ratio 0.3)", "dropout", _dropout_inputs, _dropout_grad,
                         lambda a: {"dx": a["x"] * a["mask"].astype(np.float32) * _scale()}))


def splitmix_uniform(seed, n):
    """dropout.cu's uniform01(seed, i) for i < n: splitmix64's finalizer of seed + (i + 1) * golden, top 24 bits."""
    with np.errstate(over="ignore"):
        z = np.uint64(seed) + (np.arange(n, dtype=np.uint64) + np.uint64(1)) * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z ^= z >> np.uint64(31)
    return (z >> np.uint64(40)).astype(np.float32) * np.float32(1.0 / 16777216.0)


def _dropout(launch, a, s):
    y, mask = np.zeros_like(a["x"]), np.zeros(a["x"].shape, np.bool_)
    launch("dropout", s["grid"], s["block"], a["x"], y, mask, RATIO, a["x"].size, SEED)
    return {"y": y, "mask": mask}


def _dropout_reference(a):
    keep = splitmix_uniform(SEED, a["x"].size).reshape(a["x"].shape) < np.float32(1) - np.float32(RATIO)
    return {"y": a["x"] * keep.astype(np.float32) * _scale(), "mask": keep}


register_case(KernelCase("Dropout (ratio 0.3, seed 1234)", "dropout", _dropout_inputs, _dropout, _dropout_reference))


# ---- LayerNormalization and its gradient ------------------------------------------------------
def _layer_norm_inputs(rng, s):
    rows, cols = s["rows"], s["cols"]
    return {"x": _f32(rng.standard_normal((rows, cols)) * 3 + 5), "scale": _f32(rng.standard_normal(cols)),
            "bias": _f32(rng.standard_normal(cols)), "dy": _f32(rng.standard_normal((rows, cols)))}


def _layer_norm(launch, a, s):
    rows, cols = s["rows"], s["cols"]
    y, mean, inv_std = np.zeros_like(a["x"]), np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    launch("layer_norm", s["grid"], s["block"], a["x"], a["scale"], a["bias"], y, mean, inv_std, rows, cols, EPSILON)
    dx, dscale, dbias = np.zeros_like(a["x"]), np.zeros(cols, np.float32), np.zeros(cols, np.float32)
    launch("layer_norm_grad_input", s["grid"], s["block"], a["dy"], a["x"], a["scale"], mean, inv_std, dx, rows, cols)
    launch("layer_norm_grad_scale_bias", max(1, s["grid"] // 4), 64, a["dy"], a["x"], mean, inv_std, dscale, dbias,
           rows, cols)
    return {"y": y, "mean": mean, "inv_std": inv_std, "dx": dx, "dscale": dscale, "dbias": dbias}


def _layer_norm_reference(a):
    x, dy = a["x"].astype(np.float64), a["dy"].astype(np.float64)
    scale, bias = a["scale"].astype(np.float64), a["bias"].astype(np.float64)
    mean = x.mean(axis=1, keepdims=True)
    inv_std = 1 / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + EPSILON)
    xhat = (x - mean) * inv_std
    g = dy * scale
    dx = inv_std * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return {"y": xhat * scale + bias, "mean": mean[:, 0], "inv_std": inv_std[:, 0], "dx": dx,
            "dscale": (dy * xhat).sum(axis=0), "dbias": dy.sum(axis=0)}


register_case(KernelCase("LayerNormalization and its Grad", "layer_norm", _layer_norm_inputs, _layer_norm,
                         _layer_norm_reference, 1e-4, 1e-3))


# ---- SoftmaxCrossEntropyLoss and its gradient -------------------------------------------------
def _sce_inputs(rng, s):
    labels = rng.integers(0, s["cols"], size=s["rows"]).astype(np.int64)
    labels[::5] = IGNORE_INDEX
    return {"logits": _f32(rng.standard_normal((s["rows"], s["cols"])) * 4), "labels": labels,
            "dy": np.array([0.7], np.float32)}


def _sce(launch, a, s):
    n, classes = s["rows"], s["cols"]
    log_prob = np.zeros_like(a["logits"])
    launch("log_softmax_rows", s["grid"], s["block"], a["logits"], log_prob, n, classes)
    term, weight = np.zeros(n, np.float32), np.zeros(n, np.float32)
    launch("cross_entropy_terms", s["grid"], s["block"], log_prob, a["labels"], term, weight, n, classes, IGNORE_INDEX)
    loss, weight_sum = np.zeros(1, np.float32), np.zeros(1, np.float32)
    launch("cross_entropy_mean", 1, s["mean_block"], term, weight, loss, weight_sum, n)
    dlogits = np.zeros_like(a["logits"])
    launch("cross_entropy_grad", s["grid"], s["block"], a["dy"], log_prob, a["labels"], weight_sum, dlogits, n,
           classes, IGNORE_INDEX)
    return {"log_prob": log_prob, "loss": loss, "dlogits": dlogits}


def _sce_reference(a):
    x, labels = a["logits"].astype(np.float64), a["labels"]
    shifted = x - x.max(axis=1, keepdims=True)
    log_prob = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True))
    weight = (labels != IGNORE_INDEX).astype(np.float64)
    picked = log_prob[np.arange(len(labels)), labels]
    loss = -(picked * weight).sum() / weight.sum()
    onehot = np.zeros_like(x)
    onehot[np.arange(len(labels)), labels] = 1
    dlogits = float(a["dy"][0]) * weight[:, None] / weight.sum() * (np.exp(log_prob) - onehot)
    return {"log_prob": log_prob, "loss": np.array([loss]), "dlogits": dlogits}


register_case(KernelCase("SoftmaxCrossEntropyLoss (mean) and its Grad", "softmax_cross_entropy", _sce_inputs, _sce,
                         _sce_reference, 1e-4, 1e-5))


# ---- GatherGrad, both paths -------------------------------------------------------------------
def _gather_inputs(rng, s):
    (outer, gather_dim, inner), indices_shape = s["gather"]
    indices = rng.integers(-gather_dim, gather_dim, size=indices_shape).astype(np.int64)  # repeats, negatives
    return {"dy": _f32(rng.standard_normal((outer, indices.size, inner))), "indices": indices,
            "shape": np.array([outer, gather_dim, inner], np.int64)}


def _gather_grad(launch, a, s):
    outer, gather_dim, inner = (int(v) for v in a["shape"])
    n = a["indices"].size
    atomic = np.zeros((outer, gather_dim, inner), np.float32)
    launch("gather_grad_atomic", s["grid"], s["block"], a["dy"], a["indices"], atomic, outer, n, gather_dim, inner)
    sorted_index, sorted_position = np.zeros(n, np.int64), np.zeros(n, np.int64)
    launch("gather_grad_sort", max(1, s["grid"] // 4), 64, a["indices"], sorted_index, sorted_position, n, gather_dim)
    ordered = np.zeros((outer, gather_dim, inner), np.float32)
    launch("gather_grad_sorted", s["grid"], s["block"], a["dy"], sorted_index, sorted_position, ordered, outer, n,
           gather_dim, inner)
    return {"dx (atomic)": atomic, "sorted index": sorted_index, "dx (sorted)": ordered}


def _gather_reference(a):
    outer, gather_dim, inner = (int(v) for v in a["shape"])
    wrapped = a["indices"] % gather_dim
    dx = np.zeros((outer, gather_dim, inner))
    np.add.at(dx, (slice(None), wrapped), a["dy"].astype(np.float64))
    return {"dx (atomic)": dx, "sorted index": np.sort(wrapped, kind="stable"), "dx (sorted)": dx}


register_case(KernelCase("GatherGrad (atomic and sorted paths)", "gather_grad", _gather_inputs, _gather_grad,
                         _gather_reference, 1e-5, 1e-4))


def run_case(case, launch, size, seed=0):
    """Rows of `compare` for `case` run through `launch` at `size` ("small" or "large")."""
    s = SIZES[size]
    arrays = case.inputs(np.random.default_rng(seed), s)
    expected = case.reference(arrays)
    got = case.run(launch, arrays, s)
    return compare(case, got, expected)

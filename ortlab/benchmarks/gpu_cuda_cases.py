"""The launches of ortlab/cuda/kernels/*.cu that the GPU check runs, each beside a numpy reference.

A `KernelCase` builds its inputs at a size ("small": the CPU runner's, "large": a GPU's), runs its
kernels through a `launch(kernel, grid, block, *args)` of one source (arrays are written in place,
as `ortlab.cuda.launch` does: the CPU runner, or CuPy on a GPU) and names the outputs to compare
with `reference(arrays)`, computed in float64 (exactly where the kernel's float32 arithmetic is
reproducible: Dropout, DropoutGrad, the sorted GatherGrad's order). The launch recipes (views, grid,
block) are the op kernels' own (ortlab.cuda.op_kernels, which the engine's CUDA EP runs), given the
size's block and largest grid; the three LayerNorm versions are launched as notebook L3_01 launches them
(ortlab.walkthroughs.kernel_optimization.grid). The geometry has tails (columns not a multiple of the
block) and grids smaller than the rows, so grid-stride loops run more than once.
"""
from dataclasses import dataclass

import numpy as np

from ortlab.cuda import op_kernels
from ortlab.cuda.kernels.layer_norm_versions import VERSIONS, grid

SIZES = {
    "small": {"rows": 37, "cols": 300, "grid": 8, "block": 128, "gather": ((7, 5, 3), (12,))},
    "large": {"rows": 4099, "cols": 1000, "grid": 264, "block": 256, "gather": ((8, 500, 33), (600,))},
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


class SizedLaunch:
    """A bare `launch(kernel, grid, block, *args)` as the launcher an op kernel takes: numpy arrays, the
    size's block and largest grid (ortlab.cuda.launcher's interface)."""

    xp = np

    def __init__(self, launch, size):
        self.launch, self.block, self.max_grid = launch, size["block"], size["grid"]

    def __call__(self, kernel, grid, block, *args):
        self.launch(kernel, grid, block, *args)

    def to_numpy(self, array):
        return np.asarray(array)


def op(launch, size, op_type, domain, attributes, *inputs, **options):
    """The outputs of op kernel (op_type, domain) on `inputs`, launched through `launch`."""
    call = op_kernels.OpCall(attributes, make_launcher=lambda source: SizedLaunch(launch, size), options=options)
    return op_kernels.OPS[(op_type, domain)].run(call, *inputs)


# ---- ReduceSum --------------------------------------------------------------------------------
def _matrix(rng, s):
    return {"x": _f32(rng.standard_normal((s["rows"], s["cols"])))}


def _reduce_sum(launch, a, s):
    (y,) = op(launch, s, "ReduceSum", "", {"keepdims": 0}, a["x"], np.array([-1], np.int64))
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
    (dx,) = op(launch, s, "DropoutGrad", op_kernels.MS, {}, a["x"], a["mask"], np.array(RATIO, np.float32))
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
    y, mask = op(launch, s, "Dropout", "", {"seed": SEED}, a["x"], np.array(RATIO, np.float32), np.array(True))
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
    attributes = {"axis": -1, "epsilon": EPSILON}
    y, mean, inv_std = op(launch, s, "LayerNormalization", "", attributes, a["x"], a["scale"], a["bias"])
    dx, dscale, dbias = op(launch, s, "LayerNormalizationGrad", op_kernels.MS, attributes, a["dy"], a["x"],
                           a["scale"], mean, inv_std)
    return {"y": y, "mean": mean.reshape(-1), "inv_std": inv_std.reshape(-1), "dx": dx, "dscale": dscale,
            "dbias": dbias}


def _layer_norm_stats(x):
    mean = x.mean(axis=1, keepdims=True)
    return mean, 1 / np.sqrt(((x - mean) ** 2).mean(axis=1, keepdims=True) + EPSILON)


def _layer_norm_reference(a):
    x, dy = a["x"].astype(np.float64), a["dy"].astype(np.float64)
    scale, bias = a["scale"].astype(np.float64), a["bias"].astype(np.float64)
    mean, inv_std = _layer_norm_stats(x)
    xhat = (x - mean) * inv_std
    g = dy * scale
    dx = inv_std * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return {"y": xhat * scale + bias, "mean": mean[:, 0], "inv_std": inv_std[:, 0], "dx": dx,
            "dscale": (dy * xhat).sum(axis=0), "dbias": dy.sum(axis=0)}


register_case(KernelCase("LayerNormalization and its Grad", "layer_norm", _layer_norm_inputs, _layer_norm,
                         _layer_norm_reference, 1e-4, 1e-3))


def _layer_norm_versions(launch, a, s):
    rows, cols = a["x"].shape
    found = {}
    for label, kernel, _ in VERSIONS:
        found[label] = np.zeros_like(a["x"])
        launch(kernel, grid(kernel, rows, s["block"]), s["block"], a["x"], a["scale"], a["bias"], found[label],
               rows, cols, EPSILON)
    return found


def _layer_norm_versions_reference(a):
    x = a["x"].astype(np.float64)
    mean, inv_std = _layer_norm_stats(x)
    y = (x - mean) * inv_std * a["scale"].astype(np.float64) + a["bias"].astype(np.float64)
    return {"naive": y, "block tree": y, "warp + float4": y}


register_case(KernelCase("LayerNormalization forward, three versions (notebook L3_01)", "layer_norm_versions",
                         _layer_norm_inputs, _layer_norm_versions, _layer_norm_versions_reference, 1e-4, 1e-3))


# ---- SoftmaxCrossEntropyLoss and its gradient -------------------------------------------------
def _sce_inputs(rng, s):
    labels = rng.integers(0, s["cols"], size=s["rows"]).astype(np.int64)
    labels[::5] = IGNORE_INDEX
    return {"logits": _f32(rng.standard_normal((s["rows"], s["cols"])) * 4), "labels": labels,
            "dy": np.array([0.7], np.float32)}


def _sce(launch, a, s):
    attributes = {"reduction": "mean", "ignore_index": IGNORE_INDEX}
    loss, log_prob = op(launch, s, "SoftmaxCrossEntropyLoss", "", attributes, a["logits"], a["labels"])
    (dlogits,) = op(launch, s, "SoftmaxCrossEntropyLossGrad", op_kernels.MS, attributes, a["dy"].reshape(()),
                    log_prob, a["labels"])
    return {"log_prob": log_prob, "loss": loss.reshape(1), "dlogits": dlogits}


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
    args = (a["shape"], a["indices"], a["dy"])
    (atomic,) = op(launch, s, "GatherGrad", op_kernels.MS, {"axis": 1}, *args, path="atomic")
    (ordered,) = op(launch, s, "GatherGrad", op_kernels.MS, {"axis": 1}, *args, path="sorted")
    return {"dx (atomic)": atomic, "dx (sorted)": ordered}


def _gather_reference(a):
    outer, gather_dim, inner = (int(v) for v in a["shape"])
    dx = np.zeros((outer, gather_dim, inner))
    np.add.at(dx, (slice(None), a["indices"] % gather_dim), a["dy"].astype(np.float64))
    return {"dx (atomic)": dx, "dx (sorted)": dx}


register_case(KernelCase("GatherGrad (atomic and sorted paths)", "gather_grad", _gather_inputs, _gather_grad,
                         _gather_reference, 1e-5, 1e-4))


def run_case(case, launch, size, seed=0):
    """Rows of `compare` for `case` run through `launch` at `size` ("small" or "large")."""
    s = SIZES[size]
    arrays = case.inputs(np.random.default_rng(seed), s)
    expected = case.reference(arrays)
    got = case.run(launch, arrays, s)
    return compare(case, got, expected)

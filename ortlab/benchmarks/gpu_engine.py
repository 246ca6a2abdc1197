"""The GPU check's engine part: ortlab's InferenceSession run on the GPU by its CUDAExecutionProvider and by its
TritonExecutionProvider, each graph's outputs against those of the CPU EP alone.

Small training graphs made with onnx.helper (GRAPHS) cover every op the CUDA EP has a kernel for
(ortlab.cuda.op_kernels: ReduceSum, Dropout, DropoutGrad, LayerNormalization, LayerNormalizationGrad,
SoftmaxCrossEntropyLoss, SoftmaxCrossEntropyLossGrad, GatherGrad) on shapes with tails: columns not a multiple
of a block, more rows than a grid has blocks. Each graph runs in three sessions, as ORT's
CompareOpTester::CompareWithCPU (onnxruntime/test/providers/compare_provider_test_utils.cc) runs a model on the
CPU EP and on a target EP and compares the fetches:

    cpu      the CPU EP alone: the reference (ortlab's CPU kernels, checked against ORT 1.19.2 by
             tests/engine/test_engine_cuda_ep*.py)
    cuda     CUDAExecutionProvider, then the CPU EP for the nodes it declines
    triton   TritonExecutionProvider, then the CPU EP

Per graph and device EP the record holds: which EP ran each node, against the placement the graph expects; the
Memcpy nodes the session inserted; each output's max abs error against the reference and whether every element
is within rtol * |reference| + atol * max |reference| (the absolute part scaled by the output's largest value:
sums over thousands of rows, such as LayerNormalizationGrad's scale and bias gradients, cancel to values far
smaller than their terms, and their last bits depend on the order of summation); the time to build the
session, of the first run (the kernels are compiled then) and the median of `repeat` runs after it, each run
followed by the EP's synchronize.

Dropout in training mode draws its mask differently on each EP (ortlab's CPU kernel, dropout.cu's
counter-based hash, Triton's tl.rand), so that graph is compared given the mask: its reference is the CPU EP's
DropoutGrad fed the EP's own mask (y = x * mask / (1 - ratio), and dx likewise), and the kept fraction must be
1 - ratio within 5 binomial standard deviations; the row also says whether the next run drew a new mask (ORT
1.19.2's does, seed attribute or not: its generator's offset advances). Inference mode is compared directly.

What differs is listed in `mismatches`; what did not run on the GPU (CuPy or the GPU missing, Triton
interpreted, the part's time spent) in `not run`: neither is ever a silent pass. With `--dry-run` the graphs are
built and the CPU EP's reference computed, and the part stops before the first device EP is made.
"""
import statistics
import time
from dataclasses import dataclass

import numpy as np

from ortlab.benchmarks.gpu_cuda import use_cuda_home
from ortlab.benchmarks.gpu_registry import Skip, dry_run_stop, time_left

CPU, CUDA, TRITON = "CPUExecutionProvider", "CUDAExecutionProvider", "TritonExecutionProvider"
SESSIONS = {"cpu": (CPU,), "cuda": (CUDA, CPU), "triton": (TRITON, CPU)}
DEVICE_EPS = ("cuda", "triton")
MS = "com.microsoft"
REPEAT = 5
RESERVE_S = 8.0  # a (graph, EP) is not started with less of the part's budget left
SEED = 2024
# small: the CPU runner's launcher (block 128, at most 8 blocks): 14 and 19 rows loop, 45 columns leave a tail;
# large: a GPU's (CupyLauncher: block 256, at most 4096 blocks): 4104 and 4099 rows loop, 1000 columns a tail
SIZES = {
    "small": {"batch": (2, 7), "cols": 45, "rows": 19, "classes": 45, "vocab": 11, "hidden": 33,
              "indices": (7, 5), "labels": 7},
    "large": {"batch": (8, 513), "cols": 1000, "rows": 4099, "classes": 1000, "vocab": 1001, "hidden": 129,
              "indices": (8, 515), "labels": 33},
}
RATIO = 0.3


@dataclass(frozen=True)
class EngineGraph:
    """One graph: `build(rng, size) -> (model, feeds)`; `expect` {EP key: names of the nodes that EP should
    run} (every other node: the CPU EP); outputs equal the reference within rtol * |reference| + atol * max
    |reference| (compare_output).
    `given_mask(outputs, feeds) -> (model, feeds)`: a CPU EP model whose outputs are the reference given an
    EP's Dropout mask (training mode); `kept`: (mask output, ratio) whose kept fraction is checked."""

    name: str
    build: object
    expect: dict
    rtol: float = 1e-4
    atol: float = 1e-5
    given_mask: object = None
    kept: tuple = ()


GRAPHS = []


def register_graph(graph):
    GRAPHS.append(graph)
    return graph


# ---- building the graphs --------------------------------------------------------------------------------
def _model(nodes, feeds, outputs, initializers=()):
    """A model of `nodes`, its inputs typed after `feeds`' arrays, its outputs [(name, dtype)] of unknown shape."""
    from onnx import helper, numpy_helper  # lazy: without onnx gpu_check skips this part only

    inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for name, a in feeds.items()]
    outs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(np.dtype(t)), None)
            for name, t in outputs]
    graph = helper.make_graph(nodes, "g", inputs, outs, [numpy_helper.from_array(np.asarray(v), k)
                                                          for k, v in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def _node(op, inputs, outputs, name, **attrs):
    from onnx import helper  # lazy: without onnx gpu_check skips this part only

    domain = MS if op.endswith("Grad") else ""
    return helper.make_node(op, inputs, outputs, name=name, domain=domain, **attrs)


def _f32(rng, *shape, scale=1.0, shift=0.0):
    return (rng.standard_normal(shape) * scale + shift).astype(np.float32)


def reduce_sum_graph(rng, size):
    """ReduceSum over the last axis, the last two (kept), and the first (the CUDA kernel reduces trailing
    axes only: that node stays on the CPU EP)."""
    feeds = {"x": _f32(rng, *size["batch"], size["cols"])}
    nodes = [_node("ReduceSum", ["x", "last"], ["y_last"], "rs_last", keepdims=0),
             _node("ReduceSum", ["x", "last2"], ["y_last2"], "rs_last2", keepdims=1),
             _node("ReduceSum", ["x", "first"], ["y_first"], "rs_first", keepdims=0)]
    inits = [("last", np.array([-1], np.int64)), ("last2", np.array([1, 2], np.int64)),
             ("first", np.array([0], np.int64))]
    return _model(nodes, feeds, [("y_last", "float32"), ("y_last2", "float32"), ("y_first", "float32")], inits), feeds


def layer_norm_graph(rng, size):
    """LayerNormalization over the last axis and its gradient (LayerNormalizationGrad from the saved mean and
    inv_std, as ORT's gradient builder emits it), and one over the last two axes (axis 1)."""
    a, b = size["batch"]
    c = size["cols"]
    feeds = {"x": _f32(rng, a, b, c, scale=3, shift=5), "dy": _f32(rng, a, b, c)}
    inits = [("s", _f32(rng, c)), ("b", _f32(rng, c)), ("s2", _f32(rng, b, c)), ("b2", _f32(rng, b, c))]
    nodes = [_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv_std"], "ln", epsilon=1e-5),
             _node("LayerNormalizationGrad", ["dy", "x", "s", "mean", "inv_std"], ["dx", "ds", "db"], "ln_grad"),
             _node("LayerNormalization", ["x", "s2", "b2"], ["y2"], "ln_axis1", axis=1, epsilon=1e-3)]
    outputs = [(n, "float32") for n in ("y", "mean", "inv_std", "dx", "ds", "db", "y2")]
    return _model(nodes, feeds, outputs, inits), feeds


def dropout_graph(rng, size, training=True):
    """Dropout (ratio 0.3, a seed) and DropoutGrad of its mask."""
    shape = (size["rows"], size["cols"])
    feeds = {"x": _f32(rng, *shape), "dy": _f32(rng, *shape)}
    inits = [("ratio", np.array(RATIO, np.float32)), ("training", np.array(training))]
    nodes = [_node("Dropout", ["x", "ratio", "training"], ["y", "mask"], "dropout", seed=7),
             _node("DropoutGrad", ["dy", "mask", "ratio"], ["dx"], "dropout_grad")]
    return _model(nodes, feeds, [("y", "float32"), ("mask", "bool"), ("dx", "float32")], inits), feeds


def dropout_given_mask(outputs, feeds):
    """The reference of dropout_graph given an EP's mask: y = DropoutGrad(x, mask), dx = DropoutGrad(dy, mask)
    on the CPU EP (both are t * mask / (1 - ratio)), and the mask itself."""
    given = {"x": feeds["x"], "dy": feeds["dy"], "given": np.asarray(outputs["mask"], bool)}
    nodes = [_node("DropoutGrad", ["x", "given", "ratio"], ["y"], "y_given_mask"),
             _node("Identity", ["given"], ["mask"], "mask"),
             _node("DropoutGrad", ["dy", "given", "ratio"], ["dx"], "dx_given_mask")]
    model = _model(nodes, given, [("y", "float32"), ("mask", "bool"), ("dx", "float32")],
                   [("ratio", np.array(RATIO, np.float32))])
    return model, given


def softmax_cross_entropy_graph(rng, size):
    """SoftmaxCrossEntropyLoss (mean, ignore_index 3, every fourth label 3) and its gradient."""
    n, classes = size["rows"], size["classes"]
    labels = rng.integers(0, classes, n).astype(np.int64)
    labels[::4] = 3
    feeds = {"scores": _f32(rng, n, classes, scale=2), "labels": labels}
    nodes = [_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss", "log_prob"], "sce", ignore_index=3),
             _node("SoftmaxCrossEntropyLossGrad", ["one", "log_prob", "labels"], ["dscores"], "sce_grad",
                   ignore_index=3)]
    outputs = [("loss", "float32"), ("log_prob", "float32"), ("dscores", "float32")]
    return _model(nodes, feeds, outputs, [("one", np.array(1.0, np.float32))]), feeds


def gather_grad_graph(rng, size):
    """GatherGrad along axis 0 (int64 indices, many repeated) and along axis 1 (int32 indices, some negative)."""
    vocab, hidden = size["vocab"], size["hidden"]
    idx = rng.integers(0, vocab, size["indices"]).astype(np.int64)
    idx1 = rng.integers(-vocab, vocab, size["indices"][1]).astype(np.int32)
    feeds = {"idx": idx, "dy": _f32(rng, *idx.shape, hidden), "idx1": idx1, "dy1": _f32(rng, 3, idx1.size, 5)}
    inits = [("shape0", np.array([vocab, hidden], np.int64)), ("shape1", np.array([3, vocab, 5], np.int64))]
    nodes = [_node("GatherGrad", ["shape0", "idx", "dy"], ["dtable"], "gather_grad"),
             _node("GatherGrad", ["shape1", "idx1", "dy1"], ["dtable1"], "gather_grad_axis1", axis=1)]
    return _model(nodes, feeds, [("dtable", "float32"), ("dtable1", "float32")], inits), feeds


def training_step_graph(rng, size):
    """An embedding, LayerNorm, Dropout (inference mode), a projection, the loss, and back: the loss's
    gradient, the projection's (MatMul, on the CPU EP), DropoutGrad of a given mask, LayerNormalizationGrad,
    GatherGrad into the table, ReduceSum of the bias gradient (over the leading axis: the CPU EP) and of each
    row (the trailing axis)."""
    tokens, vocab, hidden, classes = size["rows"], size["vocab"], size["hidden"], size["labels"]
    feeds = {"ids": rng.integers(0, vocab, tokens).astype(np.int64),
             "labels": rng.integers(0, classes, tokens).astype(np.int64),
             "mask": rng.random((tokens, hidden)) < 0.8}
    w = _f32(rng, hidden, classes)
    inits = [("emb", _f32(rng, vocab, hidden)), ("s", _f32(rng, hidden)), ("b", _f32(rng, hidden)), ("w", w),
             ("wt", np.ascontiguousarray(w.T)), ("ratio", np.array(0.25, np.float32)), ("off", np.array(False)),
             ("one", np.array(1.0, np.float32)), ("axes0", np.array([0], np.int64)),
             ("axes1", np.array([-1], np.int64)), ("emb_shape", np.array([vocab, hidden], np.int64))]
    nodes = [_node("Gather", ["emb", "ids"], ["e"], "gather"),
             _node("LayerNormalization", ["e", "s", "b"], ["h", "mean", "inv_std"], "ln"),
             _node("Dropout", ["h", "ratio", "off"], ["hd", "hmask"], "dropout"),
             _node("MatMul", ["hd", "w"], ["logits"], "proj"),
             _node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss", "log_prob"], "sce"),
             _node("SoftmaxCrossEntropyLossGrad", ["one", "log_prob", "labels"], ["dlogits"], "sce_grad"),
             _node("MatMul", ["dlogits", "wt"], ["dh"], "proj_grad"),
             _node("DropoutGrad", ["dh", "mask", "ratio"], ["dhd"], "dropout_grad"),
             _node("LayerNormalizationGrad", ["dhd", "e", "s", "mean", "inv_std"], ["de", "ds", "db"], "ln_grad"),
             _node("GatherGrad", ["emb_shape", "ids", "de"], ["demb"], "gather_grad"),
             _node("ReduceSum", ["dlogits", "axes0"], ["dbias"], "bias_grad", keepdims=0),
             _node("ReduceSum", ["dh", "axes1"], ["dh_rows"], "rows", keepdims=1)]
    outputs = [(n, "float32") for n in ("loss", "hd", "ds", "db", "demb", "dbias", "dh_rows")]
    return _model(nodes, feeds, outputs, inits), feeds


ON_BOTH = {"ln", "dropout", "sce", "sce_grad", "dropout_grad", "ln_grad", "gather_grad", "rows"}
register_graph(EngineGraph("reduce_sum", reduce_sum_graph,
                           {"cuda": {"rs_last", "rs_last2"}, "triton": {"rs_last", "rs_last2", "rs_first"}}))
register_graph(EngineGraph("layer_norm", layer_norm_graph,
                           {"cuda": {"ln", "ln_grad", "ln_axis1"}, "triton": {"ln", "ln_grad", "ln_axis1"}}))
register_graph(EngineGraph("dropout_training", dropout_graph,
                           {"cuda": {"dropout", "dropout_grad"}, "triton": {"dropout", "dropout_grad"}},
                           rtol=1e-6, atol=0.0, given_mask=dropout_given_mask, kept=("mask", RATIO)))
register_graph(EngineGraph("dropout_inference", lambda rng, size: dropout_graph(rng, size, training=False),
                           {"cuda": {"dropout", "dropout_grad"}, "triton": {"dropout", "dropout_grad"}},
                           rtol=1e-6, atol=0.0))
register_graph(EngineGraph("softmax_cross_entropy", softmax_cross_entropy_graph,
                           {"cuda": {"sce", "sce_grad"}, "triton": {"sce", "sce_grad"}}))
register_graph(EngineGraph("gather_grad", gather_grad_graph,
                           {"cuda": {"gather_grad", "gather_grad_axis1"},
                            "triton": {"gather_grad", "gather_grad_axis1"}}))
register_graph(EngineGraph("training_step", training_step_graph,
                           {"cuda": ON_BOTH, "triton": ON_BOTH | {"bias_grad"}}))


# ---- running and comparing ------------------------------------------------------------------------------
def session(model, key):
    """An ortlab InferenceSession of `model` on the EPs of SESSIONS[key], the graph as built (level 0)."""
    from ortlab.engine import InferenceSession, SessionOptions  # lazy: needs onnx; else gpu_check skips this part

    return InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=0),
                            providers=list(SESSIONS[key]))


def timed_runs(sess, feeds, repeat):
    """(first outputs, second outputs, first run ms, median ms of `repeat` runs after it): each run is
    followed by the session's first EP's synchronize (a no-op on the CPU EP)."""
    sync = sess.providers[0].synchronize
    names = [o.name for o in sess.get_outputs()]
    start = time.perf_counter()
    first = dict(zip(names, sess.run(None, feeds)))
    sync()
    first_ms = (time.perf_counter() - start) * 1e3
    times, second = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        out = sess.run(None, feeds)
        sync()
        times.append((time.perf_counter() - start) * 1e3)
        second = second or dict(zip(names, out))
    return first, second, first_ms, statistics.median(times) if times else None


def compare_output(name, got, want, rtol, atol):
    """{output, max abs error, max |reference|, tolerance, ok}: every element within rtol * |want| + atol * max|want|
    (bool and integer outputs: equal); a dtype, shape or NaN pattern that differs is not ok."""
    got, want = np.asarray(got), np.asarray(want)
    row = {"output": name, "max abs error": None, "max |reference|": None,
           "tolerance": f"rtol {rtol:g} * |reference| + atol {atol:g} * max |reference|", "ok": False}
    if got.dtype != want.dtype or got.shape != want.shape:
        return {**row, "max abs error": f"{got.dtype}{list(got.shape)} where the reference is "
                                        f"{want.dtype}{list(want.shape)}"}
    if want.dtype.kind not in "fc":
        return {**row, "max abs error": int(np.count_nonzero(got != want)), "tolerance": "equal (elements differing)",
                "ok": bool(np.array_equal(got, want))}
    g, w = got.astype(np.float64), want.astype(np.float64)
    nan_differs = bool(np.any(np.isnan(g) != np.isnan(w)))
    both = ~(np.isnan(g) | np.isnan(w))
    diff = np.abs(g - w)[both]
    scale = float(np.abs(w[both]).max()) if diff.size else 0.0
    within = bool(np.all(diff <= rtol * np.abs(w[both]) + atol * scale))
    return {**row, "max abs error": float("inf") if nan_differs else float(diff.max()) if diff.size else 0.0,
            "max |reference|": scale, "ok": within and not nan_differs}


def kept_fraction(mask, ratio):
    """(kept fraction, ok): 1 - ratio within 5 binomial standard deviations (plus one element)."""
    mask = np.asarray(mask)
    kept, n = float(mask.mean()), mask.size
    return round(kept, 5), abs(kept - (1 - ratio)) <= 5 * np.sqrt(ratio * (1 - ratio) / n) + 1.0 / n


def placement(sess):
    """({node name: EP key}, [Memcpy nodes as 'op (EP key)']) of a session's plan."""
    short = {CPU: "cpu", CUDA: "cuda", TRITON: "triton"}
    steps = sess.state.steps
    placed = {s.node.name: short.get(s.provider.type, s.provider.type) for s in steps
              if not s.node.op_type.startswith("Memcpy")}
    copies = [f"{s.node.op_type} ({short.get(s.provider.type, s.provider.type)})" for s in steps
              if s.node.op_type.startswith("Memcpy")]
    return placed, copies


def check_graph(graph, model, feeds, reference, key, repeat):
    """One graph on one device EP: (row, output rows, partition, mismatches)."""
    start = time.perf_counter()
    sess = session(model, key)
    build_s = time.perf_counter() - start
    first, second, first_ms, ms = timed_runs(sess, feeds, repeat)
    placed, copies = placement(sess)
    misplaced = [f"{graph.name} on {key}: node {node} ran on {ep}, expected {want}" for node, ep in placed.items()
                 if ep != (want := key if node in graph.expect.get(key, ()) else "cpu")]
    expected = reference
    if graph.given_mask is not None:
        given_model, given_feeds = graph.given_mask(first, feeds)
        expected, *_ = timed_runs(session(given_model, "cpu"), given_feeds, 0)
    outputs = [{"graph": graph.name, "ep": key, **compare_output(name, first[name], expected[name], graph.rtol,
                                                                   graph.atol)} for name in first]
    mismatches = misplaced + [f"{graph.name} on {key}: {o['output']} max abs error {o['max abs error']} "
                              f"({o['tolerance']})" for o in outputs if not o["ok"]]
    row = {"graph": graph.name, "ep": key,
           "nodes on the EP": f"{sum(ep == key for ep in placed.values())} of {len(placed)}",
           "placement as expected": not misplaced,
           "memcpy nodes": len(copies),
           "max abs error": max((o["max abs error"] for o in outputs if isinstance(o["max abs error"], float)),
                                default=None),
           "outputs ok": f"{sum(o['ok'] for o in outputs)} of {len(outputs)}",
           "session s": round(build_s, 3), "first run ms": round(first_ms, 2),
           "ms per run (median)": None if ms is None else round(ms, 3)}
    if graph.kept:
        mask_name, ratio = graph.kept
        row["kept fraction"], ok = kept_fraction(first[mask_name], ratio)
        if not ok:
            mismatches.append(f"{graph.name} on {key}: kept {row['kept fraction']} of the elements, "
                              f"expected {1 - ratio:g} within 5 standard deviations")
        if second is not None:
            row["new mask on the next run"] = bool(np.any(second[mask_name] != first[mask_name]))
    return row, outputs, {"nodes": placed, "memcpy": copies}, mismatches


def references(size, repeat):
    """[(graph, model, feeds, CPU EP outputs, CPU EP ms per run)] of every graph at `size`."""
    built = []
    for graph in GRAPHS:
        model, feeds = graph.build(np.random.default_rng(SEED), SIZES[size])
        first, _, _, ms = timed_runs(session(model, "cpu"), feeds, repeat)
        built.append((graph, model, feeds, first, ms))
    return built


def where_not_gpu(key):
    """Why the EP of `key` would not run its kernels on a GPU here, or None when it would."""
    if key == "cuda":
        from ortlab.engine.cuda_execution_provider import gpu_arch  # lazy: needs onnx; else gpu_check skips this part

        return None if gpu_arch() else "CuPy sees no GPU: its kernels would run on the CPU runner"
    from ortlab.env import triton_mode  # lazy: ortlab.env imports torch, which only a part may import

    mode = triton_mode()
    return None if mode == "compiled (cuda)" else f"Triton runs {mode}"


def device_label(key):
    from ortlab.engine import EXECUTION_PROVIDERS  # lazy: needs onnx; else gpu_check skips this part

    return str(EXECUTION_PROVIDERS[SESSIONS[key][0]]().device)


def check_engine(context, size="large", repeat=REPEAT, require_gpu=True):
    """Every graph at `size` on the CPU EP (the reference), then on each device EP: the part's result."""
    built = references(size, 0 if context.dry_run else repeat)
    dry_run_stop(context, "the CUDA and Triton EPs' sessions are made and run on the GPU")
    use_cuda_home()  # NVRTC and ptxas from the image's toolkit, for the CUDA EP's kernels
    not_run, eps = [], []
    for key in DEVICE_EPS:
        why = where_not_gpu(key) if require_gpu else None
        (not_run.append(f"every graph on {key}: {why}") if why else eps.append(key))
    if require_gpu and not eps:
        raise Skip("neither device EP can run on a GPU here: " + "; ".join(not_run))
    rows, outputs, partitions, mismatches = [], [], {}, []
    for graph, model, feeds, reference, cpu_ms in built:
        for key in eps:
            if time_left(context) < RESERVE_S:
                not_run.append(f"{graph.name} on {key}: the part's time budget ran out")
                continue
            try:
                row, outs, placed, differ = check_graph(graph, model, feeds, reference, key, repeat)
            except Exception as error:  # noqa: BLE001 - one session's failure is a row, the others still run
                not_run.append(f"{graph.name} on {key}: failed: {type(error).__name__}: {error}"[:500])
                continue
            rows.append({**row, "cpu EP ms per run": None if cpu_ms is None else round(cpu_ms, 3)})
            outputs += outs
            partitions.setdefault(graph.name, {})[key] = placed
            mismatches += differ
    passed = sum(not any(m.startswith(f"{r['graph']} on {r['ep']}:") for m in mismatches) for r in rows)
    return {"size": size, "sizes": SIZES[size], "devices": {key: device_label(key) for key in eps},
            "ops": sorted({n.op_type for _, model, *_ in built for n in model.graph.node}),
            "rows": rows, "outputs": outputs, "partitions": partitions, "mismatches": mismatches,
            "not run": not_run, "checks": {"passed": passed, "total": len(rows) + len(not_run)}}


def part_engine_eps(context):
    """(g) ortlab's engine on the GPU: each graph on the CUDA EP and on the Triton EP against the CPU EP."""
    return check_engine(context)

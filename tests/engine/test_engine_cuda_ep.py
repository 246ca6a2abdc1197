"""ortlab.engine's CUDAExecutionProvider (the CUDA C++ kernels of ortlab/cuda/kernels, on the CPU runner here)
against real onnxruntime 1.19.2's CPUExecutionProvider: one-node models of each op on shapes with tails
(columns not a multiple of the block, more rows than the grid), non-power-of-two sizes and several attribute
values; a training-like graph; the partition (exactly the nodes an op kernel accepts, the others to the next
EP with the reason); a session whose nodes land on the CUDA, Triton and CPU EPs; hostile inputs.

Dropout in training mode is checked through its invariants: ORT draws its mask with curand's Philox,
dropout.cu with its own counter-based hash, so the masks differ (by design, not by error).
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlab.cuda import op_kernels
from ortlab.cuda.launcher import CPU_RUNNER, built
from ortlab.engine import InferenceSession, InvalidArgument, KernelFailure, SessionOptions
from ortlab.engine.cuda_execution_provider import CUDAExecutionProvider, node_spec
from ortlab.errors import OrtlabError

CUDA, TRITON, CPU = "CUDAExecutionProvider", "TritonExecutionProvider", "CPUExecutionProvider"
MS = "com.microsoft"
F, I64, B = TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL


@pytest.fixture(scope="module", autouse=True)
def kernels_built():
    """Each source built by g++ once (ortlab.cuda.launcher.built caches it for the process)."""
    for source in ("reduce_sum", "dropout", "layer_norm", "softmax_cross_entropy", "gather_grad"):
        built(source)


def rng(seed=0):
    return np.random.default_rng(seed)


def f32(*shape, seed=0, scale=1.0, shift=0.0):
    return (rng(seed).standard_normal(shape) * scale + shift).astype(np.float32)


def make_model(nodes, feeds, outputs, initializers=()):
    """A model of `nodes` whose inputs are typed after `feeds`' arrays (shapes known), outputs untyped."""
    inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for name, a in feeds.items()]
    outs = [helper.make_tensor_value_info(name, elem, None) for name, elem in outputs]
    graph = helper.make_graph(nodes, "g", inputs, outs, [numpy_helper.from_array(v, k) for k, v in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def ours(model, feeds, providers=(CUDA, CPU), **options):
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=0, **options),
                            providers=list(providers))
    return sess, sess.run(None, feeds)


def theirs(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=[CPU]).run(None, feeds)


def placed(sess):
    """{node name: EP} of the model's own nodes (Memcpy nodes left out)."""
    return {s.node.name: s.provider.type for s in sess.state.steps if not s.node.op_type.startswith("Memcpy")}


def assert_equal_to_ort(model, feeds, rtol=1e-5, atol=1e-5, expect_on_cuda=None):
    sess, got = ours(model, feeds)
    want = theirs(model, feeds)
    for g, w, out in zip(got, want, model.graph.output):
        assert g.dtype == w.dtype and g.shape == w.shape, (out.name, g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol, err_msg=out.name)
    if expect_on_cuda is not None:
        assert {n for n, ep in placed(sess).items() if ep == CUDA} == set(expect_on_cuda)
    return sess, got, want


# ---- one node per op -----------------------------------------------------------------------------
@pytest.mark.parametrize("shape, axes, keepdims", [((37, 300), [-1], 1), ((5, 7, 33), [1, 2], 0),
                                                   ((3, 1000), None, 0), ((9, 1), [1], 0), ((2, 3, 5), [2, -2], 1)])
def test_reduce_sum_equals_ort(shape, axes, keepdims):
    feeds = {"x": f32(*shape)}
    inputs, inits = (["x"], []) if axes is None else (["x", "axes"], [("axes", np.array(axes, np.int64))])
    model = make_model([helper.make_node("ReduceSum", inputs, ["y"], name="n", keepdims=keepdims)], feeds,
                       [("y", F)], inits)
    assert_equal_to_ort(model, feeds, expect_on_cuda={"n"})


def test_reduce_sum_noop_with_empty_axes_equals_ort():
    """An empty axes input with noop_with_empty_axes: y = x (ORT 1.19.2's CPU kernel fails when the axes input
    is left out instead, so the empty one is given)."""
    feeds = {"x": f32(4, 5)}
    model = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="n", noop_with_empty_axes=1)],
                       feeds, [("y", F)], [("axes", np.zeros(0, np.int64))])
    _, got, want = assert_equal_to_ort(model, feeds, expect_on_cuda={"n"})
    np.testing.assert_array_equal(got[0], feeds["x"])


@pytest.mark.parametrize("ratio", [0.3, 0.0, 0.9, None])
def test_dropout_grad_equals_ort(ratio):
    """ORT's CPU kernel divides by 1 - ratio, dropout_grad.cu multiplies by its reciprocal: one rounding apart."""
    feeds = {"dy": f32(37, 300), "mask": rng(1).random((37, 300)) < 0.7}
    inputs = ["dy", "mask"]
    if ratio is not None:
        feeds["ratio"] = np.array(ratio, np.float32)
        inputs.append("ratio")
    model = make_model([helper.make_node("DropoutGrad", inputs, ["dx"], name="n", domain=MS)], feeds, [("dx", F)])
    assert_equal_to_ort(model, feeds, rtol=2 ** -23, atol=0, expect_on_cuda={"n"})


def dropout_model(x, ratio, training, seed=None):
    feeds = {"x": x, "ratio": np.array(ratio, np.float32), "training": np.array(training)}
    attrs = {} if seed is None else {"seed": seed}
    return make_model([helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"], name="n", **attrs)],
                      feeds, [("y", F), ("mask", B)]), feeds


def test_dropout_inference_mode_equals_ort():
    model, feeds = dropout_model(f32(37, 301), 0.5, False)
    _, got, _ = assert_equal_to_ort(model, feeds, rtol=0, atol=0, expect_on_cuda={"n"})
    assert got[1].all()


@pytest.mark.parametrize("ratio", [0.1, 0.5, 0.8])
def test_dropout_training_mode_invariants(ratio):
    """Kept elements are x / (1 - ratio) (x times the float32 reciprocal, as the kernel computes), dropped ones
    0; the kept fraction is 1 - ratio within 5 binomial standard deviations; each run draws a new mask (the
    generator's offset advances) and one seed gives one sequence of masks; ORT's own outputs obey the same."""
    x = f32(101, 199)
    model, feeds = dropout_model(x, ratio, True, seed=7)
    sess, (y, mask) = ours(model, feeds)
    assert placed(sess) == {"n": CUDA}
    scale = np.float32(1) / (np.float32(1) - np.float32(ratio))
    np.testing.assert_array_equal(y[mask], x[mask] * scale)
    assert not y[~mask].any()
    assert abs(mask.mean() - (1 - ratio)) < 5 * np.sqrt(ratio * (1 - ratio) / x.size)
    y2, mask2 = sess.run(None, feeds)
    assert (mask2 != mask).any()
    _, (_, again) = ours(model, feeds)
    np.testing.assert_array_equal(again, mask)
    ort_y, ort_mask = theirs(model, feeds)
    np.testing.assert_allclose(ort_y[ort_mask], x[ort_mask] / np.float32(1 - ratio), rtol=2 ** -23)
    assert not ort_y[~ort_mask].any()


@pytest.mark.parametrize("shape, axis, bias, epsilon", [((37, 300), -1, True, 1e-5), ((4, 9, 33), 1, True, 1e-3),
                                                         ((3, 1000), -1, False, 1e-5), ((6, 1), 1, True, 1e-5)])
def test_layer_norm_equals_ort(shape, axis, bias, epsilon):
    norm = shape[axis:] if axis >= 0 else shape[axis:]
    feeds = {"x": f32(*shape, scale=3, shift=5), "s": f32(*norm, seed=1)}
    if bias:
        feeds["b"] = f32(*norm, seed=2)
    model = make_model([helper.make_node("LayerNormalization", list(feeds), ["y", "mean", "inv_std"], name="n",
                                         axis=axis, epsilon=epsilon)], feeds, [("y", F), ("mean", F), ("inv_std", F)])
    assert_equal_to_ort(model, feeds, rtol=1e-4, atol=1e-4, expect_on_cuda={"n"})


@pytest.mark.parametrize("shape, axis", [((37, 300), -1), ((4, 9, 33), 1), ((3, 1000), 1)])
def test_layer_norm_grad_equals_ort(shape, axis):
    norm = shape[axis:]
    x, s = f32(*shape, scale=2, shift=1), f32(*norm, seed=1)
    forward = make_model([helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "inv_std"], axis=axis)],
                         {"x": x, "s": s}, [("y", F), ("mean", F), ("inv_std", F)])
    _, mean, inv_std = theirs(forward, {"x": x, "s": s})
    feeds = {"dy": f32(*shape, seed=3), "x": x, "s": s, "mean": mean, "inv_std": inv_std}
    model = make_model([helper.make_node("LayerNormalizationGrad", list(feeds), ["dx", "ds", "db"], name="n",
                                         domain=MS, axis=axis)], feeds, [("dx", F), ("ds", F), ("db", F)])
    assert_equal_to_ort(model, feeds, rtol=1e-4, atol=1e-4, expect_on_cuda={"n"})


def sce_feeds(n, classes, ignore_index, label_dtype=np.int64, seed=0):
    labels = rng(seed + 1).integers(0, classes, size=n).astype(label_dtype)
    if ignore_index is not None and ignore_index >= 0:
        labels[::5] = ignore_index
    return {"scores": f32(n, classes, seed=seed, scale=4), "labels": labels}


SCE_CASES = [(37, 300, 3, np.int64), (37, 10, None, np.int64), (50, 1000, 0, np.int32), (9, 7, -100, np.int64)]


@pytest.mark.parametrize("n, classes, ignore_index, label_dtype", SCE_CASES)
def test_softmax_cross_entropy_and_grad_equal_ort(n, classes, ignore_index, label_dtype):
    feeds = sce_feeds(n, classes, ignore_index, label_dtype)
    attrs = {"reduction": "mean", **({} if ignore_index is None else {"ignore_index": ignore_index})}
    model = make_model([helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss", "log_prob"],
                                         name="n", **attrs)], feeds, [("loss", F), ("log_prob", F)])
    _, _, (_, log_prob) = assert_equal_to_ort(model, feeds, expect_on_cuda={"n"})
    grad_feeds = {"dy": np.array(0.7, np.float32), "log_prob": log_prob, "labels": feeds["labels"]}
    grad = make_model([helper.make_node("SoftmaxCrossEntropyLossGrad", list(grad_feeds), ["dscores"], name="g",
                                        domain=MS, **attrs)], grad_feeds, [("dscores", F)])
    assert_equal_to_ort(grad, grad_feeds, rtol=1e-5, atol=1e-7, expect_on_cuda={"g"})


def test_softmax_cross_entropy_with_every_sample_ignored_is_zero_as_in_ort():
    """ORT gives loss 0 and gradient 0 when no sample counts (the normalize factor is 0); softmax_cross_entropy.cu
    divided by it and gave NaN."""
    feeds = {"scores": f32(6, 5), "labels": np.full(6, 2, np.int64)}
    model = make_model([helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["loss", "log_prob"],
                                         ignore_index=2)], feeds, [("loss", F), ("log_prob", F)])
    _, (loss, log_prob), _ = assert_equal_to_ort(model, feeds)
    assert loss == 0
    grad_feeds = {"dy": np.array(1.0, np.float32), "log_prob": log_prob, "labels": feeds["labels"]}
    grad = make_model([helper.make_node("SoftmaxCrossEntropyLossGrad", list(grad_feeds), ["d"], domain=MS,
                                        ignore_index=2)], grad_feeds, [("d", F)])
    _, (d,), _ = assert_equal_to_ort(grad, grad_feeds, rtol=0, atol=0)
    assert not d.any()


@pytest.mark.parametrize("path", ["sorted", "atomic"])
@pytest.mark.parametrize("shape, axis, indices_shape, index_dtype", [
    ((7, 5, 3), 1, (4, 3), np.int64), ((50, 33), 0, (130,), np.int64), ((2, 3, 11), -1, (6,), np.int32)])
def test_gather_grad_equals_ort(path, shape, axis, indices_shape, index_dtype):
    """The sorted path sums each element's terms in position order, as ORT's CPU kernel does: equal bit for bit."""
    a = axis % len(shape)
    indices = rng().integers(-shape[a], shape[a], size=indices_shape).astype(index_dtype)  # repeats, negatives
    feeds = {"indices": indices, "dy": f32(*shape[:a], *indices_shape, *shape[a + 1:], seed=1)}
    model = make_model([helper.make_node("GatherGrad", ["shape", "indices", "dy"], ["dx"], name="n", domain=MS,
                                         axis=axis)], feeds, [("dx", F)], [("shape", np.array(shape, np.int64))])
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=0),
                            providers=[(CUDA, {"gather_grad": path}), CPU])
    (got,) = sess.run(None, feeds)
    (want,) = theirs(model, feeds)
    assert placed(sess) == {"n": CUDA} and got.shape == want.shape
    if path == "sorted":
        np.testing.assert_array_equal(got, want)
    else:
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# ---- a training-like graph -----------------------------------------------------------------------
def training_like():
    """Embedding lookup, LayerNorm, Dropout (inference mode: both runtimes keep all), a projection, the loss and
    its gradient, back through the projection and LayerNorm to the embedding (GatherGrad), ReduceSum of the
    bias gradient, and a DropoutGrad with a given mask."""
    tokens, vocab, hidden, classes = 37, 11, 33, 7
    r = rng(5)
    feeds = {"ids": r.integers(0, vocab, tokens).astype(np.int64), "labels": r.integers(0, classes, tokens),
             "mask": r.random((tokens, hidden)) < 0.8}
    feeds["labels"][::4] = 1
    inits = [("emb", f32(vocab, hidden, seed=6)), ("s", f32(hidden, seed=7)), ("b", f32(hidden, seed=8)),
             ("w", f32(hidden, classes, seed=9)), ("wt", None), ("ratio", np.array(0.25, np.float32)),
             ("off", np.array(False)), ("one", np.array(1.0, np.float32)), ("axes0", np.array([0], np.int64)),
             ("axes1", np.array([-1], np.int64)), ("emb_shape", np.array([vocab, hidden], np.int64))]
    inits[4] = ("wt", np.ascontiguousarray(inits[3][1].T))
    node = helper.make_node
    nodes = [node("Gather", ["emb", "ids"], ["e"], name="gather"),
             node("LayerNormalization", ["e", "s", "b"], ["h", "mean", "inv_std"], name="ln"),
             node("Dropout", ["h", "ratio", "off"], ["hd", "hmask"], name="dropout"),
             node("MatMul", ["hd", "w"], ["logits"], name="proj"),
             node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss", "log_prob"], name="sce", ignore_index=1),
             node("SoftmaxCrossEntropyLossGrad", ["one", "log_prob", "labels"], ["dlogits"], name="sce_grad",
                  domain=MS, ignore_index=1),
             node("MatMul", ["dlogits", "wt"], ["dh"], name="proj_grad"),
             node("DropoutGrad", ["dh", "mask", "ratio"], ["dhd"], name="dropout_grad", domain=MS),
             node("LayerNormalizationGrad", ["dhd", "e", "s", "mean", "inv_std"], ["de", "ds", "db"], name="ln_grad",
                  domain=MS),
             node("GatherGrad", ["emb_shape", "ids", "de"], ["demb"], name="gather_grad", domain=MS),
             node("ReduceSum", ["dlogits", "axes0"], ["dbias"], name="bias_grad", keepdims=0),
             node("ReduceSum", ["dh", "axes1"], ["dh_rows"], name="rows", keepdims=1)]
    outputs = [("loss", F), ("ds", F), ("db", F), ("demb", F), ("dbias", F), ("dh_rows", F)]
    return make_model(nodes, feeds, outputs, inits), feeds


def test_a_training_like_graph_equals_ort_and_runs_its_kernels_on_the_cuda_ep():
    model, feeds = training_like()
    cuda_nodes = {"ln", "dropout", "sce", "sce_grad", "dropout_grad", "ln_grad", "gather_grad", "rows"}
    sess, _, _ = assert_equal_to_ort(model, feeds, rtol=1e-4, atol=1e-5, expect_on_cuda=cuda_nodes)
    # the bias gradient sums over the leading axis, which reduce_sum.cu does not do
    assert {n for n, ep in placed(sess).items() if ep == CPU} == {"gather", "proj", "proj_grad", "bias_grad"}
    # inputs ORT's CUDA kernels read on the host (InputMemoryType CPU) get no copy: ratio, training_mode, axes, shape
    copied = {name for s in sess.state.steps if s.node.op_type.startswith("Memcpy") for name in s.node.input_names}
    assert copied.isdisjoint({"ratio", "off", "axes1", "emb_shape"}) and copied


# ---- what is declined, and why -------------------------------------------------------------------
DECLINED = [
    (helper.make_node("ReduceSum", ["x", "axes0"], ["y"], name="n"), {"x": f32(4, 6)}, [("axes0", np.array([0]))],
     "not the trailing axes"),
    (helper.make_node("ReduceSum", ["x", "a"], ["y"], name="n"), {"x": f32(4, 6), "a": np.array([1])}, [],
     "axes is a runtime input"),
    (helper.make_node("LayerNormalization", ["x", "s"], ["y"], name="n"),
     {"x": f32(4, 6).astype(np.float64), "s": np.ones(6)}, [], "input 0 is float64", TensorProto.DOUBLE),
    (helper.make_node("SoftmaxCrossEntropyLoss", ["x", "l"], ["y"], name="n", reduction="sum"),
     {"x": f32(4, 6), "l": np.arange(4)}, [], "reduction 'sum'"),
    (helper.make_node("SoftmaxCrossEntropyLoss", ["x", "l", "w"], ["y"], name="n"),
     {"x": f32(4, 6), "l": np.arange(4), "w": np.ones(6, np.float32)}, [], "class weights"),
    (helper.make_node("SoftmaxCrossEntropyLoss", ["x", "l"], ["y"], name="n"),
     {"x": f32(2, 6, 3), "l": np.zeros((2, 3), np.int64)}, [], "rank 3"),
    (helper.make_node("Softmax", ["x"], ["y"], name="n"), {"x": f32(4, 6)}, [], "no CUDA C++ kernel"),
]


@pytest.mark.parametrize("case", DECLINED, ids=[d[3] for d in DECLINED])
def test_a_declined_node_falls_back_to_the_cpu_ep_with_the_reason(case):
    node, feeds, inits, reason, out_type = (*case, F)[:5]
    model = make_model([node], feeds, [("y", out_type)], [(k, np.asarray(v, np.int64)) for k, v in inits])
    sess, got = ours(model, feeds, log_severity_level=0)
    assert placed(sess) == {"n": CPU}
    assert reason in CUDAExecutionProvider().find_kernel(sess.graph.nodes()[0])[1]
    assert f"{CUDA} kernel not found in registries for Op type: {node.op_type} node name: n" in sess.log.text()
    assert reason in sess.log.text()
    np.testing.assert_allclose(got[0], theirs(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_the_partition_claims_exactly_the_nodes_an_op_kernel_accepts():
    """In a zoo model's training graph (GPT, ORT's gradient builder), the CUDA EP takes every Dropout,
    DropoutGrad, GatherGrad, SoftmaxCrossEntropyLoss(Grad) node and no other, except the Memcpy nodes it adds;
    the graph's ReduceSum nodes read their axes at run time and are declined."""
    from engine_models import training_graph

    model, feeds = training_graph("gpt", "ort", batch=2, seq=5)
    sess, got = ours(model, feeds)
    ep = CUDAExecutionProvider()
    for node in sess.graph.nodes():
        if node.op_type.startswith("Memcpy"):
            continue
        found, why = ep.find_kernel(node)
        assert (placed(sess)[node.name] == CUDA) == (found is not None), (node.op_type, why)
    claimed = {s.node.op_type for s in sess.state.steps if s.provider.type == CUDA}
    assert claimed == {"Dropout", "DropoutGrad", "GatherGrad", "SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad",
                       "MemcpyFromHost", "MemcpyToHost"}
    want = theirs(model, feeds)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


# ---- three EPs in one session ----------------------------------------------------------------------
def test_a_session_on_the_cuda_triton_and_cpu_eps_equals_ort_with_copies_between_them():
    """LayerNorm (CUDA) -> Softmax (Triton: the CUDA EP has no kernel) -> ReduceSum (CUDA) and Relu (CPU) ->
    ReduceSum (CUDA). Values between the two device EPs pass through the host as in ORT (a MemcpyToHost of the
    producer's EP, a MemcpyFromHost of the reader's): Triton's kernels get torch tensors, the CUDA EP's numpy."""
    feeds = {"x": f32(37, 300, scale=2), "s": f32(300, seed=1), "b": f32(300, seed=2)}
    node = helper.make_node
    model = make_model([node("LayerNormalization", ["x", "s", "b"], ["h"], name="ln"),
                        node("Softmax", ["h"], ["p"], name="softmax"),
                        node("ReduceSum", ["p", "axes"], ["z1"], name="rs1", keepdims=0),
                        node("Relu", ["p"], ["q"], name="relu"),
                        node("ReduceSum", ["q", "axes"], ["z2"], name="rs2", keepdims=1)],
                       feeds, [("z1", F), ("z2", F), ("h", F)], [("axes", np.array([-1], np.int64))])
    sess, got = ours(model, feeds, providers=(CUDA, TRITON, CPU))
    assert placed(sess) == {"ln": CUDA, "softmax": TRITON, "rs1": CUDA, "relu": CPU, "rs2": CUDA}
    copies = sorted((s.node.op_type, s.provider.type) for s in sess.state.steps if s.node.op_type.startswith("Memcpy"))
    assert copies == [("MemcpyFromHost", CUDA), ("MemcpyFromHost", CUDA), ("MemcpyFromHost", TRITON),
                      ("MemcpyToHost", CUDA), ("MemcpyToHost", TRITON)]
    for g, w in zip(got, theirs(model, feeds)):
        assert isinstance(g, np.ndarray)
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_a_session_builds_no_source_again():
    """Each .cu source is built by g++ once per process (the module fixture built them): sessions reuse it."""
    before = built.cache_info()
    model, feeds = training_like()
    ours(model, feeds)
    ours(model, feeds)
    after = built.cache_info()
    assert after.misses == before.misses and after.hits > before.hits


def test_the_device_is_labelled_as_what_runs_the_kernels():
    ep = CUDAExecutionProvider()
    assert ep.device.type == "GPU" and ep.device.backing == CPU_RUNNER
    assert "g++" in CPU_RUNNER and not ep.is_cpu_based


# ---- hostile inputs ---------------------------------------------------------------------------------
def one_node_session(node, feeds, inits=()):
    model = make_model([node], feeds, [(o, F) for o in node.output], inits)
    return InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=0),
                            providers=[CUDA, CPU])


def test_a_label_outside_the_classes_is_a_clear_error_not_an_out_of_bounds_read():
    feeds = {"x": f32(4, 10), "l": np.array([1, 2, 3, 10])}
    sess = one_node_session(helper.make_node("SoftmaxCrossEntropyLoss", ["x", "l"], ["y"]), feeds)
    with pytest.raises(KernelFailure, match=r"label 10 is outside \[0, 10\)"):
        sess.run(None, feeds)


def test_a_dropout_ratio_of_one_is_refused():
    feeds = {"x": f32(4, 10), "r": np.array(1.0, np.float32), "t": np.array(True)}
    sess = one_node_session(helper.make_node("Dropout", ["x", "r", "t"], ["y"]), feeds)
    with pytest.raises(KernelFailure, match=r"ratio must be in \[0, 1\), got 1.0"):
        sess.run(None, feeds)


def test_a_gather_grad_index_out_of_range_is_refused():
    feeds = {"i": np.array([0, 5]), "dy": f32(2, 3)}
    sess = one_node_session(helper.make_node("GatherGrad", ["shape", "i", "dy"], ["dx"], domain=MS), feeds,
                            [("shape", np.array([5, 3], np.int64))])
    with pytest.raises(KernelFailure, match=r"outside \[-5, 5\)"):
        sess.run(None, feeds)


def test_an_unknown_gather_grad_path_is_refused_when_the_session_is_made():
    feeds = {"x": f32(2, 3)}
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], feeds, [("y", F)])
    with pytest.raises(OrtlabError, match="gather_grad='fast'"):
        InferenceSession(model.SerializeToString(), providers=[(CUDA, {"gather_grad": "fast"})])
    with pytest.raises(InvalidArgument, match="does not take the provider options"):
        InferenceSession(model.SerializeToString(), providers=[(CUDA, {"device_id": 3, "arena": 1})])


def test_the_op_kernels_refuse_what_they_lack_directly_too():
    with pytest.raises(op_kernels.CudaOpError, match="input 0 is float64"):
        op_kernels.run_op("ReduceSum", "", {}, [np.ones((2, 3))])
    (total,) = op_kernels.run_op("ReduceSum", "ai.onnx", {"keepdims": 0}, [np.ones((2, 3), np.float32)])
    assert total.shape == () and total == 6
    with pytest.raises(op_kernels.CudaOpError, match="no CUDA C\\+\\+ kernel for ai.onnx:Softmax"):
        op_kernels.run_op("Softmax", "", {}, [np.ones((2, 3), np.float32)])
    with pytest.raises(op_kernels.CudaOpError, match="scale has 4 elements"):
        op_kernels.run_op("LayerNormalization", "", {}, [f32(2, 3), f32(4)])
    with pytest.raises(op_kernels.CudaOpError, match="dY has shape"):
        op_kernels.run_op("GatherGrad", MS, {}, [np.array([4, 3]), np.array([0, 1]), f32(3, 3)])
    with pytest.raises(op_kernels.CudaOpError, match="ratio must be in"):
        op_kernels.run_op("DropoutGrad", MS, {}, [f32(2), np.ones(2, bool), np.array(-0.5, np.float32)])


def test_the_eps_view_of_a_node_is_its_attributes_dtypes_ranks_and_constants():
    feeds = {"x": f32(4, 6)}
    model = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], keepdims=0)], feeds, [("y", F)],
                       [("axes", np.array([-1], np.int64))])
    sess, _ = ours(model, feeds)
    spec = node_spec(sess.graph.nodes()[0])
    assert (spec.attributes, spec.dtypes, spec.ranks, spec.opset) == ({"keepdims": 0}, ("float32", "int64"),
                                                                      (2, 1), 17)
    np.testing.assert_array_equal(spec.constants[1], [-1])


def test_a_session_knows_the_cuda_ep_by_name_without_importing_its_module():
    import subprocess
    import sys

    code = ("from ortlab.engine.inference_session import make_providers; "
            "print([p.type for p in make_providers(['CUDAExecutionProvider'])])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "['CUDAExecutionProvider', 'CPUExecutionProvider']"


def test_the_op_kernels_run_through_the_cupy_launcher_with_cupy_replaced_by_the_cpu_runner(monkeypatch):
    """The GPU path's plumbing: each op's launches through ortlab.cuda.launcher.CupyLauncher (its block 256 and
    larger grids), CuPy replaced by test_gpu_check's stand-in whose kernels run on the CPU runner."""
    import sys

    from ortlab.cuda.launcher import CupyLauncher
    from test_gpu_check import _fake_cupy

    fake = _fake_cupy()
    for name in ("zeros", "ascontiguousarray", "float32", "int64", "bool_"):
        setattr(fake, name, getattr(np, name))
    monkeypatch.setitem(sys.modules, "cupy", fake)

    def call(attributes, **options):
        return op_kernels.OpCall(attributes, make_launcher=lambda s: CupyLauncher(s, b"cubin of " + s.encode()),
                                 options=options)

    x, s, b = f32(300, 37, scale=3, shift=5), f32(37, seed=1), f32(37, seed=2)
    got = op_kernels.run_op("LayerNormalization", "", {"epsilon": 1e-5}, [x, s, b], call({"epsilon": 1e-5}))
    want = theirs(make_model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "m", "r"])],
                             {"x": x, "s": s, "b": b}, [("y", F), ("m", F), ("r", F)]), {"x": x, "s": s, "b": b})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-4)
    feeds = sce_feeds(300, 33, 2)
    (loss, log_prob) = op_kernels.run_op("SoftmaxCrossEntropyLoss", "", {"ignore_index": 2}, list(feeds.values()),
                                         call({"ignore_index": 2}))
    model = make_model([helper.make_node("SoftmaxCrossEntropyLoss", ["scores", "labels"], ["l", "p"], ignore_index=2)],
                       feeds, [("l", F), ("p", F)])
    for g, w in zip((loss, log_prob), theirs(model, feeds)):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-5)

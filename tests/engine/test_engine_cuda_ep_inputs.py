"""The CUDA EP (ortlab/cuda/kernels on the CPU runner) on held-out inputs, checked against onnxruntime 1.19.2's
CPU EP: ranks 1, 3 and 4, one huge column, one long row, attributes and dtypes the kernels do not take (each
declined, with its reason, to the CPU EP), ORT's defaults, zoo training graphs with the Triton EP too, onnx's
backend node tests, io_binding and a session run twice. Where ORT 1.19.2 itself refuses a valid input, the test
pins ORT's behaviour next to ortlab's answer.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

from ortlab.engine import InferenceSession, SessionOptions
from ortlab.errors import OrtlabError
from ortlab.ir import Graph

pytestmark = pytest.mark.heldout

CUDA, TRITON, CPU = "CUDAExecutionProvider", "TritonExecutionProvider", "CPUExecutionProvider"
MS = "com.microsoft"


def rng(seed=0):
    return np.random.default_rng(seed)


def f32(*shape, seed=0):
    return (rng(seed).standard_normal(shape) * 2 + 1).astype(np.float32)


def make_model(nodes, feeds, outputs, initializers=(), opset=17):
    """A model of `nodes`, inputs typed after `feeds`, outputs without a declared type (ORT infers them)."""
    inputs = [helper.make_tensor_value_info(name, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape)
              for name, a in feeds.items()]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_empty_tensor_value_info(o) for o in outputs],
                              [numpy_helper.from_array(np.asarray(v), k) for k, v in initializers])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset), helper.make_opsetid(MS, 1)])
    model.ir_version = 8
    return model


def session(model, providers=(CUDA, CPU), level=0):
    return InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level),
                            providers=list(providers))


def theirs(model, feeds):
    return ort.InferenceSession(model.SerializeToString(), providers=[CPU]).run(None, feeds)


def placed(sess):
    """{op_type: EP} of the model's own nodes (Memcpy nodes left out)."""
    return {s.node.op_type: s.provider.type for s in sess.state.steps if not s.node.op_type.startswith("Memcpy")}


def assert_equal_to_ort(model, feeds, on, rtol=1e-4, atol=1e-4):
    """Ours (CUDA EP first) equals ORT's CPU EP output by output, and the node ran on EP `on`."""
    sess = session(model)
    got, want = sess.run(None, feeds), theirs(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
    assert set(placed(sess).values()) == {on}, placed(sess)
    return got


# ---- ORT's defaults ----------------------------------------------------------------------------
@pytest.mark.parametrize("op", ["SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad"])
def test_a_label_of_minus_one_is_ignored_when_ignore_index_is_absent_as_in_ort(op):
    """ORT's kernels default ignore_index to -1 (orttraining/orttraining/training_ops/cpu/loss/
    softmax_cross_entropy_loss.cc, cuda/loss/softmax_cross_entropy_loss_impl.cc): a label -1 with no
    ignore_index attribute is an ignored sample, not a bad label. The CUDA EP refused it."""
    scores, labels = f32(6, 4), np.array([0, 1, 2, 3, 0, -1])
    if op == "SoftmaxCrossEntropyLoss":
        feeds, outputs = {"x": scores, "l": labels}, ["loss", "log_prob"]
        node = helper.make_node(op, ["x", "l"], outputs)
    else:
        log_prob = scores - np.log(np.exp(scores).sum(1, keepdims=True))
        feeds, outputs = {"dy": np.array(0.7, np.float32), "lp": log_prob, "l": labels}, ["d"]
        node = helper.make_node(op, ["dy", "lp", "l"], outputs, domain=MS)
    got = assert_equal_to_ort(make_model([node], feeds, outputs), feeds, on=CUDA, rtol=1e-5, atol=1e-6)
    if op == "SoftmaxCrossEntropyLoss":
        np.testing.assert_allclose(got[0], -np.mean(got[1][np.arange(5), labels[:5]]), rtol=1e-6)
    else:
        assert not got[0][5].any()


# ---- io_binding and a session run twice --------------------------------------------------------------
def ln_dropout_sum():
    """LayerNormalization -> Dropout (training) -> ReduceSum over the last axis, all three on the CUDA EP."""
    x = f32(6, 10)
    node = helper.make_node
    model = make_model([node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv_std"]),
                        node("Dropout", ["y", "ratio", "t"], ["d", "mask"], seed=3),
                        node("ReduceSum", ["d", "axes"], ["z"], keepdims=0)],
                       {"x": x, "t": np.array(True)}, ["y", "z", "mask", "d"],
                       [("s", f32(10, seed=1)), ("b", f32(10, seed=2)), ("ratio", np.array(0.5, np.float32)),
                        ("axes", np.array([-1], np.int64))])
    return model, {"x": x, "t": np.array(True)}


def assert_dropout_invariants(y, z, mask, d):
    np.testing.assert_array_equal(d[mask], y[mask] * np.float32(2))
    assert not d[~mask].any()
    np.testing.assert_allclose(z, d.sum(-1), rtol=1e-5, atol=1e-5)


def test_io_binding_with_the_cuda_ep_equals_ort_and_each_run_draws_a_new_mask():
    model, feeds = ln_dropout_sum()
    sess = session(model, level=99)
    assert set(placed(sess).values()) == {CUDA}
    (want_y,) = theirs(model, feeds)[:1]
    binding = sess.io_binding()
    binding.bind_cpu_input("x", feeds["x"])
    binding.bind_cpu_input("t", feeds["t"])
    binding.bind_output("y", "cuda")
    binding.bind_output("z")
    binding.bind_output("mask", "cuda")
    d_buffer = np.empty((6, 10), np.float32)
    binding.bind_ortvalue_output("d", d_buffer)
    runs = []
    for _ in range(2):
        sess.run_with_iobinding(binding)
        runs.append([np.array(v) for v in binding.copy_outputs_to_cpu()])
        y, z, mask, d = runs[-1]
        np.testing.assert_allclose(y, want_y, rtol=1e-4, atol=1e-4)
        assert_dropout_invariants(y, z, mask, d)
        np.testing.assert_array_equal(d_buffer, d)
    assert (runs[0][2] != runs[1][2]).any()
    plain = [sess.run(None, feeds) for _ in range(2)]
    for y, z, mask, d in plain:
        assert_dropout_invariants(y, z, mask, d)
    assert (plain[0][2] != plain[1][2]).any()


@pytest.mark.parametrize("providers", [(CPU,), (CUDA, CPU)])
def test_an_output_bound_to_a_host_buffer_of_another_shape_is_refused_clearly(providers):
    """ReduceSum gives [6]; the bound host buffer holds 7. On the CPU EP the frame's shape verification refuses
    it (as ORT's); from the CUDA EP the value is copied into the buffer after the run, which raised numpy's
    'could not broadcast' (ORT's copy, core/framework/data_transfer_manager.cc, fails 'Tensor size mismatch')."""
    model, feeds = ln_dropout_sum()
    sess = session(model, providers)
    binding = sess.io_binding()
    binding.bind_cpu_input("x", feeds["x"])
    binding.bind_cpu_input("t", feeds["t"])
    binding.bind_ortvalue_output("z", np.empty(7, np.float32))
    with pytest.raises(OrtlabError, match=r"shape verification failed|Tensor size mismatch"):
        sess.run_with_iobinding(binding)


# ---- inputs ORT refuses are refused, not computed -------------------------------------------------
def ort_refuses(model, feeds):
    with pytest.raises(Exception) as caught:  # noqa: PT011 (ORT's pybind errors share no base class but Exception)
        theirs(model, feeds)
    return str(caught.value)


def labels_of_another_shape(op, labels):
    if op == "SoftmaxCrossEntropyLoss":
        feeds = {"x": f32(4, 5), "l": labels}
        return make_model([helper.make_node(op, ["x", "l"], ["loss"])], feeds, ["loss"]), feeds
    feeds = {"dy": np.array(1.0, np.float32), "lp": f32(4, 5), "l": labels}
    return make_model([helper.make_node(op, ["dy", "lp", "l"], ["d"], domain=MS)], feeds, ["d"]), feeds


@pytest.mark.parametrize("op", ["SoftmaxCrossEntropyLoss", "SoftmaxCrossEntropyLossGrad"])
@pytest.mark.parametrize("labels", [np.array([[0], [1], [2], [3]]), np.array([0, 1, 2, 3, 4]), np.array([0, 1, 2])],
                         ids=["N x 1", "N + 1", "N - 1"])
def test_labels_not_of_shape_n_are_refused_as_ort_refuses_them(op, labels):
    """Scores [4, 5] take labels [4]. The CUDA EP summed the first 4 of 5 labels, read [4, 1] as [4], and
    read past 3 labels (the CPU runner's bounds check stopped it; a GPU would read garbage)."""
    model, feeds = labels_of_another_shape(op, labels)
    ort_refuses(model, feeds)
    sess = session(model)
    assert set(placed(sess).values()) == {CUDA}
    with pytest.raises(OrtlabError, match=r"labels have shape .* the scores \[N, C\] = \(4, 5\) take \(4,\)"):
        sess.run(None, feeds)


@pytest.mark.parametrize("ratio", [1.0, -0.1])
def test_a_dropout_ratio_outside_0_1_is_refused_in_inference_mode_too_as_ort_does(ratio):
    """ORT's Dropout checks the ratio before it looks at training_mode (onnxruntime/core/providers/cpu/nn/
    dropout_op.h, cuda/nn/dropout.cc); the CUDA EP returned y = x."""
    feeds = {"x": f32(5, 6), "r": np.array(ratio, np.float32), "t": np.array(False)}
    model = make_model([helper.make_node("Dropout", ["x", "r", "t"], ["y", "mask"])], feeds, ["y", "mask"])
    assert "ratio" in ort_refuses(model, feeds)
    with pytest.raises(OrtlabError, match=r"ratio must be in \[0, 1\)"):
        session(model).run(None, feeds)


def test_reduce_sum_axes_of_rank_2_are_refused_as_ort_refuses_them():
    """ORT: 'An axes tensor must be a vector tensor' (core/providers/cpu/reduction/reduction_ops.cc); the CUDA EP
    flattened [[-1]] and reduced."""
    feeds = {"x": f32(3, 4)}
    model = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"])], feeds, ["y"],
                       [("axes", np.array([[-1]], np.int64))])
    assert "vector" in ort_refuses(model, feeds)
    sess = session(model)
    assert placed(sess) == {"ReduceSum": CPU}
    assert "axes of shape (1, 1)" in sess.state.providers[CUDA].find_kernel(sess.graph.nodes()[0])[1]


# ---- where ORT 1.19.2 itself refuses or errs, pinned next to the CUDA EP's answer -------------------------
def test_layer_norm_of_rows_far_from_zero_is_nan_in_ort_and_right_on_the_cuda_ep():
    """ORT's CPU LayerNormalization takes var = E[x^2] - E[x]^2 in float (core/providers/cpu/nn/layer_norm_impl.cc):
    for [30000, 30001, 30002] the difference cancels to a negative number and ORT returns NaN. layer_norm.cu's
    Welford update keeps the centred sum: the float64 answer."""
    x = np.array([[3e4, 3e4 + 1, 3e4 + 2], [1.0, 2.0, 4.0]], np.float32)
    feeds = {"x": x, "s": np.ones(3, np.float32)}
    model = make_model([helper.make_node("LayerNormalization", ["x", "s"], ["y", "mean", "inv_std"])], feeds,
                       ["y", "mean", "inv_std"])
    ort_y = theirs(model, feeds)[0]
    assert np.isnan(ort_y[0]).all() and np.isfinite(ort_y[1]).all()
    sess = session(model)
    y, mean, inv_std = sess.run(None, feeds)
    assert placed(sess) == {"LayerNormalization": CUDA}
    x64 = x.astype(np.float64)
    want = (x64 - x64.mean(1, keepdims=True)) / np.sqrt(x64.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(y[1], ort_y[1], rtol=1e-5, atol=1e-6)


def test_layer_norm_grad_over_one_element_is_refused_by_ort_and_zero_on_the_cuda_ep():
    """ORT's CPU LayerNormalizationGrad enforces that the normalized size is not 1 (orttraining/orttraining/
    training_ops/cpu/nn/layer_norm.cc). The gradient there is plain: xhat = 0, so dx = 0, dscale = 0, dbias = sum dy."""
    x, dy = f32(7, 1), f32(7, 1, seed=1)
    feeds = {"dy": dy, "x": x, "s": f32(1, seed=2), "mean": x, "inv_std": np.full((7, 1), 316.2, np.float32)}
    model = make_model([helper.make_node("LayerNormalizationGrad", list(feeds), ["dx", "ds", "db"], domain=MS)],
                       feeds, ["dx", "ds", "db"])
    assert "M != 1" in ort_refuses(model, feeds)
    sess = session(model)
    dx, ds, db = sess.run(None, feeds)
    assert placed(sess) == {"LayerNormalizationGrad": CUDA}
    assert not dx.any() and not ds.any()
    np.testing.assert_allclose(db, dy.sum(0), rtol=1e-6)


def test_reduce_sum_with_no_axes_and_noop_with_empty_axes_is_x_as_onnx_says_where_ort_fails():
    """ONNX: empty axes with noop_with_empty_axes=1 leave x as it is. ORT 1.19.2's CPU kernel fails when the axes
    input is left out ('Reduction on all axes, output size should be 1'); the CUDA EP returns x."""
    feeds = {"x": f32(3, 4)}
    model = make_model([helper.make_node("ReduceSum", ["x"], ["y"], noop_with_empty_axes=1)], feeds, ["y"])
    assert "output size should be 1" in ort_refuses(model, feeds)
    sess = session(model)
    (y,) = sess.run(None, feeds)
    assert placed(sess) == {"ReduceSum": CUDA}
    np.testing.assert_array_equal(y, feeds["x"])


# ---- one node per op on held-out shapes, attributes and dtypes: claimed and equal, or declined to the CPU EP -----
def reduce_sum_case(shape, axes, keepdims=1, noop=0, dtype=np.float32, opset=17):
    feeds = {"x": f32(*shape).astype(dtype)}
    if opset < 13:
        attrs = {} if axes is None else {"axes": axes}
        return make_model([helper.make_node("ReduceSum", ["x"], ["y"], keepdims=keepdims, **attrs)], feeds, ["y"],
                          opset=opset), feeds
    inputs, inits = (["x"], []) if axes is None else (["x", "axes"], [("axes", np.array(axes, np.int64))])
    return make_model([helper.make_node("ReduceSum", inputs, ["y"], keepdims=keepdims, noop_with_empty_axes=noop)],
                      feeds, ["y"], inits), feeds


def layer_norm_case(shape, axis, epsilon=1e-5, bias=True, dtype=np.float32, stash=None):
    norm = shape[axis % len(shape):]
    feeds = {"x": f32(*shape).astype(dtype), "s": f32(*norm, seed=1).astype(dtype)}
    if bias:
        feeds["b"] = f32(*norm, seed=2).astype(dtype)
    attrs = {"axis": axis, "epsilon": epsilon, **({} if stash is None else {"stash_type": stash})}
    outputs = ["y", "mean", "inv_std"] if dtype == np.float32 else ["y"]
    return make_model([helper.make_node("LayerNormalization", list(feeds), outputs, **attrs)], feeds, outputs), feeds


def layer_norm_grad_case(shape, axis):
    x, s = f32(*shape), f32(*shape[axis % len(shape):], seed=1)
    forward = make_model([helper.make_node("LayerNormalization", ["x", "s"], ["y", "m", "r"], axis=axis)],
                         {"x": x, "s": s}, ["y", "m", "r"])
    _, mean, inv_std = theirs(forward, {"x": x, "s": s})
    feeds = {"dy": f32(*shape, seed=3), "x": x, "s": s, "m": mean, "r": inv_std}
    return make_model([helper.make_node("LayerNormalizationGrad", list(feeds), ["dx", "ds", "db"], domain=MS,
                                        axis=axis)], feeds, ["dx", "ds", "db"]), feeds


def sce_case(n, classes, reduction="mean", ignore=None, label_dtype=np.int64, weights=False, extra=(), grad=False):
    scores = f32(n, classes, *extra)
    labels = rng(1).integers(0, classes, size=(n, *extra)).astype(label_dtype)
    if ignore is not None:
        labels.reshape(-1)[::3] = ignore
    attrs = {"reduction": reduction, **({} if ignore is None else {"ignore_index": ignore})}
    feeds = {"x": scores, "l": labels, **({"w": np.abs(f32(classes, seed=2))} if weights else {})}
    model = make_model([helper.make_node("SoftmaxCrossEntropyLoss", list(feeds), ["loss", "lp"], **attrs)], feeds,
                       ["loss", "lp"])
    if not grad:
        return model, feeds
    log_prob = theirs(model, feeds)[1]
    dy = np.array(0.7, np.float32) if reduction != "none" else f32(n, *extra, seed=4)
    feeds = {"dy": dy, "lp": log_prob, "l": labels, **({"w": feeds["w"]} if weights else {})}
    return make_model([helper.make_node("SoftmaxCrossEntropyLossGrad", list(feeds), ["d"], domain=MS, **attrs)],
                      feeds, ["d"]), feeds


def gather_grad_case(shape, axis, indices, dtype=np.float32):
    a = axis % len(shape)
    feeds = {"i": indices, "dy": f32(*shape[:a], *indices.shape, *shape[a + 1:]).astype(dtype)}
    return make_model([helper.make_node("GatherGrad", ["shape", "i", "dy"], ["dx"], domain=MS, axis=axis)], feeds,
                      ["dx"], [("shape", np.array(shape, np.int64))]), feeds


def dropout_case(shape, ratio, training, dtype=np.float32, outputs=("y", "mask"), opset=17):
    feeds, inputs = {"x": f32(*shape).astype(dtype)}, ["x"]
    if ratio is not None or training is not None:
        inputs.append("" if ratio is None else "r")
        if ratio is not None:
            feeds["r"] = np.array(ratio, np.float32)
    if training is not None:
        inputs.append("t")
        feeds["t"] = np.array(training)
    return make_model([helper.make_node("Dropout", inputs, list(outputs))], feeds, list(outputs), opset=opset), feeds


def dropout_grad_case(ratio, training=None, dtype=np.float32, ratio_dtype=np.float32):
    feeds = {"dy": f32(5, 6).astype(dtype), "mask": rng(1).random((5, 6)) < 0.5, "r": np.array(ratio, ratio_dtype)}
    if training is not None:
        feeds["t"] = np.array(training)
    return make_model([helper.make_node("DropoutGrad", list(feeds), ["dx"], domain=MS)], feeds, ["dx"]), feeds


IDX = np.array
HELD_OUT = {  # id: (model and feeds, the EP that should run the node)
    "reduce rank 1 keepdims": (reduce_sum_case((7,), [0]), CUDA),
    "reduce rank 1 axis -1": (reduce_sum_case((7,), [-1], keepdims=0), CUDA),
    "reduce rank 3 last": (reduce_sum_case((3, 4, 5), [2]), CUDA),
    "reduce rank 4 two trailing": (reduce_sum_case((2, 3, 4, 5), [2, 3], keepdims=0), CUDA),
    "reduce rank 4 three trailing": (reduce_sum_case((2, 3, 4, 5), [1, 2, 3]), CUDA),
    "reduce rank 4 not trailing": (reduce_sum_case((2, 3, 4, 5), [0, 3]), CPU),
    "reduce huge rows x 1": (reduce_sum_case((20000, 1), [1], keepdims=0), CUDA),
    "reduce 1 x 5000": (reduce_sum_case((1, 5000), [1]), CUDA),
    "reduce all by default": (reduce_sum_case((1, 5000), None, keepdims=0), CUDA),
    "reduce empty axes noop": (reduce_sum_case((3, 4), [], noop=1), CUDA),
    "reduce empty axes all": (reduce_sum_case((3, 4), [], keepdims=0), CUDA),
    "reduce repeated axis": (reduce_sum_case((3, 4), [1, -1]), CUDA),
    "reduce zero rows": (reduce_sum_case((0, 4), [1]), CUDA),
    "reduce zero cols": (reduce_sum_case((3, 0), [1], keepdims=0), CUDA),
    "reduce float16": (reduce_sum_case((3, 4), [-1], dtype=np.float16), CPU),
    "reduce float64": (reduce_sum_case((3, 4), [-1], dtype=np.float64), CPU),
    "reduce int32": (reduce_sum_case((3, 4), [-1], dtype=np.int32), CPU),
    "reduce int64": (reduce_sum_case((3, 4), [-1], dtype=np.int64), CPU),
    "reduce opset 11 attribute": (reduce_sum_case((3, 4), [1], opset=11), CUDA),
    "reduce opset 11 leading": (reduce_sum_case((3, 4), [0], opset=11), CPU),
    "ln rank 1": (layer_norm_case((7,), -1), CUDA),
    "ln rank 1 axis 0": (layer_norm_case((7,), 0), CUDA),
    "ln rank 3 axis 0": (layer_norm_case((3, 4, 5), 0), CUDA),
    "ln rank 3 axis 1": (layer_norm_case((3, 4, 5), 1), CUDA),
    "ln rank 3 axis -2 no bias": (layer_norm_case((3, 4, 5), -2, bias=False), CUDA),
    "ln rank 4 axis 2 eps 1e-3": (layer_norm_case((2, 3, 4, 5), 2, epsilon=1e-3), CUDA),
    "ln rank 4 eps 0.1 no bias": (layer_norm_case((2, 3, 4, 5), -1, epsilon=0.1, bias=False), CUDA),
    "ln huge rows x 1": (layer_norm_case((20000, 1), -1), CUDA),
    "ln 1 x 5000": (layer_norm_case((1, 5000), -1), CUDA),
    "ln eps 0": (layer_norm_case((3, 4), -1, epsilon=0.0), CUDA),
    "ln eps 1": (layer_norm_case((3, 4), -1, epsilon=1.0), CUDA),
    "ln stash_type 1": (layer_norm_case((3, 4), -1, stash=1), CUDA),
    "ln float16": (layer_norm_case((4, 6), -1, dtype=np.float16), CPU),
    "ln float64": (layer_norm_case((4, 6), -1, dtype=np.float64), CPU),
    "ln grad rank 1": (layer_norm_grad_case((7,), -1), CUDA),
    "ln grad rank 3 axis 1": (layer_norm_grad_case((3, 4, 5), 1), CUDA),
    "ln grad rank 3 axis -2": (layer_norm_grad_case((3, 4, 5), -2), CUDA),
    "ln grad rank 3 axis 0": (layer_norm_grad_case((3, 4, 5), 0), CUDA),
    "ln grad rank 4 axis 3": (layer_norm_grad_case((2, 3, 4, 5), 3), CUDA),
    "ln grad 1 x 5000": (layer_norm_grad_case((1, 5000), -1), CUDA),
    "sce mean": (sce_case(8, 5), CUDA),
    "sce sum": (sce_case(8, 5, "sum"), CPU),
    "sce none": (sce_case(8, 5, "none"), CPU),
    "sce ignore some int32": (sce_case(8, 5, ignore=2, label_dtype=np.int32), CUDA),
    "sce ignore -1": (sce_case(8, 5, ignore=-1), CUDA),
    "sce ignore -100": (sce_case(8, 5, ignore=-100), CUDA),
    "sce ignore_index no label hits": (sce_case(8, 5, ignore=None), CUDA),
    "sce weights": (sce_case(8, 5, ignore=1, weights=True), CPU),
    "sce rank 3": (sce_case(8, 5, extra=(3,)), CPU),
    "sce 1 x 5000": (sce_case(1, 5000), CUDA),
    "sce huge rows x 1": (sce_case(20000, 1), CUDA),
    "sce grad mean": (sce_case(8, 5, grad=True), CUDA),
    "sce grad sum": (sce_case(8, 5, "sum", grad=True), CPU),
    "sce grad none rank 4": (sce_case(8, 5, "none", extra=(3, 2), grad=True), CPU),
    "sce grad ignore int32": (sce_case(8, 5, ignore=2, label_dtype=np.int32, grad=True), CUDA),
    "sce grad weights": (sce_case(8, 5, "sum", ignore=1, weights=True, grad=True), CPU),
    "sce grad 1 x 5000": (sce_case(1, 5000, grad=True), CUDA),
    "gather grad repeated negative": (gather_grad_case((5, 3), 0, IDX([0, 0, 4, -1, -5])), CUDA),
    "gather grad axis 1": (gather_grad_case((5, 3), 1, IDX([[0, 2], [-1, 2]])), CUDA),
    "gather grad axis -2 rank 3": (gather_grad_case((4, 5, 3), -2, IDX([1, 1, 1])), CUDA),
    "gather grad scalar index": (gather_grad_case((4, 5, 3), 2, IDX(2)), CUDA),
    "gather grad rank 1": (gather_grad_case((5,), 0, IDX([1, 1, 2, -2])), CUDA),
    "gather grad no index": (gather_grad_case((5, 3), 0, np.zeros(0, np.int64)), CUDA),
    "gather grad huge rows x 1": (gather_grad_case((20000, 1), 0, rng(5).integers(-20000, 20000, 300)), CUDA),
    "gather grad 1 x 5000": (gather_grad_case((1, 5000), 1, rng(6).integers(0, 5000, 700)), CUDA),
    "gather grad rank 4 int32": (gather_grad_case((2, 3, 4, 5), 3, IDX([[0, 4], [4, -5]], np.int32)), CUDA),
    "gather grad float16": (gather_grad_case((5, 3), 0, IDX([0, 1]), np.float16), CPU),
    "dropout ratio 0 training": (dropout_case((5, 6), 0.0, True), CUDA),
    "dropout inference": (dropout_case((5, 6), 0.5, False), CUDA),
    "dropout no ratio inference": (dropout_case((5, 6), None, False), CUDA),
    "dropout no training_mode": (dropout_case((5, 6), 0.0, None), CUDA),
    "dropout rank 1": (dropout_case((7,), 0.0, True), CUDA),
    "dropout rank 3": (dropout_case((2, 3, 4), 0.0, True), CUDA),
    "dropout y only": (dropout_case((5, 6), 0.0, True, outputs=("y",)), CUDA),
    "dropout float16": (dropout_case((5, 6), 0.0, True, np.float16), CPU),
    "dropout float64": (dropout_case((5, 6), 0.0, True, np.float64), CPU),
    "dropout grad ratio 0": (dropout_grad_case(0.0), CUDA),
    "dropout grad ratio 0 training": (dropout_grad_case(0.0, True), CUDA),
    "dropout grad ratio 0 inference": (dropout_grad_case(0.0, False), CUDA),
    "dropout grad inference": (dropout_grad_case(0.4, False), CUDA),
    "dropout grad ratio float64": (dropout_grad_case(0.2, ratio_dtype=np.float64), CUDA),
    "dropout grad float16": (dropout_grad_case(0.2, dtype=np.float16), CPU),
}


@pytest.mark.parametrize("case", list(HELD_OUT), ids=list(HELD_OUT))
def test_a_held_out_node_equals_ort_on_the_ep_that_claims_it(case):
    (model, feeds), ep = HELD_OUT[case]
    tolerance = 1e-2 if any(a.dtype == np.float16 for a in feeds.values()) else 1e-4
    assert_equal_to_ort(model, feeds, on=ep, rtol=tolerance, atol=tolerance)
    if ep == CPU:  # declined with a reason, asked of the node as partitioning saw it (before InsertCastTransformer
        sess = session(model)  # computes a float16 node in float32 between Casts on the CPU EP)
        graph = Graph.from_model(model)
        graph.resolve()
        found, why = sess.state.providers[CUDA].find_kernel(graph.nodes()[0])
        assert found is None and why


# ---- onnx's backend node tests for these ops --------------------------------------------------------------
def backend_cases():
    """(name, model, inputs, expected outputs) of onnx's node tests of LayerNormalization, SoftmaxCrossEntropyLoss,
    ReduceSum and Dropout (opset 22 models are given opset 21: ORT 1.19.2 stops there; Dropout did not change)."""
    import glob
    import os
    import re

    import onnx

    base = os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")
    pattern = re.compile(r"^test_(layer_normalization|sce|reduce_sum|dropout)_(?!square)")
    cases = []
    for name in sorted(os.listdir(base)):
        if not pattern.match(name) or "expanded" in name or "random" in name:
            continue
        model = onnx.load(os.path.join(base, name, "model.onnx"))
        for opset in model.opset_import:
            opset.version = min(opset.version, 21) if opset.domain in ("", "ai.onnx") else opset.version
        folder = sorted(glob.glob(os.path.join(base, name, "test_data_set_*")))[0]
        arrays = {kind: [numpy_helper.to_array(onnx.load_tensor(p)) for p in
                         sorted(glob.glob(os.path.join(folder, f"{kind}_*.pb")),
                                key=lambda p: int(p.rsplit("_", 1)[1][:-3]))] for kind in ("input", "output")}
        cases.append((name, model, arrays["input"], arrays["output"]))
    return cases


BACKEND = backend_cases()


def test_the_backend_node_tests_cover_the_four_ops():
    assert len(BACKEND) >= 60
    assert {c[0].split("_")[1] for c in BACKEND} >= {"layer", "sce", "reduce", "dropout"}


def assert_expected(name, model, feeds, expected):
    """Ours and ORT's CPU EP both give the case's expected outputs; the session, for a look at placement."""
    sess = session(model)
    got = sess.run(None, feeds)
    for g, want, w in zip(got, expected, theirs(model, feeds)):
        assert g.shape == want.shape and g.dtype == want.dtype
        np.testing.assert_allclose(g, want, rtol=1e-4, atol=1e-5, err_msg=name)
        np.testing.assert_allclose(w, want, rtol=1e-4, atol=1e-5, err_msg=f"ORT on {name}")
    return sess


@pytest.mark.parametrize("case", BACKEND, ids=[c[0] for c in BACKEND])
def test_an_onnx_backend_node_test_gives_its_expected_outputs(case):
    name, model, inputs, expected = case
    sess = assert_expected(name, model, dict(zip([i.name for i in model.graph.input], inputs)), expected)
    if name.startswith("test_layer_normalization") or name in ("test_sce_mean", "test_sce_mean_log_prob"):
        assert set(placed(sess).values()) == {CUDA}


WITH_AXES = [c for c in BACKEND if c[0].startswith("test_reduce_sum") and len(c[2]) == 2]


@pytest.mark.parametrize("case", WITH_AXES, ids=[c[0] for c in WITH_AXES])
def test_a_reduce_sum_backend_test_with_its_axes_made_a_weight_gives_its_expected_outputs(case):
    """As given, the axes are a graph input (read at run time: declined). Made an initializer, the CUDA EP claims
    the cases whose axes are trailing, or empty."""
    name, given, (x, axes), expected = case
    model = type(given)()
    model.CopyFrom(given)
    model.graph.initializer.append(numpy_helper.from_array(axes, model.graph.input[1].name))
    del model.graph.input[1]
    sess = assert_expected(name, model, {model.graph.input[0].name: x}, expected)
    rank = x.ndim
    trailing = sorted(int(a) % rank for a in axes) == list(range(rank - axes.size, rank))
    assert placed(sess)["ReduceSum"] == (CUDA if trailing or axes.size == 0 else CPU)


# ---- zoo training graphs ------------------------------------------------------------------------------------
MODEL_RUNS = [("mlp", "ort", (CUDA, TRITON, CPU)), ("gpt", "ort", (CUDA, TRITON, CPU)), ("bert", "ort", (CUDA, CPU)),
              ("bert", "ortlab", (CUDA, CPU)), ("gpt", "ortlab", (CUDA, CPU))]


@pytest.mark.parametrize("name, builder, providers", MODEL_RUNS, ids=["-".join(r[:2]) + f"-{len(r[2])}eps"
                                                                      for r in MODEL_RUNS])
@pytest.mark.parametrize("level", [0, 99])
def test_a_zoo_training_graph_equals_ort_and_again_on_a_second_run(name, builder, providers, level):
    """Forward and backward of a zoo model (its gradient graph by ORT's or ortlab's builder, dropout 0), on the
    CUDA EP first (then Triton), with graph optimizations off and on: ORT's outputs, twice from one session."""
    from engine_models import training_graph

    model, feeds = training_graph(name, builder, batch=2, seq=5)
    want = theirs(model, feeds)
    sess = session(model, providers, level)
    assert {s.provider.type for s in sess.state.steps} >= {CUDA, CPU}
    first, second = sess.run(None, feeds), sess.run(None, feeds)
    for g, again, w in zip(first, second, want):
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)
        np.testing.assert_array_equal(g, again)


def test_layer_norm_of_values_near_1e19_equals_ort():
    """[1e19, -1e19, 0]: the variance (6.7e37) is a float, the square of the difference of two lanes' means (4e38)
    is not. layer_norm.cu's merge of two Welford summaries squared that difference first and gave inv_std 0,
    y = bias: a silently wrong row (ORT's CPU kernel gives +-1.2247)."""
    x = np.array([[1e19, -1e19, 0.0], [0.0, -1.2e19, 1.2e19], [1.0, 2.0, 4.0]], np.float32)
    feeds = {"x": x, "s": np.ones(3, np.float32), "b": np.full(3, 0.5, np.float32)}
    model = make_model([helper.make_node("LayerNormalization", ["x", "s", "b"], ["y", "mean", "inv_std"])], feeds,
                       ["y", "mean", "inv_std"])
    y = assert_equal_to_ort(model, feeds, on=CUDA, rtol=1e-5, atol=1e-6)[0]
    np.testing.assert_allclose(y[0], [1.7247449, -0.7247449, 0.5], rtol=1e-6)


def test_dropout_then_dropout_grad_agree_on_the_mask_and_equal_ort_given_that_mask():
    """Dropout (training, ratio 0.3) and its DropoutGrad on the CUDA EP, run twice: y = x * mask / 0.7 and
    dx = dy * mask / 0.7 with one mask per run; ORT's DropoutGrad given that mask gives the same dx."""
    x, dy = f32(33, 65), f32(33, 65, seed=1)
    feeds = {"x": x, "dy": dy}
    node = helper.make_node
    model = make_model([node("Dropout", ["x", "ratio", "t"], ["y", "mask"]),
                        node("DropoutGrad", ["dy", "mask", "ratio"], ["dx"], domain=MS)], feeds, ["y", "mask", "dx"],
                       [("ratio", np.array(0.3, np.float32)), ("t", np.array(True))])
    sess = session(model)
    assert set(placed(sess).values()) == {CUDA}
    masks = []
    for _ in range(2):
        y, mask, dx = sess.run(None, feeds)
        scale = np.float32(1) / np.float32(0.7)
        np.testing.assert_array_equal(y, x * mask * scale)
        grad_feeds = {"dy": dy, "mask": mask, "ratio": np.array(0.3, np.float32)}
        grad = make_model([node("DropoutGrad", ["dy", "mask", "ratio"], ["dx"], domain=MS)], grad_feeds, ["dx"])
        np.testing.assert_allclose(dx, theirs(grad, grad_feeds)[0], rtol=2 ** -23, atol=0)
        masks.append(mask)
    assert (masks[0] != masks[1]).any()


def test_training_tinygpt_with_the_cuda_ep_gives_pytorchs_losses():
    """Six SGD steps of the zoo's GPT through MiniORTModule on ortlab's engine with the CUDA EP first (its backward
    graph's GatherGrad, DropoutGrad, ReduceSum and SoftmaxCrossEntropyLossGrad on the CUDA EP): PyTorch's losses."""
    import copy

    import torch

    from ortlab import models
    from ortlab.training import SGD, MiniORTModule, train

    torch.manual_seed(0)
    module = models.get("gpt", dropout=0.0)
    batches = [module.example_inputs(batch=2, seq=6, seed=s) for s in range(2)]
    reference = copy.deepcopy(module)
    want = train(reference, batches, torch.optim.SGD(reference.parameters(), lr=0.05), 6, progress=False,
                 skip_non_finite=False).losses
    ours = MiniORTModule(copy.deepcopy(module), gradient_builder="ortlab", runtime="ortlab", level="basic",
                         providers=[CUDA, CPU])
    got = train(ours, batches, SGD(ours.parameters(), lr=0.05), 6, progress=False, skip_non_finite=False).losses
    np.testing.assert_allclose(got, want, rtol=1e-4)
    backward = ours._training_manager().backward_session
    on_cuda = {s.node.op_type for s in backward.state.steps if s.provider.type == CUDA}
    assert {"GatherGrad", "SoftmaxCrossEntropyLossGrad"} <= on_cuda


@pytest.mark.parametrize("device_ep", [CUDA, TRITON])
def test_a_device_bound_output_of_a_new_shape_from_the_cpu_ep_is_refused_not_broadcast(device_ep):
    """Run 1 leaves y's [6, 10] buffer in the binding (bound to 'cuda' without a buffer); run 2's y is [1, 10], made
    on the CPU EP and copied into that buffer after the run. ORT's copy fails 'Tensor size mismatch'
    (core/framework/data_transfer_manager.cc); the Triton EP's torch copy_ broadcast the row into all six and
    returned a [6, 10] y."""
    feeds = {"x": f32(6, 10)}
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], feeds, ["y"])
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_param = "n"
    sess = session(model, (device_ep, CPU))
    assert placed(sess) == {"Relu": CPU}
    binding = sess.io_binding()
    binding.bind_output("y", "cuda")
    binding.bind_cpu_input("x", feeds["x"])
    sess.run_with_iobinding(binding)
    np.testing.assert_array_equal(binding.copy_outputs_to_cpu()[0], np.maximum(feeds["x"], 0))
    binding.bind_cpu_input("x", feeds["x"][:1].copy())
    with pytest.raises(OrtlabError, match="Tensor size mismatch"):
        sess.run_with_iobinding(binding)

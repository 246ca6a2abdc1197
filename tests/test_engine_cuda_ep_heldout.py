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

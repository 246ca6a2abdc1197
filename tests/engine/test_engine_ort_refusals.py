"""Inputs ORT 1.19.2 refuses or answers its own way, run in real ORT and in ortlab's engine on the
CPU EP and the Triton EP: SoftmaxCrossEntropyLoss(Grad) with labels or weights of the wrong shape
(orttraining/orttraining/training_ops/cpu/loss/softmax_cross_entropy_loss.cc,
VerifyLogitWeightAndLabelShape), and Dropout's mask at opsets 7 to 12 in inference
(onnxruntime/core/providers/cpu/tensor/identity_op.h for 7 to 11, cpu/nn/dropout_op.cc from 12)."""
import numpy as np
import pytest
from onnx import TensorProto

from ortlab import session
from ortlab.engine import InferenceSession, KernelFailure, SessionOptions
from ortlab.errors import OrtlabError
from ortlab.onnx_defs import MS_DOMAIN, one_node_model

PROVIDERS = (["CPUExecutionProvider"], ["TritonExecutionProvider"])
F, I64 = TensorProto.FLOAT, TensorProto.INT64


def engine_run(model, feeds, providers):
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0), providers)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def ort_refusal(model, feeds):
    """ORT's message when it refuses the feeds, None when it answers."""
    try:
        session.run_model(model, feeds)
    except OrtlabError as exc:
        return str(exc)
    return None


def sce_model(label_rank, weight_rank=None, reduction="mean"):
    """SoftmaxCrossEntropyLoss (opset 13) with shapes left open, so that ORT checks them at run time."""
    inputs = [(F, [None, None]), (I64, [None] * label_rank)]
    if weight_rank is not None:
        inputs.append((F, [None] * weight_rank))
    return one_node_model("SoftmaxCrossEntropyLoss", inputs, {"reduction": reduction}, opset=13, outputs=2)


def sce_grad_model(label_rank, weight_rank=None):
    inputs = [(F, []), (F, [None, None]), (I64, [None] * label_rank)]
    if weight_rank is not None:
        inputs.append((F, [None] * weight_rank))
    return one_node_model("SoftmaxCrossEntropyLossGrad", inputs, {"reduction": "mean"}, domain=MS_DOMAIN,
                          opset=13)


# (label shape, weight shape or None, the words of ORT's refusal, or None when ORT answers)
SCE_CASES = [
    ((4, 1), None, "logit_shape must be (1 + label_shape)"),
    ((3,), None, "The shape of logit and label does not match"),
    ((5,), None, "The shape of logit and label does not match"),
    ((4,), (7, 1), "Weights tensor is not 1-D"),
    ((4, 1), (7,), "logit_shape must be (1 + label_shape)"),
    ((4,), None, None),
    ((4,), (7,), None),
]


def sce_feeds(label_shape, weight_shape, grad=False):
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((4, 7)).astype(np.float32)
    labels = rng.integers(0, 7, label_shape).astype(np.int64)
    names = ["x0", "x1", "x2", "x3"] if grad else ["x0", "x1", "x2"]
    values = ([np.array(1.0, np.float32), scores] if grad else [scores]) + [labels]
    if weight_shape is not None:
        values.append(rng.uniform(0.5, 2, weight_shape).astype(np.float32))
    return dict(zip(names, values))


@pytest.mark.parametrize("grad", [False, True], ids=["loss", "grad"])
@pytest.mark.parametrize("label_shape,weight_shape,words", SCE_CASES)
@pytest.mark.parametrize("providers", PROVIDERS, ids=["cpu", "triton"])
def test_softmax_cross_entropy_refuses_what_ort_refuses(grad, label_shape, weight_shape, words, providers):
    rank = None if weight_shape is None else len(weight_shape)
    model = sce_grad_model(len(label_shape), rank) if grad else sce_model(len(label_shape), rank)
    feeds = sce_feeds(label_shape, weight_shape, grad)
    refused = ort_refusal(model, feeds)
    if words is None:
        assert refused is None
        want = session.run_model(model, feeds)
        got = engine_run(model, feeds, providers)
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)
        return
    assert refused is not None and words in refused  # ORT's own words: the test reads them from ORT
    with pytest.raises(KernelFailure) as info:
        engine_run(model, feeds, providers)
    message = str(info.value)
    assert words in message
    assert "cannot reshape" not in message and "out of bounds" not in message
    assert "pass" in message  # says what to do


@pytest.mark.parametrize("providers", PROVIDERS, ids=["cpu", "triton"])
def test_softmax_cross_entropy_label_past_the_classes_is_refused(providers):
    """ORT reads log_prob and weights past their end for a label >= C (no check): the engine refuses."""
    model = sce_model(1)
    feeds = sce_feeds((4,), None)
    feeds["x1"] = np.array([0, 7, 2, 3], np.int64)
    with pytest.raises(KernelFailure) as info:
        engine_run(model, feeds, providers)
    assert "outside [0, 7)" in str(info.value)


@pytest.mark.parametrize("outputs", [1, 2])
@pytest.mark.parametrize("opset", [7, 9, 10, 11, 12, 13])
def test_dropout_inference_mask_equals_ort(opset, outputs):
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    model = one_node_model("Dropout", [x], opset=opset, outputs=outputs)
    want = session.run_model(model, {"x0": x})
    got = engine_run(model, {"x0": x}, ["CPUExecutionProvider"])
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


_CHILD = """
import sys
import numpy as np
import onnx
import onnxruntime as ort
model = onnx.ModelProto.FromString(bytes.fromhex(sys.argv[1]))
feeds = {name: np.load(path) for name, path in zip(sys.argv[2::2], sys.argv[3::2])}
ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
"""


def ort_child_returncode(model, feeds, tmp_path):
    """The exit code of a child process running the model in ORT (negative: the signal that killed it)."""
    import subprocess
    import sys

    args = []
    for name, value in feeds.items():
        np.save(tmp_path / f"{name}.npy", value)
        args += [name, str(tmp_path / f"{name}.npy")]
    child = subprocess.run([sys.executable, "-c", _CHILD, model.SerializeToString().hex(), *args],
                           capture_output=True, text=True, timeout=120)
    return child.returncode


# (scores shape, label shape, the signal ORT 1.19.2 dies of, words of the engine's refusal)
CRASH_CASES = [
    ((0, 7), (0,), "SIGFPE", "SIGFPE"),   # N*D = 0: C = logits' size / 0 (GetNDCFromLogitAndLabelShape)
    ((7,), (), "SIGABRT", "rank >= 2"),  # label_shape[0] of a scalar: ORT's process aborts
]


@pytest.mark.parametrize("grad", [False, True], ids=["loss", "grad"])
@pytest.mark.parametrize("scores_shape,label_shape,signal_name,words", CRASH_CASES)
def test_softmax_cross_entropy_inputs_that_kill_ort_are_refused(grad, scores_shape, label_shape, signal_name, words,
                                                                 tmp_path):
    import signal

    scores, labels = np.zeros(scores_shape, np.float32), np.zeros(label_shape, np.int64)
    label_type, scores_type = (I64, [None] * labels.ndim), (F, [None] * scores.ndim)
    if grad:
        model = one_node_model("SoftmaxCrossEntropyLossGrad", [(F, []), scores_type, label_type],
                               {"reduction": "mean"}, domain=MS_DOMAIN, opset=13)
        feeds = {"x0": np.array(1.0, np.float32), "x1": scores, "x2": labels}
    else:
        model = one_node_model("SoftmaxCrossEntropyLoss", [scores_type, label_type], {"reduction": "mean"},
                               opset=13, outputs=2)
        feeds = {"x0": scores, "x1": labels}
    assert ort_child_returncode(model, feeds, tmp_path) == -getattr(signal, signal_name)
    for providers in PROVIDERS:
        with pytest.raises(KernelFailure, match=words.replace("(", r"\(").replace(")", r"\)")):
            engine_run(model, feeds, providers)


# (labels, number of weights or None): ORT answers, and reads no buffer past its end
VALUE_CASES = [
    ([0, 1, 2, 5], 6),      # fewer weights than classes: ORT checks only that weights are 1-D
    ([0, -1, 2, 3], None),  # -1: ORT's default ignore_index when the node sets none
    ([0, -1, 2, 6], 8),     # more weights than classes
]


@pytest.mark.parametrize("grad", [False, True], ids=["loss", "grad"])
@pytest.mark.parametrize("labels,n_weights", VALUE_CASES)
@pytest.mark.parametrize("providers", PROVIDERS, ids=["cpu", "triton"])
def test_softmax_cross_entropy_labels_and_weights_ort_accepts(grad, labels, n_weights, providers):
    weight_rank = None if n_weights is None else 1
    model = sce_grad_model(1, weight_rank) if grad else sce_model(1, weight_rank)
    feeds = sce_feeds((4,), None if n_weights is None else (n_weights,), grad)
    feeds["x2" if grad else "x1"] = np.array(labels, np.int64)
    want = session.run_model(model, feeds)
    got = engine_run(model, feeds, providers)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


@pytest.mark.parametrize("providers", PROVIDERS, ids=["cpu", "triton"])
def test_softmax_cross_entropy_label_past_the_weights_is_refused(providers):
    """Six weights for seven classes and a label 6: ORT reads weights[6], past their end; the engine refuses."""
    model = sce_model(1, 1)
    feeds = sce_feeds((4,), (6,))
    feeds["x1"] = np.array([0, 1, 2, 6], np.int64)
    with pytest.raises(KernelFailure, match=r"outside \[0, 6\)"):
        engine_run(model, feeds, providers)

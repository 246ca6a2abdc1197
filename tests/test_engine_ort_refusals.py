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

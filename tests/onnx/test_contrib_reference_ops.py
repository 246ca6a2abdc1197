"""The com.microsoft reference ops (ortlab.ops.contrib_ops) against ORT 1.19.2's CPU kernels.

Every registered op has cases here (a registered op without one fails); each case is a one-node
model run by ORT with optimizations off and by `reference_run`, and every output must match in
dtype, shape and values. BiasSoftmax and BiasDropout have no CPU kernel in ORT (CUDA only), and
SliceGrad fails on negative steps in ORT 1.19.2: those cases check an independent numpy/torch
formula instead, and say so in their test id. Last, whole training graphs of the lab's models.
"""
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from ortlab import models, session
from ortlab.onnx_defs import MS_DOMAIN, one_node_model
from ortlab.ops.contrib_ops import CONTRIB_OPS, ContribOpError, reference_run

rng = np.random.default_rng(7)


def f(*shape, dtype=np.float32):
    return rng.standard_normal(shape).astype(dtype)


def i64(*values):
    return np.array(values, np.int64)


def sigmoid(x):
    return (1 / (1 + np.exp(-x))).astype(x.dtype)


def softmax(x, axis):
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def log_softmax(x, axis):
    shifted = x - x.max(axis=axis, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))).astype(x.dtype)


def ln_stats(x, axis):
    """LayerNormalization's saved Mean and InvStdDev (float32, ones from axis on), from numpy."""
    axes = tuple(range(axis % x.ndim, x.ndim))
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=axes, keepdims=True)
    return mean.astype(np.float32), (1 / np.sqrt(x64.var(axis=axes, keepdims=True) + 1e-5)).astype(np.float32)


@dataclass
class Case:
    """One node: inputs (None: an omitted optional input), attributes, output names ("" omitted).
    expect: None to compare with ORT, or f(*inputs) -> outputs, an independent formula."""
    id: str
    inputs: list
    attrs: dict = field(default_factory=dict)
    outputs: tuple = ("y0",)
    expect: object = None
    shapes: list = None  # static output shapes (float outputs), for kernels that read them from the graph


def scores(n, c, *rest):
    return log_softmax(f(n, c, *rest), 1)


X234 = f(2, 3, 4)
MEAN_1, INV_1 = ln_stats(X234, -1)
MEAN_AX1, INV_AX1 = ln_stats(X234, 1)
X234_64 = X234.astype(np.float64)
MEAN_64, INV_64 = ln_stats(X234_64, -1)
MASK = rng.random((3, 5)) > 0.3
ACT_INPUTS = [f(2, 3), f(3, 4), f(4)]


def torch_bias_softmax(axis):
    """softmax(x + bias) over the dims from axis on, by torch (flatten, softmax, reshape)."""
    def expect(x, bias):
        z = torch.from_numpy(x + bias).double()
        return [torch.softmax(z.flatten(axis), -1).reshape(z.shape).float().numpy()]
    return expect


def bias_dropout_identity(x, bias, residual=None, *rest):
    """Nothing is dropped: y = x + bias (+ residual), mask all True."""
    y = x + bias + (0 if residual is None else residual)
    return [y.astype(x.dtype), np.ones(x.shape, bool)]


def slice_grad_numpy(index):
    """zeros(shape) with dY written at x[index], by numpy's own slicing."""
    def expect(dy, shape, *rest):
        dx = np.zeros([int(d) for d in shape], dy.dtype)
        dx[index] = dy
        return [dx]
    return expect


def conv_grad_torch(pads, stride=1):
    """(dX, dW, dB) of torch's conv2d with ONNX pads [top, left, bottom, right], from autograd."""
    def expect(dy, x, w):
        xt, wt = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
        y = torch.nn.functional.conv2d(torch.nn.functional.pad(xt, (pads[1], pads[3], pads[0], pads[2])), wt,
                                       stride=stride)
        y.backward(torch.tensor(dy))
        return [xt.grad.numpy(), wt.grad.numpy(), dy.sum(axis=(0, 2, 3))]
    return expect


# Keyed by op name, literally (tests/project/test_registry.py checks each registered op is named here).
CASES = {
    "Gelu": [Case("3d", [f(2, 3, 4)])],
    "BiasGelu": [Case("bias-last-dim", [f(2, 3, 4), f(4)])],
    "FusedMatMul": [
        Case("plain", [f(2, 3), f(3, 4)]),
        Case("transA", [f(3, 2), f(3, 4)], {"transA": 1}),
        Case("transB-alpha", [f(2, 3), f(4, 3)], {"transB": 1, "alpha": 0.125}),
        Case("transA-transB", [f(3, 2), f(4, 3)], {"transA": 1, "transB": 1, "alpha": -2.0}),
        Case("batch-broadcast", [f(2, 3, 4), f(4, 5)]),
        Case("batch-both", [f(2, 1, 3, 4), f(3, 4, 5)], {"transB": 0}),
        Case("transBatchA", [f(3, 2, 4), f(2, 4, 5)], {"transBatchA": 1}),
        Case("transBatchB", [f(2, 3, 4), f(4, 2, 5)], {"transBatchB": 1}),
        Case("transBatchA-transA", [f(4, 2, 3), f(2, 4, 5)], {"transBatchA": 1, "transA": 1}),
        Case("1d-transA-ignored", [f(4), f(4, 5)], {"transA": 1}),
        Case("2d-by-1d-transA-vs-numpy-ORT-ignores-transA", [f(4, 3), f(4)], {"transA": 1},
             expect=lambda a, b: [a.T @ b]),
    ],
    "FusedGemm": [
        Case("Relu", ACT_INPUTS, {"activation": "Relu"}),
        Case("Relu-no-C", ACT_INPUTS[:2], {"activation": "Relu"}),
        Case("Sigmoid-trans-alpha-beta", [f(3, 2), f(4, 3), f(2, 4)],
             {"activation": "Sigmoid", "transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}),
        Case("Tanh", ACT_INPUTS, {"activation": "Tanh"}),
        Case("LeakyRelu", ACT_INPUTS, {"activation": "LeakyRelu", "activation_alpha": 0.2}),
        Case("Elu", ACT_INPUTS, {"activation": "Elu", "activation_alpha": 0.7}),
        Case("HardSigmoid", ACT_INPUTS, {"activation": "HardSigmoid", "activation_alpha": 0.3,
                                         "activation_beta": 0.4}),
        Case("Selu", ACT_INPUTS, {"activation": "Selu", "activation_alpha": 1.6, "activation_gamma": 1.05}),
        Case("Softplus", ACT_INPUTS, {"activation": "Softplus"}),
        Case("Softsign", ACT_INPUTS, {"activation": "Softsign"}),
        Case("ThresholdedRelu", ACT_INPUTS, {"activation": "ThresholdedRelu", "activation_alpha": 0.5}),
        Case("ParametricSoftplus", ACT_INPUTS, {"activation": "ParametricSoftplus", "activation_alpha": 2.0,
                                                "activation_beta": 0.5}),
        Case("ScaledTanh", ACT_INPUTS, {"activation": "ScaledTanh", "activation_alpha": 2.0,
                                        "activation_beta": 0.5}),
    ],
    "BiasSoftmax": [
        Case("axis-last-bias-broadcast-vs-torch-no-ORT-CPU-kernel", [f(2, 3, 4, 4), f(1, 1, 4, 4)],
             {"axis": -1, "is_inner_broadcast": 0}, expect=torch_bias_softmax(3)),
        Case("axis1-flattens-the-rest-vs-torch-no-ORT-CPU-kernel", [f(2, 3, 4), f(2, 3, 4)],
             {"axis": 1, "is_inner_broadcast": 0}, expect=torch_bias_softmax(1)),
    ],
    "BiasDropout": [
        Case("ratio0-training-vs-formula-no-ORT-CPU-kernel",
             [f(3, 4), f(4), f(3, 4), np.array(0.0, np.float32), np.array(True)], outputs=("y0", "y1"),
             expect=bias_dropout_identity),
        Case("inference-mode-vs-formula-no-ORT-CPU-kernel", [f(3, 4), f(4), None, np.array(0.5, np.float32),
                                                               np.array(False)], outputs=("y0", "y1"),
             expect=bias_dropout_identity),
    ],
    "BroadcastGradientArgs": [
        Case("3d-vs-2d", [i64(2, 3, 4), i64(3, 1)], outputs=("y0", "y1")),
        Case("same-shapes-empty-axes", [i64(2, 3), i64(2, 3)], outputs=("y0", "y1")),
        Case("vs-scalar", [i64(2, 3), np.zeros(0, np.int64)], outputs=("y0", "y1")),
        Case("ones-on-both-sides", [i64(1, 3), i64(1, 1)], outputs=("y0", "y1")),
        Case("both-stretched", [i64(5, 1, 4), i64(3, 1)], outputs=("y0", "y1")),
        Case("a-shorter", [i64(1), i64(2, 3, 4)], outputs=("y0", "y1")),
    ],
    "DivGrad": [
        Case("b-broadcast", [f(2, 3), f(2, 3), f(3) + 3], outputs=("y0", "y1")),
        Case("both-broadcast", [f(2, 3, 4), f(2, 1, 4), f(3, 1) + 3], outputs=("y0", "y1")),
        Case("dA-only", [f(2, 3), f(2, 3), f(3) + 3], outputs=("y0",)),
        Case("dB-only", [f(2, 3), f(2, 3), f(3) + 3], outputs=("", "y1")),
    ],
    "ReduceSumTraining": [
        Case("axis1", [f(2, 3, 4), i64(1)]),
        Case("negative-axes-keepdims0", [f(2, 3, 4), i64(-1, 0)], {"keepdims": 0}),
        Case("empty-axes-reduce-all", [f(2, 3), np.zeros(0, np.int64)]),
        Case("empty-axes-noop", [f(2, 3), np.zeros(0, np.int64)], {"noop_with_empty_axes": 1}),
    ],
    "Scale": [
        Case("multiply", [f(2, 3), np.array(2.5, np.float32)]),
        Case("scale_down", [f(2, 3), np.array([3.0], np.float32)], {"scale_down": 1}),
        Case("int64-scale", [f(2, 3), np.array([3], np.int64)], {"scale_down": 1}),
        Case("double-input", [f(2, 3, dtype=np.float64), np.array(0.75, np.float32)]),
    ],
    "ReluGrad": [Case("x", [f(3, 4), f(3, 4)])],
    "SigmoidGrad": [Case("from-Y", [f(3, 4), sigmoid(f(3, 4))])],
    "TanhGrad": [Case("from-Y", [f(3, 4), np.tanh(f(3, 4))])],
    "GeluGrad": [Case("x", [f(3, 4), f(3, 4)])],
    "LeakyReluGrad": [Case("alpha-default", [f(3, 4), f(3, 4)]),
                      Case("alpha", [f(3, 4), f(3, 4)], {"alpha": 0.3})],
    "SoftmaxGrad_13": [
        Case("axis-default", [f(2, 3, 4), softmax(f(2, 3, 4), -1)]),
        Case("axis1-one-axis-not-flattened", [f(2, 3, 4), softmax(f(2, 3, 4), 1)], {"axis": 1}),
    ],
    "LogSoftmaxGrad_13": [
        Case("axis-default", [f(2, 3, 4), log_softmax(f(2, 3, 4), -1)]),
        Case("axis0", [f(2, 3, 4), log_softmax(f(2, 3, 4), 0)], {"axis": 0}),
    ],
    "DropoutGrad": [
        Case("ratio-default-0.5", [f(3, 5), MASK]),
        Case("ratio-0.2", [f(3, 5), MASK, np.array(0.2, np.float32)]),
        Case("ratio-0", [f(3, 5), np.ones((3, 5), bool), np.array(0.0, np.float32)]),
        Case("training_mode-false-still-scales", [f(3, 5), MASK, np.array(0.2, np.float32), np.array(False)]),
        Case("double-ratio", [f(3, 5), MASK, np.array(0.3)]),
    ],
    "GatherGrad": [
        Case("axis0-repeats", [i64(4, 3), i64(0, 0, 3), f(3, 3)]),
        Case("axis1-2d-indices", [i64(2, 4, 3), i64([1, 1], [3, 0]), f(2, 2, 2, 3)], {"axis": 1}),
        Case("axis-negative", [i64(2, 4, 3), i64(2, 2), f(2, 4, 2)], {"axis": -1}),
        Case("int32-negative-indices", [i64(4, 3), np.array([0, -1, -1], np.int32), f(3, 3)]),
        Case("scalar-index", [i64(2, 4, 3), np.array(2, np.int64), f(2, 3)], {"axis": 1}),
    ],
    "GatherElementsGrad": [
        Case("axis1-repeats", [f(3, 2), i64(3, 4), i64([0, 2], [1, 1], [3, 0])], {"axis": 1}),
        Case("axis0", [f(2, 4), i64(3, 4), i64([2, 0, 2, 1], [2, 2, 0, 0])]),
        Case("axis-negative-negative-indices", [f(3, 2), i64(3, 4), i64([-1, 0], [-4, 3], [1, -1])], {"axis": -1}),
    ],
    "ConvGrad": [
        Case("groups-pads-strides", [f(2, 6, 3, 3), f(2, 4, 6, 5), f(6, 2, 3, 3)],
             {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}, outputs=("y0", "y1", "y2")),
        Case("dilations-no-dB", [f(1, 3, 2, 2), f(1, 2, 7, 7), f(3, 2, 3, 3)], {"dilations": [2, 2], "strides": [2, 2]},
             outputs=("y0", "y1")),
        Case("1d-dW-only", [f(2, 4, 3), f(2, 3, 8), f(4, 3, 3)], {"strides": [2]}, outputs=("", "y1", "")),
        Case("same-upper-vs-torch-ORT-ignores-auto_pad", [f(1, 3, 3, 3), f(1, 2, 5, 6), f(3, 2, 3, 3)],
             {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, outputs=("y0", "y1", "y2"),
             expect=conv_grad_torch((1, 0, 1, 1), 2)),
    ],
    "SliceGrad": [
        Case("starts-ends", [f(2, 2), i64(4, 3), i64(1, 0), i64(3, 2)]),
        Case("axes", [f(2, 1), i64(2, 3), i64(1), i64(2), i64(1)]),
        Case("negative-start-clamped-end", [f(2, 2), i64(4, 3), i64(-2, 1), i64(100, 3), i64(0, 1)]),
        Case("step2", [f(3), i64(5), i64(0), i64(5), i64(0), i64(2)]),
        Case("negative-step-vs-numpy-ORT-fails", [f(2), i64(5), i64(4), i64(0), i64(0), i64(-2)],
             expect=slice_grad_numpy(np.s_[4:0:-2])),
        Case("negative-step-to-start-vs-numpy-ORT-fails", [f(3), i64(5), i64(-1), i64(-6), i64(0), i64(-2)],
             expect=slice_grad_numpy(np.s_[4::-2])),
    ],
    "LayerNormalizationGrad": [
        Case("axis-last", [f(2, 3, 4), X234, f(4), MEAN_1, INV_1], outputs=("y0", "y1", "y2")),
        Case("axis1", [f(2, 3, 4), X234, f(3, 4), MEAN_AX1, INV_AX1], {"axis": 1},
             outputs=("y0", "y1", "y2")),
        Case("double-X-float-stats", [f(2, 3, 4, dtype=np.float64), X234_64, f(4, dtype=np.float64),
                                      MEAN_64, INV_64], outputs=("y0", "y1", "y2")),
    ],
    "SkipLayerNormalization": [
        Case("all-inputs-and-sum", [f(2, 3, 4), f(2, 3, 4), f(4), f(4), f(4)], {"epsilon": 1e-5},
             outputs=("y0", "", "", "y3")),
        Case("skip-2d-no-beta", [f(2, 3, 4), f(3, 4), f(4)]),
    ],
    "SimplifiedLayerNormalization": [
        Case("inv_std_var", [f(2, 3, 4), f(4)], {"epsilon": 1e-5}, outputs=("y0", "y1")),
        Case("axis1", [f(2, 3, 4), f(3, 4)], {"axis": 1}),
    ],
    "MaxPoolGrad": [
        # Indices of MaxPool(kernel 2, stride 2) over a (1, 1, 2, 4) X: each window's max position
        Case("2d", [f(1, 1, 1, 2), i64([[[1, 6]]])], {"kernel_shape": [2, 2], "strides": [2, 2]},
             shapes=[[1, 1, 2, 4]]),
    ],
    "AveragePoolGrad": [
        Case("2d-overlap-pads", [f(1, 2, 3, 3)], {"kernel_shape": [2, 2], "pads": [1, 0, 0, 1]},
             shapes=[[1, 2, 3, 3]]),
    ],
    "SoftmaxCrossEntropyLossGrad": [
        Case("mean", [np.array(1.3, np.float32), scores(4, 5), i64(0, 2, 4, 1)]),
        Case("sum", [np.array(0.7, np.float32), scores(4, 5), i64(0, 2, 4, 1)], {"reduction": "sum"}),
        Case("none", [f(4), scores(4, 5), i64(0, 2, 4, 1)], {"reduction": "none"}),
        Case("mean-ignore_index", [np.array(1.0, np.float32), scores(4, 5), i64(0, 1, 1, 3)],
             {"ignore_index": 1}),
        Case("mean-weights", [np.array(1.0, np.float32), scores(4, 5), i64(0, 2, 4, 1), f(5) ** 2]),
        Case("none-weights-ignore", [f(4), scores(4, 5), i64(0, 2, 4, 2), f(5) ** 2],
             {"reduction": "none", "ignore_index": 2}),
        Case("3d-mean", [np.array(1.0, np.float32), scores(2, 5, 3), i64([0, 4, 2], [1, 1, 3])]),
        Case("int32-labels", [np.array(1.0, np.float32), scores(4, 5), np.array([0, 2, 4, 1], np.int32)]),
        Case("label-minus1-ignored-by-default", [np.array(1.0, np.float32), scores(4, 5), i64(0, -1, 4, 1)]),
        Case("mean-all-ignored-is-zero", [np.array(1.0, np.float32), scores(4, 5), i64(3, 3, 3, 3)],
             {"ignore_index": 3}),
    ],
}


def _params():
    return [pytest.param(op, domain, case, id=f"{op}-{case.id if case else 'NO-CASE'}")
            for op, domain in CONTRIB_OPS for case in CASES.get(op) or [None]]


def _model(op, domain, case):
    """A one-node model of the case; omitted outputs ("") are not graph outputs."""
    model = one_node_model(op, case.inputs, case.attrs, domain=domain, outputs=list(case.outputs))
    kept = [o for o in model.graph.output if o.name]
    if case.shapes:
        from onnx import TensorProto, helper

        kept = [helper.make_tensor_value_info(o.name, TensorProto.FLOAT, s) for o, s in zip(kept, case.shapes)]
    del model.graph.output[:]
    model.graph.output.extend(kept)
    feeds = {f"x{i}": np.asarray(v) for i, v in enumerate(case.inputs) if v is not None}
    return model, feeds


def assert_same(got, want, rtol=1e-5, atol=1e-6, what=""):
    """Same dtype, same shape, values allclose (bool and integer outputs: equal)."""
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), f"{what}: got {got.dtype}{got.shape}, want " \
                                                                f"{want.dtype}{want.shape}"
    if want.dtype.kind in "biu":
        np.testing.assert_array_equal(got, want, err_msg=what)
    else:
        np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


@pytest.mark.parametrize("op, domain, case", _params())
def test_reference_op_matches_ort_cpu_kernel(op, domain, case):
    assert case is not None, f"{op} is registered in CONTRIB_OPS but has no case in CASES"
    model, feeds = _model(op, domain, case)
    got = reference_run(model, feeds)
    names = [o for o in case.outputs if o]
    if case.expect is not None:
        inputs = [None if v is None else np.asarray(v) for v in case.inputs]
        want = dict(zip(case.outputs, case.expect(*inputs)))
    else:
        want = session.run_model(model, feeds)
    assert sorted(got) == sorted(names)
    for name in names:
        assert_same(got[name], want[name], what=f"{op} {case.id} output {name}")


def test_bias_dropout_in_training_keeps_its_invariant():
    """BiasDropout (no ORT CPU kernel) that drops: y = mask * (x + bias) / (1 - ratio) + residual."""
    x, bias, residual = f(64, 16), f(16), f(64, 16)
    case = Case("train", [x, bias, residual, np.array(0.25, np.float32), np.array(True)], {"seed": 3},
                outputs=("y0", "y1"))
    got = reference_run(*_model("BiasDropout", MS_DOMAIN, case))
    y, mask = got["y0"], got["y1"]
    assert mask.dtype == bool and 0.6 < mask.mean() < 0.9
    assert_same(y, np.where(mask, (x + bias) / 0.75, 0).astype(np.float32) + residual)


# Inputs ORT 1.19.2's CPU kernels refuse; the reference ops refuse them too, saying why.
REFUSED = [
    pytest.param("FusedGemm", ACT_INPUTS, {}, id="FusedGemm-no-activation"),
    pytest.param("FusedGemm", ACT_INPUTS, {"activation": "LeakyRelu"},
                 id="FusedGemm-LeakyRelu-without-alpha"),
    pytest.param("FusedGemm", ACT_INPUTS, {"activation": "Swish"}, id="FusedGemm-unknown-activation"),
    pytest.param("BiasGelu", [f(2, 3), f(2, 3)], {}, id="BiasGelu-2d-bias"),
    pytest.param("FusedMatMul", [f(2, 3), f(3, 4)], {"transBatchA": 1}, id="FusedMatMul-transBatch-rank2"),
    pytest.param("DropoutGrad", [f(3, 5), MASK, np.array(1.0, np.float32)], {}, id="DropoutGrad-ratio-1"),
    pytest.param("BroadcastGradientArgs", [i64(2, 3), i64(4)], {}, id="BroadcastGradientArgs-no-broadcast"),
    pytest.param("Scale", [f(2, 3), np.array(0.0, np.float32)], {}, id="Scale-zero"),
    pytest.param("GatherElementsGrad", [f(3, 2), i64(3, 4), i64([0, 4], [1, 1], [3, 0])], {"axis": 1},
                 id="GatherElementsGrad-index-out-of-range"),
    pytest.param("GatherElementsGrad", [f(3, 2), i64(3, 4), i64(0, 1)], {"axis": 1},
                 id="GatherElementsGrad-indices-not-shaped-like-dY"),
    pytest.param("ConvGrad", [f(1, 4, 3, 3), f(1, 3, 5, 5), f(4, 2, 3, 3)], {"group": 2},
                 id="ConvGrad-group-does-not-split-channels"),
    pytest.param("SoftmaxCrossEntropyLossGrad", [np.array(1.0, np.float32), scores(4, 5), i64(0, 2, 4, 1)],
                 {"reduction": "max"}, id="SoftmaxCrossEntropyLossGrad-unknown-reduction"),
    pytest.param("LayerNormalizationGrad", [f(3, 1), f(3, 1), f(1), f(3, 1), f(3, 1)], {},
                 id="LayerNormalizationGrad-one-element-rows"),
]


@pytest.mark.parametrize("op, inputs, attrs", REFUSED)
def test_reference_op_refuses_what_ort_refuses(op, inputs, attrs):
    outputs = {"LayerNormalizationGrad": ("y0", "y1", "y2"),
               "BroadcastGradientArgs": ("y0", "y1")}.get(op, ("y0",))
    model, feeds = _model(op, MS_DOMAIN, Case("refused", inputs, attrs, outputs=outputs))
    with pytest.raises(session.SessionError):
        session.run_model(model, feeds)
    with pytest.raises(ContribOpError, match=op):
        reference_run(model, feeds)


def test_an_omitted_output_does_not_become_the_omitted_optional_input():
    """DivGrad -> ("", dB), then Clip(dB, "", max): the reference's "" stays None (no min), as in ORT."""
    from onnx import helper

    from ortlab.onnx_defs import make_model

    dy, a, b, top = f(2, 3), f(2, 3), f(3) + 3, np.array(0.05, np.float32)
    names = ["dy", "a", "b", "top"]
    graph = helper.make_graph(
        [helper.make_node("DivGrad", ["dy", "a", "b"], ["", "db"], domain=MS_DOMAIN),
         helper.make_node("Clip", ["db", "", "top"], ["y"])], "omitted",
        [helper.make_tensor_value_info(n, 1, list(v.shape)) for n, v in zip(names, (dy, a, b, top))],
        [helper.make_tensor_value_info("y", 1, None)])
    feeds = dict(zip(names, (dy, a, b, top)))
    model = make_model(graph)
    assert_same(reference_run(model, feeds)["y"], session.run_model(model, feeds)["y"])


# Whole training graphs: dropout 0 so that ORT's and onnx.reference's Dropout agree.
@pytest.fixture(scope="module")
def training_graphs():
    """{(model name, builder): (training graph, feeds)}, built once for the module."""
    from ortlab.training.training_manager import build_training_graph

    graphs = {}
    for name in ("mlp", "bert", "gpt"):
        module = models.get(name, dropout=0.0)
        inputs = module.example_inputs()
        export = models.export(module, inputs, training=True)
        xs = [t.name for t in export.graph.initializer if t.data_type == 1]
        for builder in ("ort", "ortlab"):
            graph, _ = build_training_graph(export, [o.name for o in export.graph.output], xs, builder)
            names = [i.name for i in graph.graph.input]
            feeds = {n: v.numpy() for n, v in zip(names, inputs)}
            feeds.update({n: np.array(1.0, np.float32) for n in names if n not in feeds})
            graphs[name, builder] = graph, feeds
    return graphs


@pytest.mark.parametrize("level", ["raw", "basic", "extended"])
@pytest.mark.parametrize("builder", ["ort", "ortlab"])
@pytest.mark.parametrize("name", ["mlp", "bert", "gpt"])
def test_training_graph_runs_in_reference_as_in_ort(training_graphs, name, builder, level):
    """The training graph (and ORT's own optimized form of it, with ReduceSumTraining, FusedGemm, ...)
    gives every output, loss and gradients, as ORT gives it."""
    graph, feeds = training_graphs[name, builder]
    if level != "raw":
        graph = session.optimized_model(graph, level=level, providers=["CPUExecutionProvider"])
    ms_ops = {n.op_type for n in graph.graph.node if n.domain == MS_DOMAIN}
    assert ms_ops and ms_ops <= {op for op, _ in CONTRIB_OPS}
    want, got = session.run_model(graph, feeds), reference_run(graph, feeds)
    assert sorted(got) == sorted(want)
    for output, value in want.items():
        assert_same(got[output], value, rtol=1e-4, atol=1e-5, what=f"{name} {builder} {level} {output}")

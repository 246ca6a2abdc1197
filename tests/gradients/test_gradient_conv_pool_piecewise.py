"""The builders ortlab added after the first set (GatherElements, Expand, Abs, Clip, Max/Min,
LeakyRelu, Tile, Conv, pools): ortlab's gradient graph, run in ORT and in ortlab's reference
kernels (onnx.reference plus ortlab.ops.contrib_ops), against torch autograd, central
differences, and ORT's own C++ builder's graph run in ORT."""
import numpy as np
import pytest
import torch
import torch.nn.functional as tf

import ortcheck
from gradient_cases import Case
from ortlab import OrtlabError
from ortlab.gradients import build_gradient_graph, check_gradient, ort_gradient_graph
from ortlab.walkthroughs.per_op_gradients import gradient_nodes
from ortlab.ops.contrib_ops import reference_run

rng = np.random.default_rng(11)


def x(*shape):
    return (rng.standard_normal(shape).astype(np.float32), True)


def const(array):
    return (np.asarray(array), False)


def gather(axis):
    return lambda a, i: torch.gather(a, axis % a.dim(), i)


CASES = [
    Case("GatherElements", [x(3, 4), const([[0, 2], [1, 1], [3, 0]])], gather(1), {"axis": 1},
         id="GatherElements-axis1-repeats"),
    Case("GatherElements", [x(3, 4), const([[2, 0, 2, 1], [2, 2, 0, 0]])], gather(0), {"axis": 0},
         id="GatherElements-axis0"),
    Case("GatherElements", [x(2, 3, 4), const(rng.integers(0, 4, (2, 3, 6)))], gather(-1), {"axis": -1},
         id="GatherElements-axis-negative-3d"),
    Case("GatherElements", [x(3, 4), const([[-1, 0], [-4, 3], [1, -1]])], lambda a, i: torch.gather(a, 1, i % 4),
         {"axis": 1}, id="GatherElements-negative-indices"),
    Case("Expand", [x(3, 1), const([2, 3, 4])], lambda a, s: a.expand(2, 3, 4), id="Expand-rank-up-size1"),
    Case("Expand", [x(3, 4), const([2, 1, 1])], lambda a, s: a.expand(2, 3, 4), id="Expand-shape-of-ones"),
    Case("Expand", [x(3, 4), const([4])], lambda a, s: a * 1, id="Expand-noop-lower-rank-shape"),
    Case("Expand", [x(1, 4, 1), const([3, 1, 5])], lambda a, s: a.expand(3, 4, 5), id="Expand-both-ways"),
    Case("Expand", [x(), const([2, 3])], lambda a, s: a.expand(2, 3), id="Expand-scalar"),
    Case("Tile", [x(2, 3), const([2, 1])], lambda a, r: a.repeat(2, 1), id="Tile-2d"),
    Case("Tile", [x(2, 1, 3), const([1, 4, 2])], lambda a, r: a.repeat(1, 4, 2), id="Tile-3d"),
    Case("Tile", [x(4), const([3])], lambda a, r: a.repeat(3), id="Tile-1d"),
    Case("Abs", [x(3, 4)], torch.abs, id="Abs"),
    Case("Clip", [x(3, 4), const(np.float32(-0.3)), const(np.float32(0.4))],
         lambda a, lo, hi: torch.clamp(a, lo, hi), id="Clip-both"),
    Case("Clip", [x(3, 4), const(np.float32(0.1))], lambda a, lo: torch.clamp(a, min=lo), id="Clip-min-only"),
    Case("Clip", [x(3, 4), None, const(np.float32(0.1))], lambda a, _, hi: torch.clamp(a, max=hi), id="Clip-max-only"),
    Case("Clip", [x(3, 4)], lambda a: a * 1, id="Clip-no-bounds"),
    Case("Max", [x(2, 3), x(3), x(2, 1)], lambda a, b, c: torch.maximum(torch.maximum(a, b), c), id="Max-three"),
    Case("Min", [x(4), x(3, 1)], torch.minimum, id="Min-broadcast"),
    Case("Max", [x(2, 3)], lambda a: a * 1, id="Max-one-input"),
    Case("LeakyRelu", [x(3, 4)], tf.leaky_relu, id="LeakyRelu-default-alpha"),
    Case("LeakyRelu", [x(3, 4)], lambda a: tf.leaky_relu(a, 0.3), {"alpha": 0.3}, id="LeakyRelu-alpha"),
]

def conv(stride=1, pads=(0, 0, 0, 0), groups=1, dilation=1):
    """torch's conv2d of X (padded as ONNX pads [top, left, bottom, right]) with W and B."""
    def fn(a, w, bias=None):
        a = tf.pad(a, (pads[1], pads[3], pads[0], pads[2]))
        return tf.conv2d(a, w, bias, stride=stride, groups=groups, dilation=dilation)
    return fn


CASES += [
    Case("Conv", [x(2, 4, 6, 5), x(6, 2, 3, 3), x(6)], conv(2, (1, 1, 1, 1), 2),
         {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}, id="Conv-groups-pads-strides"),
    Case("Conv", [x(1, 3, 7, 6), x(4, 3, 3, 2)], conv(1, (2, 0, 1, 1)), {"pads": [2, 0, 1, 1]},
         id="Conv-no-bias-asymmetric-pads"),
    Case("Conv", [x(1, 2, 9, 8), x(2, 1, 3, 3), x(2)], conv(2, groups=2, dilation=2),
         {"group": 2, "strides": [2, 2], "dilations": [2, 2]}, id="Conv-depthwise-dilations"),
    Case("Conv", [x(1, 2, 5, 6), x(3, 2, 3, 3), x(3)], conv(2, (1, 0, 1, 1)),
         {"auto_pad": "SAME_UPPER", "strides": [2, 2]}, id="Conv-same-upper"),
    Case("Conv", [x(1, 2, 5, 6), x(3, 2, 3, 3), x(3)], conv(2, (1, 1, 1, 0)),
         {"auto_pad": "SAME_LOWER", "strides": [2, 2]}, id="Conv-same-lower"),
    Case("Conv", [x(1, 2, 6, 6), x(3, 2, 3, 3), x(3)], conv(1, (1, 1, 1, 1)),
         {"auto_pad": "SAME_UPPER"}, id="Conv-same-upper-stride1"),
    Case("Conv", [x(1, 2, 5, 6), x(3, 2, 3, 3), x(3)], conv(2), {"auto_pad": "VALID", "strides": [2, 2]},
         id="Conv-valid"),
    Case("Conv", [x(2, 3, 8), x(4, 3, 3), x(4)], lambda a, w, b: tf.conv1d(a, w, b, stride=2), {"strides": [2]},
         id="Conv-1d"),
    Case("Conv", [x(1, 2, 4, 4), const(rng.standard_normal((3, 2, 2, 2)).astype(np.float32))],
         conv(), id="Conv-x-only"),
    Case("Conv", [const(rng.standard_normal((1, 2, 4, 4)).astype(np.float32)), x(3, 2, 2, 2)],
         conv(), id="Conv-w-only"),
    Case("MaxPool", [x(2, 3, 6, 6)], lambda a: tf.max_pool2d(a, 2, 2), {"kernel_shape": [2, 2], "strides": [2, 2]},
         id="MaxPool"),
    Case("MaxPool", [x(1, 2, 7, 7)], lambda a: tf.max_pool2d(a, 3, 1), {"kernel_shape": [3, 3]}, id="MaxPool-overlap"),
    Case("MaxPool", [x(1, 2, 7, 6)], lambda a: tf.max_pool2d(a, 3, 2, padding=1),
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, id="MaxPool-pads"),
    Case("MaxPool", [x(1, 2, 7, 7)], lambda a: tf.max_pool2d(a, 2, 2, ceil_mode=True),
         {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, id="MaxPool-ceil"),
    Case("MaxPool", [x(1, 2, 8, 8)], lambda a: tf.max_pool2d(a, 2, 1, dilation=2),
         {"kernel_shape": [2, 2], "dilations": [2, 2]}, id="MaxPool-dilations"),
    Case("MaxPool", [x(2, 3, 9)], lambda a: tf.max_pool1d(a, 3, 2), {"kernel_shape": [3], "strides": [2]},
         id="MaxPool-1d"),
    Case("AveragePool", [x(2, 3, 6, 6)], lambda a: tf.avg_pool2d(a, 2, 2), {"kernel_shape": [2, 2], "strides": [2, 2]},
         id="AveragePool"),
    Case("AveragePool", [x(1, 2, 7, 6)], lambda a: tf.avg_pool2d(a, 3, 2, padding=1, count_include_pad=False),
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, id="AveragePool-pads"),
    Case("AveragePool", [x(1, 2, 7, 6)], lambda a: tf.avg_pool2d(a, 3, 2, padding=1, count_include_pad=True),
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1},
         id="AveragePool-pads-counted"),
    Case("AveragePool", [x(1, 2, 7, 7)], lambda a: tf.avg_pool2d(a, 3, 1), {"kernel_shape": [3, 3]},
         id="AveragePool-overlap"),
    Case("AveragePool", [x(1, 2, 7, 7)], lambda a: tf.avg_pool2d(a, 2, 2, ceil_mode=True),
         {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, id="AveragePool-ceil"),
    Case("AveragePool", [x(2, 3, 9)], lambda a: tf.avg_pool1d(a, 3, 2), {"kernel_shape": [3], "strides": [2]},
         id="AveragePool-1d"),
    Case("GlobalAveragePool", [x(2, 3, 4, 5)], lambda a: a.mean((2, 3), keepdim=True), id="GlobalAveragePool"),
    Case("GlobalAveragePool", [x(2, 3, 7)], lambda a: a.mean(2, keepdim=True), id="GlobalAveragePool-1d"),
]


# Forward nodes onnx.reference gets wrong (ORT runs them): its GatherElements
# (onnx/reference/ops/op_gather_elements.py) slices the shapes with a negative axis as given and
# refuses; its Conv with auto_pad=VALID and strides makes a [3, 3] output where ONNX says [2, 2],
# which the loss's Mul then refuses.
REFERENCE_FORWARD_FAILS = {
    "GatherElements-axis-negative-3d": "all dimensions of index and self should be the same size",
    "Conv-valid": "binary operator 'Mul'"}

# Forward nodes onnx.reference computes wrongly without failing: its MaxPool's Indices with overlapping
# windows leave out the (batch, channel) offset ORT's flat indices carry (channel 1's first index is 0,
# not H*W), so MaxPoolGrad adds dY into channel 0.
REFERENCE_FORWARD_WRONG = {"MaxPool-overlap"}



def ort_convgrad_ignores_auto_pad(case, model, expected):
    """ORT's builder copies auto_pad=SAME_* onto ConvGrad, whose CPU kernel ignores it: dX and dW
    are wrong (dB, a plain sum, is right)."""
    theirs = run(ort_gradient_graph(model, case.x_names, "loss"), case.feeds)
    for name in ("in0", "in1"):
        assert not np.allclose(theirs[f"{name}_grad"], expected[name], rtol=1e-3, atol=1e-3), name
    np.testing.assert_allclose(theirs["in2_grad"], expected["in2"], rtol=1e-4, atol=1e-5)


# ORT 1.19.2 builds a wrong or no gradient here (its behaviour is pinned below)
ORT_DIFFERS = {"Conv-same-upper": ort_convgrad_ignores_auto_pad, "Conv-same-lower": ort_convgrad_ignores_auto_pad,
               "Conv-same-upper-stride1": ort_convgrad_ignores_auto_pad}


def run(model, feeds):
    return dict(zip([o.name for o in model.graph.output], ortcheck.run(model, feeds)))


def assert_gradients(got, expected, names, what):
    for name in names:
        assert np.shape(got[f"{name}_grad"]) == expected[name].shape, (what, name)
        np.testing.assert_allclose(got[f"{name}_grad"], expected[name], rtol=1e-4, atol=1e-5, err_msg=f"{what} {name}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gradient_equals_torch_in_ort_and_in_ortlabs_kernels(case):
    model = case.model()
    expected = case.torch_gradients()
    ours = build_gradient_graph(model, case.x_names, "loss")
    assert_gradients(run(ours, case.feeds), expected, case.x_names, "ortlab's graph in ORT")
    if case.id in REFERENCE_FORWARD_WRONG:
        got = reference_run(ours, case.feeds)["in0_grad"]
        assert not np.allclose(got, expected["in0"], rtol=1e-4, atol=1e-5), "onnx.reference's MaxPool is fixed"
    elif case.id in REFERENCE_FORWARD_FAILS:  # the forward op, not the gradient, fails there
        with pytest.raises(Exception, match=REFERENCE_FORWARD_FAILS[case.id]):
            reference_run(ours, case.feeds)
    else:
        assert_gradients(reference_run(ours, case.feeds), expected, case.x_names, "ortlab's graph in reference kernels")
    assert check_gradient(model, case.x_names, "loss", case.feeds, gradient_model=ours).passed


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_orts_builder_gives_torchs_gradient(case):
    model = case.model()
    expected = case.torch_gradients()
    if case.id in ORT_DIFFERS:
        ORT_DIFFERS[case.id](case, model, expected)
        return
    assert_gradients(run(ort_gradient_graph(model, case.x_names, "loss"), case.feeds), expected, case.x_names,
                     "ORT's graph")


@pytest.mark.parametrize("case", [c for c in CASES if c.op in ("GatherElements", "LeakyRelu", "Tile", "Expand", "Conv",
                                                                   "GlobalAveragePool", "MaxPool", "AveragePool")],
                         ids=lambda c: c.id)
def test_ortlab_emits_the_op_types_ort_emits(case):
    model = case.model()
    ours = {n.op_type for n in gradient_nodes(build_gradient_graph(model, case.x_names, "loss"), model)}
    theirs = {n.op_type for n in gradient_nodes(ort_gradient_graph(model, case.x_names, "loss"), model)}
    assert ours == theirs


def pool_model(op, dims):
    from onnx import helper
    nodes = [helper.make_node("Relu", ["x"], ["r"]),
             helper.make_node(op, ["r"], ["y"], kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, dims)],
                              [helper.make_tensor_value_info("loss", 1, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_every_gradient_value_carries_its_forward_values_type_and_shape_as_in_orts_graph():
    """ORT's MaxPoolGrad takes dX's shape from the graph: an untyped gradient value once crashed
    ORT's session (a segmentation fault) when ortlab's graph was loaded."""
    model = pool_model("MaxPool", [2, 3, 6, 6])
    ours, theirs = build_gradient_graph(model, ["x"], "loss"), ort_gradient_graph(model, ["x"], "loss")

    def shapes(m):
        infos = list(m.graph.value_info) + list(m.graph.output)
        return {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim] for v in infos
                if v.type.tensor_type.HasField("shape")}
    pool_grad = [n.output[0] for n in ours.graph.node if n.op_type == "MaxPoolGrad"][0]
    assert shapes(ours)[pool_grad] == [2, 3, 6, 6]
    assert shapes(ours)["x_grad"] == shapes(theirs)["x_grad"] == [2, 3, 6, 6]
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    tf.max_pool2d(torch.relu(xt), 2, 2).sum().backward()
    np.testing.assert_allclose(run(ours, {"x": x})["x_grad"], xt.grad.numpy())


@pytest.mark.parametrize("op", ["MaxPool", "AveragePool"])
def test_pooling_over_symbolic_shapes_is_refused_where_orts_graph_gives_an_empty_gradient(op):
    from ortlab.gradients import GradientBuilderError

    model = pool_model(op, ["N", "C", "H", "W"])
    with pytest.raises(GradientBuilderError, match=f"{op}Grad\\) needs the static shape of X"):
        build_gradient_graph(model, ["x"], "loss")
    x = rng.standard_normal((2, 3, 6, 6)).astype(np.float32)
    theirs = run(ort_gradient_graph(model, ["x"], "loss"), {"x": x})
    assert theirs["x_grad"].size == 0  # ORT 1.19.2: no error, an empty gradient


def clip_model(opset):
    """Clip(x, -0.3, 0.4) summed: the bounds as attributes before opset 11, as inputs from 11."""
    from onnx import helper, numpy_helper
    if opset < 11:
        clip, inits = helper.make_node("Clip", ["x"], ["y"], min=-0.3, max=0.4), []
    else:
        clip = helper.make_node("Clip", ["x", "lo", "hi"], ["y"])
        inits = [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", -0.3), ("hi", 0.4))]
    graph = helper.make_graph([clip, helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)], "g",
                              [helper.make_tensor_value_info("x", 1, [3, 4])],
                              [helper.make_tensor_value_info("loss", 1, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 7
    return model


@pytest.mark.parametrize("opset", [8, 10, 11, 12, 17])
def test_clip_gradient_at_every_opset(opset):
    """ortlab's mask reads the bounds from the attributes before opset 11, and builds X >= min
    from Not(Less) before opset 12. ORT 1.19.2's builder ignores the attributes (dY passes
    unclipped) and emits GreaterOrEqual, which opset 11 lacks (the model does not load)."""
    x = rng.standard_normal((3, 4)).astype(np.float32)
    xt = torch.tensor(x, requires_grad=True)
    torch.clamp(xt, -0.3, 0.4).sum().backward()
    model = clip_model(opset)
    np.testing.assert_array_equal(run(build_gradient_graph(model, ["x"], "loss"), {"x": x})["x_grad"], xt.grad.numpy())
    if opset == 11:
        with pytest.raises(OrtlabError, match="No Op registered for GreaterOrEqual with domain_version of 11"):
            run(ort_gradient_graph(model, ["x"], "loss"), {"x": x})
        return
    theirs = run(ort_gradient_graph(model, ["x"], "loss"), {"x": x})["x_grad"]
    if opset < 11:
        np.testing.assert_array_equal(theirs, np.ones_like(x))
    else:
        np.testing.assert_array_equal(theirs, xt.grad.numpy())


def test_conv_with_same_padding_over_symbolic_shapes_is_refused():
    from onnx import helper
    from ortlab.gradients import GradientBuilderError

    nodes = [helper.make_node("Conv", ["x", "w"], ["y"], auto_pad="SAME_UPPER"),
             helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, ["N", 2, "H", "W"]),
                                           helper.make_tensor_value_info("w", 1, [3, 2, 3, 3])],
                              [helper.make_tensor_value_info("loss", 1, [])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    with pytest.raises(GradientBuilderError, match="auto_pad=SAME_UPPER needs the static spatial shapes"):
        build_gradient_graph(model, ["x", "w"], "loss")

"""Scan with scan_input_directions, scan_input_axes, scan_output_directions and scan_output_axes, and Loop scan
outputs that change shape, run in ORT 1.19.2 and in ortlab's engine: ORT's answer (checked against a numpy
loop too), or a clear OrtlabError where ORT refuses.

Facts from ORT (asserted on the real session below): every direction and axis combination runs; scan inputs
of different lengths, a scan input of length 0, and a Loop scan output whose shape changes between
iterations ('Inconsistent shape in loop output') are refused.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from ortlab.engine import InferenceSession
from ortlab.errors import OrtlabError

X = np.arange(12, dtype=np.float32).reshape(3, 4)


def vi(name, shape=None, elem=T.FLOAT):
    return h.make_tensor_value_info(name, elem, shape)


def scan_model(n, opset=16, **attributes):
    """Scan over x: state s += e; scan outputs y = 2 e and z = s (after the add)."""
    body = h.make_graph([h.make_node("Add", ["s", "e"], ["s2"]), h.make_node("Mul", ["e", "two"], ["y"]),
                         h.make_node("Identity", ["s2"], ["z"])], "body",
                        [vi("s", [n]), vi("e", [n])], [vi("s2", [n]), vi("y", [n]), vi("z", [n])],
                        initializer=[numpy_helper.from_array(np.array(2, np.float32), "two")])
    node = h.make_node("Scan", ["s0", "x"], ["sf", "ys", "zs"], body=body, num_scan_inputs=1, **attributes)
    m = h.make_model(h.make_graph([node], "g", [vi("s0"), vi("x")], [vi("sf"), vi("ys"), vi("zs")]),
                     opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def ort_run(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def numpy_scan(x, in_axis, in_dir, out_axes, out_dirs):
    """The Scan above, computed with a Python loop."""
    slices = [np.take(x, i, axis=in_axis) for i in range(x.shape[in_axis])]
    slices = slices[::-1] if in_dir else slices
    s, ys, zs = np.zeros(slices[0].shape, np.float32), [], []
    for e in slices:
        s = s + e
        ys.append(2 * e)
        zs.append(s)
    outs = [np.stack(v[::-1] if d else v, axis=a % 2) for v, a, d in zip((ys, zs), out_axes, out_dirs)]
    return [s] + outs


CASES = [dict(), dict(scan_input_directions=[1]), dict(scan_output_directions=[1, 0]),
         dict(scan_output_directions=[0, 1]), dict(scan_input_directions=[1], scan_output_directions=[1, 1]),
         dict(scan_input_axes=[1]), dict(scan_input_axes=[-1]), dict(scan_input_axes=[1], scan_input_directions=[1]),
         dict(scan_output_axes=[1, 0]), dict(scan_output_axes=[-1, 1]),
         dict(scan_input_axes=[1], scan_input_directions=[1], scan_output_axes=[1, -1],
              scan_output_directions=[1, 0])]


@pytest.mark.parametrize("attributes", CASES, ids=[str(c) for c in CASES])
def test_scan_directions_and_axes_as_ort(attributes):
    in_axis = attributes.get("scan_input_axes", [0])[0]
    n = X.shape[1 - in_axis % 2]
    m, feeds = scan_model(n, **attributes), {"s0": np.zeros(n, np.float32), "x": X}
    theirs, ours = ort_run(m, feeds), InferenceSession(m).run(None, feeds)
    expected = numpy_scan(X, in_axis, attributes.get("scan_input_directions", [0])[0],
                          attributes.get("scan_output_axes", [0, 0]), attributes.get("scan_output_directions", [0, 0]))
    for a, b, e in zip(ours, theirs, expected):
        np.testing.assert_array_equal(b, e)  # the rule, independently of ORT
        assert a.shape == b.shape and a.dtype == b.dtype
        np.testing.assert_array_equal(a, b)


def two_input_scan(directions):
    body = h.make_graph([h.make_node("Sub", ["a", "b"], ["y"]), h.make_node("Identity", ["s"], ["s2"])], "b",
                        [vi("s", [1]), vi("a", []), vi("b", [])], [vi("s2", [1]), vi("y", [])])
    node = h.make_node("Scan", ["s0", "a", "b"], ["sf", "ys"], body=body, num_scan_inputs=2,
                       scan_input_directions=directions)
    m = h.make_model(h.make_graph([node], "g", [vi("s0"), vi("a"), vi("b")], [vi("sf"), vi("ys")]),
                     opset_imports=[h.make_opsetid("", 18)])
    m.ir_version = 8
    return m


@pytest.mark.parametrize("directions", [[0, 1], [1, 0], [1, 1]])
def test_scan_with_two_inputs_in_different_directions_as_ort(directions):
    a, b = np.arange(3, dtype=np.float32), np.arange(3, dtype=np.float32) * 10
    feeds = {"s0": np.zeros(1, np.float32), "a": a, "b": b}
    m = two_input_scan(directions)
    theirs, ours = ort_run(m, feeds), InferenceSession(m).run(None, feeds)
    expected = (a[::-1] if directions[0] else a) - (b[::-1] if directions[1] else b)
    np.testing.assert_array_equal(theirs[1], expected)
    assert ours[1].shape == (3,)  # scalars per iteration stack to [n]
    np.testing.assert_array_equal(ours[1], theirs[1])


@pytest.mark.parametrize("feeds, words", [
    ({"a": np.arange(3, dtype=np.float32), "b": np.arange(4, dtype=np.float32)}, "inconsistent sequence lengths"),
    ({"a": np.zeros(0, np.float32), "b": np.zeros(0, np.float32)}, "length 0")])
def test_scan_inputs_ort_refuses_are_refused_clearly(feeds, words):
    m = two_input_scan([0, 1])
    feeds = {"s0": np.zeros(1, np.float32), **feeds}
    with pytest.raises(Exception):  # noqa: B017 (ORT's own exception types)
        ort_run(m, feeds)
    with pytest.raises(OrtlabError, match=words):
        InferenceSession(m).run(None, feeds)


def test_scan_input_axis_out_of_range_is_refused_clearly():
    m, feeds = scan_model(4, scan_input_axes=[2]), {"s0": np.zeros(4, np.float32), "x": X}
    with pytest.raises(Exception):  # noqa: B017
        ort_run(m, feeds)
    with pytest.raises(OrtlabError, match="scan_input_axes"):
        InferenceSession(m).run(None, feeds)


def test_a_backward_scan_inside_a_loop_body_as_ort():
    inner = scan_model(4, scan_input_directions=[1]).graph.node[0]
    body = h.make_graph([inner, h.make_node("Identity", ["c"], ["c2"])], "loop_body",
                        [vi("i", [], T.INT64), vi("c", [], T.BOOL)], [vi("c2", [], T.BOOL), vi("zs", [3, 4])])
    loop = h.make_node("Loop", ["n", ""], ["out"], body=body)
    m = h.make_model(h.make_graph([loop], "g", [vi("s0", [4]), vi("x", [3, 4]), vi("n", [], T.INT64)], [vi("out")]),
                     opset_imports=[h.make_opsetid("", 16)])
    m.ir_version = 8
    feeds = {"s0": np.zeros(4, np.float32), "x": X, "n": np.array(2, np.int64)}
    theirs, ours = ort_run(m, feeds), InferenceSession(m).run(None, feeds)
    np.testing.assert_array_equal(ours[0], theirs[0])


def growing_loop():
    """A Loop whose scan output y is ones([i + 1]): one longer each iteration."""
    body = h.make_graph(
        [h.make_node("Add", ["i", "one"], ["n1"]), h.make_node("Reshape", ["n1", "sh"], ["n1s"]),
         h.make_node("ConstantOfShape", ["n1s"], ["y"], value=h.make_tensor("v", T.FLOAT, [1], [1.0])),
         h.make_node("Identity", ["c"], ["c2"])], "body",
        [vi("i", [], T.INT64), vi("c", [], T.BOOL)], [vi("c2", [], T.BOOL), vi("y")],
        initializer=[numpy_helper.from_array(np.array(1, np.int64), "one"),
                     numpy_helper.from_array(np.array([1], np.int64), "sh")])
    m = h.make_model(h.make_graph([h.make_node("Loop", ["n", ""], ["ys"], body=body, name="grow")], "g",
                                  [vi("n", [], T.INT64)], [vi("ys")]), opset_imports=[h.make_opsetid("", 18)])
    m.ir_version = 8
    return m


def test_a_loop_scan_output_changing_shape_is_refused_naming_the_loop_and_iteration():
    feeds = {"n": np.array(3, np.int64)}
    with pytest.raises(Exception, match="Inconsistent shape in loop output"):
        ort_run(growing_loop(), feeds)
    with pytest.raises(OrtlabError, match=r"Loop 'grow': scan output 'y' has shape \[2\] at iteration 1"):
        InferenceSession(growing_loop()).run(None, feeds)


def test_a_loop_scan_output_of_one_iteration_is_stacked_as_ort():
    feeds = {"n": np.array(1, np.int64)}
    theirs, ours = ort_run(growing_loop(), feeds), InferenceSession(growing_loop()).run(None, feeds)
    np.testing.assert_array_equal(ours[0], theirs[0])

"""Held-out probes of sequence and optional values, feeds and Dropout in the engine, each run in ORT 1.19.2 too.

Facts from ORT (each asserted on the real session below): ConcatFromSequence with new_axis=1 stacks its
elements along a new axis at position `axis` (the ONNX spec; onnx.reference always stacks at the end); a
Python list fed for a tensor input is taken as an array of the input's element type.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from ortlab.engine import InferenceSession
from ortlab.errors import OrtlabError

pytestmark = pytest.mark.heldout

SEQ = h.make_sequence_type_proto(h.make_tensor_type_proto(T.FLOAT, None))


def model(nodes, inputs, outputs, opset=18):
    return h.make_model(h.make_graph(nodes, "g", inputs, outputs), opset_imports=[h.make_opsetid("", opset)])


def both(m, feeds):
    ours = InferenceSession(m).run(None, feeds)
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    return ours, theirs


def assert_equal(ours, theirs):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_concat_from_sequence_new_axis_stacks_at_axis_as_ort(axis):
    m = model([h.make_node("ConcatFromSequence", ["s"], ["y"], axis=axis, new_axis=1)],
              [h.make_value_info("s", SEQ)], [h.make_tensor_value_info("y", T.FLOAT, None)])
    seq = [np.arange(6, dtype=np.float32).reshape(2, 3) + 10 * i for i in range(4)]
    ours, theirs = both(m, {"s": seq})
    np.testing.assert_array_equal(theirs[0], np.stack(seq, axis=axis))  # the spec, independently of ORT
    assert_equal(ours, theirs)


def identity(elem_type, shape):
    return model([h.make_node("Identity", ["x"], ["y"])], [h.make_tensor_value_info("x", elem_type, shape)],
                 [h.make_tensor_value_info("y", elem_type, shape)])


@pytest.mark.parametrize("elem_type, shape, value", [
    (T.FLOAT, [2], [1.0, 2.0]), (T.FLOAT, [2], [1, 2]), (T.INT32, [2], [1, 2]), (T.FLOAT16, [2], [1.5, 2.0]),
    (T.FLOAT, [2, 1], [[1.0], [2.0]]), (T.BOOL, [2], [True, False]), (T.INT64, [2], [3, -4]),
    (T.STRING, [2], ["a", "bc"])])
def test_a_python_list_feed_becomes_the_inputs_element_type_as_ort(elem_type, shape, value):
    ours, theirs = both(identity(elem_type, shape), {"x": value})
    assert_equal(ours, theirs)


def test_a_list_of_fractions_for_an_integer_input_is_refused_where_ort_truncates():
    m = identity(T.INT64, [2])
    session = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    theirs = session.run(None, {"x": [1.5, 2.0]})
    np.testing.assert_array_equal(theirs[0], [1, 2])  # ORT drops the fraction without a word
    with pytest.raises(OrtlabError, match="fraction"):
        InferenceSession(m).run(None, {"x": [1.5, 2.0]})


def bfloat16_tensor(name, values):
    """A BFLOAT16 TensorProto in raw_data: each float32's upper 16 bits (values chosen exact in bfloat16)."""
    values = np.asarray(values, np.float32)
    bits = (values.view(np.uint32) >> np.uint32(16)).astype("<u2")
    return h.make_tensor(name, T.BFLOAT16, values.shape, vals=bits.tobytes(), raw=True)


BF16_VALUES = np.array([[1.0, -2.25], [2.0 ** 127, 2.0 ** -10]], np.float32)


@pytest.mark.parametrize("body_op", ["If", "Loop"])
def test_a_bfloat16_constant_inside_a_body_holds_its_values_as_ort(body_op):
    value = bfloat16_tensor("", BF16_VALUES)
    out = h.make_tensor_value_info("o", T.FLOAT, None)
    nodes = [h.make_node("Constant", [], ["w"], value=value), h.make_node("Cast", ["w"], ["o"], to=T.FLOAT)]
    if body_op == "If":
        body = h.make_graph(nodes, "b", [], [out])
        node = h.make_node("If", ["c"], ["y"], then_branch=body, else_branch=body)
        feeds, inputs = {"c": np.array(True)}, [h.make_tensor_value_info("c", T.BOOL, [])]
    else:
        body = h.make_graph(nodes + [h.make_node("Identity", ["cond"], ["cond_out"])], "b",
                            [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("cond", T.BOOL, [])],
                            [h.make_tensor_value_info("cond_out", T.BOOL, []), out])
        node = h.make_node("Loop", ["n", ""], ["y"], body=body)
        feeds, inputs = {"n": np.array(1)}, [h.make_tensor_value_info("n", T.INT64, [])]
    m = model([node], inputs, [h.make_tensor_value_info("y", T.FLOAT, None)])
    ours, theirs = both(m, feeds)
    expected = BF16_VALUES if body_op == "If" else BF16_VALUES[None]
    np.testing.assert_array_equal(theirs[0], expected)  # exact in bfloat16, so the float32s come back
    assert_equal(ours, theirs)


@pytest.mark.parametrize("in_body", [False, True])
def test_constant_of_shape_with_a_bfloat16_value_fills_it_as_ort(in_body):
    value = bfloat16_tensor("", np.array([2.25], np.float32))
    nodes = [h.make_node("ConstantOfShape", ["s"], ["w"], value=value), h.make_node("Cast", ["w"], ["o"], to=T.FLOAT)]
    inputs = [h.make_tensor_value_info("s", T.INT64, [1])]
    feeds = {"s": np.array([3])}
    if in_body:
        body = h.make_graph(nodes, "b", [], [h.make_tensor_value_info("o", T.FLOAT, None)])
        nodes = [h.make_node("If", ["c"], ["o"], then_branch=body, else_branch=body)]
        inputs, feeds = inputs + [h.make_tensor_value_info("c", T.BOOL, [])], {**feeds, "c": np.array(True)}
    m = model(nodes, inputs, [h.make_tensor_value_info("o", T.FLOAT, None)], opset=20)
    ours, theirs = both(m, feeds)
    np.testing.assert_array_equal(theirs[0], np.full(3, 2.25, np.float32))
    assert_equal(ours, theirs)


def test_a_sequence_of_0d_tensors_as_ort():
    """0-d arrays are sequence elements in ORT and in the engine; numpy scalars (np.float32(3)) are refused by
    ORT's binding (CreateSequenceOfTensors: Input is not a tensor) and taken by the engine as 0-d arrays."""
    m = model([h.make_node("Identity", ["s"], ["y"])], [h.make_value_info("s", SEQ)], [h.make_value_info("y", SEQ)])
    seq = [np.array(3.0, np.float32), np.array(-1.0, np.float32)]
    ours, theirs = both(m, {"s": seq})
    assert_equal(ours[0], theirs[0])
    with pytest.raises(Exception, match="not a tensor"):
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(
            None, {"s": [np.float32(3.0)]})
    assert_equal(InferenceSession(m).run(None, {"s": [np.float32(3.0)]})[0], [np.array(3.0, np.float32)])


def test_identity_of_an_empty_optional_is_empty_as_ort():
    opt = h.make_optional_type_proto(h.make_tensor_type_proto(T.FLOAT, [2]))
    m = model([h.make_node("Identity", ["o"], ["y"])], [h.make_value_info("o", opt)], [h.make_value_info("y", opt)])
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"o": None})
    assert theirs == [None]
    assert InferenceSession(m).run(None, {"o": None}) == [None]


def test_binding_a_list_as_a_sequence_input_is_refused_as_ort():
    m = model([h.make_node("SequenceLength", ["s"], ["n"])], [h.make_value_info("s", SEQ)],
              [h.make_tensor_value_info("n", T.INT64, [])])
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    with pytest.raises(Exception, match="Only binding Tensors"):
        theirs.io_binding().bind_cpu_input("s", [np.ones(1, np.float32)])
    with pytest.raises(OrtlabError, match="bind_cpu_input"):
        InferenceSession(m).io_binding().bind_cpu_input("s", [np.ones(1, np.float32)])


def test_dropout_inside_an_if_draws_a_new_mask_each_run_as_ort():
    """Training-mode Dropout in a branch: ratio 0.3 keeps about 70% and scales kept values by 1/0.7, and the
    mask changes from run to run of one session, in ORT and in the engine (masks themselves differ: other RNGs)."""
    out = [h.make_tensor_value_info("o", T.FLOAT, None), h.make_tensor_value_info("mk", T.BOOL, None)]
    body = h.make_graph([h.make_node("Dropout", ["x", "r", "t"], ["o", "mk"], seed=3)], "b", [], out)
    inputs = [h.make_tensor_value_info("c", T.BOOL, []), h.make_tensor_value_info("x", T.FLOAT, [4000]),
              h.make_tensor_value_info("r", T.FLOAT, []), h.make_tensor_value_info("t", T.BOOL, [])]
    m = model([h.make_node("If", ["c"], ["y", "mask"], then_branch=body, else_branch=body)], inputs,
              [h.make_tensor_value_info("y", T.FLOAT, None), h.make_tensor_value_info("mask", T.BOOL, None)], opset=13)
    x = np.ones(4000, np.float32)
    feeds = {"c": np.array(True), "x": x, "r": np.array(0.3, np.float32), "t": np.array(True)}
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    for session in (theirs, InferenceSession(m)):
        (y1, m1), (y2, m2) = session.run(None, feeds), session.run(None, feeds)
        assert not np.array_equal(m1, m2)
        for y, mask in ((y1, m1), (y2, m2)):
            assert abs(mask.mean() - 0.7) < 0.04
            np.testing.assert_allclose(y, mask * x / np.float32(0.7), rtol=1e-6)

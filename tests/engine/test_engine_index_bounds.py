"""Ops that take indices, with indices in and out of range, run in ORT 1.19.2 and in ortlab's engine: where
ORT refuses an index the engine must refuse it with an OrtlabError naming the index and the range (never
wrap it, as onnx.reference's GatherElements did, nor fail with numpy's IndexError); where ORT answers,
the engine gives the same answer (negative indices in range count from the end).

Facts from ORT (asserted on the real session below): Gather, GatherElements, GatherND (with batch_dims),
ScatterElements, Scatter, ScatterND, SequenceAt, SequenceErase and SequenceInsert refuse indices outside
[-n, n - 1] (SequenceInsert takes n too and appends); OneHot gives a row of off values.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from ortlab.engine import InferenceSession
from ortlab.errors import OrtlabError

X = np.arange(12, dtype=np.float32).reshape(4, 3)
X3 = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
NP2T = {np.dtype(np.float32): T.FLOAT, np.dtype(np.int64): T.INT64, np.dtype(np.int32): T.INT32}
SEQ = h.make_sequence_type_proto(h.make_tensor_type_proto(T.FLOAT, None))


def model(nodes, feeds, opset=18, inits=None, inputs=None):
    inputs = inputs or [h.make_tensor_value_info(k, NP2T[v.dtype], list(v.shape)) for k, v in feeds.items()]
    inits = [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()]
    m = h.make_model(h.make_graph(nodes, "g", inputs, [h.make_tensor_value_info("y", T.FLOAT, None)],
                                  initializer=inits), opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def ort_outcome(m, feeds):
    try:
        return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    except Exception as exc:  # noqa: BLE001 (ORT's own exception types)
        return exc


def assert_as_ort(m, feeds, refused_words=("out of range",)):
    """The engine gives ORT's answer; where ORT refuses, an OrtlabError with `refused_words`."""
    theirs = ort_outcome(m, feeds)
    if isinstance(theirs, Exception):
        with pytest.raises(OrtlabError) as caught:
            InferenceSession(m).run(None, feeds)
        for words in refused_words:
            assert words in str(caught.value)
        return "refused"
    ours = InferenceSession(m).run(None, feeds)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_array_equal(a, b)
    return "answered"


def test_gather_elements_refuses_minus_four_on_an_axis_of_three():
    m = model([h.make_node("GatherElements", ["x", "i"], ["y"], axis=1)], {"x": X, "i": np.full((4, 1), -4)})
    assert assert_as_ort(m, {"x": X, "i": np.full((4, 1), -4)}, ("index -4", "[-3, 2]")) == "refused"


@pytest.mark.parametrize("index, outcome", [(-4, "refused"), (3, "refused"), (-3, "answered"), (-1, "answered"),
                                            (2, "answered")])
@pytest.mark.parametrize("opset", [11, 13])
def test_gather_elements_index_range_as_ort(index, outcome, opset):
    feeds = {"x": X, "i": np.full((4, 2), index, np.int64)}
    m = model([h.make_node("GatherElements", ["x", "i"], ["y"], axis=1)], feeds, opset=opset)
    assert assert_as_ort(m, feeds) == outcome


@pytest.mark.parametrize("axis, index, dtype, outcome", [
    (0, -5, np.int64, "refused"), (0, 4, np.int64, "refused"), (0, -4, np.int64, "answered"),
    (1, -4, np.int32, "refused"), (1, 3, np.int32, "refused"), (1, -1, np.int32, "answered")])
def test_gather_index_range_as_ort(axis, index, dtype, outcome):
    feeds = {"x": X, "i": np.array([index, 0], dtype)}
    m = model([h.make_node("Gather", ["x", "i"], ["y"], axis=axis)], feeds)
    assert assert_as_ort(m, feeds) == outcome


@pytest.mark.parametrize("index, outcome", [([4, 0], "refused"), ([-5, 0], "refused"), ([0, 3], "refused"),
                                            ([0, -4], "refused"), ([-4, -3], "answered"), ([3, 2], "answered")])
def test_gather_nd_index_range_as_ort(index, outcome):
    feeds = {"x": X, "i": np.array([index], np.int64)}
    m = model([h.make_node("GatherND", ["x", "i"], ["y"])], feeds)
    assert assert_as_ort(m, feeds) == outcome


@pytest.mark.parametrize("index, outcome", [([[3], [0]], "refused"), ([[-4], [0]], "refused"),
                                            ([[-1], [-3]], "answered"), ([[1], [2]], "answered")])
def test_gather_nd_with_batch_dims_checks_the_axis_after_the_batch(index, outcome):
    feeds = {"x": X3, "i": np.array(index, np.int64)}
    m = model([h.make_node("GatherND", ["x", "i"], ["y"], batch_dims=1)], feeds)
    assert assert_as_ort(m, feeds) == outcome


@pytest.mark.parametrize("opset", [11, 13, 16])
@pytest.mark.parametrize("index, outcome", [(3, "refused"), (-3, "answered")])
def test_scatter_elements_and_scatter_nd_at_older_opsets_as_ort(opset, index, outcome):
    feeds = {"x": X, "i": np.full((4, 1), index, np.int64), "u": np.ones((4, 1), np.float32)}
    m = model([h.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1)], feeds, opset=opset)
    assert assert_as_ort(m, feeds) == outcome
    feeds = {"x": X, "i": np.array([[0, index]], np.int64), "u": np.ones((1,), np.float32)}
    m = model([h.make_node("ScatterND", ["x", "i", "u"], ["y"])], feeds, opset=opset)
    assert assert_as_ort(m, feeds) == outcome
    feeds = {"x": X, "i": np.array([[0, index]], np.int64)}
    m = model([h.make_node("GatherND", ["x", "i"], ["y"])], feeds, opset=min(opset, 12))
    assert assert_as_ort(m, feeds) == outcome


@pytest.mark.parametrize("index, outcome", [(3, "refused"), (-4, "refused"), (-3, "answered"), (2, "answered")])
@pytest.mark.parametrize("reduction", ["none", "add", "max"])
def test_scatter_elements_index_range_as_ort(index, outcome, reduction):
    feeds = {"x": X, "i": np.full((4, 1), index, np.int64), "u": np.ones((4, 1), np.float32)}
    m = model([h.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=1, reduction=reduction)], feeds)
    assert assert_as_ort(m, feeds) == outcome


@pytest.mark.parametrize("index, outcome", [(3, "refused"), (-4, "refused"), (-3, "answered")])
def test_deprecated_scatter_index_range_as_ort(index, outcome):
    feeds = {"x": X, "i": np.full((4, 1), index, np.int64), "u": np.ones((4, 1), np.float32)}
    m = model([h.make_node("Scatter", ["x", "i", "u"], ["y"], axis=1)], feeds, opset=9)
    assert assert_as_ort(m, feeds) == outcome


@pytest.mark.parametrize("index, outcome", [([4], "refused"), ([-5], "refused"), ([-4], "answered"),
                                            ([0, 3], "refused"), ([0, -4], "refused"), ([0, -1], "answered")])
@pytest.mark.parametrize("reduction", ["none", "add"])
def test_scatter_nd_index_range_as_ort(index, outcome, reduction):
    indices = np.array([index], np.int64)
    updates = np.ones((1, 3) if len(index) == 1 else (1,), np.float32)
    feeds = {"x": X, "i": indices, "u": updates}
    m = model([h.make_node("ScatterND", ["x", "i", "u"], ["y"], reduction=reduction)], feeds)
    assert assert_as_ort(m, feeds) == outcome


@pytest.mark.parametrize("index", [5, -5, 4, -4, 3])
def test_one_hot_out_of_range_is_a_row_of_off_values_as_ort(index):
    feeds = {"i": np.array([index, 0], np.int64)}
    m = model([h.make_node("OneHot", ["i", "d", "v"], ["y"])], feeds,
              inits={"d": np.array(4, np.int64), "v": np.array([0, 1], np.float32)})
    assert assert_as_ort(m, feeds) == "answered"


def test_gather_elements_out_of_range_inside_a_loop_body_is_refused():
    body = h.make_graph(
        [h.make_node("GatherElements", ["x", "idx"], ["s"], axis=1), h.make_node("Identity", ["c"], ["c2"])], "body",
        [h.make_tensor_value_info("it", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, [])],
        [h.make_tensor_value_info("c2", T.BOOL, []), h.make_tensor_value_info("s", T.FLOAT, None)])
    feeds = {"x": X, "idx": np.full((4, 1), -4, np.int64)}
    m = model([h.make_node("Loop", ["n", ""], ["y"], body=body)], feeds, inits={"n": np.array(1, np.int64)})
    assert assert_as_ort(m, feeds) == "refused"


def sequence_model(tail_nodes, extra_inputs=()):
    nodes = [h.make_node("SplitToSequence", ["x"], ["s"], axis=1)] + tail_nodes
    inputs = [h.make_tensor_value_info("x", T.FLOAT, [2, 3])] + list(extra_inputs)
    return model(nodes, {}, inputs=inputs)


SX = np.arange(6, dtype=np.float32).reshape(2, 3)


@pytest.mark.parametrize("index, outcome", [(3, "refused"), (-4, "refused"), (2, "answered"), (-3, "answered"),
                                            (-1, "answered"), (0, "answered")])
@pytest.mark.parametrize("dtype", [np.int64, np.int32])
def test_sequence_at_index_range_as_ort(index, outcome, dtype):
    m = sequence_model([h.make_node("SequenceAt", ["s", "i"], ["y"])],
                       [h.make_tensor_value_info("i", NP2T[np.dtype(dtype)], [])])
    feeds = {"x": SX, "i": np.array(index, dtype)}
    assert assert_as_ort(m, feeds, ("index", "sequence of 3", "[-3, 2]")) == outcome


@pytest.mark.parametrize("index, outcome", [(3, "refused"), (-4, "refused"), (1, "answered"), (-3, "answered")])
def test_sequence_erase_index_range_as_ort(index, outcome):
    m = sequence_model([h.make_node("SequenceErase", ["s", "i"], ["s2"]),
                        h.make_node("ConcatFromSequence", ["s2"], ["y"], axis=1)],
                       [h.make_tensor_value_info("i", T.INT64, [])])
    assert assert_as_ort(m, {"x": SX, "i": np.array(index, np.int64)}, ("index",)) == outcome


@pytest.mark.parametrize("index, outcome", [(3, "answered"), (4, "refused"), (-4, "refused"), (1, "answered"),
                                            (-3, "answered"), (0, "answered")])
def test_sequence_insert_position_as_ort(index, outcome):
    m = sequence_model([h.make_node("SequenceInsert", ["s", "t", "i"], ["s2"]),
                        h.make_node("ConcatFromSequence", ["s2"], ["y"], axis=1)],
                       [h.make_tensor_value_info("t", T.FLOAT, [2, 1]), h.make_tensor_value_info("i", T.INT64, [])])
    feeds = {"x": SX, "t": np.full((2, 1), 9, np.float32), "i": np.array(index, np.int64)}
    assert assert_as_ort(m, feeds, ("index",)) == outcome
    if index == 3:  # inserting at the length appends (onnx.reference's modulo put it first)
        np.testing.assert_array_equal(InferenceSession(m).run(None, feeds)[0][:, -1], [9, 9])


def test_gather_with_empty_indices_keeps_the_other_axes_as_ort():
    feeds = {"x": X3, "i": np.zeros((0,), np.int64)}
    m = model([h.make_node("Gather", ["x", "i"], ["y"], axis=1)], feeds)
    assert assert_as_ort(m, feeds) == "answered"
    assert InferenceSession(m).run(None, feeds)[0].shape == (2, 0, 4)


@pytest.mark.parametrize("axis", [-1, -2])
def test_gather_and_scatter_elements_with_a_negative_axis_as_ort(axis):
    indices = np.full((2, 3, 2) if axis == -1 else (2, 2, 4), -1, np.int32)
    feeds = {"x": X3, "i": indices}
    m = model([h.make_node("GatherElements", ["x", "i"], ["y"], axis=axis)], feeds)
    assert assert_as_ort(m, feeds) == "answered"
    feeds = {"x": X3, "i": indices, "u": np.ones(indices.shape, np.float32)}
    m = model([h.make_node("ScatterElements", ["x", "i", "u"], ["y"], axis=axis)], feeds)
    assert assert_as_ort(m, feeds) == "answered"


@pytest.mark.parametrize("insert_at, read_at, outcome", [(0, -1, "answered"), (-1, 0, "refused"),
                                                         (1, 0, "refused")])
def test_sequence_insert_into_an_empty_sequence_as_ort(insert_at, read_at, outcome):
    nodes = [h.make_node("SequenceEmpty", [], ["s"]), h.make_node("SequenceInsert", ["s", "t", "i"], ["s2"]),
             h.make_node("SequenceAt", ["s2", "j"], ["y"])]
    inputs = [h.make_tensor_value_info("t", T.FLOAT, [2]), h.make_tensor_value_info("i", T.INT64, []),
              h.make_tensor_value_info("j", T.INT64, [])]
    feeds = {"t": np.array([1, 2], np.float32), "i": np.array(insert_at, np.int64), "j": np.array(read_at, np.int64)}
    assert assert_as_ort(model(nodes, {}, inputs=inputs), feeds, ("index",)) == outcome


def test_sequence_at_of_an_empty_sequence_is_refused_as_ort():
    nodes = [h.make_node("SequenceEmpty", [], ["s"]), h.make_node("SequenceAt", ["s", "i"], ["y"])]
    m = model(nodes, {}, inputs=[h.make_tensor_value_info("i", T.INT64, [])])
    assert assert_as_ort(m, {"i": np.array(0, np.int64)}, ("sequence of 0",)) == "refused"


@pytest.mark.parametrize("with_index", [False, True])
def test_sequence_erase_of_an_empty_sequence_is_refused_as_ort(with_index):
    nodes = [h.make_node("SequenceEmpty", [], ["s"]),
             h.make_node("SequenceErase", ["s", "i"] if with_index else ["s"], ["s2"]),
             h.make_node("SequenceLength", ["s2"], ["n"]), h.make_node("Cast", ["n"], ["y"], to=T.FLOAT)]
    m = model(nodes, {}, inputs=[h.make_tensor_value_info("i", T.INT64, [])] if with_index else [])
    feeds = {"i": np.array(0, np.int64)} if with_index else {}
    assert assert_as_ort(m, feeds, ("empty sequence",)) == "refused"

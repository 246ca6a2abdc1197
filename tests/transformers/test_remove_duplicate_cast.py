"""RemoveDuplicateCastTransformer (ortlab.transformers.remove_duplicate_cast) against ORT 1.19.2, live.

Every chain x -> Cast 'a' -> Cast 'b' -> Identity over a grid of element types: the nodes ortlab's session keeps
are the nodes of ORT's saved graph at ORT_DISABLE_ALL (the remover runs at every level), and the outputs are
ORT's. A lossy pair (float -> bfloat16 -> float, int64 -> int32 -> int64) used to be removed, silently changing
the values; ORT keeps it.
"""
import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from ortlab import session
from ortlab.engine import InferenceSession, SessionOptions
from ortlab.memory.session_graph import session_graph
from ortlab.transformers.remove_duplicate_cast import unsafe_cast

FEEDS = {T.FLOAT: np.array([1.00390625, 1.0001, -3.7, 70000.5, 0.0], np.float32),
         T.DOUBLE: np.array([1.00390625, 1.0000001, -3.7, 70000.5, 0.0], np.float64),
         T.FLOAT16: np.array([1.0, 1.5, -3.7, 600, 0.0], np.float16),
         T.INT64: np.array([1, 300, 70000, -5, 2 ** 40], np.int64),
         T.INT32: np.array([1, 300, 70000, -5, 2 ** 25 + 1], np.int32),
         T.UINT8: np.array([1, 200, 255, 0, 7], np.uint8),
         T.BOOL: np.array([True, False, True, True, False])}
TYPES = [T.FLOAT, T.DOUBLE, T.FLOAT16, T.BFLOAT16, T.INT8, T.INT32, T.INT64, T.UINT8, T.UINT32, T.BOOL]
GRID = [(s, m, d) for s, m, d in itertools.product(FEEDS, TYPES, TYPES) if m != s]


def chain(src, mid, dst, names=("a", "b")):
    nodes = [h.make_node("Cast", ["x"], ["m"], to=mid, name=names[0]),
             h.make_node("Cast", ["m"], ["c"], to=dst, name=names[1]),
             h.make_node("Identity", ["c"], ["y"], name="id")]
    graph = h.make_graph(nodes, "casts", [h.make_tensor_value_info("x", src, [5])],
                         [h.make_tensor_value_info("y", dst, [5])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)


def kept_by_ort(model):
    saved = session.optimized_model(model, level="disable", providers=["CPUExecutionProvider"])
    return sorted((n.name, tuple(n.input)) for n in saved.graph.node)


def kept_by_ortlab(model):
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    return sorted((s.node.name, tuple(s.node.input_names)) for s in sess.state.steps)


def name(t):
    return T.DataType.Name(t).lower()


@pytest.mark.parametrize("src, mid, dst", GRID, ids=[f"{name(s)}-{name(m)}-{name(d)}" for s, m, d in GRID])
def test_the_casts_kept_and_the_values_are_orts(src, mid, dst):
    model = chain(src, mid, dst)
    theirs = kept_by_ort(model)
    assert kept_by_ortlab(model) == theirs
    assert sorted((n.name, tuple(a.name for a in n.inputs)) for n in session_graph(model).graph.nodes()) == theirs
    if dst == T.BFLOAT16:
        return  # neither run() returns a bfloat16 output (tests/engine/test_engine_bfloat16_types.py)
    ours = InferenceSession(model).run(None, {"x": FEEDS[src]})[0]
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": FEEDS[src]})[0]
    np.testing.assert_array_equal(ours, expected)


@pytest.mark.parametrize("narrow", [T.FLOAT16, T.BFLOAT16])
def test_a_lossy_round_trip_rounds_as_ort_at_every_level(narrow):
    model = chain(T.FLOAT, narrow, T.FLOAT)
    x = FEEDS[T.FLOAT]
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(
        None, {"x": x})[0]
    assert not np.array_equal(expected, x)  # the round trip loses bits: 1.0001 is not representable
    for level in (0, 1, 2, 99):
        ours = InferenceSession(model, SessionOptions(graph_optimization_level=level)).run(None, {"x": x})[0]
        np.testing.assert_array_equal(ours, expected)


def test_insert_cast_transformers_own_narrowing_cast_is_not_lossy_by_its_name():
    """A narrowing Cast named InsertedPrecisionFreeCast_* (what InsertCastTransformer names its fp32 -> fp16
    Casts) does not count as lossy, so the pair goes, as in ORT."""
    model = chain(T.FLOAT, T.FLOAT16, T.FLOAT, names=("InsertedPrecisionFreeCast_a", "b"))
    theirs = kept_by_ort(model)
    assert [n for n, _ in theirs] == ["id"]
    assert kept_by_ortlab(model) == theirs


def test_a_lossy_cast_then_a_narrower_one_drops_the_first_as_ort():
    """double -> float -> float16 loses nothing the direct double -> float16 keeps: the first Cast goes."""
    model = chain(T.DOUBLE, T.FLOAT, T.FLOAT16)
    theirs = kept_by_ort(model)
    assert ("b", ("x",)) in theirs and "a" not in [n for n, _ in theirs]
    assert kept_by_ortlab(model) == theirs


@pytest.mark.parametrize("src, dst, lossy", [
    (T.FLOAT, T.DOUBLE, False), (T.DOUBLE, T.FLOAT, True), (T.FLOAT, T.BFLOAT16, True),
    (T.FLOAT16, T.BFLOAT16, True), (T.BFLOAT16, T.FLOAT16, True), (T.FLOAT16, T.FLOAT, False),
    (T.INT32, T.INT64, False), (T.INT64, T.INT32, True), (T.INT32, T.UINT32, True), (T.UINT8, T.INT16, False),
    (T.UINT16, T.INT16, True), (T.INT32, T.FLOAT, True), (T.INT32, T.DOUBLE, False), (T.FLOAT, T.INT64, True),
    (T.BOOL, T.UINT8, False), (T.INT8, T.BOOL, True), (T.STRING, T.FLOAT, True), (None, T.FLOAT, True)])
def test_unsafe_cast_counts_what_can_lose_information(src, dst, lossy):
    """Independent facts: a float32 holds every int16 but not every int32 (24-bit significand); uint16 65535 does
    not fit int16; float16 and bfloat16 each hold values the other does not (range, precision)."""
    assert unsafe_cast(src, dst) is lossy

"""The memory-planner seam under careless planners: SessionOptions(memory_planner=...) names what it takes and
what it was given, numpy integer offsets are offsets, a block no machine could allocate is refused before
anything is allocated (naming the planner, the tensor, its offset and the block), and a planner that raises is
named. What runs gives onnxruntime's outputs."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortlab.engine import InferenceSession, InvalidArgument, SessionOptions
from ortlab.memory import PlannerError, plan, placement_of


def _model():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])
    nodes = [helper.make_node("Relu", ["x"], ["h1"]), helper.make_node("Sigmoid", ["h1"], ["h2"]),
             helper.make_node("Tanh", ["h2"], ["h3"]), helper.make_node("Add", ["h3", "h1"], ["y"])]
    return helper.make_model(helper.make_graph(nodes, "chain", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])


FEEDS = {"x": np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)}


def _ort_outputs():
    return ort.InferenceSession(_model().SerializeToString(), providers=["CPUExecutionProvider"]).run(None, FEEDS)


def stacked(tensors, as_offset=int):
    offsets, top = {}, 0
    for t in tensors:
        offsets[t.name], top = as_offset(top), top + t.size
    return offsets


def _run(planner):
    sess = InferenceSession(_model(), SessionOptions(memory_planner=planner))
    return sess, sess.run(None, FEEDS)


@pytest.mark.parametrize("planner", [dict, list, int, type("Planner", (), {})], ids=lambda p: p.__name__)
def test_a_class_is_refused_when_the_session_is_made_naming_what_memory_planner_takes(planner):
    with pytest.raises(InvalidArgument, match=rf"memory_planner must be 'ort'.*a function.*{planner.__name__}.*class"):
        InferenceSession(_model(), SessionOptions(memory_planner=planner))


@pytest.mark.parametrize("planner", [lambda: {}, lambda tensors, extra: {}], ids=["no argument", "two arguments"])
def test_a_function_that_cannot_take_the_tensors_is_refused_when_the_session_is_made(planner):
    with pytest.raises(InvalidArgument, match="takes one argument, the list of tensors"):
        InferenceSession(_model(), SessionOptions(memory_planner=planner))


@pytest.mark.parametrize("kind", [np.int64, np.int32, np.uint64, np.uint16])
def test_numpy_integer_offsets_are_offsets(kind):
    sess, outputs = _run(lambda tensors: stacked(tensors, kind))
    np.testing.assert_allclose(outputs[0], _ort_outputs()[0], rtol=1e-6)
    assert sess.last_run.pattern_bytes == sum(t.size for t in plan(sess.model, {"x": (4, 8)}).planned())


@pytest.mark.parametrize("offset, kind", [(0.5, "float"), (256.0, "float"), (np.float64(0), "numpy.float64"),
                                          (False, "bool"), (np.bool_(False), "numpy.bool_"), (None, "NoneType"),
                                          ("0", "str"), (np.array(0), "numpy.ndarray")])
def test_an_offset_that_is_no_integer_is_refused_naming_its_type(offset, kind):
    with pytest.raises(PlannerError, match=rf"offsets must be ints >= 0.*\({kind}\)"):
        _run(lambda tensors: {t.name: offset for t in tensors})


def test_a_negative_offset_is_refused():
    with pytest.raises(PlannerError, match=r"ints >= 0.*-256"):
        _run(lambda tensors: {t.name: -256 for t in tensors})


@pytest.mark.parametrize("offset", [2 ** 60, 2 ** 70, np.int64(2 ** 62)])
def test_a_block_no_machine_could_allocate_is_refused_before_allocating(offset):
    def far(tensors):
        return {t.name: offset + k * t.size for k, t in enumerate(tensors)}

    with pytest.raises(PlannerError, match=r"planner 'far' puts tensor 'h\d' at offset \d+.*block of "
                                           r"\d+ bytes.*more than this machine's memory"):
        _run(far)


def test_a_large_block_within_the_machines_memory_runs_and_gives_orts_outputs():
    sess, outputs = _run(lambda tensors: {t.name: 2 ** 26 + o for t, o in zip(tensors, stacked(tensors).values())})
    np.testing.assert_allclose(outputs[0], _ort_outputs()[0], rtol=1e-6)
    assert sess.last_run.pattern_bytes > 2 ** 26


@pytest.mark.parametrize("planner, error", [(lambda tensors: 1 / 0, "ZeroDivisionError"),
                                            (lambda tensors: tensors[99], "IndexError")])
def test_a_planner_that_raises_is_named_with_its_error(planner, error):
    with pytest.raises(PlannerError, match=rf"planner '<lambda>' raised {error}") as info:
        _run(planner)
    assert type(info.value.__cause__).__name__ == error


@pytest.mark.parametrize("returned, kind", [(None, "NoneType"), ([], "list"), ((i for i in ()), "generator")])
def test_a_planner_returning_no_dict_is_refused(returned, kind):
    with pytest.raises(PlannerError, match=rf"returned {kind}; return \{{tensor name: offset\}}"):
        _run(lambda tensors: returned)


def test_missing_and_extra_tensors_are_named():
    with pytest.raises(PlannerError, match=r"missing \['h1'\], unknown \['zz'\]"):
        _run(lambda tensors: {**{k: v for k, v in stacked(tensors).items() if k != "h1"}, "zz": 0})


def test_placement_of_refuses_a_class_and_accepts_numpy_offsets_as_the_engine_does():
    p = plan(_model(), {"x": (4, 8)})
    with pytest.raises(PlannerError, match="dict.*class"):
        placement_of(p, dict)
    placement = placement_of(p, lambda tensors: stacked(tensors, np.int64))
    assert all(type(o) is int for o in placement.offsets.values())
    assert placement.peak_bytes == sum(v.size for v in p.planned())

"""D_03's exercises are judged by ORT 1.19.2's values and profiler. Here: each dump's values are those onnx's
reference evaluator computes, and the birth the judge finds in ORT's dump is the one it finds in the reference
evaluator's; the bytes ORT's profiler records are numpy's shape times element size for each node, and the one
node the profile lacks is the Shape that ORT's optimized graph replaced by an initializer.
"""
import numpy as np
import onnx
import pytest
from onnx.reference import ReferenceEvaluator

from ortlab import session
from ortlab.labs import d_03
from ortlab.labs.judges.d_03 import BYTES_LEVEL, birth, ort_output_bytes


def _reference_dump(model, feeds):
    """The dump of `model` with the values onnx.reference computes (every value made a graph output)."""
    every = onnx.ModelProto.FromString(model.SerializeToString())
    present = {v.name for v in every.graph.output}
    made = [o for n in every.graph.node for o in n.output]
    every.graph.output.extend(onnx.ValueInfoProto(name=o) for o in made if o not in present)
    outputs = [o.name for o in every.graph.output]
    with np.errstate(divide="ignore", invalid="ignore"):  # log(0) and inf - inf, on purpose
        values = dict(zip(outputs, ReferenceEvaluator(every).run(None, feeds)))
    known = dict(feeds, **{t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}, **values)
    return [d_03.NodeIO(n.name, n.op_type, {i: known[i] for i in n.input if i}, {o: values[o] for o in n.output})
            for n in model.graph.node]


@pytest.mark.parametrize("case", list(d_03.NAN_CASES))
def test_orts_dump_holds_the_reference_evaluators_values_and_the_same_birth(case):
    model, feeds = d_03.nan_case(case)
    ours, theirs = d_03.io_dump(model, feeds), _reference_dump(model, feeds)
    for mine, ref in zip(ours, theirs):
        assert mine.name == ref.name and list(mine.outputs) == list(ref.outputs)
        for name, value in mine.outputs.items():
            np.testing.assert_allclose(np.asarray(value, np.float64), np.asarray(ref.outputs[name], np.float64),
                                       rtol=1e-5, atol=1e-6, equal_nan=True)
    assert birth(ours) == birth(theirs)


def test_the_births_are_a_nan_from_zero_over_zero_a_minus_inf_from_log_zero_and_a_fed_inf():
    births = {case: birth(d_03.io_dump(*d_03.nan_case(case))) for case in d_03.NAN_CASES}
    with np.errstate(divide="ignore", invalid="ignore"):
        assert np.isnan(np.float32(0) / np.float32(0)) and np.log(np.float32(0)) == -np.inf
    assert births == {"layer_norm": ("normalize", "a NaN"), "entropy": ("log", "a -inf"), "fed_inf": ("x", "an inf"),
                      "masked": ("sqrt", "a NaN"), "clean": (None, None)}


def _numpy_outputs():
    x = d_03.bytes_feeds()["x"]
    w = onnx.numpy_helper.to_array(next(t for t in d_03.bytes_model().graph.initializer if t.name == "W"))
    h = x @ w
    return {"matmul": h, "to_half": h.astype(np.float16), "shape": np.array(h.shape, np.int64),
            "argmax": h.argmax(axis=1)[:, None].astype(np.int64), "rowsum": h.sum(axis=1), "positive": h > 0,
            "flatten": h.reshape(-1), "transpose": h.T}


def test_the_profiled_bytes_are_numpys_shape_times_element_size_for_every_node_that_runs():
    expected = {name: value.nbytes for name, value in _numpy_outputs().items()}
    profiled = ort_output_bytes()
    assert set(expected) - set(profiled) == {"shape"}
    assert profiled == {name: expected[name] for name in profiled}


def test_the_node_the_profile_lacks_was_folded_into_an_initializer():
    optimized = session.optimized_model(d_03.bytes_model(), BYTES_LEVEL, providers=["CPUExecutionProvider"])
    assert "Shape" not in [n.op_type for n in optimized.graph.node]
    dims = next(t for t in optimized.graph.initializer if t.name == "dims")
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(dims), [4, 8])

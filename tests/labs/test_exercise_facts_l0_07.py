"""L0_07's exercises: 'self_times' is judged by torch.profiler's own self CPU time, and 'fused_matmuls' by the
graph ORT saves at level extended. Here: torch's per-op self times are what the events' nesting gives (each
event's duration minus its direct children's), on the check's profile and on hand-made events, and ortlab's
reader (profiling.torch_profile.self_times) agrees; ORT's FusedMatMuls carry the attributes the judge's messages
name (transA, transB, alpha), the folded weight is W transposed, and the optimized graph computes what numpy
computes from the model's definition."""
from collections import defaultdict

import numpy as np
import pytest
from onnx import helper, numpy_helper

from ortlab import session
from ortlab.labs import l0_07
from ortlab.labs.judges.l0_07 import WHY, WHY_LEFT, ort_fusions, recorded, tree
from ortlab.profiling.torch_profile import self_times

CPU = ["CPUExecutionProvider"]


def test_torchs_self_times_are_each_events_duration_minus_its_direct_childrens():
    events, truth = recorded()
    parent = tree(events)
    own = [e["dur"] - sum(events[j]["dur"] for j, p in enumerate(parent) if p == i) for i, e in enumerate(events)]
    totals = defaultdict(float)
    for e, us in zip(events, own):
        totals[e["name"]] += us
    assert set(totals) == set(truth)
    assert all(abs(totals[name] - us) <= 1e-3 + 1e-6 * us for name, us in truth.items()), (totals, truth)
    assert max(l0_07.nesting(events)) >= 3  # grandchildren exist, so the planted mistakes differ
    copies = [dict(e) for e in events]
    mirror = self_times(copies)
    assert all(abs(mirror[id(copy)] - us) < 1e-6 for copy, us in zip(copies, own))


def test_the_nesting_of_hand_made_events():
    # a [0, 10) contains b [1, 5) which contains c [2, 3); d [5, 9) starts when b ends; e on another thread
    events = [{"name": "d", "ts": 5.0, "dur": 4.0, "tid": 1}, {"name": "a", "ts": 0.0, "dur": 10.0, "tid": 1},
              {"name": "c", "ts": 2.0, "dur": 1.0, "tid": 1}, {"name": "e", "ts": 1.0, "dur": 8.0, "tid": 2},
              {"name": "b", "ts": 1.0, "dur": 4.0, "tid": 1}]
    names = [e["name"] for e in events]
    assert [names[p] if p is not None else None for p in tree(events)] == ["a", None, "b", None, "a"]
    own = {e["name"]: e["dur"] - sum(events[j]["dur"] for j, p in enumerate(tree(events)) if p == i)
           for i, e in enumerate(events)}
    assert own == {"a": 2.0, "b": 3.0, "c": 1.0, "d": 4.0, "e": 8.0}


def _optimized():
    return session.optimized_model(l0_07.matmul_model(), "extended", providers=CPU)


def test_orts_fused_matmuls_carry_the_attributes_the_messages_name():
    nodes = {n.name.split("/")[0]: n for n in _optimized().graph.node if n.op_type == "FusedMatMul"}
    attrs = {name: {a.name: helper.get_attribute_value(a) for a in n.attribute} for name, n in nodes.items()}
    assert sorted(nodes) == ort_fusions()["fused"] == ["mm_first", "mm_scaled", "mm_scores", "mm_shared"]
    assert list(nodes["mm_scores"].input) == ["q", "k"] and attrs["mm_scores"]["transB"] == 1
    assert list(nodes["mm_shared"].input) == ["a", "b"] and attrs["mm_shared"]["transA"] == 1
    assert list(nodes["mm_first"].input) == ["c", "d"] and attrs["mm_first"]["transA"] == 1
    assert attrs["mm_scaled"]["alpha"] == pytest.approx(0.125)
    assert set(WHY) == {n.name for n in l0_07.matmul_model().graph.node if n.op_type == "MatMul"}
    assert set(WHY_LEFT) == {n.name for n in l0_07.matmul_model().graph.node if n.op_type == "Transpose"}


def test_constant_folding_replaced_the_weights_transpose_by_w_transposed_and_the_shared_transpose_stays():
    optimized = _optimized()
    model = l0_07.matmul_model()
    w = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "W"))
    projected = next(n for n in optimized.graph.node if n.name == "mm_projected")
    assert projected.op_type == "MatMul"
    folded = next(t for t in optimized.graph.initializer if t.name == projected.input[1])
    np.testing.assert_array_equal(numpy_helper.to_array(folded), w.T)
    relu = next(n for n in optimized.graph.node if n.op_type == "Relu")
    shared = next(n for n in optimized.graph.node if n.name == "t_shared")
    assert relu.input[0] == shared.output[0]
    assert ort_fusions()["transposes_left"] == ["t_heads", "t_shared"]


def test_the_optimized_graph_computes_what_numpy_computes():
    model = l0_07.matmul_model()
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    init = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    f = feeds
    expected = {"scores": f["q"] @ f["k"].transpose(0, 1, 3, 2), "context": f["probs"] @ f["v"].transpose(0, 2, 1, 3),
                "projected": f["x"] @ init["W"].T, "ab": f["a"].T @ f["b"], "relu_at": np.maximum(f["a"].T, 0),
                "cd": f["c"].T @ f["d"], "scaled": (f["x"] @ init["W2"]) * np.float32(0.125)}
    s = session.create(_optimized(), session.session_options("disable"), CPU)
    got = dict(zip([o.name for o in s.get_outputs()], s.run(None, feeds)))
    for name, value in expected.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-5)

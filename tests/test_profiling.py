"""Profiles from ORT and torch read into one shape, and the seed-004 graph doctor on graphs built to
hold each finding (and on one that holds none)."""
import json

import matplotlib
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from ortlab import models, profiling
from ortlab.profiling import Event, Profile, ProfileError, diagnose

matplotlib.use("Agg")


def _mlp_model():
    module = models.get("mlp", dropout=0.0)
    x, _ = module.example_inputs()
    return models.export(module, (x,)), {"x": x.numpy()}


def test_ort_profile_has_one_kernel_event_per_node_and_run():
    model, feeds = _mlp_model()
    profile = profiling.profile_model(model, feeds, runs=3, level="disable")
    assert len(profile.runs) == 3
    assert len(profile.events) == 3 * len(model.graph.node)
    expected = {}
    for node in model.graph.node:
        expected[node.op_type] = expected.get(node.op_type, 0) + 3
    assert {op: calls for op, (calls, _) in profile.by_op_type().items()} == expected
    assert profile.total_us == pytest.approx(sum(us for _, us in profile.by_op_type().values()))
    assert all(e.provider == "CPUExecutionProvider" for e in profile.events)
    top = profile.top(100).rows
    assert {r[0] for r in top} == {e.name for e in profile.events}
    totals = [sum(e.dur for e in profile.events if e.name == r[0]) for r in top]
    assert totals == sorted(totals, reverse=True)


def test_compare_and_tables_on_hand_made_profiles():
    a = Profile("a", [Event("n1", "MatMul", 0, 10), Event("n2", "Relu", 10, 2), Event("n1", "MatMul", 20, 10)])
    b = Profile("b", [Event("m", "MatMul", 0, 5), Event("g", "Gelu", 5, 7)])
    assert a.by_op_type() == {"MatMul": (2, 20.0), "Relu": (1, 2.0)}
    rows = {r[0]: r[1:] for r in a.compare(b, ("a", "b")).rows}
    assert rows == {"MatMul": ("20", "5", "-15"), "Gelu": ("0", "7", "+7"), "Relu": ("2", "0", "-2")}
    a.runs, b.runs = [("r0", 0, 30), ("r1", 30, 30)], [("r0", 0, 12)]
    calls = {r[0]: r[1:] for r in a.compare(b, by="calls").rows}
    assert calls == {"MatMul": ("1", "1", "0"), "Gelu": ("0", "1", "+1"), "Relu": ("0.5", "0", "-0.5")}
    with pytest.raises(ProfileError, match="compare by"):
        a.compare(b, by="speed")
    assert a.op_type_table().rows[0] == ("MatMul", 2, "20", "90.9%")
    assert a.top(1).rows == [("n1", "MatMul", 2, "20", "90.9%")]


def test_torch_profile_counts_self_times_and_marks_steps():
    layer = torch.nn.Linear(8, 4)
    x = torch.randn(16, 8)
    profile = profiling.profile_torch(lambda i: layer(x).sum().backward(), steps=2)
    assert [r[0] for r in profile.runs] == ["step 0", "step 1"]
    ops = profile.by_op_type()
    assert ops["aten::linear"][0] == 2 and ops["aten::addmm"][0] == 2
    assert all(e.dur >= -1e-6 for e in profile.events)
    span = sum(r[2] for r in profile.runs)
    assert profile.total_us <= span  # self times add up to at most the steps' wall time


def test_self_times_of_nested_events():
    from ortlab.profiling.torch_profile import self_times

    ops = [dict(name="outer", tid=1, ts=0, dur=10), dict(name="inner", tid=1, ts=1, dur=3),
           dict(name="innermost", tid=1, ts=2, dur=1), dict(name="inner2", tid=1, ts=5, dur=4),
           dict(name="alone", tid=1, ts=20, dur=1), dict(name="other", tid=2, ts=0, dur=30)]
    own = {e["name"]: t for e, t in zip(ops, [self_times(ops)[id(e)] for e in ops])}
    assert own == {"outer": 3.0, "inner": 2.0, "innermost": 1.0, "inner2": 4.0, "alone": 1.0, "other": 30.0}


def test_bad_traces_are_explained(tmp_path):
    with pytest.raises(ProfileError, match="no such profile"):
        profiling.load_ort_profile(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(ProfileError, match="is not a Chrome trace"):
        profiling.load_ort_profile(tmp_path / "bad.json")
    (tmp_path / "torch.json").write_text(json.dumps({"traceEvents": []}))
    with pytest.raises(ProfileError, match="use load_torch_profile"):
        profiling.load_ort_profile(tmp_path / "torch.json")
    with pytest.raises(ProfileError, match="not a torch.profiler trace"):
        profiling.load_torch_profile([])
    with pytest.raises(ProfileError, match="no kernel events"):
        Profile("empty", []).timeline()


def test_timeline_draws(monkeypatch):
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "show", lambda: None)
    model, feeds = _mlp_model()
    profiling.profile_model(model, feeds, runs=2).timeline()
    assert len(plt.gcf().axes[0].patches) >= 2


# --- the graph doctor -------------------------------------------------------------------------

def _graph(nodes, inputs=("X",), outputs=("Y",), initializers=()):
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info(i, TensorProto.FLOAT, None) for i in inputs],
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              list(initializers))
    return helper.make_model(graph)


def _n(op, inputs, outputs, name, **attrs):
    return helper.make_node(op, inputs, outputs, name=name, **attrs)


CASES = {
    "memcpy": ([_n("MemcpyToHost", ["X"], ["h"], "to_host"), _n("Clip", ["h"], ["c"], "clip"),
                _n("MemcpyFromHost", ["c"], ["Y"], "from_host")], {"to_host", "clip", "from_host"}),
    "cast_sandwich": ([_n("Cast", ["X"], ["a"], "c1", to=10), _n("Gelu", ["a"], ["b"], "gelu"),
                       _n("Cast", ["b"], ["Y"], "c2", to=1)], {"gelu"}),
    "unfused_layer_norm": ([_n("Pow", ["X", "X"], ["Y"], "pow")], {"pow"}),
    "unfused_gelu": ([_n("Erf", ["X"], ["Y"], "erf")], {"erf"}),
    "standalone_matmul": ([_n("Transpose", ["X"], ["t"], "tr"), _n("MatMul", ["t", "X"], ["m"], "mm1"),
                           _n("MatMul", ["X", "X"], ["m2"], "mm2"), _n("Add", ["m2", "m"], ["Y"], "add")],
                          {"mm1", "mm2"}),
    "standalone_dropout": ([_n("Add", ["X", "X"], ["a"], "add"), _n("Dropout", ["a"], ["Y"], "drop")], {"drop"}),
    "standalone_softmax": ([_n("Add", ["X", "X"], ["a"], "add"), _n("Softmax", ["a"], ["Y"], "soft")], {"soft"}),
}


@pytest.mark.parametrize("check", list(CASES))
def test_each_check_finds_what_its_graph_holds_and_nothing_else(check):
    nodes, expected = CASES[check]
    diagnosis = diagnose(_graph(nodes))
    assert {f.node for f in diagnosis.findings if f.check == check} == expected
    assert {f.check for f in diagnosis.findings} == {check}


def test_a_clean_graph_has_no_findings():
    nodes = [_n("MatMul", ["X", "W"], ["m"], "mm"), _n("Relu", ["m"], ["r"], "relu"),
             _n("Softmax", ["r"], ["s"], "soft"), _n("Dropout", ["s"], ["Y"], "drop"),
             _n("LayerNormalization", ["X", "W"], ["L"], "ln")]
    diagnosis = diagnose(_graph(nodes, inputs=("X", "W"), outputs=("Y", "L")))
    assert diagnosis.findings == [] and set(diagnosis.counts().values()) == {0}
    assert repr(diagnosis) == "Diagnosis(0 findings: none)"


def test_doctor_on_a_real_export_finds_the_unfused_layer_norms_and_gelus():
    module = models.get("bert", dropout=0.0)
    exported = models.export(module, module.example_inputs()[:1])
    counts = diagnose(exported, ["unfused_layer_norm", "unfused_gelu"]).counts()
    ops = [n.op_type for n in exported.graph.node]
    assert counts == {"unfused_layer_norm": ops.count("Pow"), "unfused_gelu": ops.count("Erf")}
    assert counts == {"unfused_layer_norm": 5, "unfused_gelu": 2}  # 5 LayerNorms, 2 FFN GELUs in TinyBert


def test_doctor_errors_and_extension():
    with pytest.raises(profiling.DoctorError, match="the checks are memcpy"):
        diagnose(_graph([]), ["nope"])
    with pytest.raises(profiling.DoctorError, match="not int"):
        diagnose(3)
    with pytest.raises(profiling.DoctorError, match="train with save_onnx=True"):
        profiling.diagnose_dumps({})

    @profiling.register_check
    def sqrt_nodes(graph, uses):
        return [profiling.Finding("sqrt_nodes", n.name, n.op_type, "a Sqrt") for n in graph.node if n.op_type == "Sqrt"]

    try:
        assert diagnose(_graph([_n("Sqrt", ["X"], ["Y"], "s")])).counts()["sqrt_nodes"] == 1
    finally:
        del profiling.CHECKS["sqrt_nodes"]


def test_plan_table_lists_each_nodes_output_bytes_in_execution_order():
    model, feeds = _mlp_model()
    profile = profiling.profile_model(model, feeds, runs=2, level="disable")
    table = profiling.plan_table(profile, run=1)
    assert [r[0] for r in table.rows] == [n.name for n in model.graph.node]  # one node after the other
    for (_, _, shapes, size, _), node in zip(table.rows, model.graph.node):
        dims = [int(d) for d in shapes.strip("[]").split(", ")] if shapes else []
        assert size == (4 * int(np.prod(dims)) if dims else size)  # float32: 4 bytes an element
    assert table.rows[-1][4] == sum(r[3] for r in table.rows)
    with pytest.raises(ProfileError, match="no session runs"):
        profiling.plan_table(Profile("empty", []))

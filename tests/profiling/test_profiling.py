"""Profiles from ORT and torch read into one shape, and the seed-004 graph doctor on graphs built to
hold each finding (and on one that holds none)."""
import json
import shutil

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
    "cast_sandwich": ([_n("Cast", ["X"], ["a"], "c1", to=1), _n("Gelu", ["a"], ["b"], "gelu"),
                       _n("Cast", ["b"], ["Y"], "c2", to=10)], {"gelu"}),
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

    with pytest.raises(profiling.DoctorError, match="did you mean memcpy"):
        diagnose(_graph([]), "memcopy")

    def sqrt_nodes(graph, uses):
        return [profiling.Finding("sqrt_nodes", n.name, n.op_type, "a Sqrt") for n in graph.node if n.op_type == "Sqrt"]

    try:
        assert profiling.register_check(sqrt_nodes) is sqrt_nodes
        assert diagnose(_graph([_n("Sqrt", ["X"], ["Y"], "s")])).counts()["sqrt_nodes"] == 1
        assert list(profiling.CHECKS)[-1] == "sqrt_nodes"
    finally:
        profiling.CHECKS.unregister("sqrt_nodes")
    assert "sqrt_nodes" not in profiling.CHECKS


def test_uses_answers_with_the_checked_graphs_own_nodes():
    from ortlab.profiling.graph_doctor import Uses

    model = _graph([_n("Add", ["X", "X"], ["a"], "add"), _n("Mul", ["a", "a"], ["Y"], "mul")])
    uses = Uses(model)
    add, mul = model.graph.node
    assert uses.before(mul) == [add, add] and all(p is add for p in uses.before(mul))  # one per edge
    assert [c.name for c in uses.after(add)] == ["mul", "mul"] and uses.before(add) == []
    assert uses.graph.producer("a").name == "add"
    with pytest.raises(profiling.DoctorError, match="take a node of the graph the check was given"):
        uses.before(_n("Relu", ["a"], ["r"], "elsewhere"))


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


def test_cast_sandwich_follows_the_float_nodes_between_a_cast_up_and_the_nearest_cast_down():
    bf16, f32 = TensorProto.BFLOAT16, TensorProto.FLOAT
    nodes = [_n("Cast", ["X"], ["x32"], "up", to=f32),                      # from a bfloat16 MatMul, say
             _n("Add", ["x32", "R"], ["s"], "residual"), _n("ReduceMean", ["s"], ["m"], "mean"),
             _n("Sub", ["s", "m"], ["d"], "sub"), _n("Pow", ["d", "R"], ["p"], "pow"),
             _n("Div", ["d", "p"], ["n"], "div"), _n("Cast", ["n"], ["n16"], "down", to=bf16),
             _n("Shape", ["s"], ["shape"], "shape"),                        # not on the way to the Cast down
             _n("Relu", ["n16"], ["r"], "relu"), _n("Cast", ["r"], ["Y"], "up2", to=f32)]
    findings = diagnose(_graph(nodes, inputs=("X", "R"), outputs=("Y", "shape")), ["cast_sandwich"]).findings
    assert [(f.check, f.node, f.op_type) for f in findings] == [("cast_sandwich", "residual", "Add")]
    assert findings[0].message == "5 nodes in float from up to down (Cast to bfloat16): Add, ReduceMean, Sub, Pow, Div"
    # the other way round (a bfloat16 node between a Cast down and a Cast up) is the narrow compute itself
    narrow = [_n("Cast", ["X"], ["a"], "c1", to=bf16), _n("Gelu", ["a"], ["b"], "gelu"),
              _n("Cast", ["b"], ["Y"], "c2", to=f32)]
    assert diagnose(_graph(narrow)).findings == []
    # a Cast down with no Cast up before it (float from the graph input) is no sandwich
    plain = [_n("Relu", ["X"], ["a"], "relu"), _n("Cast", ["a"], ["Y"], "down", to=bf16)]
    assert diagnose(_graph(plain)).findings == []


def test_cast_sandwich_on_a_bfloat16_autocast_export():
    module = models.get("bert", dropout=0.0).eval()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        exported = models.export(module, module.example_inputs()[:1])
    casts = [n for n in exported.graph.node if n.op_type == "Cast"]
    to = {n.name: next(a.i for a in n.attribute if a.name == "to") for n in casts}
    findings = diagnose(exported, ["cast_sandwich"]).findings
    ups = sorted(n for n, t in to.items() if t == TensorProto.FLOAT)
    assert len(ups) == 4 and len(findings) == 4  # after each residual branch: back to float, then down again
    assert sorted(f.message.split(" from ")[1].split(" to ")[0] for f in findings) == ups
    assert all("(Cast to bfloat16): Add, ReduceMean, Sub, Pow" in f.message for f in findings)  # Add + LayerNorm


# --- the external profilers -------------------------------------------------------------------

def _fake_tool(directory, name, script):
    path = directory / name
    path.write_text("#!/bin/sh\n" + script)
    path.chmod(0o755)


def test_tool_table_is_the_same_everywhere_and_corrects_nvprof():
    table = profiling.tool_table()
    rows = {r[0]: r for r in table.rows}
    assert list(rows) == ["nsys", "ncu", "nvprof", "perf"]
    assert rows["nvprof"][2] == "a GPU of compute capability < 8.0"
    assert all("python train.py" in r[3] for r in table.rows)


def test_run_tools_prints_what_this_machine_cannot_run(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no tool installed
    runs = {r.tool: r for r in profiling.run_tools(target=["true"], gpu=None, workdir=str(tmp_path))}
    assert not any(r.ran for r in runs.values())
    assert runs["perf"].why == "printed, not run: perf is not installed here"
    assert runs["nsys"].why == "printed, not run: no GPU here (nothing for it to record)"
    assert runs["nsys"].command.startswith("nsys profile -t cuda,nvtx") and runs["nsys"].command.endswith(" true")
    assert profiling.runs_table(list(runs.values())).rows[3] == ("perf", "printed", runs["perf"].why)


def test_run_tools_runs_installed_tools_and_says_why_nvprof_is_skipped(tmp_path, monkeypatch):
    for tool in ("nsys", "ncu", "nvprof"):
        _fake_tool(tmp_path, tool, f'echo "{tool} ran: $@"\n')
    # a perf without hardware counters: stat says <not supported>; record writes -o; report prints a table
    _fake_tool(tmp_path, "perf", 'case "$1" in\n'
               '  stat) echo "   <not supported>      instructions" >&2 ;;\n'
               '  record) shift; while [ "$1" != "-o" ]; do shift; done; echo data > "$2" ;;\n'
               '  report) echo "# header"; echo "    75.00%  libfake.so" ;;\n'
               'esac\n')
    monkeypatch.setenv("PATH", f"{tmp_path}:/usr/bin:/bin")
    h100 = ("NVIDIA H100", (9, 0))
    runs = {r.tool: r for r in profiling.run_tools(target=["true"], gpu=h100, workdir=str(tmp_path))}
    assert runs["nsys"].ran and runs["ncu"].ran and runs["nsys"].why == "ran (exit 0)"
    assert runs["ncu"].output.startswith("ncu ran: --set full -k regex:layer_norm -c 1 true")
    assert not runs["nvprof"].ran and "compute capability 9.0; nvprof supports only < 8.0" in runs["nvprof"].why
    assert runs["perf"].ran and "-e cpu-clock" in runs["perf"].command
    assert "cpu-clock software event" in runs["perf"].why
    assert runs["perf"].output == "75.00%  libfake.so".rjust(len("    75.00%  libfake.so"))
    v100 = ("Tesla V100", (7, 0))
    runs = {r.tool: r for r in profiling.run_tools(target=["true"], gpu=v100, workdir=str(tmp_path))}
    assert runs["nvprof"].ran and runs["nvprof"].output.startswith("nvprof ran: --print-gpu-summary")


def test_run_tools_reports_a_failing_tool(tmp_path, monkeypatch):
    _fake_tool(tmp_path, "nsys", 'echo "no permission" >&2; exit 3\n')
    monkeypatch.setenv("PATH", str(tmp_path))
    runs = {r.tool: r for r in profiling.run_tools(target=["true"], gpu=("GPU", (9, 0)), workdir=str(tmp_path))}
    assert runs["nsys"].ran and runs["nsys"].why == "ran (exit 3)" and runs["nsys"].output == "no permission"
    assert runs["ncu"].why == "printed, not run: a GPU (GPU) but ncu is not installed here"


@pytest.mark.skipif(shutil.which("perf") is None, reason="perf is not installed on this machine")
def test_run_tools_runs_the_real_perf_here():
    runs = {r.tool: r for r in profiling.run_tools(gpu=None)}
    perf = runs["perf"]
    assert perf.ran and perf.command.startswith("perf record -e ")
    if perf.why.startswith("ran: "):  # perf_event_paranoid may forbid it: then the failure is reported
        assert "%" in perf.output


def test_cast_targets_counts_casts_by_type():
    nodes = [_n("Cast", ["X"], ["a"], "c1", to=TensorProto.BFLOAT16),
             _n("Cast", ["a"], ["b"], "c2", to=TensorProto.FLOAT),
             _n("Cast", ["b"], ["Y"], "c3", to=TensorProto.BFLOAT16), _n("Relu", ["X"], ["Z"], "r")]
    assert profiling.cast_targets(_graph(nodes, outputs=("Y", "Z"))) == {"bfloat16": 2, "float": 1}


def test_print_runs_says_what_ran(capsys):
    profiling.print_runs([profiling.ToolRun("perf", "perf record x", True, "ran: ok", "  50.00%  libx.so"),
                          profiling.ToolRun("nsys", "nsys profile x", False, "printed, not run: no GPU here")])
    assert capsys.readouterr().out == ("perf: ran: ok\n  $ perf record x\n    50.00%  libx.so\n"
                                       "nsys: printed, not run: no GPU here\n  $ nsys profile x\n")

"""The GPU check's engine part (ortlab/benchmarks/gpu_engine.py) without a GPU: its graphs cover every op the CUDA
EP has a kernel for and equal real onnxruntime 1.19.2 on the CPU EP; the whole part runs, onnxruntime blocked,
with the CUDA EP on the CPU runner and the Triton EP interpreted (the device path with the device replaced);
planted wrong kernels and placements come out as mismatches, never as a pass; its dry run, budget and record.
"""
import dataclasses
import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import onnxruntime as ort
import pytest

from ortlab.benchmarks import gpu_check, gpu_engine, gpu_record
from ortlab.benchmarks.gpu_engine import GRAPHS, SIZES, check_engine, compare_output, kept_fraction
from ortlab.benchmarks.gpu_registry import PARTS, Context, Part, Skip, time_left
from ortlab.cuda import op_kernels
from test_gpu_check import BLOCK_ONNXRUNTIME  # the first lines of a script run with onnxruntime blocked
from repo_paths import ROOT



def built(graph, size="small"):
    return graph.build(np.random.default_rng(gpu_engine.SEED), SIZES[size])


def by_name(name):
    return next(g for g in GRAPHS if g.name == name)


# ---- the graphs ---------------------------------------------------------------------------------------------
def test_the_graphs_cover_every_op_the_cuda_ep_has_a_kernel_for_with_tails():
    ops = {(n.op_type, n.domain) for g in GRAPHS for n in built(g)[0].graph.node}
    assert set(op_kernels.OPS) <= ops
    large = SIZES["large"]
    # CupyLauncher's block (256) and grid limit (4096): columns leave a tail, rows make the grid loop
    assert large["cols"] % 256 and large["classes"] % 256 and large["hidden"] % 32
    assert large["rows"] > 4096 and math.prod(large["batch"]) > 4096
    # the CPU runner's launcher (block 128, at most 8 blocks) on the small size
    small = SIZES["small"]
    assert small["cols"] % 32 and small["rows"] > 8 and math.prod(small["batch"]) > 8


@pytest.mark.parametrize("graph", [g for g in GRAPHS if g.given_mask is None], ids=lambda g: g.name)
def test_each_graph_on_the_cpu_ep_equals_onnxruntime(graph):
    """The reference (ortlab's CPU EP) against ORT 1.19.2's CPU EP, within the graph's own tolerance."""
    model, feeds = built(graph)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = gpu_engine.session(model, "cpu").run(None, feeds)
    for out, g, w in zip(model.graph.output, got, want):
        assert compare_output(out.name, g, w, graph.rtol, graph.atol)["ok"], out.name


def test_training_mode_dropout_of_onnxruntime_passes_the_given_mask_comparison():
    """ORT's own Dropout (its Philox mask) checked the way the part checks an EP: y and dx equal the CPU EP's
    DropoutGrad fed ORT's mask, and the kept fraction is 1 - ratio."""
    graph = by_name("dropout_training")
    model, feeds = built(graph, "large")
    names = [o.name for o in model.graph.output]
    theirs = dict(zip(names, ort.InferenceSession(model.SerializeToString(),
                                                  providers=["CPUExecutionProvider"]).run(None, feeds)))
    given_model, given_feeds = graph.given_mask(theirs, feeds)
    expected = dict(zip(names, gpu_engine.session(given_model, "cpu").run(None, given_feeds)))
    assert [compare_output(n, theirs[n], expected[n], graph.rtol, graph.atol)["ok"] for n in names] == [True] * 3
    assert kept_fraction(theirs["mask"], gpu_engine.RATIO)[1]


# ---- comparing ----------------------------------------------------------------------------------------------
def test_compare_output_reports_errors_dtypes_shapes_and_nans():
    ok = compare_output("y", np.float32([1, 2.0001]), np.float32([1, 2]), 1e-4, 0)
    assert ok["ok"] and ok["max abs error"] == pytest.approx(1e-4, rel=1e-2)
    assert not compare_output("y", np.float32([1, 2.001]), np.float32([1, 2]), 1e-4, 0)["ok"]
    assert not compare_output("y", np.float64([1, 2]), np.float32([1, 2]), 1e-4, 0)["ok"]
    assert not compare_output("y", np.float32([1, 2, 3]), np.float32([1, 2]), 1e-4, 0)["ok"]
    nan = compare_output("y", np.float32([1, np.nan]), np.float32([1, 2]), 1e-4, 1)
    assert not nan["ok"] and nan["max abs error"] == math.inf
    assert compare_output("y", np.float32([np.nan]), np.float32([np.nan]), 0, 0)["ok"]
    mask = compare_output("m", np.array([True, False, True]), np.array([True, True, True]), 0, 0)
    assert not mask["ok"] and mask["max abs error"] == 1
    # the absolute part scales with the output's largest value: a sum that cancels to near 0 beside one of 1000
    cancelled = compare_output("s", np.float32([1000, 1e-3]), np.float32([1000, 0]), 1e-4, 1e-5)
    assert cancelled["ok"] and cancelled["max |reference|"] == 1000
    assert not compare_output("s", np.float32([1000, 1e-3]), np.float32([1000, 0]), 1e-4, 0)["ok"]
    assert not compare_output("s", np.float32([1, 1e-3]), np.float32([1, 0]), 1e-4, 1e-5)["ok"]


def test_kept_fraction_is_1_minus_ratio_within_5_binomial_standard_deviations():
    n, ratio = 10000, 0.3
    spread = 5 * math.sqrt(ratio * (1 - ratio) / n) + 1 / n
    inside = np.arange(n) < round((1 - ratio - 0.9 * spread) * n)
    outside = np.arange(n) < round((1 - ratio - 1.1 * spread) * n)
    assert kept_fraction(inside, ratio)[1] and not kept_fraction(outside, ratio)[1]


# ---- the whole part, onnxruntime blocked, the device replaced by the CPU runner and Triton's interpreter ------
BLOCKED_RUN = BLOCK_ONNXRUNTIME + """from ortlab.benchmarks import gpu_check, gpu_engine
from ortlab.benchmarks.gpu_registry import Context, Skip
try:
    gpu_engine.part_engine_eps(Context(dry_run=True))
    dry = "did not stop"
except Skip as why:
    dry = str(why)
result = gpu_check._jsonable(gpu_engine.check_engine(Context(), size="small", repeat=2, require_gpu=False))
print(json.dumps({"dry": dry, "result": result}))
"""


@pytest.fixture(scope="module")
def blocked_run(tmp_path_factory):
    """The part's dry run, then the whole part at the small size on the CPU runner and Triton's interpreter, in a
    process where importing onnxruntime fails (and is logged)."""
    log = tmp_path_factory.mktemp("imports") / "imports.log"
    log.write_text("")
    env = {**os.environ, "ORTLAB_TEST_IMPORT_LOG": str(log), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", BLOCKED_RUN], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1]), log.read_text()


def test_the_engine_and_both_device_eps_never_import_onnxruntime(blocked_run):
    run, imports = blocked_run
    assert imports == ""
    assert run["dry"] == ("dry run: CPU side done, stopped before the CUDA and Triton EPs' sessions are made and run "
                          "on the GPU")


def test_the_whole_part_with_the_device_replaced_agrees_with_the_cpu_ep(blocked_run):
    result = blocked_run[0]["result"]
    assert result["mismatches"] == [] and result["not run"] == []
    assert result["checks"] == {"passed": 2 * len(GRAPHS), "total": 2 * len(GRAPHS)}
    assert [(r["graph"], r["ep"]) for r in result["rows"]] == [(g.name, ep) for g in GRAPHS
                                                               for ep in ("cuda", "triton")]
    assert "CPU runner" in result["devices"]["cuda"] and "interpreter" in result["devices"]["triton"]
    for row in result["rows"]:
        assert row["placement as expected"] is True and row["outputs ok"].split(" of ")[0] == \
            row["outputs ok"].split(" of ")[1]
        assert row["ms per run (median)"] > 0 and row["first run ms"] > 0 and row["cpu EP ms per run"] > 0
    for graph in GRAPHS:
        for ep in ("cuda", "triton"):
            placed = result["partitions"][graph.name][ep]["nodes"]
            assert {n for n, where in placed.items() if where == ep} == graph.expect[ep]
    # Memcpy nodes: only where a CPU EP node's value meets a device EP node (the training step's Gather and MatMuls)
    memcpy = {(r["graph"], r["ep"]): r["memcpy nodes"] for r in result["rows"]}
    assert memcpy[("training_step", "cuda")] > 0 and memcpy[("training_step", "triton")] > 0
    assert memcpy[("layer_norm", "cuda")] == memcpy[("dropout_training", "triton")] == 0
    dropout = [r for r in result["rows"] if r["graph"] == "dropout_training"]
    assert all(abs(r["kept fraction"] - 0.7) < 0.1 for r in dropout)
    assert {o["output"] for o in result["outputs"] if o["graph"] == "dropout_training"} == {"y", "mask", "dx"}
    assert json.loads(json.dumps(result)) == result


def test_layer_norm_at_the_gpu_size_on_the_cpu_runner_is_within_tolerance(monkeypatch):
    """The CUDA EP's kernels on the CPU runner (CUDA's thread semantics: the GPU's order of summation) at the size
    the GPU runs: the scale and bias gradients sum 4104 rows, and differ from the CPU EP's in their last bits only."""
    only(monkeypatch, "layer_norm")
    result = check_engine(Context(), size="large", repeat=0, require_gpu=False)
    assert result["mismatches"] == [] and result["checks"] == {"passed": 1, "total": 1}
    errors = {o["output"]: o["max abs error"] / o["max |reference|"] for o in result["outputs"]}
    assert 0 < errors["ds"] < 1e-5 and 0 < errors["db"] < 1e-5


# ---- what differs is reported, never passed ---------------------------------------------------------------
def only(monkeypatch, *names, eps=("cuda",)):
    monkeypatch.setattr(gpu_engine, "GRAPHS", [by_name(n) for n in names])
    monkeypatch.setattr(gpu_engine, "DEVICE_EPS", eps)


def planted(request, key, change):
    """The CUDA op kernel of `key` with `change(outputs) -> outputs` applied after it runs, for this test."""
    op = op_kernels.OPS[key]

    def run(call, *inputs):
        return change(list(op.run(call, *inputs)))
    swap = op_kernels.OPS.using(key, dataclasses.replace(op, run=run))
    swap.__enter__()
    request.addfinalizer(lambda: swap.__exit__(None, None, None))


def test_a_wrong_cuda_kernel_is_a_mismatch(monkeypatch, request):
    only(monkeypatch, "reduce_sum")
    planted(request, ("ReduceSum", ""), lambda outs: [outs[0] + np.float32(1e-2)])
    result = check_engine(Context(), size="small", repeat=0, require_gpu=False)
    assert [m.split(" max abs error")[0] for m in result["mismatches"]] == ["reduce_sum on cuda: y_last",
                                                                          "reduce_sum on cuda: y_last2"]
    assert result["checks"] == {"passed": 0, "total": 1}
    assert result["rows"][0]["outputs ok"] == "1 of 3" and result["rows"][0]["ms per run (median)"] is None


def test_a_node_on_another_ep_than_expected_is_a_mismatch(monkeypatch):
    graph = by_name("reduce_sum")
    wrong = gpu_engine.EngineGraph("reduce_sum", graph.build, {"cuda": {"rs_last", "rs_last2", "rs_first"}})
    monkeypatch.setattr(gpu_engine, "GRAPHS", [wrong])
    monkeypatch.setattr(gpu_engine, "DEVICE_EPS", ("cuda",))
    result = check_engine(Context(), size="small", repeat=0, require_gpu=False)
    assert result["mismatches"] == ["reduce_sum on cuda: node rs_first ran on cpu, expected cuda"]
    assert result["rows"][0]["placement as expected"] is False and result["checks"]["passed"] == 0


def test_dropout_with_a_wrong_scale_or_a_mask_that_keeps_all_is_a_mismatch(monkeypatch, request):
    only(monkeypatch, "dropout_training")
    planted(request, ("Dropout", ""), lambda outs: [outs[0] * np.float32(1.001), outs[1]])
    result = check_engine(Context(), size="small", repeat=0, require_gpu=False)
    assert [m.split(" max abs error")[0] for m in result["mismatches"]] == ["dropout_training on cuda: y"]

    planted(request, ("Dropout", ""), lambda outs: [outs[0], np.ones_like(outs[1])])
    result = check_engine(Context(), size="small", repeat=0, require_gpu=False)
    assert any(m.startswith("dropout_training on cuda: y max abs error") for m in result["mismatches"])
    assert "dropout_training on cuda: kept 1.0 of the elements, expected 0.7 within 5 standard deviations" in \
        result["mismatches"]


def test_a_session_that_fails_is_not_run_with_its_error_and_the_others_still_run(monkeypatch, request):
    only(monkeypatch, "reduce_sum", "gather_grad")

    def boom(outputs):
        raise op_kernels.CudaOpError("planted failure")
    planted(request, ("ReduceSum", ""), boom)
    result = check_engine(Context(), size="small", repeat=0, require_gpu=False)
    assert len(result["not run"]) == 1 and result["not run"][0].startswith("reduce_sum on cuda: failed: ")
    assert "planted failure" in result["not run"][0]
    assert [r["graph"] for r in result["rows"]] == ["gather_grad"]
    assert result["checks"] == {"passed": 1, "total": 2}


# ---- no GPU, dry run, budget, record ----------------------------------------------------------------------
def test_without_a_gpu_the_part_skips_saying_why(monkeypatch):
    only(monkeypatch, "dropout_inference", eps=("cuda", "triton"))
    monkeypatch.setattr(gpu_engine, "where_not_gpu", lambda key: f"no GPU for {key}")
    with pytest.raises(Skip, match="neither device EP can run on a GPU here: every graph on cuda: no GPU for cuda; "
                                   "every graph on triton: no GPU for triton"):
        check_engine(Context(), size="small")
    # one EP without a GPU: the other runs, and the missing one is counted as not run
    monkeypatch.setattr(gpu_engine, "where_not_gpu", lambda key: "no CuPy" if key == "cuda" else None)
    result = check_engine(Context(), size="small", repeat=0)
    assert [(r["graph"], r["ep"]) for r in result["rows"]] == [("dropout_inference", "triton")]
    assert result["not run"] == ["every graph on cuda: no CuPy"]
    assert result["checks"] == {"passed": 1, "total": 2} and list(result["devices"]) == ["triton"]


def test_where_not_gpu_names_the_cpu_runner_and_the_interpreter_here():
    assert gpu_engine.where_not_gpu("cuda") == "CuPy sees no GPU: its kernels would run on the CPU runner"
    assert gpu_engine.where_not_gpu("triton") == "Triton runs interpreter (cpu)"


def test_a_dry_run_stops_before_any_device_ep_is_made(monkeypatch):
    only(monkeypatch, "layer_norm")
    made = []
    monkeypatch.setattr(gpu_engine, "where_not_gpu", lambda key: made.append(key))
    monkeypatch.setattr(gpu_engine, "references", lambda size, repeat: made.append(("references", size, repeat)) or [])
    with pytest.raises(Skip, match="^dry run: CPU side done"):
        check_engine(Context(dry_run=True))
    assert made == [("references", "large", 0)]


def test_when_the_budget_runs_out_the_rest_is_not_run_and_counted(monkeypatch):
    only(monkeypatch, "reduce_sum", "dropout_inference")
    result = check_engine(Context(deadline=time.monotonic() + gpu_engine.RESERVE_S / 2), size="small", repeat=0,
                          require_gpu=False)
    assert result["rows"] == [] and result["checks"] == {"passed": 0, "total": 2}
    assert result["not run"] == ["reduce_sum on cuda: the part's time budget ran out",
                                 "dropout_inference on cuda: the part's time budget ran out"]


def _left(context):
    return {"left": time_left(context)}


def test_a_part_is_given_its_deadline():
    assert time_left(Context()) == math.inf
    entry = gpu_check.run_part(Part("p", "P", _left, 30), Context(), 30)
    assert 25 < entry["result"]["left"] <= 30


def test_the_engine_part_is_registered_last_within_the_total_budget():
    part = PARTS["engine_eps"]
    assert list(PARTS)[-1] == "engine_eps" and part.run is gpu_engine.part_engine_eps
    assert part.budget_s > 4 * gpu_engine.RESERVE_S
    assert sum(p.budget_s for p in PARTS.values()) <= gpu_check.TOTAL_BUDGET_S


def test_the_summary_lists_what_was_not_run():
    parts = {"engine_eps": {"title": "(g) engine", "status": "ok", "seconds": 3.0,
                            "result": {"checks": {"passed": 1, "total": 3}, "mismatches": ["a on cuda: y"],
                                       "not run": ["b on cuda: the part's time budget ran out", "c on triton: x"]}}}
    text = gpu_record.summary(gpu_check.build_record(parts, False))
    assert ("(g) engine: ok (3 s), 1 of 3 agree\n      differs: a on cuda: y\n"
            "      not run: b on cuda: the part's time budget ran out\n      not run: c on triton: x") in text

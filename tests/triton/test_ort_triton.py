"""ORT's Triton code generator on CPU: its source run under Triton's interpreter against ORT's
InferenceSession and numpy; the family's switches against what ORT 1.19.2 reports."""
import json

import numpy as np
import pytest

from ortlab.errors import OrtlabError
from ortlab.ortmodule import triton_codegen as ot

pytest.importorskip("onnxruntime.training")
pytest.importorskip("triton")


@pytest.fixture(scope="module")
def run():
    """One interpreted run of the generated Add -> Softmax -> Mul kernel (a child process)."""
    return ot.run_interpreted()


@pytest.fixture(scope="module")
def facts():
    return ot.build_facts()


@pytest.fixture(scope="module")
def switches(tmp_path_factory):
    return ot.switches_run(tmp_path_factory.mktemp("family"))


def _numpy_reference(inputs):
    s = inputs["x"] + inputs["b"]
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True) * inputs["y"]


def test_interpreted_kernel_equals_ort_and_numpy(run):
    model = ot.add_softmax_mul()
    inputs = ot.example_inputs(model)
    assert run.max_diff < 1e-6
    assert np.abs(run.outputs[0] - ot.ort_reference(model, inputs)[0]).max() < 1e-6
    assert np.abs(run.outputs[0] - _numpy_reference(inputs)).max() < 1e-5


def test_generated_source_is_for_cuda(run):
    assert "@triton.autotune" in run.source and 'device="cuda"' in run.source
    assert "tl.max" in run.source and "tl.sum" in run.source and "tl.exp" in run.source  # the decomposed Softmax


def test_cpu_edits(run):
    assert "@triton.autotune" not in run.cpu.source and 'device="cpu"' in run.cpu.source
    assert run.cpu.devices_replaced == 1
    ((kernel, config),) = run.cpu.configs.items()
    assert f"{kernel}[grid](" in run.cpu.source and "XBLOCK=" in run.cpu.source and set(config) == {"XBLOCK", "RBLOCK"}


def test_cpu_source_keeps_the_first_config_of_each_kernel():
    source = '''@triton.autotune(
    configs=[
        triton.Config({"XBLOCK": 2}, num_warps=2),
        triton.Config({"XBLOCK": 8}, num_warps=4),
    ],
    key=["xnumel"],
)
@triton.jit
def k1(a, XBLOCK: tl.constexpr):
    pass


@triton.autotune(configs=[triton.Config({"RBLOCK": 16, "XBLOCK": 1})], key=[])
@triton.jit
def k2(a, XBLOCK: tl.constexpr, RBLOCK: tl.constexpr):
    pass


def f(a):
    out = torch.empty((4,), device="cuda")
    k1[grid](a, 4)
    k2[grid](a)
'''
    edited = ot.cpu_source(source)
    assert edited.configs == {"k1": {"XBLOCK": 2}, "k2": {"RBLOCK": 16, "XBLOCK": 1}}
    assert "k1[grid](a, 4, XBLOCK=2)" in edited.source and "k2[grid](a, RBLOCK=16, XBLOCK=1)" in edited.source
    assert "autotune" not in edited.source and 'device="cpu"' in edited.source


def test_kernel_source_follows_the_shapes():
    source = ot.kernel_source(ot.add_softmax_mul(cols=32), [[3, 32], [32], [3, 32]])
    assert "rnumel = 32" in source and "xnumel = 3" in source


def test_executor_path_and_debug_files(run, facts):
    if not facts["torch.cuda.is_available()"]:
        assert "active drivers" in run.executor_error
        assert {"1234_original.onnx", "1234_processed.onnx"} <= set(run.debug_files)
        assert not [f for f in run.debug_files if f.endswith(".py")]


def test_family_table_verdicts(run, facts, switches):
    table = ot.family_table(run, facts, switches)
    verdicts = {row[0]: row[1] for row in table.rows}
    assert len(verdicts) == 6
    assert verdicts["ort_triton._codegen"].startswith("runs here")
    triton_off = not facts["C.is_triton_enabled()"]
    assert verdicts["ORTMODULE_USE_TRITON=1"].startswith("not possible") == triton_off
    assert verdicts["ORTMODULE_TRITON_CONFIG_FILE"].startswith("not possible") == triton_off
    assert verdicts["ORTMODULE_USE_FLASH_ATTENTION=1"].startswith("not possible") == (
        triton_off or not facts["torch.cuda.is_available()"])
    assert verdicts["ORTMODULE_TRITON_DEBUG=1"].startswith("runs here")
    assert "nothing to tune" in verdicts[" / ".join(ot.TUNING_VARIABLES)]


def test_switches_as_ort_reads_them(switches, facts):
    options = switches["runtime options"]
    assert options["enable_triton"] == facts["C.is_triton_enabled()"]
    assert options["enable_tuning"] is True and options["max_tuning_duration_ms"] == 500
    assert switches["tuning files"] == {"tuning_results_training.json": []}
    assert switches["config ops"] == ["Add"]
    assert any("Online Op Tuning" in line and "ON" in line for line in switches["banner"])


def test_family_table_flips_with_the_facts(run, switches):
    on = dict(switches, **{"runtime options": dict(switches["runtime options"], enable_triton=True)})
    facts = {"C.is_triton_enabled()": True, "register_triton_op_executor in C": True,
             "torch.cuda.is_available()": True, "triton importable": True}
    verdicts = {row[0]: row[1] for row in ot.family_table(run, facts, on).rows}
    assert verdicts["ORTMODULE_USE_TRITON=1"] == "runs here"
    assert verdicts["ORTMODULE_TRITON_CONFIG_FILE"] == "runs here"


def test_reprs(run):
    assert "interpreted max |diff|" in repr(run) and "autotune dropped" in repr(run.cpu)
    json.dumps(run.debug_files)


@pytest.mark.parametrize("call", [
    lambda: ot.add_softmax_mul(0), lambda: ot.cpu_source("print(1)"), lambda: ot.cpu_source(None),
    lambda: ot.kernel_source(ot.add_softmax_mul(), [[4, 64]]), lambda: ot.kernel_source("no.onnx", []),
    lambda: ot.kernel_source(ot.add_softmax_mul(), [[4, 64], [64], [4, 64]], name="1bad"),
    lambda: ot.run_interpreted(ot.add_softmax_mul(), {"x": np.zeros((4, 64), np.float32)}),
    lambda: ot.run_interpreted(ot.add_softmax_mul(), [1, 2]),
])
def test_bad_input_is_explained(call):
    with pytest.raises(OrtlabError):
        call()


def test_agreement_is_a_stable_verdict(run):
    """Below TOLERANCE the run reports 'equal' (no CPU-dependent noise); above it, the figure."""
    assert run.max_diff <= ot.TOLERANCE and run.agrees == "<= 1e-05 (equal)"
    assert f"{run.max_diff:.1e}" not in ot._codegen_row(run)[2] or run.max_diff == 0
    far = ot.TritonRun(run.source, run.cpu, run.outputs, run.executor_error, run.debug_files, 0.25)
    assert far.agrees == "2.5e-01" and "2.5e-01" in ot._codegen_row(far)[2]

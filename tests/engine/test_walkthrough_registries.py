"""L0_04's kernel-registry probe (who_runs) against what ORT 1.19.2 executes, read from its profiler, and the
ONNX spec: a node ORT says a kernel runs is one profiled kernel call of that op; a node it expands runs as the
ops of its function body."""
import subprocess
import sys

import numpy as np
import pytest
from onnx import TensorProto

from ortlab import session
from ortlab.onnx_defs import one_node_model
from ortlab.walkthroughs import onnx_ops_schemas_kernels as kr

F, D, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT64


def profiled_ops(probe, feeds):
    """The op types ORT's profiler saw run for a one-node model of `probe` (graph optimizations off)."""
    model = one_node_model(probe.op, [(t, None) for t in probe.inputs], dict(probe.attributes), probe.domain,
                           probe.opset, probe.outputs)
    events = session.kernel_events(session.profile(model, feeds, level="disable", providers=["CPUExecutionProvider"]))
    return [e["args"]["op_name"] for e in events]


def sce_feeds(dtype):
    rng = np.random.default_rng(0)
    return {"x0": rng.standard_normal((4, 5)).astype(dtype), "x1": np.array([0, 1, 2, 4], np.int64)}


@pytest.mark.parametrize("dtype, elem", [(np.float32, F), (np.float64, D)])
def test_softmax_cross_entropy_loss_internal_kernel_or_body_is_what_the_profiler_sees(dtype, elem):
    probe = kr.Probe("SoftmaxCrossEntropyLossInternal", kr.MS, inputs=(elem, I64), outputs=2)
    answer, ops = kr.who_runs(probe)
    ran = profiled_ops(probe, sce_feeds(dtype))
    if dtype is np.float32:
        assert (answer, ops, ran) == ("kernel", [probe.op], [probe.op])
    else:
        assert answer == "function body" and ran == ops and probe.op not in ran
        assert "LogSoftmax" in ran and "GatherElements" in ran


def test_every_table_row_is_one_profiled_kernel_call_of_its_op():
    rng = np.random.default_rng(1)
    feeds = {"MatMul": [rng.standard_normal((2, 3)), rng.standard_normal((3, 4))],
             "LayerNormalization": [rng.standard_normal((2, 4)), np.ones(4), np.zeros(4)],
             "Gelu": [rng.standard_normal((2, 3))],
             "FusedMatMul": [rng.standard_normal((2, 3)), rng.standard_normal((3, 4))],
             "GeluGrad": [rng.standard_normal((2, 3)), rng.standard_normal((2, 3))]}
    checked = 0
    for _, probe, _ in kr.REGISTRY_ROWS:
        if probe.op.startswith("SoftmaxCrossEntropy"):
            arrays = list(sce_feeds(np.float32).values())
        else:
            arrays = [a.astype(np.float32) for a in feeds[probe.op]]
        ran = profiled_ops(probe, {f"x{i}": a for i, a in enumerate(arrays)})
        assert kr.who_runs(probe) == ("kernel", [probe.op]) and ran == [probe.op], probe.label()
        checked += 1
    assert checked == len(kr.REGISTRY_ROWS) == 8


def test_layer_normalization_before_opset_17_is_not_onnxs_yet_ort_runs_it():
    """onnx's own registry, in a fresh process: ortlab's Graph.resolve installs ORT's LayerNormalization-1
    (ortlab.ops.schemas) into it, so an earlier test in this process may have added it."""
    code = ("import onnx.defs as d\n"
            "try:\n    d.get_schema('LayerNormalization', 16); print('found')\n"
            "except d.SchemaError:\n    print('none')\n"
            "print(d.get_schema('LayerNormalization', 17).since_version)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["none", "17"]
    assert kr.who_runs(kr.Probe("LayerNormalization", opset=14, inputs=(F, F, F)))[0] == "kernel"


def test_gelu_on_float64_has_no_kernel_and_its_bodys_erf_is_named():
    answer, detail = kr.who_runs(kr.Probe("Gelu", kr.MS, inputs=(D,)))
    assert answer == "no kernel" and "Erf(" in detail[0]
    assert "then found no kernel for one of its ops" in kr.describe(kr.Probe("Gelu", kr.MS, inputs=(D,)))
    with pytest.raises(session.SessionError, match="Erf"):
        session.run_node("Gelu", [np.ones(3)], domain="com.microsoft")


def test_the_wheel_cannot_list_its_kernels_and_has_no_cuda_ep():
    import onnxruntime as ort

    assert not hasattr(ort.capi._pybind_state, "get_all_opkernel_def")
    assert "CUDAExecutionProvider" not in ort.get_available_providers()


@pytest.mark.parametrize("probe, answer, words", [
    (kr.Probe("NoSuchOp"), "invalid", "No Op registered for NoSuchOp"),
    (kr.Probe("MatMul", inputs=(TensorProto.INT8, TensorProto.INT8)), "invalid", "Type Error"),
    (kr.Probe("Gelu", "com.nowhere"), "invalid", "not a registered function/op"),
])
def test_nodes_no_schema_accepts_are_said_to_be_refused_not_kernel_less(probe, answer, words):
    found, detail = kr.who_runs(probe)
    assert found == answer and words in detail[0]
    assert kr.describe(probe).startswith("refused before any kernel is looked for")


@pytest.mark.parametrize("bad", [kr.Probe("Relu", inputs=()), kr.Probe("Relu", inputs=("float",)),
                                 kr.Probe("Relu", inputs=(np.float32,)), "Relu"])
def test_bad_probes_are_refused_with_what_to_give(bad):
    with pytest.raises(kr.RegistryError, match="Probe|TensorProto"):
        kr.who_runs(bad)

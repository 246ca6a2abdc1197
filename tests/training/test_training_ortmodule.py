"""The real ORTModule driven by ortlab.ortmodule.driver: dumps, variables, logs, fallback, and
ORT 1.19.2's crash with the compute optimizer off. Parity is against plain PyTorch runs.

(Named to run after test_stack: ORTModule registers export symbolics process-wide.)
"""
import copy

import numpy as np
import pytest
import torch

from torch_reference import sgd_losses
from ortlab import models
from ortlab.training import MiniORTModule
from ortlab.ortmodule import driver as om


@pytest.fixture(scope="module")
def bert_run(tmp_path_factory):
    module = models.get("bert", dropout=0.0)
    batches = [module.example_inputs(seed=s) for s in range(2)]
    expected = sgd_losses(copy.deepcopy(module), batches, 3)
    run = om.train(module, batches, 3, prefix="bert", folder=tmp_path_factory.mktemp("dumps"))
    return run, expected


def test_trains_like_pytorch_and_dumps_five_graphs(bert_run):
    run, expected = bert_run
    np.testing.assert_allclose(run.losses, expected, rtol=1e-5)
    assert not run.fell_back
    assert list(run.graphs()) == list(om.DUMPS)
    assert sorted(p.name for p in run.folder.iterdir()) == sorted(f"bert_{k}_training.onnx" for k in om.DUMPS)


def test_graph_changes_show_the_fusions_and_the_gradient_ops(bert_run):
    run, _ = bert_run
    graphs = run.graphs()
    table = om.graph_changes(graphs)
    rows = {r[0]: r for r in table.rows}
    exported, pre_grad = om.op_counts(graphs["torch_exported"]), om.op_counts(graphs["optimized_pre_grad"])
    assert exported["Pow"] == 5 and "Pow" not in pre_grad               # LayerNorm subgraphs fused
    assert pre_grad["LayerNormalization"] == 5 and pre_grad["com.microsoft:Gelu"] == 2
    assert rows["Pow"][-1] == "disappears" and rows["LayerNormalization"][-1] == "appears"
    assert "com.microsoft:YieldOp" in om.op_counts(graphs["optimized"])  # where forward meets backward
    assert rows["(all nodes)"][1:-1] == tuple(len(g.graph.node) for g in graphs.values())


def test_opset_and_save_path_variables(tmp_path):
    module = models.get("mlp", dropout=0.0)
    run = om.train(module, [module.example_inputs()], 1, ONNX_OPSET_VERSION=15, SAVE_ONNX_PATH=tmp_path)
    assert run.folder == tmp_path and len(list(tmp_path.glob("*.onnx"))) == 5
    exported = run.graphs()["torch_exported"]
    assert {i.domain: i.version for i in exported.opset_import}[""] == 15
    assert "ORTMODULE_ONNX_OPSET_VERSION" not in __import__("os").environ  # restored afterwards


def test_log_levels_print_more_as_they_go_down():
    module = models.get("mlp", dropout=0.0)
    counts = {level: len(om.train(copy.deepcopy(module), [module.example_inputs()], 1, log_level=level,
                                  save_onnx=False).log) for level in ("ERROR", "WARNING", "INFO")}
    assert counts["ERROR"] == 0 < counts["WARNING"] < counts["INFO"]


def test_fallback_to_pytorch_and_fallback_disable():
    Lgamma = models.LgammaRegressor
    torch.manual_seed(0)
    module, batches = Lgamma(), [(torch.randn(8, 4),)]
    expected = sgd_losses(copy.deepcopy(module), batches, 2)
    run = om.train(module, batches, 2, save_onnx=False)
    assert run.fell_back and run.grep("Fallback to PyTorch")
    np.testing.assert_allclose(run.losses, expected, rtol=1e-6)
    with pytest.raises(om.OrtModuleError, match="ORTModuleONNXModelException.*aten::lgamma"):
        om.train(Lgamma(), batches, 1, save_onnx=False, FALLBACK_POLICY="FALLBACK_DISABLE")


def test_compute_optimizer_off_crashes_ort_1_19_2_unless_the_hook_is_fixed():
    module = models.get("gpt", dropout=0.0)
    batches = [module.example_inputs(seed=s) for s in range(2)]
    with pytest.raises(om.OrtModuleError, match="'NoneType' object is not iterable"):
        om.train(copy.deepcopy(module), batches, 1, fix_label_hook=False, ENABLE_COMPUTE_OPTIMIZER=0)
    on = om.train(copy.deepcopy(module), batches, 2)
    off = om.train(copy.deepcopy(module), batches, 2, ENABLE_COMPUTE_OPTIMIZER=0)
    np.testing.assert_allclose(off.losses, sgd_losses(copy.deepcopy(module), batches, 2), rtol=1e-5)
    np.testing.assert_allclose(on.losses, off.losses, rtol=1e-5)
    assert om.op_counts(on.graphs()["execution_model"]) != om.op_counts(off.graphs()["execution_model"])


def test_deepcopy_variable_decides_whether_export_runs_the_users_module():
    Counting = models.CountingModule

    calls = {}
    for value in (1, 0):
        module = Counting()
        om.train(module, [(torch.randn(8, 4),)], 3, save_onnx=False, DEEPCOPY_BEFORE_MODEL_EXPORT=value)
        calls[value] = module.calls
    assert calls == {1: 1, 0: 2}  # the tracing run, plus the schema run when not on a copy


def test_cache_dir_skips_the_second_export(tmp_path):
    module = models.get("mlp", dropout=0.0)
    om.train(copy.deepcopy(module), [module.example_inputs()], 1, save_onnx=False, CACHE_DIR=tmp_path)
    assert len(list(tmp_path.glob("*.onnx"))) == 1
    second = om.train(copy.deepcopy(module), [module.example_inputs()], 1, save_onnx=False, CACHE_DIR=tmp_path)
    assert second.grep("Cached model detected")


def test_mini_ortmodule_exports_plain_onnx_after_ortmodule_registered_its_symbolics(bert_run):
    run, _ = bert_run
    assert "org.pytorch.aten:ATen" in om.op_counts(run.graphs()["torch_exported"])  # ORTModule's embedding
    mini = MiniORTModule(models.get("bert", dropout=0.0))
    mini(*mini.module.example_inputs()).backward()
    exported = mini.graphs()["torch_exported"]
    assert {n.op_type for n in exported.graph.node} >= {"Gather"} and all(n.domain == "" for n in exported.graph.node)
    from torch.onnx._internal import registration
    assert registration.registry.get_function_group("aten::embedding")._functions._overrides  # put back


def test_bad_log_level_is_explained():
    with pytest.raises(om.OrtModuleError, match="log_level must be one of"):
        om.ortmodule(torch.nn.Linear(2, 2), log_level="LOUD")


def test_clean_log_line():
    line = "\x1b[0;93m2026-11-22 17:02:47.120809943 [W:onnxruntime:, inference_session.cc:2039 Initialize] x\x1b[m"
    assert om.clean_log_line(line) == "onnxruntime [W] x"
    assert om.clean_log_line("    2026-11-22 17:06:13,300 orttraining [WARNING] - y") == "    orttraining [WARNING] - y"


def test_profiling_ortmodule_sees_forward_and_backward_runs_of_the_execution_graph():
    from ortlab.profiling import diagnose_dumps, load_ort_profile

    module = models.get("bert", dropout=0.1)
    run = om.train(module, [module.example_inputs(seed=s) for s in range(2)], 3, profile=True)
    profile = load_ort_profile(run.profile)
    assert len(profile.runs) == 6  # each step: the forward partial run and the backward one
    executed = {n.name for n in run.graphs()["execution_model"].graph.node}
    assert {e.name for e in profile.events} <= executed
    assert {"LayerNormalizationGrad", "GatherGrad"} <= set(profile.by_op_type())
    counts = diagnose_dumps(run.graphs()).counts()
    assert counts["unfused_layer_norm"] == counts["unfused_gelu"] == counts["memcpy"] == 0
    assert counts["standalone_dropout"] == 4  # BiasDropout is a CUDA-only fusion: not on CPU


def test_log_levels_table_and_the_fatal_level_crash():
    module = models.get("mlp", dropout=0.0)
    table = om.log_levels(module, module.example_inputs(), levels=("INFO", "WARNING", "FATAL"))
    rows = {r[0]: dict(zip(table.header, r)) for r in table.rows}
    assert rows["INFO"]["ORTModule INFO lines"] > 0 == rows["WARNING"]["ORTModule INFO lines"]
    assert rows["INFO"]["torch exporter's graph"] == "yes" and rows["WARNING"]["torch exporter's graph"] == "no"
    assert rows["INFO"]["ORT C++ INFO"] == "no" and rows["WARNING"]["error"] == ""
    assert "Invalid session log severity level" in rows["FATAL"]["error"]  # 1.19.2 passes 5 to the C++ core


def test_memory_stats_print_only_with_cuda():
    module = models.get("mlp", dropout=0.0)
    run = om.train(module, [module.example_inputs()], 2, save_onnx=False, PRINT_MEMORY_STATS=1)
    assert bool(run.grep("memory (MiB)")) == torch.cuda.is_available()


def test_export_decisions_fast_path_and_full_checks():
    module = models.get("mlp", dropout=0.0)
    x, y = module.example_inputs(batch=8)
    calls = [((x,), {}), ((x[:3],), {}), ((x,), {"labels": y})]
    assert om.export_decisions(module, calls) == [True, "skipped", "skipped"]
    assert om.export_decisions(module, calls, SKIPCHECK_POLICY="SKIP_CHECK_DISABLED") == [True, False, True]
    mini = MiniORTModule(copy.deepcopy(module))
    decisions = []
    for args, kwargs in calls:
        before = len(mini.exports)
        mini(*args, **kwargs)
        decisions.append(len(mini.exports) > before)
    assert decisions == [True, False, True]  # the same rule as ORTModule with every check on


def test_ort_seed_makes_ortmodule_dropout_repeatable():
    from ortlab.env import seed_ort

    module = models.get("mlp", dropout=0.5)
    batches = [module.example_inputs()]

    def losses(seed=None):
        if seed is not None:
            seed_ort(seed)
        return om.train(copy.deepcopy(module), batches, 3, save_onnx=False).losses

    assert losses(7) == losses(7)
    assert losses() != losses()  # the generator goes on from where the last run left it


def test_models_export_is_plain_onnx_after_ortmodule_ran(bert_run):
    exported = models.export(models.get("bert", dropout=0.0), models.get("bert").example_inputs()[:1])
    assert all(n.domain == "" for n in exported.graph.node)
    assert "Gather" in {n.op_type for n in exported.graph.node}


def test_plain_export_keeps_a_users_own_custom_symbolic(bert_run):
    """Only ORTModule's symbolics are set aside: one a user registers still applies."""
    def relu_as_leaky(g, x):
        return g.op("LeakyRelu", x, alpha_f=0.0)

    torch.onnx.register_custom_op_symbolic("aten::relu", relu_as_leaky, 9)
    try:
        mlp = models.get("mlp", dropout=0.0)
        ops = {n.op_type for n in models.export(mlp, mlp.example_inputs()[:1]).graph.node}
    finally:
        torch.onnx.unregister_custom_op_symbolic("aten::relu", 9)
    assert "LeakyRelu" in ops and "Relu" not in ops


def test_training_agent_runs_one_session_whose_outputs_are_the_gradients(bert_run):
    run, _ = bert_run
    session = run.training_agent()._inference_session
    outputs = [o.name for o in session.get_outputs()]
    assert len(outputs) == len(list(run.model.parameters())) and all(o.endswith("_grad") for o in outputs)
    assert [i.name for i in session.get_inputs()][:2] == ["input_ids", "labels"]
    fallen = om.train(models.LgammaRegressor(), [(torch.randn(4, 4),)], 1, save_onnx=False)
    with pytest.raises(om.OrtModuleError, match="fell back to PyTorch"):
        fallen.training_agent()


def test_the_fast_path_silently_reuses_a_graph_exported_for_other_inputs():
    """ORT 1.19.2's default fast path: a call with labels= runs the graph exported without them and
    returns the logits where PyTorch returns the loss; every check on, it exports again (seed 003)."""
    module = models.get("mlp", dropout=0.0)
    x, y = module.example_inputs(batch=8)
    calls = [((x,), {}), ((x,), {"labels": y}), ((x[None],), {})]
    fast = om.call_outcomes(module, calls)
    full = om.call_outcomes(module, calls, SKIPCHECK_POLICY="SKIP_CHECK_DISABLED")
    assert tuple(module(x, labels=y).shape) == ()  # PyTorch: the scalar loss
    assert fast[1].decision == "skipped" and fast[1].returned == "float32 [8, 4]"  # ORT: the logits
    assert full[1].decision is True and full[1].returned == "float32 []"
    assert fast[2].decision == "error: RuntimeError" and "Gemm" in fast[2].error and "NumDimensions" in fast[2].error
    assert full[2].returned == "float32 [1, 8, 4]" and not full[2].error


def test_ortmodule_log_level_variable_wins_over_debug_options():
    module = models.get("mlp", dropout=0.0)

    def info_lines(debug_options, variable):
        run = om.train(copy.deepcopy(module), [module.example_inputs()], 1, log_level=debug_options,
                       LOG_LEVEL=variable, save_onnx=False)
        return sum(line.startswith("orttraining [INFO]") for line in run.log)

    assert info_lines("INFO", "WARNING") == 0
    assert info_lines("WARNING", "INFO") > 0

"""ortlab.walkthroughs.ortmodule_optimizations: ORTModule's features 1-6 against ORT 1.19.2's own graph dumps
and PyTorch's losses, the ORT bugs the helpers pin, and bad input.

One ORTModule comparison per feature (module-scoped fixtures), many small asserts over each. The
references are independent of the helpers: op counts read from ORT's dumps here, losses from
plain torch loops here, densities counted from the batches here, ORT's sources read here.
"""
import copy
from pathlib import Path

import pytest
import torch

from torch_reference import sgd_losses
from ortlab.env import quiet_import
from ortlab.errors import OrtlabError
from ortlab.models import TinyBert, TinyGPT, WithLossModule, get
from ortlab.walkthroughs import ortmodule_feature_models as fm
from ortlab.walkthroughs import ortmodule_input_features as oi
from ortlab.walkthroughs import ortmodule_optimizations as of
from ortlab.ortmodule.driver import op_counts, train

TOL = 1e-5


def reference_losses(module, batches, steps, lr=0.05):
    """PyTorch's losses for a copy of `module`: plain SGD, plain loop (no ortlab helper involved)."""
    return sgd_losses(copy.deepcopy(module), batches, steps, lr=lr)


def diff(a, b):
    return max(abs(x - y) for x, y in zip(a, b))


def count(model, op):
    """How many nodes of `op` ('Softmax', 'com.microsoft:PythonOp') a graph holds, read from its protobuf."""
    return sum(1 for n in model.graph.node if (f"{n.domain}:{n.op_type}" if n.domain else n.op_type) == op)


def python_funcs(model):
    return [next(a.s.decode() for a in n.attribute if a.name == "func_name")
            for n in model.graph.node if n.op_type == "PythonOp"]


# ---------------------------------------------------------------------------------------------
# 1. MEM_EFFICIENT_GRAD_MGMT


@pytest.fixture(scope="module")
def memgrad():
    return of.mem_efficient_grad("mlp", steps=3)


def test_mem_efficient_grad_crashes_as_shipped(memgrad):
    error = memgrad.errors["on, as shipped"]
    assert "TypeError" in error and "zeros()" in error and "device=dict" in error


def test_mem_efficient_grad_graph_from_ort_dump(memgrad):
    module = get("mlp", dropout=0.0)
    params = [name for name, p in module.named_parameters() if p.requires_grad]
    on = memgrad.after.graphs()["execution_model"]
    off = memgrad.before.graphs()["execution_model"]
    funcs = python_funcs(on)
    assert len(funcs) == len(params) and all("ParamRetrievalFunction" in f for f in funcs)
    assert count(on, "com.microsoft:PythonOpGrad") == len(params)
    assert count(off, "com.microsoft:PythonOp") == 0
    inputs_on = [i.name for i in on.graph.input]
    assert not any(name.endswith(p) for name in inputs_on for p in params)
    assert "mem_efficient_pull_weight_trigger" in inputs_on
    assert sum(name.endswith(p) for name in (i.name for i in off.graph.input) for p in params) == len(params)
    assert [o.name for o in on.graph.output] == ["mem_efficient_pull_weight_trigger_grad"]
    assert len(off.graph.output) == len(params)
    assert memgrad.facts["graph outputs after"] == ["mem_efficient_pull_weight_trigger_grad"]


def test_mem_efficient_grad_losses_equal_torch(memgrad):
    module = get("mlp", dropout=0.0)
    batches = [module.example_inputs(seed=s) for s in range(3)]
    ref = reference_losses(module, batches, 3)
    assert diff(memgrad.after.losses, ref) <= TOL and diff(memgrad.before.losses, ref) <= TOL
    assert memgrad.max_loss_diff <= TOL and memgrad.losses_equal()


def test_mem_efficient_grad_fix_is_undone():
    import onnxruntime.training.ortmodule._mem_efficient_grad_mgmt as meg

    original = meg.post_processing_enable_mem_efficient_training
    with of.mem_efficient_grad_fix() as fixed:
        assert meg.post_processing_enable_mem_efficient_training is fixed is not original
    assert meg.post_processing_enable_mem_efficient_training is original
    with pytest.raises(RuntimeError):
        with of.mem_efficient_grad_fix():
            raise RuntimeError("inside")
    assert meg.post_processing_enable_mem_efficient_training is original


def test_changes_table_counts_match_ort_dumps(memgrad):
    table = memgrad.changes()
    total = table.rows[-1]
    assert total[0] == "(all nodes)"
    assert list(total[1:3]) == [len(g.graph.node) for g in memgrad.graphs.values()]
    rows = {r[0]: r for r in table.rows}
    on = memgrad.after.graphs()["execution_model"]
    assert rows["com.microsoft:PythonOp"][2] == count(on, "com.microsoft:PythonOp")
    text = repr(memgrad)
    assert "on, as shipped: fails" in text and "<- feature at work" in text


# ---------------------------------------------------------------------------------------------
# 2. custom autograd.Function


def test_half_grad_tanh_is_half_the_true_gradient():
    x = torch.linspace(-2, 2, 9, requires_grad=True)
    fm.HalfGradTanh.apply(x).sum().backward()
    assert torch.allclose(x.grad, 0.5 * (1 - torch.tanh(x.detach()) ** 2))


@pytest.fixture(scope="module")
def custom():
    from onnxruntime.training.ortmodule._custom_autograd_function import custom_autograd_function_enabler

    before = custom_autograd_function_enabler.state
    result = of.custom_autograd(steps=3)
    assert custom_autograd_function_enabler.state == before  # restored
    return result


def test_custom_autograd_on_runs_the_users_backward(custom):
    on = custom.runs["support on"].graphs()["execution_model"]
    assert python_funcs(on) == [f"{fm.HalfGradTanh.__module__}.HalfGradTanh"]
    assert count(on, "com.microsoft:PythonOpGrad") == 1
    module = fm.HalfGradTanhNet()
    batches = [module.example_inputs(seed=s) for s in range(3)]
    assert diff(custom.runs["support on"].losses, reference_losses(module, batches, 3)) == 0.0


def test_custom_autograd_off_silently_inlines(custom):
    off = custom.runs["support off"].graphs()["execution_model"]
    assert count(off, "com.microsoft:PythonOp") == 0 and count(off, "com.microsoft:TanhGrad") == 1
    module = fm.HalfGradTanhNet()
    batches = [module.example_inputs(seed=s) for s in range(3)]
    assert diff(custom.runs["support off"].losses, reference_losses(module, batches, 3)) > 1e-4
    plain = fm.HalfGradTanhNet(custom=False)
    assert diff(custom.runs["support off"].losses, reference_losses(plain, batches, 3)) <= TOL
    assert not custom.losses_equal("support off") and custom.losses_equal("support on")


# ---------------------------------------------------------------------------------------------
# 3. checkpointing


@pytest.fixture(scope="module")
def ckpt():
    result = of.checkpointing(steps=2, layers=1)
    module = TinyBert(dropout=0.0, layers=1)
    batches = [module.example_inputs(seed=s) for s in range(2)]
    plain = train(copy.deepcopy(module), batches, 2, FALLBACK_POLICY="FALLBACK_DISABLE")
    return result, plain.graphs()["execution_model"], reference_losses(module, batches, 2)


def test_checkpoint_default_error_has_literal_placeholder(ckpt):
    error = ckpt[0].errors["default"]
    assert "gradient checkpointing" in error and "{func_full_qual_name}" in error


def test_checkpoint_allow_makes_one_python_op_per_block(ckpt):
    graph = ckpt[0].runs["ALLOW_AUTOGRAD_CHECKPOINT=1"].graphs()["execution_model"]
    assert python_funcs(graph) == ["torch.utils.checkpoint.CheckpointFunction"]  # one block
    assert count(graph, "com.microsoft:PythonOpGrad") == 1
    assert len(graph.graph.node) < len(ckpt[1].graph.node)


def test_checkpoint_memory_opt_recomputes_and_reentrant_false_is_plain(ckpt):
    result, plain, _ = ckpt
    level = result.runs["MEMORY_OPT_LEVEL=1"].graphs()["execution_model"]
    recompute = [n for n in level.graph.node if n.name.endswith("_recompute")]
    assert len(recompute) > 0 and count(level, "com.microsoft:PythonOp") == 0
    assert sum(result.facts["recompute nodes"]["MEMORY_OPT_LEVEL=1"].values()) == len(recompute)
    assert len(level.graph.node) - len(recompute) == len(plain.graph.node)
    inline = result.runs["use_reentrant=False"].graphs()["execution_model"]
    assert op_counts(inline) == op_counts(plain)
    assert not any(n.name.endswith("_recompute") for n in inline.graph.node)
    assert result.facts["layer-wise log line"]


def test_checkpoint_losses_equal_torch(ckpt):
    result, _, ref = ckpt
    for label, run in result.runs.items():
        assert diff(run.losses, ref) <= TOL, label


# ---------------------------------------------------------------------------------------------
# 4. label sparsity


@pytest.fixture(scope="module")
def labels():
    return oi.label_sparsity(densities=(1.0, 0.6), steps=2)


def test_label_sparsity_density_and_log(labels):
    gpt = TinyGPT(dropout=0.0)
    for density, state in ((1.0, "OFF"), (0.6, "ON")):
        batch_labels = fm.sparse_label_batches(gpt, density, count=2)[0][1]
        percent = 100.0 * float((batch_labels != -100).sum()) / batch_labels.numel()
        label = f"labels {percent:.0f}% valid"
        assert label in labels.runs
        said = f"Label sparsity-based optimization is {state} for density: {percent:.0f}%"
        assert labels.runs[label].grep(said)


def test_label_sparsity_gathers_from_ort_dump(labels):
    dense, sparse = (labels.runs[k].graphs()["execution_model"] for k in labels.runs)
    assert count(dense, "com.microsoft:ShrunkenGather") == 0 and count(dense, "NonZero") == 0
    assert count(sparse, "com.microsoft:ShrunkenGather") == 2 and count(sparse, "NonZero") == 1
    gathers = [n for n in sparse.graph.node if n.op_type == "ShrunkenGather"]
    readers = {n.output[0]: [m for m in sparse.graph.node if n.output[0] in m.input] for n in gathers}
    hidden = [g for g in gathers
              if any("_original_module.model.lm_head.weight" in m.input and "_Grad" not in m.name
                     for m in readers[g.output[0]])]
    assert len(hidden) == 1  # one gather feeds lm_head's forward MatMul (fused to Gemm) directly
    rows = {r["node"]: r for r in oi.shrunken_gathers(sparse)}
    assert rows[hidden[0].name]["before lm_head MatMul"]
    assert rows[hidden[0].name]["filters"] == "hidden states"
    assert [r["filters"] for r in rows.values()].count("labels") == 1


def test_label_sparsity_losses_equal_torch(labels):
    module = WithLossModule(TinyGPT(dropout=0.0))
    for density, label in zip((1.0, 0.6), labels.runs):
        batches = fm.sparse_label_batches(module.model, density, count=2)
        assert diff(labels.runs[label].losses, reference_losses(module, batches, 2)) <= TOL


@pytest.fixture(scope="module")
def switches():
    return oi.sparsity_switches(0.6, steps=1, switches=("ENABLE_SPARSE_OPTIMIZER=0",
                                                        "ENABLE_EMBEDDING_SPARSE_OPTIMIZER=0"))


def test_sparse_optimizer_variable_is_never_read(switches):
    root = Path(quiet_import("onnxruntime.training.ortmodule").__file__).parent
    sources = "".join(p.read_text(errors="replace") for p in root.rglob("*.py"))
    assert "ORTMODULE_ENABLE_SPARSE_OPTIMIZER" not in sources
    assert "ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER" in sources
    assert switches.facts["read by ORT"] == {"ENABLE_SPARSE_OPTIMIZER=0": False,
                                             "ENABLE_EMBEDDING_SPARSE_OPTIMIZER=0": True}
    graph = switches.runs["ENABLE_SPARSE_OPTIMIZER=0"].graphs()["execution_model"]
    assert count(graph, "com.microsoft:ShrunkenGather") == 2


def test_embedding_switch_turns_label_sparsity_off(switches, labels):
    graphs = {k: r.graphs()["execution_model"] for k, r in switches.runs.items()}
    assert count(labels.after.graphs()["execution_model"], "com.microsoft:ShrunkenGather") == 2  # default
    assert count(graphs["ENABLE_EMBEDDING_SPARSE_OPTIMIZER=0"], "com.microsoft:ShrunkenGather") == 0
    on = {k: count(g, "com.microsoft:ShrunkenGather") > 0 for k, g in graphs.items()}
    assert switches.facts["on"] == on
    ref = reference_losses(WithLossModule(TinyGPT(dropout=0.0)),
                           fm.sparse_label_batches(TinyGPT(dropout=0.0), 0.6, count=1), 1)
    assert all(diff(r.losses, ref) <= TOL for r in switches.runs.values())


# ---------------------------------------------------------------------------------------------
# 5. embedding sparsity


@pytest.fixture(scope="module")
def embedding():
    return oi.embedding_sparsity(pad_fraction=0.5, steps=2)


def test_embedding_density_is_ort_own_and_cpu_returns_early(embedding):
    gpt = TinyGPT(dropout=0.0)
    ids = fm.padded_id_batches(gpt, 0.5, count=1)[0][0]
    expected = 100.0 * float((ids != 0).sum()) / ids.numel()
    cuda, cpu = embedding.facts["ORT detection, cuda"], embedding.facts["ORT detection, cpu"]
    assert cuda["density"] == {"tok": pytest.approx(expected)} and cuda["hooks"] == 1
    assert cuda["log"] == [f"Embedding sparsity-based optimization is ON for density: {expected:.0f}%"]
    assert cpu == {"hooks": 0, "density": {}, "log": [], "printed": []}
    assert 'device.type != "cuda"' in embedding.facts["early return"]


def test_embedding_sparsity_does_nothing_on_cpu(embedding):
    plain, padded = (embedding.runs[k].graphs()["execution_model"]
                     for k in ("padding_idx=None", "padding_idx=0"))
    assert op_counts(plain) == op_counts(padded) and count(padded, "com.microsoft:PythonOp") == 0
    assert not any(n.op_type in ("FlattenAndUnpad", "PadAndUnflatten") for n in padded.graph.node)
    assert not embedding.runs["padding_idx=0"].grep("Embedding sparsity")
    gpt = TinyGPT(dropout=0.0)
    gpt.tok.padding_idx = 0
    batches = fm.padded_id_batches(gpt, 0.5, count=2)
    assert diff(embedding.after.losses, reference_losses(gpt, batches, 2)) <= TOL
    assert any("GPU" in note for note in embedding.notes)


# ---------------------------------------------------------------------------------------------
# 6. efficient attention


def test_masked_bert_is_tinybert_with_an_additive_mask():
    bert, masked = TinyBert(dropout=0.0), fm.MaskedBert(dropout=0.0)
    batch = bert.example_inputs()
    assert torch.allclose(bert(*batch), masked(*batch))
    masked.blocks[0].attn.attn_bias[..., 0] = -1e4
    assert not torch.allclose(bert(*batch), masked(*batch))


@pytest.fixture(scope="module")
def attention():
    return oi.efficient_attention(steps=2)


def test_efficient_attention_rewrite_by_hand(attention):
    before, after = attention.graphs.values()
    layers = 2
    assert count(before, "Softmax") == layers and count(after, "Softmax") == 0
    operators = [a.s.decode() for n in after.graph.node if n.op_type == "ATen"
                 for a in n.attribute if a.name == "operator"]
    aten = [op for op in operators if op.startswith("_efficient_attention")]
    assert len(aten) == 2 * layers
    assert attention.facts["registered"] == {"all": [("optimize_graph_for_aten_efficient_attention", "cuda")]}
    graph = attention.after.graphs()["execution_model"]
    assert count(graph, "Softmax") == layers  # on CPU ORT skipped its own optimizer
    module = fm.MaskedBert(dropout=0.0)
    batches = [module.example_inputs(seed=s) for s in range(2)]
    assert diff(attention.after.losses, reference_losses(module, batches, 2)) <= TOL


def test_efficient_attention_kernel_missing_on_cpu(attention):
    q = torch.randn(1, 8, 2, 16)
    with pytest.raises(NotImplementedError, match="_efficient_attention_forward"):
        torch.ops.aten._efficient_attention_forward(q, q, q, None, None, None, None, None, 0.0, 0, False)
    running = attention.facts["running it"]
    assert "Could not run 'aten::_efficient_attention_forward'" in running["ort"]
    assert running["torch"].startswith("NotImplementedError")


# ---------------------------------------------------------------------------------------------
# Hostile input (all rejected before any ORT run)


@pytest.mark.parametrize("call", [
    lambda: oi.compare_feature("fused_adam"),
    lambda: oi.compare_feature(3),
    lambda: oi.compare_feature("label_sparsity", density=0.5),
    lambda: oi.compare_feature("checkpointing", layers=9),
    lambda: of.mem_efficient_grad("gpt"),
    lambda: of.mem_efficient_grad(model=None),
    lambda: of.custom_autograd(steps=0),
    lambda: of.custom_autograd(steps="2"),
    lambda: of.custom_autograd(steps=True),
    lambda: oi.label_sparsity(densities="0.5"),
    lambda: oi.label_sparsity(densities=()),
    lambda: oi.label_sparsity(densities=(0.0,)),
    lambda: oi.label_sparsity(densities=(1.5,)),
    lambda: oi.sparsity_switches(switches=("ENABLE_TURBO=1",)),
    lambda: oi.sparsity_switches(switches="(default)"),
    lambda: oi.embedding_sparsity(pad_fraction=1.0),
    lambda: oi.embedding_sparsity(pad_fraction="half"),
    lambda: oi.efficient_attention(steps=11),
    lambda: oi.ort_embedding_density("model", ()),
    lambda: oi.ort_embedding_density(TinyGPT(), (), device="tpu"),
    lambda: of.custom_autograd_support("yes").__enter__(),
])
def test_bad_input_is_a_feature_error(call):
    with pytest.raises(of.FeatureError) as info:
        call()
    assert str(info.value)


@pytest.mark.parametrize("call", [
    lambda: fm.sparse_label_batches(TinyBert(), 0.5),
    lambda: fm.sparse_label_batches(TinyGPT(), 0),
    lambda: fm.sparse_label_batches(TinyGPT(), 0.5, count=0),
    lambda: fm.padded_id_batches(TinyGPT(), 1.0),
    lambda: fm.padded_id_batches("gpt", 0.5),
    lambda: fm.CheckpointedBert(use_reentrant="yes"),
])
def test_bad_input_to_feature_models(call):
    with pytest.raises(fm.FeatureModelError):
        call()


def test_feature_comparison_unknown_run(memgrad):
    with pytest.raises(of.FeatureError, match="no run 'nope'"):
        memgrad.loss_diff("nope")
    assert issubclass(of.FeatureError, OrtlabError)


# ---------------------------------------------------------------------------------------------
# 0. MEMORY_OPT_LEVEL (recompute)


@pytest.fixture(scope="module")
def recomputed():
    return of.recompute("gpt", steps=2)


def test_recompute_nodes_from_ort_dump(recomputed):
    off, on = (recomputed.runs[f"MEMORY_OPT_LEVEL={k}"].graphs()["execution_model"] for k in (0, 1))
    names_on = [n for n in on.graph.node if n.name.endswith("_recompute")]
    assert not any(n.name.endswith("_recompute") for n in off.graph.node)
    assert names_on and len(on.graph.node) == len(off.graph.node) + len(names_on)
    # each recompute node copies a forward node of the same op type that the level-0 graph holds
    forward = {n.name: n.op_type for n in off.graph.node}
    assert all(forward.get(n.name[:-len("_recompute")]) == n.op_type for n in names_on)
    ops = {}
    for n in names_on:
        ops[n.op_type] = ops.get(n.op_type, 0) + 1
    assert recomputed.facts["recompute nodes"]["MEMORY_OPT_LEVEL=1"] == ops


def test_recompute_losses_equal_torch(recomputed):
    module = get("gpt", dropout=0.0)
    batches = [module.example_inputs(seed=s) for s in range(2)]
    want = reference_losses(module, batches, 2)
    for label, run in recomputed.runs.items():
        assert diff(run.losses, want) <= TOL, label
    assert recomputed.losses_equal() and "recompute" in oi.FEATURES


def test_recompute_bad_model():
    with pytest.raises(of.FeatureError, match="model must be one of"):
        of.recompute("resnet")

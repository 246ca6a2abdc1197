"""L1_07's helpers, sections 4-6 of the ORTModule training guidelines' features: what ORT does with a
model's inputs (label sparsity, embedding sparsity) and efficient attention, each against PyTorch, with
compare_feature(name) over every section. The runs and FeatureComparison are in ortmodule_optimizations.
L0_02's reprocess_checks: which inputs need a gradient, the GraphTransitionManager's second check.
"""
import copy
import inspect
import logging
import math
import re
from pathlib import Path

import numpy as np
import torch
from onnx import TensorProto, helper

from ortlab.capture import captured_lines
from ortlab.env import quiet_import
from ortlab.patch import patched
from ortlab.models import TinyGPT, WithLossModule
from ortlab.viz import Table
from ortlab.walkthroughs import ortmodule_feature_models as fm
from ortlab.ortmodule.driver import captured_logs, ortmodule, ortmodule_env
from ortlab.walkthroughs.ortmodule_optimizations import (check_densities, check_steps, count_ops, execution_graphs,
                                                         run_with_variables, checkpointing, custom_autograd,
                                                         FeatureComparison,
                                                         FeatureError, GPU_ATTENTION_COMMAND, GPU_EMBEDDING_COMMAND,
                                                         mem_efficient_grad, recompute, torch_losses,
                                                         compute_optimizer)


# ---------------------------------------------------------------------------------------------
# 4. Label sparsity


def _consumers(model):
    found = {}
    for node in model.graph.node:
        for name in node.input:
            found.setdefault(name, []).append(node)
    return found


def _producers(model):
    return {out: node for node in model.graph.node for out in node.output}


MATMULS = ("MatMul", "Gemm", "FusedMatMul")


def shrunken_gathers(model):
    """Where label sparsity's ShrunkenGather nodes sit in a training graph: one dict per node with what
    it filters ('labels' or 'hidden states'), the node producing its data and the forward nodes
    reading its output (gradient nodes, named '*_Grad*', left out), and whether one of those is
    lm_head's MatMul (or the Gemm ORT fused it into)."""
    producers, consumers, rows = _producers(model), _consumers(model), []
    for node in model.graph.node:
        if node.op_type != "ShrunkenGather":
            continue
        source = producers.get(node.input[0])
        forward = [c for c in consumers.get(node.output[0], []) if "_Grad" not in c.name]
        on_labels = source is not None and "labels" in source.input
        rows.append({"node": node.name, "filters": "labels" if on_labels else "hidden states",
                     "data from": f"{source.op_type} {source.name}" if source else node.input[0],
                     "feeds": [f"{c.op_type} {c.name}" for c in forward],
                     "before lm_head MatMul": any("lm_head/MatMul" in c.name and c.op_type in MATMULS
                                                  for c in forward)})
    return rows


def variables_read(*names):
    """True when every ORTMODULE_* variable in `names` is named anywhere in ORTModule's Python sources
    (onnxruntime/training/ortmodule/**/*.py): a variable named nowhere is never read."""
    root = Path(quiet_import("onnxruntime.training.ortmodule").__file__).parent
    text = "\n".join(path.read_text(errors="replace") for path in sorted(root.rglob("*.py")))
    return all(f'"{name}"' in text for name in names)


def _sparsity_options(run):
    """The sparsity-related flags of ORTModule's _RuntimeOptions (options.py) after a run."""
    options = run.model._torch_module._execution_manager(True)._runtime_options
    names = ("enable_compute_optimizer", "enable_label_sparse_optimizer", "enable_embedding_sparse_optimizer")
    return {name: getattr(options, name) for name in names}


def _sparsity_ratios(run):
    """ORT's own record of the densities it saw: (label, embedding) strings of _RuntimeOptions."""
    options = run.model._torch_module._execution_manager(True)._runtime_options
    return options.label_sparsity_ratio, options.embed_sparsity_ratio


def _label_model():
    return WithLossModule(TinyGPT(dropout=0.0))


def _percent(batches, ignore_index=-100):
    labels = batches[0][1]
    return 100.0 * float((labels != ignore_index).sum()) / labels.numel()


def label_sparsity(densities=(1.0, 0.6), steps=2):
    """TinyGPT inside WithLossModule (loss = nn.CrossEntropyLoss module) with labels valid at each
    density, the rest ignore_index: ORT turns label sparsity on below 90 % (its log line), adds
    NonZero and two ShrunkenGather nodes, the one on the hidden states sitting before lm_head's
    MatMul (facts['gathers']). Losses equal PyTorch's at every density."""
    densities = check_densities(densities)
    steps = check_steps(steps)
    module = _label_model()
    runs, torch_runs, facts = {}, {}, {"density": {}, "ORT log": {}, "ORT density record": {}, "gathers": {}}
    for density in densities:
        batches = fm.sparse_label_batches(module.model, density, count=steps)
        label = f"labels {_percent(batches):.0f}% valid"
        runs[label] = run_with_variables(module, batches, steps, log_level="INFO")
        torch_runs[label] = torch_losses(module, batches, steps)
        facts["density"][label] = _percent(batches)
        said = runs[label].grep("Label sparsity-based")
        facts["ORT log"][label] = sorted({line.split("] ", 1)[-1].lstrip("- ") for line in said})
        facts["ORT density record"][label] = _sparsity_ratios(runs[label])[0]
        facts["gathers"][label] = shrunken_gathers(runs[label].graphs()["execution_model"])
    main = min(runs, key=lambda k: facts["density"][k])
    notes = ["the threshold is ORT's: density < 90 % turns it on (_graph_transition_manager.py, "
             "_add_check_label_sparsity_hook); each density has its own batches and PyTorch losses"]
    notes += [f"{label}: ORT says '{said}'" for label, lines in facts["ORT log"].items() for said in lines]
    for row in facts["gathers"][main]:
        where = "before lm_head's MatMul" if row["before lm_head MatMul"] else f"feeding {row['feeds']}"
        notes.append(f"ShrunkenGather on the {row['filters']}: {where}")
    return FeatureComparison("label_sparsity", "labels padded with ignore_index=-100 (TinyGPT + loss)",
                             torch_runs[main], runs, main, {}, execution_graphs(runs), facts, notes,
                             references=torch_runs)


SPARSITY_SWITCHES = {"(default)": {}, "ENABLE_SPARSE_OPTIMIZER=0": {"ENABLE_SPARSE_OPTIMIZER": 0},
                     "ENABLE_LABEL_SPARSE_OPTIMIZER=0": {"ENABLE_LABEL_SPARSE_OPTIMIZER": 0},
                     "ENABLE_EMBEDDING_SPARSE_OPTIMIZER=0": {"ENABLE_EMBEDDING_SPARSE_OPTIMIZER": 0},
                     "ENABLE_COMPUTE_OPTIMIZER=0": {"ENABLE_COMPUTE_OPTIMIZER": 0}}


def _switch_remark(switch, on, facts):
    if not facts["read by ORT"].get(switch, True):
        return " (a variable ORT never reads)"
    if on and not facts["runtime options"][switch]["enable_label_sparse_optimizer"]:
        return " (ORT sets enable_label_sparse_optimizer=False; the label hook is given the embedding flag)"
    if not on and "EMBEDDING" in switch:
        return " (the label hook is given the embedding flag: _graph_transition_manager.py, _export_model)"
    return ""


def sparsity_switches(density=0.6, steps=1, switches=tuple(SPARSITY_SWITCHES)):
    """The label-sparsity model at `density` under each ORTMODULE_* switch (SPARSITY_SWITCHES):
    facts['on'] says whether the ShrunkenGather appeared. In 1.19.2 ENABLE_SPARSE_OPTIMIZER (the guidelines'
    name) and ENABLE_LABEL_SPARSE_OPTIMIZER are never read; ENABLE_EMBEDDING_SPARSE_OPTIMIZER=0 turns
    *label* sparsity off (_export_model passes the embedding flag to the label hook)."""
    check_densities([density])
    steps = check_steps(steps)
    if isinstance(switches, str) or not hasattr(switches, "__iter__"):
        raise FeatureError(f"switches must be a list of names from SPARSITY_SWITCHES, not {switches!r}")
    unknown = [s for s in switches if s not in SPARSITY_SWITCHES]
    if unknown:
        raise FeatureError(f"unknown switch {unknown[0]!r}; choose from {', '.join(SPARSITY_SWITCHES)}")
    module = _label_model()
    batches = fm.sparse_label_batches(module.model, density, count=steps)
    runs = {name: run_with_variables(module, batches, steps, **SPARSITY_SWITCHES[name]) for name in switches}
    graphs = execution_graphs(runs)
    facts = {"on": {k: count_ops(g, "com.microsoft:ShrunkenGather") > 0 for k, g in graphs.items()},
             "density": _percent(batches)}
    facts["read by ORT"] = {k: variables_read(*[f"ORTMODULE_{v}" for v in SPARSITY_SWITCHES[k]])
                            for k in switches if SPARSITY_SWITCHES[k]}
    facts["runtime options"] = {k: _sparsity_options(run) for k, run in runs.items()}
    first = "(default)" if "(default)" in runs else next(iter(runs))
    notes = [f"{k}: label sparsity {'ON' if on else 'OFF'}{_switch_remark(k, on, facts)}"
             for k, on in facts["on"].items()]
    return FeatureComparison("label_sparsity switches",
                             f"ORTMODULE_* switches at {facts['density']:.0f}% valid labels",
                             torch_losses(module, batches, steps), runs, first, {}, graphs, facts, notes)


# ---------------------------------------------------------------------------------------------
# 5. Embedding sparsity


class _Collect(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def ort_embedding_density(module, batch, device="cuda"):
    """Run ORT's own embedding-sparsity hook (GraphTransitionManager._add_check_embedding_sparsity_hook,
    ortmodule/_graph_transition_manager.py) on `module` in plain PyTorch for one batch, as ORTModule's
    export would on `device`. Returns {'hooks': how many Embeddings it hooked, 'density': ORT's
    RuntimeInspector map {name: %}, 'log': its log lines, 'printed': what FlagAndPrintDensity printed}.

    ORT is given the device it asks for: on 'cpu' the hook returns early (no hooks, nothing measured);
    on 'cuda' (only the device's *type* is read, so no GPU is needed) it measures the real batch.
    """
    if not isinstance(module, torch.nn.Module):
        raise FeatureError(f"module must be a torch.nn.Module, not {type(module).__name__}")
    if device not in ("cpu", "cuda"):
        raise FeatureError(f"device must be 'cpu' or 'cuda', not {device!r}")
    gtm = quiet_import("onnxruntime.training.ortmodule._graph_transition_manager").GraphTransitionManager
    inspector_mod = quiet_import("onnxruntime.training.ortmodule._runtime_inspector")
    logger, handler = logging.getLogger("ortlab.ort_embedding_density"), _Collect()
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.addHandler(handler)
    inspector = inspector_mod.RuntimeInspector(logger, module, True)
    try:
        hooks = gtm._add_check_embedding_sparsity_hook(True, torch.device(device), logger, inspector, module)
        with captured_lines() as printed, torch.no_grad():
            try:
                module(*batch)
            finally:
                for hook in hooks:
                    hook.remove()
    finally:
        logger.removeHandler(handler)
    return {"hooks": len(hooks), "density": dict(inspector._embedding_module_to_padding_density_map),
            "log": handler.lines, "printed": [line.strip() for line in printed if line.strip()]}


def embedding_sparsity(pad_fraction=0.5, steps=2):
    """TinyGPT with tok.padding_idx=0 and right-padded ids (the closest real thing on CPU):
    ORT's own embedding hook measures the batch's density when told the device is CUDA
    (facts['ORT detection, cuda']) and returns early on CPU (facts['ORT detection, cpu']); the
    ORTModule run on CPU shows nothing (no log line, no FlagAndPrintDensity PythonOp, same graph).
    The rewrite itself (PaddingElimination: FlattenAndUnpad/PadAndUnflatten) is a C++ transformer
    registered only under USE_CUDA/USE_ROCM (orttraining/core/optimizer/graph_transformer_utils.cc)."""
    if isinstance(pad_fraction, bool) or not isinstance(pad_fraction, (int, float)) \
            or not 0 < pad_fraction < 1:
        raise FeatureError(f"pad_fraction must be a fraction in (0, 1), not {pad_fraction!r}")
    steps = check_steps(steps)
    plain, padded = TinyGPT(dropout=0.0), TinyGPT(dropout=0.0)
    padded.tok.padding_idx = 0
    batches = fm.padded_id_batches(padded, pad_fraction, count=steps)
    ids = batches[0][0]
    facts = {"density": 100.0 * float((ids != 0).sum()) / ids.numel(),
             "ORT detection, cpu": ort_embedding_density(padded, batches[0], "cpu"),
             "ORT detection, cuda": ort_embedding_density(padded, batches[0], "cuda")}
    runs = {"padding_idx=None": run_with_variables(plain, batches, steps, log_level="INFO"),
            "padding_idx=0": run_with_variables(padded, batches, steps, log_level="INFO")}
    facts["ORT log on CPU"] = runs["padding_idx=0"].grep("Embedding sparsity")
    facts["ORT density record on CPU"] = _sparsity_ratios(runs["padding_idx=0"])[1]
    gem = inspect.getsource(quiet_import("onnxruntime.training.ortmodule._graph_transition_manager")
                            .GraphTransitionManager._add_check_embedding_sparsity_hook)
    facts["early return"] = next(line.strip() for line in gem.splitlines() if 'device.type != "cuda"' in line)
    cuda = facts["ORT detection, cuda"]
    notes = [f"ORT's own hook, told the device is 'cuda': {'; '.join(cuda['log'] + cuda['printed'])}",
             f"told 'cpu': {facts['ORT detection, cpu']['hooks']} hooks ({facts['early return']})",
             "closest real thing: ORT's detection only; the padding rewrite needs CUDA twice: the hook "
             "returns early when device.type != 'cuda', and PaddingElimination is registered only "
             "#if defined(USE_CUDA) || defined(USE_ROCM) in graph_transformer_utils.cc",
             f"GPU: {GPU_EMBEDDING_COMMAND}"]
    return FeatureComparison("embedding_sparsity",
                             f"nn.Embedding(padding_idx=0), {pad_fraction:.0%} right padding",
                             torch_losses(padded, batches, steps), runs, "padding_idx=0", {},
                             execution_graphs(runs), facts, notes,
                             references={"padding_idx=None": torch_losses(plain, batches, steps)})


# ---------------------------------------------------------------------------------------------
# 6. Efficient attention


def aten_efficient_attention_on_cpu(batch=1, seq=8, heads=2, head_dim=16):
    """Build ORT's own efficient-attention forward node (graph_optimizers/_aten_attn.py,
    _make_efficient_attention_nodes) into a one-node model and run it in an ORT CPU InferenceSession:
    ORT's ATen kernel hands the call to torch, which has no CPU kernel. Returns
    {'ort': first line of ORT's error, 'torch': the NotImplementedError torch raises directly}."""
    import onnxruntime as ort  # heavy: onnxruntime

    quiet_import("onnxruntime.training.ortmodule")
    executor = quiet_import("onnxruntime.training.ortmodule.torch_cpp_extensions.cpu.aten_op_executor")
    executor.load_aten_op_executor_cpp_extension()  # what ORTModule does before running ATen nodes
    attn = quiet_import("onnxruntime.training.ortmodule.graph_optimizers._aten_attn")
    nodes, value_infos = attn._make_efficient_attention_nodes(
        0, "q", "k", "v", "y", "dy", "dq", "dk", "dv", "bias", False, 1 / math.sqrt(head_dim), 0.0, False)
    forward = [n for n in nodes if n.op_type != "ATen" or n.name.startswith("efficient_attention_forward")]
    shape = [batch, seq, heads, head_dim]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, shape) for n in "qkv"]
    inputs.append(helper.make_tensor_value_info("bias", TensorProto.FLOAT, [batch, heads, seq, seq]))
    graph = helper.make_graph(forward, "efficient_attention", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              value_info=value_infos)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("org.pytorch.aten", 1)])
    rng = np.random.default_rng(0)
    feeds = {n: rng.standard_normal(shape).astype(np.float32) for n in "qkv"}
    feeds["bias"] = np.zeros([batch, heads, seq, seq], np.float32)
    result = {}
    options = ort.SessionOptions()
    options.log_severity_level = 4
    with captured_logs():
        try:
            ort.InferenceSession(model.SerializeToString(), options,
                                 providers=["CPUExecutionProvider"]).run(None, feeds)
            result["ort"] = "ran"
        except Exception as exc:
            message = str(exc)
            found = re.search(r"Could not run '[^']+' with arguments from the '\w+' backend", message)
            result["ort"] = f"{type(exc).__name__}: {found.group(0) if found else message.splitlines()[0]}"
    q = torch.from_numpy(feeds["q"])
    try:
        torch.ops.aten._efficient_attention_forward(q, q, q, None, None, None, None, None, 0.0, 0, False)
        result["torch"] = "ran"
    except NotImplementedError as exc:
        result["torch"] = f"NotImplementedError: {str(exc).split('. ')[0]}"
    return result


def efficient_attention(steps=1):
    """feature_models.MaskedBert (Div by sqrt(d), additive mask Add, Softmax) trained with
    ORTMODULE_USE_EFFICIENT_ATTENTION=1: on CPU the optimizer is registered for 'cuda' and skipped
    (graph unchanged, losses equal). Then ORT's own optimize_graph_for_aten_efficient_attention is
    applied by hand to the run's optimized training graph: changes() shows the rewrite, and
    facts['running it'] the ATen kernel's failure on CPU (aten_efficient_attention_on_cpu)."""
    steps = check_steps(steps)
    module = fm.MaskedBert(dropout=0.0)
    batches = [module.example_inputs(seed=s) for s in range(steps)]
    runs = {"USE_EFFICIENT_ATTENTION=1": run_with_variables(module, batches, steps, USE_EFFICIENT_ATTENTION=1)}
    optimized = runs["USE_EFFICIENT_ATTENTION=1"].graphs()["optimized"]
    rewritten = copy.deepcopy(optimized)
    attn = quiet_import("onnxruntime.training.ortmodule.graph_optimizers._aten_attn")
    attn.optimize_graph_for_aten_efficient_attention(rewritten.graph)
    registry = quiet_import("onnxruntime.training.ortmodule.graph_optimizer_registry").GraphOptimizerRegistry
    registered = {key: [(f.__name__, device) for f, device, *_ in funcs if "attention" in f.__name__]
                  for key, funcs in registry._OPTIMIZER_FUNCS.items()}  # others (Triton's) vary by import
    registered = {key: funcs for key, funcs in registered.items() if funcs}
    facts = {"registered": registered,
             "ATen nodes added": [n.name for n in rewritten.graph.node
                                  if n.op_type == "ATen" and n.name.startswith("efficient_attention")],
             "running it": aten_efficient_attention_on_cpu()}
    notes = ["closest real thing: ORT's rewrite applied by hand to the CPU optimized training graph; "
             "the ATen kernel it targets has no CPU implementation",
             f"ORT's optimizer registry: {registered} (skipped on CPU: the run's graph is unchanged)",
             f"ORT's ATen node run on CPU: {facts['running it']['ort']}",
             f"GPU: {GPU_ATTENTION_COMMAND}"]
    return FeatureComparison("efficient_attention", "ORTMODULE_USE_EFFICIENT_ATTENTION=1 on MaskedBert",
                             torch_losses(module, batches, steps), runs, "USE_EFFICIENT_ATTENTION=1", {},
                             {"optimized (CPU)": optimized, "after ORT's rewrite, by hand": rewritten},
                             facts, notes)


# ---------------------------------------------------------------------------------------------
# L0_02: the re-post-export check (onnxruntime PR #19007)

# call: (the first weight trainable, x requires grad)
REPROCESS_CALLS = {"first call": (True, False), "the same call again": (True, False),
                   "x.requires_grad_(True)": (True, True), "first weight frozen, x plain": (False, False)}


def reprocess_checks(module, batch, policies=("SKIP_CHECK_DISABLED", None)):
    """Four training steps of ORTModule(`module`) on `batch` (x, labels), REPROCESS_CALLS in order, under each
    ORTMODULE_SKIPCHECK_POLICY of `policies` (None: the default fast path). Per call: what the
    GraphTransitionManager's two checks returned (ortmodule/_graph_transition_manager.py, ORT 1.19.2:
    _export_check, whether the input schema changed; _reprocess_check, whether the graph inputs that need
    a gradient changed, which rebuilds the post-export model and the gradient graph without exporting),
    'skipped' where the fast path ran neither, how many gradient graphs were built, and which inputs got a
    gradient. Returns a viz.Table; both checks are wrapped, not changed."""
    quiet_import("onnxruntime.training.ortmodule")
    from onnxruntime.training.ortmodule import _graph_execution_manager as gem  # heavy: ORTModule
    from onnxruntime.training.ortmodule._graph_transition_manager import GraphTransitionManager as gtm  # heavy

    said = {}

    def recorded(key, check):
        def wrapper(*args, **kwargs):
            result = check(*args, **kwargs)
            said[key] = result if isinstance(result, bool) else result[0]
            return result
        return staticmethod(wrapper)

    build = gem.GraphExecutionManager._initialize_graph_builder

    def counted(self, *args, **kwargs):
        said["graph builds"] = said.get("graph builds", 0) + 1
        return build(self, *args, **kwargs)

    rows = []
    x, labels = batch
    with patched(gtm, "_export_check", recorded("export", gtm._export_check)), \
            patched(gtm, "_reprocess_check", recorded("reprocess", gtm._reprocess_check)), \
            patched(gem.GraphExecutionManager, "_initialize_graph_builder", counted):
        for policy in policies:
            variables = {"SKIPCHECK_POLICY": policy} if policy else {}
            with ortmodule_env(**variables), captured_logs():
                model = ortmodule(copy.deepcopy(module), "WARNING", False)
            first = next(model.parameters())
            for call, (trainable, x_grad) in REPROCESS_CALLS.items():
                first.requires_grad_(trainable)
                inputs = x.clone().requires_grad_(x_grad)
                said.clear()
                model.zero_grad(set_to_none=True)
                with captured_logs():
                    model(inputs, labels).backward()
                got = sum(p.grad is not None for p in model.parameters())
                rows.append((policy or "default (fast path)", call, said.get("export", "skipped"),
                             said.get("reprocess", "-" if said.get("export") else "skipped"),
                             said.get("graph builds", 0),
                             f"{got} parameters" + (" + x" if inputs.grad is not None else "")))
    return Table(("ORTMODULE_SKIPCHECK_POLICY", "call", "_export_check", "_reprocess_check",
                  "gradient graphs built", "gradients received"), rows)


# ---------------------------------------------------------------------------------------------

FEATURES = {"compute_optimizer": compute_optimizer, "recompute": recompute, "mem_efficient_grad": mem_efficient_grad,
            "custom_autograd": custom_autograd, "checkpointing": checkpointing,
            "label_sparsity": label_sparsity, "sparsity_switches": sparsity_switches,
            "embedding_sparsity": embedding_sparsity, "efficient_attention": efficient_attention}


def compare_feature(name, **kwargs):
    """Run the helper of FEATURES named `name` with its keyword arguments; a FeatureComparison."""
    if not isinstance(name, str) or name not in FEATURES:
        raise FeatureError(f"unknown feature {name!r}; choose one of {', '.join(FEATURES)}")
    try:
        inspect.signature(FEATURES[name]).bind(**kwargs)
    except TypeError as exc:
        signature = inspect.signature(FEATURES[name])
        raise FeatureError(f"{name}: {exc}; its signature is {name}{signature}") from None
    return FEATURES[name](**kwargs)

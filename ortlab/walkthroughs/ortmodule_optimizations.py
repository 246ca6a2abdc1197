"""ORTModule's optional features switched on one at a time, each against the same model trained in
PyTorch (features 1-6 of the ONNX Runtime Training Guidelines): what ORT 1.19.2 does to the graph,
and whether the losses still equal PyTorch's.

    recompute(...)                    0. ORTMODULE_MEMORY_OPT_LEVEL=1: '*_recompute' nodes, losses unchanged
    mem_efficient_grad_fix()          context manager: the one-line fix for MEM_EFFICIENT_GRAD_MGMT's crash
    mem_efficient_grad(...)           1. ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT: the crash, then the graph
    custom_autograd(...)              2. a torch.autograd.Function as PythonOp, and silently inlined when off
    checkpointing(...)                3. torch.utils.checkpoint: the four paths through ORTModule
    label_sparsity(...)               4. labels full of ignore_index: ShrunkenGather before the LM head
    sparsity_switches(...)            4. which ORTMODULE_* variables really switch label sparsity off
    embedding_sparsity(...)           5. padded input ids: ORT's own density check; why CPU stops there
    efficient_attention(...)          6. ORT's ATen efficient-attention rewrite applied by hand on CPU
    compare_feature(name, **kwargs)   any of the above by name (FEATURES)

Every helper returns a FeatureComparison: the ORTModule runs by label, PyTorch's losses for the same
model and batches, the largest loss difference, and changes() (ortmodule.graph_changes over ORT's
own execution-model dumps). Mirrors orttraining/orttraining/python/training/ortmodule/
(_graph_transition_manager.py, _mem_efficient_grad_mgmt.py, _custom_autograd_function.py,
__init__.py's checkpoint override, _runtime_inspector.py, graph_optimizers/_aten_attn.py).
"""
import contextlib
import copy
import re
from dataclasses import dataclass, field

import torch

from ortlab.env import quiet_import
from ortlab.errors import OrtlabError, as_list
from ortlab.patch import patched
from ortlab.models import get as get_model
from ortlab.walkthroughs import ortmodule_feature_models as fm
from ortlab.training.loop import train as torch_train
from ortlab.ortmodule.driver import OrtModuleError, graph_changes, op_counts, train

TOLERANCE = 1e-5  # |ORT loss - PyTorch loss| allowed at every step (float32, 2-3 SGD steps)
LR = 0.05
STRICT = {"FALLBACK_POLICY": "FALLBACK_DISABLE"}  # a feature that fails must fail, not fall back
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
GPU_EMBEDDING_COMMAND = (
    "ORTMODULE_ENABLE_EMBEDDING_SPARSE_OPTIMIZER=1 python train.py  # on a CUDA build, model.to('cuda'): "
    "look for 'Embedding sparsity-based optimization is ON' and FlattenAndUnpad/PadAndUnflatten in "
    "the *_execution_model_training.onnx dump (DebugOptions(save_onnx=True))")
GPU_ATTENTION_COMMAND = (
    "ORTMODULE_USE_EFFICIENT_ATTENTION=1 python train.py  # on a CUDA build (sm >= 50), model.to('cuda'): "
    "the optimizer registered for 'cuda' rewrites Div/Add/Softmax into ATen _efficient_attention_forward")


class FeatureError(OrtlabError):
    """A feature helper was given something it cannot use (unknown feature, wrong type, bad range)."""


@dataclass
class FeatureComparison:
    """One ORTModule feature, switched on and compared with PyTorch on the same model and batches.

    runs: {label: OrtModuleRun} in order; `main` names the run where the feature is at work.
    errors: {label: message} for paths that fail on purpose (ORT's pinned bugs, CPU-only limits).
    graphs: {label: onnx.ModelProto} that changes() tabulates (ORT's execution-model dumps by default).
    facts: plain data the feature is about (graph inputs, densities, node placement...).
    """

    feature: str
    setting: str
    torch_losses: list
    runs: dict
    main: str
    errors: dict = field(default_factory=dict)
    graphs: dict = field(default_factory=dict)
    facts: dict = field(default_factory=dict)
    notes: list = field(default_factory=list)
    tolerance: float = TOLERANCE
    references: dict = field(default_factory=dict)  # {label: PyTorch losses} where a run has its own batches

    @property
    def before(self):
        """The first run (usually the feature off)."""
        return next(iter(self.runs.values())) if self.runs else None

    @property
    def after(self):
        """The run where the feature is at work."""
        return self.runs.get(self.main)

    def loss_diff(self, label=None):
        """max |ORT loss - PyTorch loss| over the steps of run `label` (default: the main run)."""
        label = self.main if label is None else label
        if label not in self.runs:
            raise FeatureError(f"no run {label!r} in this comparison; runs: {', '.join(self.runs) or 'none'}")
        reference = self.references.get(label, self.torch_losses)
        return max(abs(a - b) for a, b in zip(self.runs[label].losses, reference))

    @property
    def max_loss_diff(self):
        """max |ORT loss - PyTorch loss| of the main run."""
        return self.loss_diff()

    def loss_diffs(self):
        """{label: max loss difference} for every run."""
        return {label: self.loss_diff(label) for label in self.runs}

    def losses_equal(self, label=None):
        """True when run `label` (default: main) follows PyTorch within `tolerance` at every step."""
        return self.loss_diff(label) <= self.tolerance

    def changes(self):
        """ortmodule.graph_changes over `graphs`: the op types whose counts differ, and all nodes."""
        if not self.graphs:
            raise FeatureError(f"{self.feature}: no graphs to compare (every path failed)")
        return graph_changes(self.graphs)

    def __repr__(self):
        lines = [f"FeatureComparison({self.feature}: {self.setting})",
                 f"  PyTorch losses{' (main run)' if self.references else ''}: {_rounded(self.torch_losses)}"]
        for label, run in self.runs.items():
            nodes = _node_count(self.graphs.get(label, run.graphs().get("execution_model")))
            gap = self.loss_diff(label)  # below the tolerance only the verdict prints: stable on any CPU
            verdict = (f"equal to PyTorch's (max diff <= {self.tolerance:.0e})" if gap <= self.tolerance else
                       f"DIFFERENT from PyTorch's (max diff {gap:.1e})")
            mark = " <- feature at work" if label == self.main else ""
            lines.append(f"  {label}: {nodes} nodes, losses {_rounded(run.losses)} {verdict}{mark}")
        for label, message in self.errors.items():
            lines.append(f"  {label}: fails: {_short(message)}")
        lines += [f"  note: {note}" for note in self.notes]
        return "\n".join(lines)


def _short(message, width=160):
    """The innermost part of an OrtModuleError message ('... (caused by X)' -> 'X'), cut to `width`."""
    inner = message.rsplit("(caused by ", 1)[-1].rstrip(")") if "(caused by " in message else message
    return inner if len(inner) <= width else inner[:width - 3] + "..."


def _rounded(values, digits=4):
    return "[" + ", ".join(f"{v:.{digits}f}" for v in values) + "]"


def _node_count(model):
    return "-" if model is None else str(len(model.graph.node))


# ---------------------------------------------------------------------------------------------
# Checking what the notebook passes in


def check_steps(steps, low=1, high=10):
    if isinstance(steps, bool) or not isinstance(steps, int) or not low <= steps <= high:
        raise FeatureError(f"steps must be an int from {low} to {high} (each step costs an ORT run), "
                           f"not {steps!r}")
    return steps


def _check_model_name(name, allowed):
    if not isinstance(name, str) or name not in allowed:
        raise FeatureError(f"model must be one of {', '.join(map(repr, allowed))}, not {name!r}")
    return name


def check_densities(densities):
    densities = as_list(densities, "densities", "fractions in (0, 1]", "(1.0, 0.6)", FeatureError)
    for d in densities:
        if isinstance(d, bool) or not isinstance(d, (int, float)) or not 0 < d <= 1:
            raise FeatureError(f"each density must be a fraction in (0, 1], not {d!r}")
    return densities


# ---------------------------------------------------------------------------------------------
# The runs


def torch_losses(module, batches, steps, lr=LR):
    """The losses of a deep copy of `module` trained in plain PyTorch (SGD, ortlab's loop)."""
    model = copy.deepcopy(module)
    return torch_train(model, batches, torch.optim.SGD(model.parameters(), lr=lr), steps,
                       progress=False, skip_non_finite=False).losses


def run_with_variables(module, batches, steps, log_level="WARNING", **variables):
    """ORTModule on a deep copy of `module`, the feature's variables plus FALLBACK_DISABLE."""
    return train(copy.deepcopy(module), batches, steps, lr=LR, log_level=log_level, **{**STRICT, **variables})


def _failure(module, batches, steps, **variables):
    """The OrtModuleError message of a run that must fail; FeatureError if it does not."""
    try:
        run_with_variables(module, batches, steps, **variables)
    except OrtModuleError as exc:
        return _ANSI.sub("", str(exc))
    raise FeatureError(f"expected ORTModule to fail with {variables}, but it ran: ORT's behaviour changed")


def execution_graphs(runs):
    return {label: run.graphs()["execution_model"] for label, run in runs.items()}


def _python_op_functions(model):
    """{func_name: count} of the PythonOp nodes of a graph (without the _<n> counter ORT appends to the
    classes it generates per export, e.g. ParamRetrievalFunction_1)."""
    names = {}
    for node in model.graph.node:
        if node.op_type == "PythonOp":
            func = next(a.s.decode() for a in node.attribute if a.name == "func_name")
            func = re.sub(r"_\d+$", "", func)
            names[func] = names.get(func, 0) + 1
    return names


def count_ops(model, op):
    return op_counts(model).get(op, 0)


# ---------------------------------------------------------------------------------------------
# 0. ORTMODULE_MEMORY_OPT_LEVEL (recompute)


def recompute(model="gpt", steps=2):
    """ORTMODULE_MEMORY_OPT_LEVEL=0 and =1 on a zoo model ('gpt', 'bert' or 'mlp'): at level 1 ORT's
    MemoryOptimizer (orttraining/core/optimizer/memory_optimizer/) adds '<node>_recompute' copies of
    forward subgraphs for the backward to read instead of stashed activations (facts['recompute nodes'],
    {op: count}); the losses stay PyTorch's. ortlab.walkthroughs.memory_recompute measures the memory."""
    _check_model_name(model, ("gpt", "bert", "mlp"))
    steps = check_steps(steps)
    module = get_model(model, dropout=0.0)
    batches = [module.example_inputs(seed=s) for s in range(steps)]
    runs = {f"MEMORY_OPT_LEVEL={level}": run_with_variables(module, batches, steps, MEMORY_OPT_LEVEL=level)
            for level in (0, 1)}
    graphs = execution_graphs(runs)
    facts = {"recompute nodes": {k: _recompute_ops(g) for k, g in graphs.items()}}
    added = facts["recompute nodes"]["MEMORY_OPT_LEVEL=1"]
    notes = [f"MEMORY_OPT_LEVEL=1: {sum(added.values())} '*_recompute' nodes "
             f"({', '.join(f'{op} {n}' for op, n in sorted(added.items(), key=lambda kv: (-kv[1], kv[0])))})"]
    return FeatureComparison("recompute", f"ORTMODULE_MEMORY_OPT_LEVEL=1 on {model}",
                             torch_losses(module, batches, steps), runs, "MEMORY_OPT_LEVEL=1", {}, graphs,
                             facts, notes)


# ---------------------------------------------------------------------------------------------
# 1. ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT


@contextlib.contextmanager
def mem_efficient_grad_fix():
    """Inside the block, ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT=1 works in ORT 1.19.2; undone on exit.

    The bug: GraphTransitionManager._post_export_process (ortmodule/_graph_transition_manager.py:682)
    calls post_processing_enable_mem_efficient_training(model, named_params, device) with
    parameter_not_as_graph_input_names (a dict) as `device`, and torch.zeros(..., device=dict) raises
    TypeError on every device. The one-line fix upstream would pass the parameters' device; this
    wraps ortmodule/_mem_efficient_grad_mgmt.py's function to do exactly that, changing nothing else.
    """
    meg = quiet_import("onnxruntime.training.ortmodule._mem_efficient_grad_mgmt")
    original = meg.post_processing_enable_mem_efficient_training

    def fixed(exported_model, named_params, device):
        if not isinstance(device, (str, torch.device)):
            named_params = list(named_params)  # ORT iterates it once; a list iterates the same way
            device = named_params[0][1].device if named_params else torch.device("cpu")
        return original(exported_model, named_params, device)

    fixed.__doc__ = f"{original.__name__}, with a parameter's device when ORT passes a dict as device"
    with patched(meg, "post_processing_enable_mem_efficient_training", fixed):
        yield fixed


def _io_names(model):
    return [i.name for i in model.graph.input], [o.name for o in model.graph.output]


def mem_efficient_grad(model="mlp", steps=3):
    """ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT=1 on a zoo model ('mlp' or 'bert'): the crash as
    shipped (errors['on, as shipped']), then with mem_efficient_grad_fix(): every trainable weight
    leaves the graph inputs and is pulled by a PythonOp ParamRetrievalFunction, its gradient by a
    PythonOpGrad; the graph outputs collapse to one trigger gradient. Losses equal PyTorch's."""
    _check_model_name(model, ("mlp", "bert"))
    steps = check_steps(steps)
    module = get_model(model, dropout=0.0)
    batches = [module.example_inputs(seed=s) for s in range(steps)]
    error = _failure(module, batches, 1, ENABLE_MEM_EFFICIENT_GRAD_MGMT=1)
    runs = {"off": run_with_variables(module, batches, steps)}
    with mem_efficient_grad_fix():
        runs["on, with mem_efficient_grad_fix()"] = run_with_variables(module, batches, steps,
                                                         ENABLE_MEM_EFFICIENT_GRAD_MGMT=1)
    graphs = execution_graphs(runs)
    (in_off, out_off), (in_on, out_on) = (_io_names(g) for g in graphs.values())
    facts = {"graph inputs before": in_off, "graph inputs after": in_on,
             "graph outputs before": out_off, "graph outputs after": out_on,
             "PythonOp functions": _python_op_functions(list(graphs.values())[-1]),
             "trainable parameters": sum(p.requires_grad for p in module.parameters())}
    weights = facts["trainable parameters"]
    notes = ["as shipped, ORT 1.19.2 passes a dict as `device` (_graph_transition_manager.py:682); "
             "mem_efficient_grad_fix() passes the parameters' device instead",
             f"graph inputs: {len(in_off) - weights} user inputs + {weights} weights -> {', '.join(in_on)}",
             f"graph outputs: {len(out_off)} weight gradients -> {', '.join(out_on)}"]
    return FeatureComparison("mem_efficient_grad", f"ORTMODULE_ENABLE_MEM_EFFICIENT_GRAD_MGMT=1 on {model}",
                             torch_losses(module, batches, steps), runs, "on, with mem_efficient_grad_fix()",
                             {"on, as shipped": error}, graphs, facts, notes)


# ---------------------------------------------------------------------------------------------
# 2. Custom torch.autograd.Function -> PythonOp


@contextlib.contextmanager
def custom_autograd_support(enabled):
    """Inside the block ORT's custom autograd.Function support is `enabled` (True/False); the
    state before is restored on exit.

    ORTMODULE_ENABLE_CUSTOM_AUTOGRAD is read once per process (when ortmodule/_custom_autograd_function.py
    is first imported), so a notebook switches with ORT's enable_custom_autograd_support() instead.
    """
    if not isinstance(enabled, bool):
        raise FeatureError(f"enabled must be True or False, not {enabled!r}")
    quiet_import("onnxruntime.training.ortmodule")
    caf = quiet_import("onnxruntime.training.ortmodule._custom_autograd_function")
    before = bool(caf.custom_autograd_function_enabler.state)
    caf.enable_custom_autograd_support(enabled)
    try:
        yield
    finally:
        caf.enable_custom_autograd_support(before)


def custom_autograd(steps=3):
    """feature_models.HalfGradTanhNet (a custom Function whose backward is half the true gradient)
    with ORT's custom autograd support on (PythonOp/PythonOpGrad run the user's backward: losses equal
    PyTorch's) and off (torch inlines a Tanh, ORT builds the true TanhGrad: losses drift). The off run
    matches PyTorch training the same net with plain tanh (facts['off vs plain-tanh PyTorch'])."""
    steps = check_steps(steps)
    module = fm.HalfGradTanhNet()
    batches = [module.example_inputs(seed=s) for s in range(steps)]
    runs = {}
    for label, enabled in (("support off", False), ("support on", True)):
        with custom_autograd_support(enabled):
            runs[label] = run_with_variables(module, batches, steps)
    graphs = execution_graphs(runs)
    plain = torch_losses(fm.HalfGradTanhNet(custom=False), batches, steps)
    off_vs_plain = max(abs(a - b) for a, b in zip(runs["support off"].losses, plain))
    facts = {"PythonOp functions": _python_op_functions(graphs["support on"]),
             "PyTorch losses with plain tanh": plain, "off vs plain-tanh PyTorch": off_vs_plain}
    notes = ["off: the custom backward is silently ignored (no error, no warning): ORT trains plain tanh"]
    return FeatureComparison("custom_autograd", "HalfGradTanh as PythonOp (custom autograd support on/off)",
                             torch_losses(module, batches, steps), runs, "support on", {}, graphs, facts,
                             notes)


# ---------------------------------------------------------------------------------------------
# 3. torch.utils.checkpoint


def _recompute_ops(model):
    """{op type: count} of the nodes ORT's memory optimizer added as recomputation ('*_recompute')."""
    found = {}
    for node in model.graph.node:
        if node.name.endswith("_recompute"):
            found[node.op_type] = found.get(node.op_type, 0) + 1
    return found


def checkpointing(steps=2, layers=2):
    """feature_models.CheckpointedBert through ORTModule's four checkpoint paths: the default (export
    error, pinned in errors['default']), ORTMODULE_ALLOW_AUTOGRAD_CHECKPOINT=1 (one PythonOp per
    block), ORTMODULE_MEMORY_OPT_LEVEL=1 (ORT drops the checkpoint and recomputes: '*_recompute'
    nodes), use_reentrant=False (traced inline: the plain TinyBert graph, no recompute)."""
    steps = check_steps(steps)
    if isinstance(layers, bool) or not isinstance(layers, int) or not 1 <= layers <= 4:
        raise FeatureError(f"layers must be an int from 1 to 4, not {layers!r}")
    quiet_import("onnxruntime.training.ortmodule")  # installs ORT's torch.utils.checkpoint override first
    reentrant = fm.CheckpointedBert(use_reentrant=True, dropout=0.0, layers=layers)
    inline = fm.CheckpointedBert(use_reentrant=False, dropout=0.0, layers=layers)
    batches = [reentrant.example_inputs(seed=s) for s in range(steps)]
    error = _failure(reentrant, batches, 1)
    runs = {"ALLOW_AUTOGRAD_CHECKPOINT=1": run_with_variables(reentrant, batches, steps, ALLOW_AUTOGRAD_CHECKPOINT=1),
            "MEMORY_OPT_LEVEL=1": run_with_variables(reentrant, batches, steps, MEMORY_OPT_LEVEL=1),
            "use_reentrant=False": run_with_variables(inline, batches, steps)}
    graphs = execution_graphs(runs)
    facts = {"PythonOp functions": {k: _python_op_functions(g) for k, g in graphs.items()},
             "recompute nodes": {k: _recompute_ops(g) for k, g in graphs.items()},
             "layer-wise log line": sorted({line.strip() for line in runs["MEMORY_OPT_LEVEL=1"]
                                            .grep("Layer-wise memory optimization")}),
             "literal {func_full_qual_name}": "{func_full_qual_name}" in error}
    recomputed = sum(facts["recompute nodes"]["MEMORY_OPT_LEVEL=1"].values())
    wrapped = sum(facts["PythonOp functions"]["ALLOW_AUTOGRAD_CHECKPOINT=1"].values())
    notes = ["default: ORT's message lacks its f-string prefix, so '{func_full_qual_name}' is printed as is",
             f"MEMORY_OPT_LEVEL=1: {recomputed} '*_recompute' nodes; ALLOW_AUTOGRAD_CHECKPOINT=1: "
             f"{wrapped} CheckpointFunction PythonOps",
             "use_reentrant=False: no error and no PythonOp; the checkpoint is silently lost"]
    return FeatureComparison("checkpointing",
                             f"torch.utils.checkpoint around each of {layers} TinyBert blocks",
                             torch_losses(reentrant, batches, steps), runs, "MEMORY_OPT_LEVEL=1",
                             {"default": error}, graphs, facts, notes)


# ---------------------------------------------------------------------------------------------
# The compute optimizer: FLOP reduction by moving a slice upstream


def value_shapes(model, feeds):
    """{value name: shape} of every node output of `model` (a forward graph), read by running it in an
    onnxruntime InferenceSession (CPU) with each of them made a graph output."""
    ort = quiet_import("onnxruntime")
    import onnx  # heavy: protobuf

    probe = copy.deepcopy(model)
    declared = {o.name for o in probe.graph.output}
    for node in probe.graph.node:
        for name in node.output:
            if name and name not in declared:
                probe.graph.output.append(onnx.ValueInfoProto(name=name))
                declared.add(name)
    session = ort.InferenceSession(probe.SerializeToString(), providers=["CPUExecutionProvider"])
    wanted = {i.name for i in session.get_inputs()}
    names = [o.name for o in session.get_outputs()]
    values = session.run(names, {k: v for k, v in feeds.items() if k in wanted})
    return {name: list(v.shape) for name, v in zip(names, values)}


def matmul_work(model, feeds):
    """One row per MatMul / Gemm of a forward graph, in graph order: (node, shape of its first input,
    shape of its output, FLOPs = 2·(output elements)·K, K the contracted size), from value_shapes."""
    shapes = value_shapes(model, feeds)
    shapes.update({k: list(v.shape) for k, v in feeds.items()})
    rows = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm"):
            continue
        a, out = shapes[node.input[0]], shapes[node.output[0]]
        trans_a = any(at.name == "transA" and at.i for at in node.attribute)
        k = a[-2] if trans_a else a[-1]
        elements = 1
        for d in out:
            elements *= d
        rows.append((f"{node.op_type} {node.name}", a, out, 2 * elements * k))
    return rows


def _feeds(module, batch):
    """An ORTModule forward graph's feeds: the batch by input name, the parameters by ORT's names."""
    feeds = {name: t.numpy() for name, t in zip(module.input_names, batch)}
    feeds.update({f"_original_module.{n}": p.detach().numpy() for n, p in module.named_parameters()})
    return feeds


def compute_optimizer(steps=2, batch=4, seq=32):
    """ORTMODULE_ENABLE_COMPUTE_OPTIMIZER=1 (the default) and =0 on feature_models.FirstTokenClassifier,
    whose loss reads position 0 of the sequence (a Gather after two Linear layers). With the optimizer on,
    ORT's UpStreamGatherGraphTransformer (onnxruntime/core/optimizer/compute_optimizer/upstream_gather.h)
    moves the Gather above the matmuls in the forward graph ORT differentiates (the *_optimized_pre_grad
    dump): facts['forward ops'] {label: op types in order}, facts['matmuls'] {label: matmul_work rows on
    that graph, for the first batch}, facts['flops'] {label: their sum}. The losses stay PyTorch's.
    ORT 1.19.2 needs label_sparsity_hook_fix to export with the optimizer off (ortmodule.train applies it)."""
    steps = check_steps(steps)
    module = fm.FirstTokenClassifier()
    batches = [module.example_inputs(batch=batch, seq=seq, seed=s) for s in range(steps)]
    runs = {f"COMPUTE_OPTIMIZER={v}": run_with_variables(module, batches, steps, ENABLE_COMPUTE_OPTIMIZER=v)
            for v in (0, 1)}
    forward = {label: run.graphs()["optimized_pre_grad"] for label, run in runs.items()}
    feeds = _feeds(module, batches[0])
    matmuls = {label: matmul_work(g, feeds) for label, g in forward.items()}
    facts = {"forward ops": {k: [n.op_type for n in g.graph.node] for k, g in forward.items()},
             "matmuls": matmuls, "flops": {k: sum(r[-1] for r in rows) for k, rows in matmuls.items()}}
    off, on = facts["flops"].values()
    notes = [f"the forward's matmuls: {off:,} FLOPs with the optimizer off, {on:,} with it on "
             f"({off // on}x fewer: one row of {seq} per sequence)"]
    return FeatureComparison("compute_optimizer", "ORTMODULE_ENABLE_COMPUTE_OPTIMIZER on FirstTokenClassifier",
                             torch_losses(module, batches, steps), runs, "COMPUTE_OPTIMIZER=1", {},
                             execution_graphs(runs), facts, notes)

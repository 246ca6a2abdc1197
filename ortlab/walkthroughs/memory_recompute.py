"""ORT's memory optimizer (recompute) on a training graph, and what it does to the memory-pattern peak.

Wraps ORT 1.19.2's own transformer, reached the way ORTModule reaches it, on a graph ortlab builds:

- orttraining/orttraining/core/optimizer/memory_optimizer/memory_optimizer.cc: MemoryOptimizer, a Level2
  graph transformer of the training build (onnxruntime/core/optimizer/graph_transformer_utils.cc), switched
  on by the session config entries "optimization.memory_optimizer_config" (a JSON file: a list of
  "<subgraph>:<type>:<count>" plans) and "optimization.enable_memory_probe_recompute_config" ("probe
  level:transformer layer as boundary"). It duplicates each chosen forward subgraph as "<node>_recompute"
  nodes that the backward reads instead of the stashed activation.
- memory_insight.cc (FindORTModuleMemoryOpportunity, the boundary between forward and backward is the one
  YieldOp) and recompute_analysis.cc: the candidates, which TrainingAgent.get_serialized_ortmodule_memory_stat
  (orttraining/orttraining/python/orttraining_pybind_state.cc) returns, as ORTModule's _runtime_inspector.py
  reads them for ORTMODULE_MEMORY_OPT_LEVEL=1 (every plan of type 1, all occurrences: ":1:-1").

The steps: the training graph's loss gradient becomes a YieldOp's output (as ORTModule's graph builder,
ortmodule_graph_builder.cc, shapes it); a CPU InferenceSession at ORT_ENABLE_EXTENDED with every other
transformer disabled (so only the memory optimizer changes the graph) saves the optimized graph; the
YieldOp is then taken out again (its kernel refuses to run outside ORTModule's partial runs: "This operator
should not be executed.") so that a plain session runs the graph, and ortlab.memory.plan plans it.
ortmodule_graphs does the same with the graphs the real ORTModule executes (its "execution_model" dumps,
without and with ORTMODULE_MEMORY_OPT_LEVEL=1).

    recompute_graphs(name, batch, seq)   RecomputeGraphs: ORT's graphs without / with recompute, the feeds
    ortmodule_graphs(name, batch, seq)   the same from the real ORTModule's execution graphs
    recompute_peaks(graphs)              predicted block, lower bound and ORT's block, per graph and order
    recompute_table(graphs) / plot_recompute_peaks(table)   the recompute nodes; the blocks as bars
"""
import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from ortlab import models
from ortlab.capture import captured_lines
from ortlab.env import quiet_import
from ortlab.errors import OrtlabError
from ortlab.memory import plan, session_graph
from ortlab.memory.ort_arena_log import ort_block
from ortlab.viz import Table
from ortlab.walkthroughs.memory import training_step

MS = "com.microsoft"
YIELD = "YieldOp"
RECOMPUTE_SUFFIX = "_recompute"
APPLYING = "is applying following optimization:type [Recompute]"   # memory_optimizer.cc ModifyGraph
SUMMARY = "MemoryInsight Summary"                                  # memory_insight.cc SerializeMemoryRecords
PROBE = "1:0"  # ORTModule's default probe (options.py): level 1, no transformer-layer boundary
CONFIG_KEY = "optimization.memory_optimizer_config"
PROBE_KEY = "optimization.enable_memory_probe_recompute_config"
# Every transformer ORT 1.19.2's CPU session runs at ORT_ENABLE_EXTENDED on these graphs, but the memory
# optimizer and the ones it runs at ORT_DISABLE_ALL too (EnsureUniqueDQForNodeUnit,
# RemoveDuplicateCastTransformer, CastFloat16Transformer, MemcpyTransformer): disabled by name.
OTHER_TRANSFORMERS = (
    "AttentionFusion", "BiasDropoutFusion", "BiasGeluFusion", "BiasSoftmaxDropoutFusion", "BiasSoftmaxFusion",
    "BitmaskDropoutReplacement", "CommonSubexpressionElimination", "ConstantFolding", "ConstantSharing",
    "ConvActivationFusion", "DoubleQDQPairsRemover", "DynamicQuantizeMatMulFusion", "EmbedLayerNormFusion",
    "FastGeluFusion", "FreeDimensionOverrideTransformer", "GatherSliceToSplitFusion", "GatherToSliceFusion",
    "GeluFusion", "GemmActivationFusion", "LayerNormFusion", "Level1_RuleBasedTransformer",
    "Level2_RuleBasedTransformer", "MatMulActivationFusion", "MatMulAddFusion", "MatMulIntegerToFloatFusion",
    "MatMulNBitsFusion", "MatMulScaleFusion", "MatmulTransposeFusion", "QDQFinalCleanupTransformer",
    "QDQPropagationTransformer", "QDQS8ToU8Transformer", "QDQSelectorActionTransformer", "QuickGeluFusion",
    "ReshapeFusion", "RocmBlasAltImpl", "SceLossGradBiasFusion", "SimplifiedLayerNormFusion",
    "SkipLayerNormFusion", "TransposeOptimizer", "TransposeOptimizer_CPUExecutionProvider")


class MemoryOptimizerError(OrtlabError):
    """The memory optimizer could not be applied to the graph given; the message says what to give."""


def _copy(model):
    return onnx.ModelProto.FromString(model.SerializeToString())


def _yield_nodes(model):
    return [n for n in model.graph.node if n.op_type == YIELD and n.domain == MS]


def with_yield_op(model, grad_inputs):
    """The training graph with its output-gradient inputs `grad_inputs` ('<output>_grad_output') made the
    outputs of one YieldOp fed the forward outputs, as ORTModule's graph builder places it; the forward
    outputs stop being graph outputs (ORTModule hands them out at the YieldOp)."""
    inputs = [i.name for i in model.graph.input]
    missing = [g for g in grad_inputs if g not in inputs]
    if not grad_inputs or missing:
        raise MemoryOptimizerError(f"with_yield_op needs the graph's output-gradient inputs; "
                                   f"{missing or '[]'} "
                                   f"are not among its inputs {inputs[:6]}...")
    forward = [g[:-len("_grad_output")] if g.endswith("_grad_output") else g for g in grad_inputs]
    produced = {o for n in model.graph.node for o in n.output}
    if any(f not in produced for f in forward):
        raise MemoryOptimizerError(f"the forward outputs {forward} must be values some node of the training "
                                   "graph produces (ortlab.walkthroughs.memory.training_step builds such graphs)")
    result = _copy(model)
    keep_in = [i for i in result.graph.input if i.name not in grad_inputs]
    del result.graph.input[:]
    result.graph.input.extend(keep_in)
    result.graph.node.append(helper.make_node(YIELD, forward, list(grad_inputs), name="ortlab_yield",
                                              domain=MS, full_shape_outputs=list(range(len(grad_inputs)))))
    if not any(o.domain == MS for o in result.opset_import):
        result.opset_import.append(helper.make_opsetid(MS, 1))
    return result


def without_yield_op(model, like):
    """The graph with its YieldOp taken out: the YieldOp's outputs become graph inputs again and its inputs
    graph outputs, with the types and order they have in `like` (the training graph before with_yield_op)."""
    found = _yield_nodes(model)
    if len(found) != 1:
        raise MemoryOptimizerError(f"the graph has {len(found)} YieldOps; without_yield_op takes a graph "
                                   "with one")
    node = found[0]
    result = _copy(model)
    result.graph.node.remove(next(n for n in result.graph.node if n.op_type == YIELD and n.domain == MS))
    have_in = {i.name: i for i in result.graph.input}
    have_out = {o.name: o for o in result.graph.output}
    inputs = [have_in.get(i.name, i) for i in like.graph.input if i.name in have_in or i.name in node.output]
    inputs += [i for i in result.graph.input if i.name not in {x.name for x in inputs}]
    outputs = [have_out.get(o.name, o) for o in like.graph.output
               if o.name in have_out or o.name in node.input]
    del result.graph.input[:], result.graph.output[:]
    result.graph.input.extend(inputs)
    result.graph.output.extend(outputs)
    return result


def _session_options(config_path="", probe=PROBE, saved=None):
    ort = quiet_import("onnxruntime")
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED
    so.log_severity_level = 3
    so.add_session_config_entry(PROBE_KEY, probe)
    so.add_session_config_entry(CONFIG_KEY, str(config_path))
    if saved:
        so.optimized_model_filepath = str(saved)
    return so


def _session(model, so):
    ort = quiet_import("onnxruntime")
    if len(_yield_nodes(model)) != 1:
        raise MemoryOptimizerError("ORT's memory optimizer needs the forward/backward boundary: one YieldOp "
                                   "(build the graph with with_yield_op)")
    return ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"],
                                disabled_optimizers=list(OTHER_TRANSFORMERS))


def opportunities(model, probe=PROBE):
    """ORT's recompute candidates for a graph with a YieldOp: {plan: (bytes saved as a symbolic
    expression, occurrences)}, the plans as "<subgraph>:1:-1", from TrainingAgent's probe
    (get_serialized_ortmodule_memory_stat, what ORTModule's memory table prints), and ORT's text table."""
    from onnxruntime.capi import _pybind_state as C  # heavy: onnxruntime

    if not isinstance(model, onnx.ModelProto):
        raise MemoryOptimizerError(f"opportunities takes an onnx.ModelProto with a YieldOp (with_yield_op), "
                                   f"not {type(model).__name__}")
    sess = _session(model, _session_options("", probe))
    device = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
    node = _yield_nodes(model)[0]
    fetches = [o.name for o in model.graph.output]
    agent = C.TrainingAgent(sess._sess, [i.name for i in model.graph.input], [device] * len(node.input),
                            fetches, [device] * len(fetches), 0)
    table, stats = agent.get_serialized_ortmodule_memory_stat("", probe, True)
    return {k: (v[0], v[1]) for k, v in stats.items()}, table


def apply(model, plans, probe=PROBE):
    """(the graph ORT's MemoryOptimizer makes of `model` (with a YieldOp) given `plans`, its log lines at
    INFO): plans is a list of "<subgraph>:<type>:<count>" strings, written to the JSON config file as
    ORTModule's _runtime_inspector.py writes it (a JSON list of them); [] leaves the graph unchanged."""
    ort = quiet_import("onnxruntime")
    with tempfile.TemporaryDirectory(prefix="ortlab-memopt-") as folder:
        config = Path(folder) / "config.json"
        saved = Path(folder) / "optimized.onnx"
        config.write_text(json.dumps(list(plans)))
        so = _session_options(config if plans else "", probe, saved)
        so.log_severity_level = 1
        ort.set_default_logger_severity(1)
        try:
            with captured_lines(fds=(1, 2), python=False) as log:
                _session(model, so)
        finally:
            ort.set_default_logger_severity(2)
        return onnx.load(str(saved)), list(log)


def recompute_nodes(model):
    """The nodes the memory optimizer added ("<node>_recompute")."""
    return [n for n in model.graph.node if n.name.endswith(RECOMPUTE_SUFFIX)]


@dataclass
class RecomputeGraphs:
    """A training graph as ORT executes it without and with recompute (YieldOp taken out), and how."""

    without: onnx.ModelProto
    with_recompute: onnx.ModelProto
    feeds: dict
    plans: list
    opportunities: dict = field(default_factory=dict)
    log: list = field(default_factory=list, repr=False)

    @property
    def recompute_nodes(self):
        """The "<node>_recompute" nodes ORT added."""
        return recompute_nodes(self.with_recompute)

    @property
    def recomputed_activations(self):
        """How many stashed activations ORT replaced by a recomputed one (its "Total number of recomputed
        nodes", one per ModifyGraph call; each brings the subgraph that recomputes it)."""
        return sum(APPLYING in line for line in self.log)

    def summary(self):
        """ORT's own "MemoryInsight Summary" table from the optimizer's log (the plans, their status and
        how often each was applied), without the log prefix."""
        start = next((k for k, line in enumerate(self.log) if SUMMARY in line), None)
        if start is None:
            return []
        lines = [line for line in self.log[start:] if line.strip() and "[I:onnxruntime" not in line]
        end = next((k for k, line in enumerate(lines) if line.startswith("=") and k > 1), len(lines) - 1)
        lines[0] = re.sub(r"path: \S+", "path: config.json", lines[0])  # a temporary file's name
        return lines[:end + 1]


def recompute_graphs(name="gpt", batch=32, seq=16, plans="all", builder="ortlab", probe=PROBE):
    """RecomputeGraphs of the zoo model's training graph (ortlab.walkthroughs.memory.training_step): both
    graphs come out of ORT's session (same transformers, the memory optimizer's config empty or `plans`);
    plans='all' takes every plan ORT's probe proposes, as ORTMODULE_MEMORY_OPT_LEVEL=1 does."""
    for what, value in (("batch", batch), ("seq", seq)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MemoryOptimizerError(f"{what} must be an int >= 1, not {value!r}")
    if plans != "all" and (isinstance(plans, str) or not all(isinstance(p, str) for p in plans)):
        raise MemoryOptimizerError(f"plans must be 'all' or a list of ORT's plan names (\"<subgraph>:1:-1\"), "
                                   f"not {plans!r}")
    training, feeds = training_step(name, batch, seq, builder)
    grads = [n for n in feeds if n.endswith("_grad_output")]
    yielded = with_yield_op(training, grads)
    found, _ = opportunities(yielded, probe)
    if plans == "all":
        plans = [p for p in found if p.split(":")[1] == "1"]
    unknown = [p for p in plans if p not in found]
    if unknown:
        raise MemoryOptimizerError(f"plans {unknown} are not among ORT's candidates {sorted(found)}")
    plain, _ = apply(yielded, [], probe)
    recomputed, log = apply(yielded, list(plans), probe)
    return RecomputeGraphs(without_yield_op(plain, training), without_yield_op(recomputed, training), feeds,
                           list(plans), found, log)


FIRST_REGION = 1 << 20  # the CPU arena's first region, reserved at session creation (BFCArena's initial chunk)


def _ort_cells(ort, predicted):
    """ORT's block and 'to the byte' for a table row. A block that fits the arena's first region is
    never logged, and the first "Extending" line is then some later allocation: not the block."""
    if ort is None or predicted < FIRST_REGION:
        return ["not logged", "(fits the first 1 MiB region)"]
    return [ort, "yes" if ort == predicted else f"no ({predicted - ort:+,} B)"]


def recompute_peaks(graphs, orders=("default", "priority"), with_ort=True):
    """A Table, one row per graph (without / with recompute) and execution order: node count, recompute
    nodes, ortlab.memory.plan's predicted block, the lower bound (most bytes live at once), and, with
    with_ort, ORT's own block for the same graph and whether the prediction matches it to the byte."""
    if not isinstance(graphs, RecomputeGraphs):
        raise MemoryOptimizerError(f"recompute_peaks takes recompute_graphs(...)'s RecomputeGraphs, "
                                   f"not {type(graphs).__name__}")
    rows = []
    for label, model in (("without recompute", graphs.without), ("with recompute", graphs.with_recompute)):
        shared = session_graph(model)
        for order in orders:
            p = plan(shared, graphs.feeds, order=order)
            row = [label, len(model.graph.node), len(recompute_nodes(model)), order, p.peak_bytes,
                   p.lower_bound_bytes]
            if with_ort:
                row += _ort_cells(ort_block(model, graphs.feeds, order), p.peak_bytes)
            rows.append(tuple(row))
    header = ("graph", "nodes", "recompute nodes", "order", "predicted block (B)", "lower bound (B)")
    if with_ort:
        header += ("ORT's block (B)", "to the byte")
    return Table(header, rows)


def recompute_table(graphs):
    """One row per recompute node: the node it duplicates, its op, and the backward nodes that now read
    its outputs instead of the stashed activation."""
    model = graphs.with_recompute if isinstance(graphs, RecomputeGraphs) else graphs
    readers = {}
    for node in model.graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node.name)
    rows = []
    for node in recompute_nodes(model):
        read_by = sorted({r for o in node.output for r in readers.get(o, [])})
        rows.append((node.name[:-len(RECOMPUTE_SUFFIX)], node.op_type, ", ".join(read_by)))
    return Table(("recomputes node", "op", "read by"), rows)


def plot_recompute_peaks(table, ax=None, title="memory-pattern block without and with recompute"):
    """Bars of recompute_peaks' table: for each execution order, the predicted block (and ORT's, when
    the table has it) without and with recompute, in KiB; returns the Axes."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    if ax is None:
        _, ax = plt.subplots(figsize=(7, 3.2))
    column = {h: i for i, h in enumerate(table.header)}
    orders = list(dict.fromkeys(r[column["order"]] for r in table.rows))
    series = [("predicted block (B)", "ortlab.memory.plan")]
    if "ORT's block (B)" in column:
        series.append(("ORT's block (B)", "ORT 1.19.2"))
    labels = [f"{g}\n{o}" for o in orders for g in ("without", "with")]
    x = np.arange(len(labels))
    width = 0.8 / len(series)
    for k, (key, name) in enumerate(series):
        values = [next(r[column[key]] for r in table.rows
                       if r[column["order"]] == o and r[column["graph"]].startswith(g)) or 0
                  for o in orders for g in ("without", "with recompute")]
        ax.bar(x + (k - (len(series) - 1) / 2) * width, [v / 1024 for v in values], width, label=name)
    ax.set_xticks(x, labels)
    ax.set_ylabel("KiB")
    ax.set_title(title)
    ax.legend(fontsize=8)
    ax.figure.tight_layout()
    return ax


def _aten_executor():
    """Load ORTModule's ATen executor (torch_cpp_extensions/cpu/aten_op_executor): without it ORT's ATen
    kernel cannot run outside ORTModule."""
    from onnxruntime.training.ortmodule.torch_cpp_extensions.cpu.aten_op_executor import (  # heavy: onnxruntime
        load_aten_op_executor_cpp_extension)

    load_aten_op_executor_cpp_extension()


def _ortmodule_execution_graph(name, batch, seq, level):
    """(ORTModule's execution graph with its YieldOp taken out, feeds) for the zoo model trained one step
    with ORTMODULE_MEMORY_OPT_LEVEL=level; the YieldOp's outputs (the loss gradient) are fed ones."""
    import torch  # heavy: torch

    from ortlab.ortmodule import driver as ortmodule  # lazy: the driver takes 1.5 s to import

    torch.manual_seed(0)
    module = models.get(name, dropout=0.0)
    inputs = module.example_inputs(batch, seq)
    params = {k: v.detach().numpy().copy() for k, v in module.named_parameters()}
    run = ortmodule.train(module, [inputs], 1, lr=0.0, MEMORY_OPT_LEVEL=level)
    if run.fell_back:
        raise MemoryOptimizerError(f"ORTModule fell back to PyTorch on {name!r}; see run.log")
    model = run.graphs()["execution_model"]
    node = _yield_nodes(model)[0]
    declared = {v.name: v for v in model.graph.value_info}
    model.graph.node.remove(node)
    model.graph.input.extend(declared.get(o) or helper.make_tensor_value_info(o, onnx.TensorProto.FLOAT,
                                                                              None) for o in node.output)
    exported = run.graphs()["torch_exported"]
    feeds = dict(zip([i.name for i in exported.graph.input], (t.numpy() for t in inputs)))
    prefix = "_original_module."
    feeds.update({i.name: params[i.name[len(prefix):]] for i in model.graph.input
                  if i.name.startswith(prefix)})
    feeds.update({o: np.ones((), np.float32) for o in node.output})
    return model, {k: v for k, v in feeds.items() if k in {i.name for i in model.graph.input}}


def ortmodule_graphs(name="gpt", batch=32, seq=16):
    """RecomputeGraphs of what the real ORTModule executes for the zoo model: its execution graphs
    (DebugOptions save_onnx's "execution_model": fused ops, ATen, the memory optimizer's work) without
    ORTMODULE_MEMORY_OPT_LEVEL and with =1, the YieldOp taken out so that a plain session runs them (ORT's
    ATen kernel needs ORTModule's executor, loaded here). ORTModule itself runs them in its
    MEMORY_EFFICIENT order with the memory pattern off; recompute_peaks plans them in ORT's default and
    priority orders, with the pattern ORT then allocates."""
    without, feeds = _ortmodule_execution_graph(name, batch, seq, 0)
    with_recompute, _ = _ortmodule_execution_graph(name, batch, seq, 1)
    _aten_executor()
    return RecomputeGraphs(without, with_recompute, feeds, plans=["ORTMODULE_MEMORY_OPT_LEVEL=1"])

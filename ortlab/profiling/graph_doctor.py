"""The checklist of seed 004 ("Performance Investigation") run on a graph, usually ORTModule's dumps.

Each check is one registered function that looks at one graph and returns findings:
- memcpy: Memcpy nodes (ideally none), and nodes sandwiched by MemcpyToHost / MemcpyFromHost
  (a missing kernel on the device);
- cast_sandwich: a node whose inputs come from Casts and whose outputs go to Casts;
- unfused_layer_norm: a Pow node, where a LayerNorm subgraph starts ("search for Pow");
- unfused_gelu: an Erf node, where a GELU subgraph starts;
- standalone_matmul: a MatMul that a leading Transpose/scale could have made FusedMatMul, or a
  following Add a Gemm;
- standalone_dropout: a Dropout after an Add (BiasDropout candidate);
- standalone_softmax: a Softmax after an Add (BiasSoftmax candidate).
The seed says where to look: LayerNorm and GELU in *_optimized_pre_grad_*, the rest in
*_execution_model_*; `diagnose_dumps` follows it.
"""
from collections import defaultdict
from dataclasses import dataclass

import onnx

from ortlab.errors import OrtlabError
from ortlab.viz import Table

CHECKS = {}
DUMP_FOR_CHECK = {"unfused_layer_norm": "optimized_pre_grad", "unfused_gelu": "optimized_pre_grad"}


class DoctorError(OrtlabError):
    """The doctor was given something that is not an ONNX model."""


def register_check(fn):
    """Add a check (graph -> list of Finding) under its function name."""
    CHECKS[fn.__name__] = fn
    return fn


@dataclass(frozen=True)
class Finding:
    check: str
    node: str
    op_type: str
    message: str


class _Uses:
    """Producer and consumers of every value of a graph."""

    def __init__(self, graph):
        self.producer, self.consumers = {}, defaultdict(list)
        for node in graph.node:
            for name in node.output:
                self.producer[name] = node
            for name in node.input:
                if name:
                    self.consumers[name].append(node)

    def before(self, node):
        return [self.producer[i] for i in node.input if i in self.producer]

    def after(self, node):
        return [c for o in node.output for c in self.consumers.get(o, [])]


def _finding(check, node, message):
    return Finding(check, node.name or "(no name)", node.op_type, message)


@register_check
def memcpy(graph, uses):
    found = [_finding("memcpy", n, "a copy between devices; ideally the execution graph has none")
             for n in graph.node if n.op_type.startswith("Memcpy")]
    for node in graph.node:
        if (node.input and all(p.op_type == "MemcpyToHost" for p in uses.before(node))
                and uses.before(node) and uses.after(node)
                and all(c.op_type == "MemcpyFromHost" for c in uses.after(node))):
            found.append(_finding("memcpy", node, f"{node.op_type} runs on the host between Memcpy nodes: "
                                  "the device has no kernel for it (look for 'Kernel not found' in the log)"))
    return found


@register_check
def cast_sandwich(graph, uses):
    found = []
    for node in graph.node:
        before, after = uses.before(node), uses.after(node)
        if node.op_type != "Cast" and before and after and all(p.op_type == "Cast" for p in before) \
                and all(c.op_type == "Cast" for c in after):
            found.append(_finding("cast_sandwich", node, f"{node.op_type} sits between Casts: does ORT have a "
                                  "kernel for the narrow type (fp16-safe LayerNorm, Gelu...)?"))
    return found


@register_check
def unfused_layer_norm(graph, uses):
    return [_finding("unfused_layer_norm", n, "a Pow: a LayerNorm subgraph that LayerNormFusion did not fuse")
            for n in graph.node if n.op_type == "Pow"]


@register_check
def unfused_gelu(graph, uses):
    return [_finding("unfused_gelu", n, "an Erf: a GELU subgraph that GeluFusion did not fuse")
            for n in graph.node if n.op_type == "Erf"]


@register_check
def standalone_matmul(graph, uses):
    found = []
    for node in graph.node:
        if node.op_type != "MatMul":
            continue
        hints = [f"input from {p.op_type} (FusedMatMul folds it)" for p in uses.before(node)
                 if p.op_type in ("Transpose", "Mul", "Div")]
        hints += ["output into Add (MatMul+Add is Gemm for 2-D)" for c in uses.after(node) if c.op_type == "Add"]
        if hints:
            found.append(_finding("standalone_matmul", node, "; ".join(hints)))
    return found


def _after_add(check, graph, uses, op_type, fused):
    return [_finding(check, n, f"{op_type} after an Add: a {fused} candidate")
            for n in graph.node if n.op_type == op_type and any(p.op_type == "Add" for p in uses.before(n))]


@register_check
def standalone_dropout(graph, uses):
    return _after_add("standalone_dropout", graph, uses, "Dropout", "BiasDropout")


@register_check
def standalone_softmax(graph, uses):
    return _after_add("standalone_softmax", graph, uses, "Softmax", "BiasSoftmax")


@dataclass
class Diagnosis:
    """Findings of the checks on one or more graphs."""

    findings: list
    checked: dict  # check -> graph it ran on

    def counts(self):
        """{check: number of findings} for every check that ran (0 when clean)."""
        found = {check: 0 for check in self.checked}
        for f in self.findings:
            found[f.check] += 1
        return found

    def table(self, limit=20):
        rows = [(f.check, f.node, f.op_type, f.message) for f in self.findings[:limit]]
        return Table(("check", "node", "op", "finding"), rows)

    def summary(self):
        return Table(("check", "graph", "findings"),
                     [(c, self.checked[c], n) for c, n in self.counts().items()])

    def __repr__(self):
        bad = {c: n for c, n in self.counts().items() if n}
        return f"Diagnosis({len(self.findings)} findings: {bad or 'none'})"


def _model(model):
    if isinstance(model, onnx.ModelProto):
        return model
    if isinstance(model, str) or hasattr(model, "__fspath__"):
        return onnx.load(str(model))
    raise DoctorError(f"diagnose takes an onnx.ModelProto or a path, not {type(model).__name__}")


def diagnose(model, checks=None, label="graph"):
    """Run `checks` (names, default all) on one model."""
    unknown = set(checks or ()) - set(CHECKS)
    if unknown:
        raise DoctorError(f"no check {sorted(unknown)}; the checks are {', '.join(CHECKS)}")
    graph = _model(model).graph
    uses = _Uses(graph)
    names = list(checks or CHECKS)
    return Diagnosis([f for name in names for f in CHECKS[name](graph, uses)], {n: label for n in names})


def diagnose_dumps(graphs):
    """Seed 004's checklist on ORTModule's dumps ({kind: model}, e.g. OrtModuleRun.graphs())."""
    missing = {"optimized_pre_grad", "execution_model"} - set(graphs)
    if missing:
        raise DoctorError(f"the dumps lack {sorted(missing)}; train with save_onnx=True")
    findings, checked = [], {}
    for name in CHECKS:
        kind = DUMP_FOR_CHECK.get(name, "execution_model")
        part = diagnose(graphs[kind], [name], kind)
        findings += part.findings
        checked.update(part.checked)
    return Diagnosis(findings, checked)

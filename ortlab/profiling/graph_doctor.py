"""The checklist of ORTModule's "Performance Investigation" guide run on a graph, usually ORTModule's dumps.

Each check is one registered function that looks at one graph and returns findings:
- memcpy: Memcpy nodes (ideally none), and nodes sandwiched by MemcpyToHost / MemcpyFromHost
  (a missing kernel on the device);
- cast_sandwich: nodes that run in a wide float type between a Cast up to it (to float or double) and
  a Cast back down to a narrow one (float16, bfloat16): what autocast, Apex O1 and DeepSpeed fp16
  leave around ops they keep in fp32 (LayerNorm, the residual Add, ...); with a narrow-type kernel
  for them (ORT's fp16-safe LayerNorm, Gelu) both Casts go. One finding per Cast down, naming its
  nearest Casts up and the nodes in between;
- unfused_layer_norm: a Pow node, where a LayerNorm subgraph starts ("search for Pow");
- unfused_gelu: an Erf node, where a GELU subgraph starts;
- standalone_matmul: a MatMul that a leading Transpose/scale could have made FusedMatMul, or a
  following Add a Gemm;
- standalone_dropout: a Dropout after an Add (BiasDropout candidate);
- standalone_softmax: a Softmax after an Add (BiasSoftmax candidate).
The seed says where to look: LayerNorm and GELU in *_optimized_pre_grad_*, the rest in
*_execution_model_*; `diagnose_dumps` follows it.

A check is a function check(graph, uses) -> [Finding]: `graph` is the onnx.GraphProto, `uses.before(node)`
and `uses.after(node)` are the nodes producing its inputs and reading its outputs (from ortlab.ir.Graph,
`uses.graph`). `@register_check` files it in CHECKS (a Registry keyed by the function's name):

    @register_check
    def standalone_sqrt(graph, uses):
        return [Finding("standalone_sqrt", n.name, n.op_type, "a Sqrt") for n in graph.node if n.op_type == "Sqrt"]
"""
from collections import defaultdict, deque
from dataclasses import dataclass

import onnx

from ortlab.errors import OrtlabError, as_names
from ortlab.ir import Graph, load_model
from ortlab.registry import Registry
from ortlab.viz import Table

DUMP_FOR_CHECK = {"unfused_layer_norm": "optimized_pre_grad", "unfused_gelu": "optimized_pre_grad"}


class DoctorError(OrtlabError):
    """The doctor was given something that is not an ONNX model, or a check that is not registered."""


def _unknown_check(checks, name, where=""):
    close = checks.close_matches(name)
    hint = f" (did you mean {', '.join(close)}?)" if close else ""
    return (f"no check {[name]}{hint}; the checks are {', '.join(checks)}; "
            "add one with @profiling.register_check")


CHECKS = Registry("doctor check", duplicates="replace", op_keys=False, error=DoctorError, miss=_unknown_check)


def register_check(fn):
    """Add a check, fn(graph, uses) -> list of Finding, under its function name; returns fn.
    A check of the same name is replaced (a re-run notebook cell)."""
    if not callable(fn):
        raise DoctorError(f"register_check decorates a function check(graph, uses), not {type(fn).__name__}")
    return CHECKS.register(fn.__name__, fn)


@dataclass(frozen=True)
class Finding:
    check: str
    node: str
    op_type: str
    message: str


class Uses:
    """Producers and consumers of a model's nodes, read from its ortlab.ir.Graph.

    Checks see the model's onnx NodeProtos; `before(node)` and `after(node)` answer with
    NodeProtos too (node k of the Graph is graph.node[k]). `uses.graph` is the Graph itself.
    """

    def __init__(self, model):
        self.graph = Graph.from_model(model)
        self.protos = list(model.graph.node)
        self._index = {id(proto): k for k, proto in enumerate(self.protos)}

    def _node(self, proto):
        if id(proto) not in self._index:
            raise DoctorError("uses.before(node) and uses.after(node) take a node of the graph the check "
                              f"was given (one of graph.node), not {type(proto).__name__} {proto!r:.60}")
        return self.graph.node(self._index[id(proto)])

    def before(self, node):
        """The nodes producing `node`'s inputs, one per input edge (Node::InputNodes)."""
        return [self.protos[p.index] for p in self._node(node).input_nodes()]

    def after(self, node):
        """The nodes reading `node`'s outputs, one per edge (Node::OutputNodes)."""
        return [self.protos[c.index] for c in self._node(node).output_nodes()]


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


WIDE_FLOATS = {onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE}
NARROW_FLOATS = {onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16}


def _cast_to(node):
    return next((a.i for a in node.attribute if a.name == "to"), None) if node.op_type == "Cast" else None


def _type_name(to):
    return onnx.TensorProto.DataType.Name(to).lower()


def _reach(start, step, stop):
    """Nodes reachable from `start` through `step` (node -> nodes), not entering nodes where `stop` holds;
    {id(node): (distance, node)}."""
    seen, frontier = {}, deque([(0, start)])
    while frontier:
        distance, node = frontier.popleft()
        for nxt in step(node):
            if id(nxt) not in seen and not stop(nxt):
                seen[id(nxt)] = (distance + 1, nxt)
                frontier.append((distance + 1, nxt))
    return seen


@register_check
def cast_sandwich(graph, uses):
    is_cast = lambda n: n.op_type == "Cast"  # noqa: E731
    order = {id(n): k for k, n in enumerate(graph.node)}
    found = []
    for down in graph.node:
        if _cast_to(down) not in NARROW_FLOATS:
            continue
        # walk back over non-Cast nodes to the nearest Casts up to a wide float
        before = _reach(down, uses.before, is_cast)
        ups = {}
        for distance, node in [(0, down)] + list(before.values()):
            for p in uses.before(node):
                if _cast_to(p) in WIDE_FLOATS:
                    ups.setdefault(id(p), (distance, p))
        if not ups:
            continue
        nearest = min(d for d, _ in ups.values())
        ups = [p for d, p in ups.values() if d == nearest]
        after = {}
        for up in ups:
            after.update(_reach(up, uses.after, is_cast))
        between = sorted((n for k, (_, n) in before.items() if k in after), key=lambda n: order[id(n)])
        if not between:
            continue
        ops = list(dict.fromkeys(n.op_type for n in between))
        found.append(_finding("cast_sandwich", between[0],
                              f"{len(between)} nodes in {_type_name(_cast_to(ups[0]))} from "
                              f"{' and '.join(u.name or '(no name)' for u in ups)} to {down.name or '(no name)'} "
                              f"(Cast to {_type_name(_cast_to(down))}): {', '.join(ops)}"))
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
        return load_model(model)
    raise DoctorError(f"diagnose takes an onnx.ModelProto or a path, not {type(model).__name__}")


def cast_targets(model):
    """{type: number of Casts to it} in a model, e.g. {'bfloat16': 5, 'float': 4, 'int64': 1}
    (the Performance Investigation guide: read a Cast's `to` as onnx.proto's TensorProto.DataType)."""
    found = defaultdict(int)
    for node in _model(model).graph.node:
        if node.op_type == "Cast":
            found[_type_name(_cast_to(node))] += 1
    return dict(sorted(found.items()))


def _run(checks, model, label, uses=None):
    """Diagnosis of `checks` ([(name, check)]) on one loaded model."""
    uses = uses or Uses(model)
    return Diagnosis([f for _, check in checks for f in check(model.graph, uses)],
                     {name: label for name, _ in checks})


def diagnose(model, checks=None, label="graph"):
    """Run `checks` (names, default all) on one model."""
    names = as_names(checks, "checks", DoctorError) if checks else list(CHECKS)
    return _run([(name, CHECKS.lookup(name)) for name in names], _model(model), label)


def diagnose_dumps(graphs):
    """The Performance Investigation checklist on ORTModule's dumps ({kind: model}, e.g. OrtModuleRun.graphs()),
    each check on the dump where the guide looks (DUMP_FOR_CHECK, else the execution graph)."""
    missing = {"optimized_pre_grad", "execution_model"} - set(graphs)
    if missing:
        raise DoctorError(f"the dumps lack {sorted(missing)}; train with save_onnx=True")
    models, uses = {}, {}
    findings, checked = [], {}
    for name, check in CHECKS.items():
        kind = DUMP_FOR_CHECK.get(name, "execution_model")
        if kind not in models:
            models[kind] = _model(graphs[kind])
            uses[kind] = Uses(models[kind])
        part = _run([(name, check)], models[kind], kind, uses[kind])
        findings += part.findings
        checked.update(part.checked)
    return Diagnosis(findings, checked)

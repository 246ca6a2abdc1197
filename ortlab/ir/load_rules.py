"""The rules a model must meet for ORT 1.19.2 to load it; Graph.resolve applies them.

Mirrors the verifications of ORT's Graph::Resolve (onnxruntime/core/graph/graph.cc:
VerifyNoDuplicateName, VerifyNodeAndOpMatch, InferAndVerifyTypeMatch) and the opset check ORT makes
on load (onnxruntime/core/graph/model_load_utils.h, ValidateOpsetForDomain). Each rule reads a Graph
and raises a GraphError subclass naming the node; none changes the graph.
"""
import re

import onnx
from onnx import helper, shape_inference

from ortlab.ir.errors import GraphError, UnknownOpError
from ortlab.ir.node import node_label
from ortlab.onnx_defs import IR_VERSION, ONNX_DOMAIN, domain_of, opset_of

# Domains whose schemas live in ORT's C++ only; onnx.defs cannot check their ops.
ORT_DOMAINS = ("com.microsoft", "com.microsoft.nchwc", "com.microsoft.internal.nhwc")

# The highest opset per domain that onnxruntime 1.19.2 accepts (a model stamped higher fails to
# load: onnxruntime/core/graph/model_load_utils.h, ValidateOpsetForDomain). onnx itself may know
# newer ones (onnx 1.17 has opset 22), which ORT 1.19.2 still refuses.
ORT_VERSION = "1.19.2"
ORT_MAX_OPSET = {ONNX_DOMAIN: 21, "com.microsoft": 1}

# {com.microsoft op: ((fewest, most inputs), (fewest, most outputs))} as ORT 1.19.2's schemas allow
# them (onnxruntime/core/graph/contrib_ops/contrib_defs.cc, bert_defs.cc,
# orttraining/orttraining/core/graph/training_op_defs.cc): the contrib ops ortlab's fusions and
# gradient builders write. ORT refuses a node outside these ranges on load; other ops of the domain
# are left to onnxruntime.
MS_OP_ARITY = {
    "FusedMatMul": ((2, 2), (1, 1)), "BiasGelu": ((2, 2), (1, 1)), "Gelu": ((1, 1), (1, 1)),
    "FastGelu": ((1, 2), (1, 1)), "QuickGelu": ((1, 1), (1, 1)), "FusedGemm": ((2, 3), (1, 1)),
    "FusedConv": ((2, 4), (1, 1)), "SkipLayerNormalization": ((3, 5), (1, 4)),
    "SkipSimplifiedLayerNormalization": ((3, 4), (1, 4)), "BiasSoftmax": ((2, 2), (1, 1)),
    "BiasDropout": ((2, 5), (1, 2)), "BitmaskDropout": ((1, 3), (1, 2)), "Attention": ((2, 7), (1, 2)),
    "ReluGrad": ((2, 2), (1, 1)), "GeluGrad": ((2, 2), (1, 1)), "BiasGeluGrad_dX": ((3, 3), (1, 1)),
    "SoftmaxGrad_13": ((2, 2), (1, 1)), "DropoutGrad": ((2, 4), (1, 1)), "Scale": ((2, 2), (1, 1)),
    "BroadcastGradientArgs": ((2, 2), (0, 2)), "SoftmaxCrossEntropyLossGrad": ((3, 4), (1, 1)),
    "LayerNormalizationGrad": ((5, 5), (3, 3)), "ConvGrad": ((3, 3), (0, 3)), "GatherGrad": ((3, 3), (1, 1)),
    "ReduceSumTraining": ((2, 2), (1, 1)),
}


def check_opsets(graph):
    """Every opset import is a positive version no newer than ORT 1.19.2 knows (ValidateOpsetForDomain)."""
    for domain, version in graph.opset_imports.items():
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise UnknownOpError(f"the opset import of domain '{domain or 'ai.onnx'}' has version "
                                 f"{version!r}; an opset version is a positive int")
        highest = ORT_MAX_OPSET.get(domain_of(domain))
        if highest is not None and version > highest:
            raise UnknownOpError(
                f"the model imports opset {version} of domain '{domain or 'ai.onnx'}', but ORT "
                f"{ORT_VERSION} supports up to opset {highest} there and refuses the model; "
                f"import opset {highest} or lower")


def check_graph_inputs(graph):
    """No graph input is declared twice (graph.cc: "Duplicate definition-site")."""
    seen = set()
    for name in graph.inputs:
        if name in seen:
            raise GraphError(f"graph input '{name}' is declared more than once; ORT refuses the "
                             "model (\"Duplicate definition-site\"): keep one declaration")
        seen.add(name)


def check_node_names(graph):
    """Two nodes may not share a name; any number may have none (graph.cc, VerifyNoDuplicateName)."""
    seen = {}
    for node in graph.nodes():
        if node.name and node.name in seen:
            raise GraphError(f"two nodes are named '{node.name}' ({node_label(seen[node.name])} and "
                             f"{node_label(node)}); ORT refuses the model (\"two nodes with same node name\"): "
                             "rename one, or leave node names empty")
        seen.setdefault(node.name, node)


def check_ms_arity(node):
    """A com.microsoft op of MS_OP_ARITY has as many inputs and outputs as its schema allows."""
    if domain_of(node.domain) != "com.microsoft" or node.op_type not in MS_OP_ARITY:
        return
    for what, args, (lo, hi) in zip(("inputs", "outputs"), (node.inputs, node.outputs), MS_OP_ARITY[node.op_type]):
        if not lo <= len(args) <= hi:
            allowed = str(lo) if lo == hi else f"{lo} to {hi}"
            raise GraphError(f"node {node_label(node)}: com.microsoft {node.op_type} takes {allowed} {what}, "
                             f"this one has {len(args)} {what}; ORT refuses the model (\"{what[:-1]} size "
                             f"{len(args)} not in range\"): give it {allowed} {what}")


def check_op(graph, node):
    """Check that the op exists; returns True when onnx.defs holds its schema (so its
    arity, attributes and types can be checked too)."""
    domain = node.domain or ""
    version = opset_of(graph.opset_imports, domain)
    if version is None:
        raise UnknownOpError(f"node {node_label(node)} uses domain '{domain or 'ai.onnx'}', which the "
                             f"model does not import; add opset_import('{domain}', <version>)")
    if domain in ORT_DOMAINS:
        check_ms_arity(node)
        return False  # ORT's C++ schemas: the rest is checked by onnxruntime when a session loads the model
    if any(f.name == node.op_type and f.domain == domain for f in graph.model_fields.get("functions", [])):
        return False
    try:
        onnx.defs.get_schema(node.op_type, version, domain)
    except onnx.defs.SchemaError:
        known = onnx.defs.has(node.op_type, domain)
        why = (f"its first version is newer than opset {version}; raise the model's opset "
               "import" if known else "no schema with that name exists in that domain; check the "
               "spelling, or register a schema (onnx.defs.register_schema) or a model function")
        raise UnknownOpError(f"node {node_label(node)}: op '{node.op_type}' of domain "
                             f"'{domain or 'ai.onnx'}' is not known at opset {version}: {why}") from None
    return True


def checker_context(graph):
    """onnx.checker's context for the graph: its IR version and opset imports ("ai.onnx" read as "")."""
    ctx = onnx.checker.C.CheckerContext()
    ctx.ir_version = int(graph.model_fields.get("ir_version") or IR_VERSION)
    imports = dict(graph.opset_imports)
    if opset_of(imports, ONNX_DOMAIN) is not None:  # "ai.onnx" is an alias of ""
        imports[ONNX_DOMAIN] = opset_of(imports, ONNX_DOMAIN)
    ctx.opset_imports = imports
    return ctx


def check_node(graph, node, ctx):
    """The node against its schema: input and output counts, required, unknown and
    mistyped attributes (onnx.checker.check_node, what ORT's VerifyNodeAndOpMatch does)."""
    proto = node.to_proto()
    try:
        if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in proto.attribute):
            onnx.checker.check_graph(_scope_of(graph, proto), ctx)
        else:
            onnx.checker.check_node(proto, ctx)
    except onnx.checker.ValidationError as exc:
        reason = str(exc).strip().splitlines()[0]
        raise GraphError(f"node {node_label(node)} does not match the schema of {node.op_type} "
                         f"(opset {ctx.opset_imports.get(node.domain or '', '?')}): {reason} "
                         "Fix the node's inputs, outputs or attributes (see onnx.defs.get_schema("
                         f"'{node.op_type}') for what it takes)") from None


def _scope_of(graph, proto):
    """A graph holding only `proto` whose inputs are every value of this graph: a subgraph (If, Loop, Scan)
    may read values of the graph around it (its lexical scope, as ORT's Graph resolves it), which a
    check of the node alone would call undefined. The types are placeholders: this checks structure,
    and type and shape inference checks the types."""
    visible = [arg.name for arg in graph.node_args() if arg.name not in proto.output]
    return helper.make_graph([proto], "scope", [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [])
                                                for name in visible],
                             [helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, [])
                              for name in proto.output if name])


def check_inference(graph):
    """Strict type and shape inference, as ORT's InferAndVerifyTypeMatch: incompatible shapes,
    bad attribute values and mismatched types fail, naming the node.

    Declared shapes of non-input values are left out first: where ONNX's inference
    disagrees with them, ORT warns and merges leniently (graph.cc, MergeShapeInfo). No data
    propagation here: ORT 1.19.2 loads a Reshape whose computed target holds two -1 (and fails
    only when it runs), which ONNX's data propagation refuses."""
    model = graph.to_model()
    g = model.graph
    by_outputs = {(n.op_type, tuple(n.output_names)): n for n in graph.nodes()}
    nodes = {}
    for k, proto in enumerate(g.node):
        proto.name = f"__ortlab_node_{k}"
        nodes[proto.name] = by_outputs.get((proto.op_type, tuple(proto.output)))
    for vi in list(g.output) + list(g.value_info):
        if vi.type.HasField("tensor_type"):
            vi.type.tensor_type.ClearField("shape")
    try:
        shape_inference.infer_shapes(model, strict_mode=True, check_type=True, data_prop=False)
    except Exception as exc:
        text = str(exc)
        match = re.search(r"\(op_type:([^,]*), node name: (__ortlab_node_\d+)\): (.*)", text)
        if match is None:
            raise GraphError(f"type and shape inference failed: {text.strip().splitlines()[0]}") from None
        node = nodes.get(match.group(2))
        where = node_label(node) if node is not None else f"a {match.group(1)} node"
        reason = match.group(3).strip()
        inputs = ", ".join(f"{a.name} {_describe(a)}" for a in node.inputs if a.exists()) if node else "?"
        raise GraphError(f"node {where}: type and shape inference fails, so ORT refuses the "
                         f"model: {reason}; check the shapes and types of its inputs ({inputs}) "
                         "and its attributes") from None


def _describe(arg):
    """'float32[2, 3]' (or '?' parts where unknown) for messages."""
    shape = "[?]" if arg.shape is None else "[" + ", ".join("?" if d is None else str(d) for d in arg.shape) + "]"
    return f"{arg.dtype or '?'}{shape}"

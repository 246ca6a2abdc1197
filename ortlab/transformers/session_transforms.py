"""The transforms an InferenceSession applies to every graph at initialization, whatever the optimization level.

Mirrors onnxruntime/core/framework/graph_partitioner.cc (InlineNodes: a node no EP claims whose schema has a
function body is replaced by the body, in node-index order; Graph::InlineFunction appends the body's nodes
with new indices and prefixes the body's internal values with a unique "_inlfunc_<Op>" identifier): DivGrad,
whose body is written here, and the ONNX ops with a function body ORT's CPU EP has no kernel for (CastLike,
GroupNormalization, ...), whose body ONNX builds for each node. The
other transform of every level, RemoveDuplicateCastTransformer, is ortlab.transformers.remove_duplicate_cast.
On the CPU EP of the training wheel the one function op in
ortlab's gradient graphs is com.microsoft DivGrad (no CPU kernel; its body in
orttraining/orttraining/core/graph/training_op_defs.cc); node indices matter because ORT's default order is
a reverse DFS that visits producers by index.
"""
import onnx
import onnx.defs
from onnx import helper, inliner

from ortlab.ir.graph import constant_value
from ortlab.onnx_defs import opset_of


MS = "com.microsoft"

# DivGrad's FunctionBody (training_op_defs.cc): (outputs, op, inputs, domain, attributes)
DIV_GRAD_BODY = (
    (("shape_A",), "Shape", ("A",), "", {}),
    (("shape_B",), "Shape", ("B",), "", {}),
    (("axes_A", "axes_B"), "BroadcastGradientArgs", ("shape_A", "shape_B"), MS, {}),
    (("dY_over_B",), "Div", ("dY", "B"), "", {}),
    (("reduce_dA",), "ReduceSumTraining", ("dY_over_B", "axes_A"), MS, {"noop_with_empty_axes": 1}),
    (("dA",), "Reshape", ("reduce_dA", "shape_A"), "", {}),
    (("B_squared",), "Mul", ("B", "B"), "", {}),
    (("minus_A",), "Neg", ("A",), "", {}),
    (("minus_A_over_B_squared",), "Div", ("minus_A", "B_squared"), "", {}),
    (("pre_reduce_dB",), "Mul", ("dY", "minus_A_over_B_squared"), "", {}),
    (("reduce_dB",), "ReduceSumTraining", ("pre_reduce_dB", "axes_B"), MS, {"noop_with_empty_axes": 1}),
    (("dB",), "Reshape", ("reduce_dB", "shape_B"), "", {}),
)
FUNCTION_BODIES = {(MS, "DivGrad"): (("dY", "A", "B"), ("dA", "dB"), DIV_GRAD_BODY)}

# ONNX ops with a function body that ORT 1.19.2's CPU EP has no kernel for, so its partitioner inlines them (the
# body ONNX builds for each node: onnx.defs, get_context_dependent_function_with_opset_version); checked against
# ORT's saved graphs in tests/transformers/test_session_transforms_onnx_functions.py
ORT_CPU_INLINED_ONNX_OPS = {"CastLike", "CenterCropPad", "GroupNormalization", "SequenceMap"}


def _unique_identifier(graph, op_type, used):
    """Graph::GenerateNodeName("_inlfunc_<op>"): the base, then base_token_<n>."""
    base = f"_inlfunc_{op_type}"
    name, n = base, 0
    while name in used:
        name, n = f"{base}_token_{n}", n + 1
    used.add(name)
    return name


def inline_function(graph, node, prefix):
    """Graph::InlineFunction: remove `node`, append its body's nodes; returns the new nodes."""
    formal_in, formal_out, body = FUNCTION_BODIES[(node.domain, node.op_type)]
    rename = {f: a.name for f, a in zip(formal_in, node.inputs)}
    rename.update({f: a.name for f, a in zip(formal_out, node.outputs) if a.exists()})
    actual = lambda name: rename.get(name, f"{prefix}_{name}")  # noqa: E731
    graph.remove_node(node)
    return [graph.add_node(op, [actual(i) for i in inputs], [actual(o) for o in outputs],
                           name=f"{prefix}_{k}", domain=domain,
                           _attributes=[helper.make_attribute(k2, v) for k2, v in attrs.items()])
            for k, (outputs, op, inputs, domain, attrs) in enumerate(body)]


def has_function_body(node):
    """True for a node ORT 1.19.2's CPU EP has no kernel for and whose op has a function body: its partitioner
    inlines it."""
    return (node.domain, node.op_type) in FUNCTION_BODIES or (
        node.domain in ("", "ai.onnx") and node.op_type in ORT_CPU_INLINED_ONNX_OPS)


def inline_nodes(graph, types=None):
    """InlineNodes: every function node without a CPU kernel, in index order; returns their ops. An ONNX function
    whose body ONNX cannot build (an input's type unknown) is left as it is. types: {value name: TypeProto}
    (default: the node args')."""
    used, inlined = set(), []
    for node in [n for n in graph.nodes() if has_function_body(n)]:
        prefix = _unique_identifier(graph, node.op_type, used)
        if (node.domain, node.op_type) in FUNCTION_BODIES:
            inline_function(graph, node, prefix)
        elif not inline_onnx_function(graph, node, prefix, types):
            continue
        inlined.append(node.op_type)
    return inlined


def inline_onnx_function(graph, node, prefix, types=None):
    """Graph::InlineFunction for an ONNX op: the body ONNX builds for this node (its input types known), inlined
    with its own values renamed `<prefix>_<name>` and its Constant nodes made initializers, as ORT's are; returns
    the new nodes, or None when ONNX builds no body."""
    body = _onnx_function_body(graph, node, types or {})
    if body is None:
        return None
    outer = set(node.input_names) | set(node.output_names) | set(node.implicit_input_names())
    actual = lambda name: name if not name or name in outer else f"{prefix}_{name}"  # noqa: E731
    graph.remove_node(node)
    added = []
    for k, proto in enumerate(body):
        value = constant_value(proto)
        if value is not None:
            graph.add_initializer(actual(proto.output[0]), value)
            continue
        added.append(graph.add_node(proto.op_type, [actual(i) for i in proto.input],
                                    [actual(o) for o in proto.output], name=f"{prefix}_{k}",
                                    domain=proto.domain, _attributes=proto.attribute))
    return added


def _onnx_function_body(graph, node, types):
    """NodeProtos of the function ONNX builds for `node` at the graph's opset, with attribute references and
    names resolved by onnx.inliner; None when an input type is unknown or ONNX has no body for that opset."""
    def type_of(name):
        arg = graph.node_arg(name)
        return types.get(name) or (arg.type_proto if arg is not None else None)

    given = [type_of(a.name) if a.exists() else onnx.TypeProto() for a in node.inputs]
    opset = opset_of(graph.opset_imports, "")
    schema = onnx.defs.get_schema(node.op_type, opset, "")
    versions = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if any(t is None for t in given) or not versions:
        return None
    proto = node.to_proto()
    function = onnx.FunctionProto()
    function.ParseFromString(schema.get_context_dependent_function_with_opset_version(
        max(versions), proto.SerializeToString(), [t.SerializeToString() for t in given]))
    reads = [n for n in dict.fromkeys(node.input_names + node.implicit_input_names()) if n]
    call = helper.make_graph([proto], "call", [_value_info(n, type_of(n)) for n in reads],
                             [onnx.ValueInfoProto(name=o) for o in proto.output if o])
    model = helper.make_model(call, opset_imports=[helper.make_opsetid(d, v) for d, v in graph.opset_imports.items()],
                              functions=[function])
    return list(inliner.inline_local_functions(model, convert_version=True).graph.node)  # (its body's opset may
    # be older than the model's: converted, as ORT builds it for the model's opset)


def _value_info(name, type_proto):
    return helper.make_value_info(name, type_proto) if type_proto is not None else onnx.ValueInfoProto(name=name)

"""The transforms an InferenceSession applies to every graph at initialization, whatever the optimization level.

Mirrors onnxruntime/core/framework/graph_partitioner.cc (InlineNodes: a node no EP claims whose schema has a
function body is replaced by the body, in node-index order; Graph::InlineFunction appends the body's nodes
with new indices and prefixes the body's internal values with a unique "_inlfunc_<Op>" identifier). The
other transform of every level, RemoveDuplicateCastTransformer, is ortlab.transformers.remove_duplicate_cast.
On the CPU EP of the training wheel the one function op in
ortlab's gradient graphs is com.microsoft DivGrad (no CPU kernel; its body in
orttraining/orttraining/core/graph/training_op_defs.cc); node indices matter because ORT's default order is
a reverse DFS that visits producers by index.
"""
from onnx import helper


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


def inline_nodes(graph):
    """InlineNodes: every function node without a CPU kernel, in index order; returns their ops."""
    used, inlined = set(), []
    for node in [n for n in graph.nodes() if (n.domain, n.op_type) in FUNCTION_BODIES]:
        inline_function(graph, node, _unique_identifier(graph, node.op_type, used))
        inlined.append(node.op_type)
    return inlined

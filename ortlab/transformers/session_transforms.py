"""The transforms an InferenceSession applies to every graph at initialization, whatever the optimization level.

Mirrors onnxruntime/core/framework/graph_partitioner.cc (InlineNodes: a node no EP claims whose schema has a
function body is replaced by the body, in node-index order; Graph::InlineFunction appends the body's nodes
with new indices and prefixes the body's internal values with a unique "_inlfunc_<Op>" identifier) and
onnxruntime/core/optimizer/insert_cast_transformer.cc (RemoveDuplicateCastTransformer, which
InferenceSession::TransformGraph runs after partitioning at every level, ORT_DISABLE_ALL included: Cast
pairs that undo each other are dropped). On the CPU EP of the training wheel the one function op in
ortlab's gradient graphs is com.microsoft DivGrad (no CPU kernel; its body in
orttraining/orttraining/core/graph/training_op_defs.cc); node indices matter because ORT's default order is
a reverse DFS that visits producers by index.
"""
from onnx import TensorProto, helper


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


T = TensorProto
TYPE_GROUPS = {T.BOOL: 0, **dict.fromkeys((T.INT8, T.INT16, T.INT32, T.INT64, T.UINT8, T.UINT16, T.UINT32,
                                             T.UINT64), 1),
               **dict.fromkeys((T.BFLOAT16, T.DOUBLE, T.FLOAT, T.FLOAT16), 2)}  # GetTypeGroup


def _elem_type(graph, name, types):
    arg = graph.node_arg(name)
    type_proto = (types or {}).get(name) or (arg.type_proto if arg is not None else None)
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return None
    return type_proto.tensor_type.elem_type


def _cast_types(graph, cast, types):
    """(input elem type, output elem type, their type groups) of a Cast node; groups None if unknown."""
    src, dst = _elem_type(graph, cast.inputs[0].name, types), _elem_type(graph, cast.outputs[0].name, types)
    return src, dst, TYPE_GROUPS.get(src), TYPE_GROUPS.get(dst)


def _is_cast(node):
    return node.op_type == "Cast" and node.domain in ("", "ai.onnx")


def remove_duplicate_casts(graph, types=None):
    """RemoveDuplicateCastTransformer::ApplyImpl, one pass in node-index order; returns the removed
    Casts' names. A Cast's Cast children that cast back to its input type (and are not graph outputs)
    are removed, their readers reading the first Cast's input; the first Cast goes too when every one of
    its output edges went to a Cast. Not for non-numeric casts, nor when a lossy Cast (float -> int, int
    -> bool) is followed by a widening one, nor a Cast whose output a subgraph reads (an implicit input's
    edge is no Cast's). types: {value name: TypeProto} (default: the node args')."""
    removed = []
    read_by_subgraphs = {name for node in graph.nodes() for name in node.implicit_input_names()}
    for node in list(graph.nodes()):
        if not graph.has_node(node) or not _is_cast(node):
            continue
        src, dst, src_group, dst_group = _cast_types(graph, node, types)
        if src_group is None or dst_group is None:
            continue
        out, inp = node.outputs[0].name, node.inputs[0].name
        edges = [c for c in graph.consumers(out) for a in c.inputs if a.name == out]
        drop, keep, inconsistent = [], [], False
        for child in (c for c in edges if _is_cast(c)):
            src1, dst1, group_in, group_out = _cast_types(graph, child, types)
            if group_in is None or group_out is None or (src_group > dst_group and group_out > group_in):
                inconsistent = True
                break
            fits = child.outputs[0].name not in graph.outputs and child.outputs[0].name not in read_by_subgraphs \
                and src == dst1 and src1 == dst
            (drop if fits else keep).append(child)
        if inconsistent:
            continue
        for child in drop:
            graph.replace_all_uses(child.outputs[0].name, inp)
            removed.append(child.name)
            graph.remove_node(child)
        if edges and len(drop) + len(keep) == len(edges) and out not in graph.outputs and out not in read_by_subgraphs:
            graph.replace_all_uses(out, inp)
            removed.append(node.name)
            graph.remove_node(node)
    return removed

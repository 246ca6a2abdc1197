"""RemoveDuplicateCastTransformer: Cast pairs that undo each other, dropped at every optimization level.

Mirrors onnxruntime/core/optimizer/insert_cast_transformer.cc as ORT 1.19.2 runs it: InferenceSession::
TransformGraph runs InsertCastTransformer after partitioning at every level, ORT_DISABLE_ALL included, and it
ends with this remover. A Cast's Cast children that cast back to its input type are removed (their readers read
the first Cast's input), and the first Cast goes too when every one of its output edges went to a Cast; a
child Cast to a third type then reads the first Cast's input directly.

What may be removed is decided by UnsafeCast, which counts a cast as unsafe when it can lose information:
narrowing (double -> float, float -> bfloat16, int64 -> int32), float -> integer or bool, a signed or float
type -> unsigned, integer -> a float no wider than it, float16 <-> bfloat16, and any type outside bool,
integers and floats. When the first Cast is unsafe, a child whose reverse is unsafe (a widening, which would
bring the lost bits back) stops the removal: float -> bfloat16 -> float keeps both Casts and rounds. Older ORT
source (one type group per kind, no bit lengths) removed such pairs; ORT 1.19.2 does not (pinned in
tests/transformers/test_remove_duplicate_cast.py against ORT's saved graphs and values).
"""
from onnx import TensorProto as T

from ortlab.ir.subgraph import transform_bodies

BOOL, INTEGER, UNSIGNED, FLOAT = 0, 1, 2, 3  # GetTypeGroup
TYPE_GROUPS = {T.BOOL: BOOL, **dict.fromkeys((T.INT8, T.INT16, T.INT32, T.INT64), INTEGER),
               **dict.fromkeys((T.UINT8, T.UINT16, T.UINT32, T.UINT64), UNSIGNED),
               **dict.fromkeys((T.BFLOAT16, T.DOUBLE, T.FLOAT, T.FLOAT16), FLOAT)}
BIT_LENGTHS = {T.BOOL: 1, T.UINT8: 8, T.INT8: 8, **dict.fromkeys((T.INT16, T.UINT16, T.BFLOAT16, T.FLOAT16), 16),
               **dict.fromkeys((T.INT32, T.UINT32, T.FLOAT), 32), **dict.fromkeys((T.INT64, T.UINT64, T.DOUBLE), 64)}
INSERTED = "InsertedPrecisionFreeCast_"  # InsertCastTransformer's own fp16 <-> fp32 Casts: never lossy


def unsafe_cast(src, dst, name=""):
    """UnsafeCast: True when casting element type `src` to `dst` (TensorProto enums; None when unknown) may
    lose information. `name` is the Cast node's; InsertCastTransformer's own narrowing Casts are not lossy."""
    src_group, dst_group = TYPE_GROUPS.get(src), TYPE_GROUPS.get(dst)
    if src_group is None or dst_group is None:
        return True
    if src_group in (INTEGER, FLOAT) and dst_group == UNSIGNED:
        return True
    if src_group == FLOAT and dst_group != FLOAT:
        return True
    src_bits, dst_bits = BIT_LENGTHS[src], BIT_LENGTHS[dst]
    if (src_group, dst_group) == (UNSIGNED, INTEGER) or (src_group in (INTEGER, UNSIGNED) and dst_group == FLOAT):
        return dst_bits <= src_bits
    if {src, dst} == {T.FLOAT16, T.BFLOAT16}:
        return True
    return src_bits > dst_bits and not name.startswith(INSERTED)


def _elem_type(graph, name, types):
    arg = graph.node_arg(name)
    type_proto = (types or {}).get(name) or (arg.type_proto if arg is not None else None)
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return None
    return type_proto.tensor_type.elem_type or None


def _is_cast(node):
    return node.op_type == "Cast" and node.domain in ("", "ai.onnx")


def _sort_children(graph, cast, types, read_by_subgraphs):
    """(Casts to remove, Casts to keep, other edges) among `cast`'s output edges; None when a child Cast would
    bring back what a lossy `cast` lost."""
    src, dst = _elem_type(graph, cast.inputs[0].name, types), _elem_type(graph, cast.outputs[0].name, types)
    lossy = unsafe_cast(src, dst, cast.name)
    out = cast.outputs[0].name
    edges = [c for c in graph.consumers(out) for a in c.inputs if a.name == out]
    drop, keep = [], []
    for child in (c for c in edges if _is_cast(c)):
        src1, dst1 = _elem_type(graph, out, types), _elem_type(graph, child.outputs[0].name, types)
        if lossy and unsafe_cast(dst1, src1, child.name):
            return None
        result = child.outputs[0].name
        fits = result not in graph.outputs and result not in read_by_subgraphs and src is not None \
            and src == dst1 and src1 == dst
        (drop if fits else keep).append(child)
    return drop, keep, len(edges) - len(drop) - len(keep)


def remove_duplicate_casts(graph, types=None):
    """RemoveDuplicateCastTransformer::ApplyImpl, one pass in node-index order over the main graph, then inside
    every If/Loop/Scan body (GraphTransformer::Recurse); returns the removed Casts' names. A Cast whose output a
    subgraph reads is kept (an implicit input's edge is no Cast's). types: {value name: TypeProto} of the main
    graph (default: the node args')."""
    removed = _remove_in_graph(graph, types)
    return removed + _remove_in_bodies(graph)


def _remove_in_bodies(graph):
    """The remover inside each body of `graph`'s nodes, nested bodies included; a body is written back only
    where a Cast went (ORT saves an unchanged subgraph as loaded)."""
    return [name for gone in transform_bodies(graph, remove_duplicate_casts) for name in gone]


def _remove_in_graph(graph, types):
    """The pass over one graph's own nodes."""
    removed = []
    read_by_subgraphs = {name for node in graph.nodes() for name in node.implicit_input_names()}
    for node in list(graph.nodes()):
        if not graph.has_node(node) or not _is_cast(node):
            continue
        sorted_children = _sort_children(graph, node, types, read_by_subgraphs)
        if sorted_children is None:
            continue
        drop, keep, others = sorted_children
        inp, out = node.inputs[0].name, node.outputs[0].name
        for child in drop:
            graph.replace_all_uses(child.outputs[0].name, inp)
            removed.append(child.name)
            graph.remove_node(child)
        if (drop or keep) and not others and out not in graph.outputs and out not in read_by_subgraphs:
            graph.replace_all_uses(out, inp)
            removed.append(node.name)
            graph.remove_node(node)
    return removed

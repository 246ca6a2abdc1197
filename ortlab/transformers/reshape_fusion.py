"""ReshapeFusion: Reshape(x, Concat(Unsqueeze(Gather(Shape(x), k)), ..., c)) -> Reshape(x, [0, ..., c]).

Mirrors onnxruntime/core/optimizer/reshape_fusion.cc (a level-1 transformer, every EP; it runs
after ConstantFolding in graph_transformer_utils.cc). An exported model computes a Reshape's
target shape at run time from x's own dims; when every piece of that Concat is known, the
subgraph becomes one constant shape and the Shape/Gather/Unsqueeze chains go. Each Concat input
gives, in order:

    its values        an int64/int32 constant initializer
    0 (keep the dim)  Unsqueeze(axes=[0]) of Gather(Shape(x), k), k the position it lands at,
                      Shape reading x itself (no start other than 0, no end)
    -1 (infer it)     any input holding exactly one number (inferred shape [1], or the
                      Shape->Gather/Slice->Squeeze->(Div/Mul)->Unsqueeze chains ORT recognises)

and the fusion needs Reshape-5/13/14 without allowzero, Concat-1/4/11/13 read only by the
Reshape, and at most one -1. The chains feeding the Concat are removed from the Concat upwards
while nothing else reads them (graph_utils::RemoveNodesWithOneOutputBottomUp): a chain the
Concat reads twice (after CSE merged two copies) stays behind unread, as in ORT.
ORT 1.19.2 also keeps the dim a Gather index picks when the index is an initializer a feed can
override (a graph input too); ortlab takes that piece for one number (-1), which stays right
whatever is fed.
"""
import numpy as np

from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_utils import label
from ortlab.transformers.pattern import Match, PatternFusion
from ortlab.transformers.registry import register_transformer

RESHAPE, CONCAT, UNSQUEEZE, GATHER, SHAPE = (5, 13, 14), (1, 4, 11, 13), (1, 11, 13), (1, 11, 13), (1, 13, 15)
SLICE, SQUEEZE, DIV_MUL = (1, 10, 11, 13), (1, 11, 13), (7, 13, 14)
INT_TYPES = (np.dtype(np.int64), np.dtype(np.int32))


def is_version(graph, node, op_type, versions):
    return node is not None and gu.is_op_version(graph, node, op_type, versions)


def unsqueeze_axes(graph, node):
    """An Unsqueeze's axes (attribute before opset 13, constant input after), or None."""
    if len(node.input_names) > 1 and node.input_names[1]:
        value = gu.constant(graph, node.input_names[1])
        return None if value is None else [int(a) for a in value.reshape(-1)]
    return node.attribute("axes")


def one_number(graph, name):
    """True when the value's inferred shape holds exactly one element ([], [1], [1, 1], ...)."""
    dims = gu.shape(graph, name)
    return dims is not None and all(isinstance(d, int) for d in dims) and int(np.prod(dims, dtype=np.int64)) == 1


def dim_chain(graph, name):
    """(Unsqueeze, Gather, Shape) when `name` is Unsqueeze(axes=[0]) of Gather of Shape, else None."""
    unsq = graph.producer(name)
    if not is_version(graph, unsq, "Unsqueeze", UNSQUEEZE) or unsqueeze_axes(graph, unsq) != [0]:
        return None
    gather = graph.producer(unsq.input_names[0])
    if not is_version(graph, gather, "Gather", GATHER):
        return None
    shape = graph.producer(gather.input_names[0])
    return (unsq, gather, shape) if is_version(graph, shape, "Shape", SHAPE) else None


def reads_all_of(graph, shape, root):
    """True when Shape gives all of root's dims: it reads root (no end, start 0), or a value of
    the same fully known shape."""
    if shape.input_names[0] == root:
        return shape.attribute("end") is None and shape.attribute("start", 0) == 0
    mine, theirs = gu.shape(graph, shape.input_names[0]), gu.shape(graph, root)
    return (mine is not None and mine == theirs and all(isinstance(d, int) for d in mine)
            and shape.attribute("end") is None and shape.attribute("start", 0) == 0)


def kept_dim(graph, root, name, position):
    """'' when `name` is root's dim `position` (the fused shape keeps it: 0), else why not."""
    chain = dim_chain(graph, name)
    if chain is None:
        return "is no Shape->Gather->Unsqueeze(axes=[0]) chain"
    _, gather, shape = chain
    index_name = gather.input_names[1]
    if index_name in graph.inputs and index_name in graph.initializers:
        return (f"is a Gather whose index '{index_name}' is a graph input too: a feed may change it "
                "(ORT 1.19.2 takes the initializer's value anyway)")
    index = gu.constant(graph, index_name)
    if index is None or index.size != 1 or int(index.reshape(-1)[0]) != position:
        return f"does not pick dim {position}"
    return "" if reads_all_of(graph, shape, root) else "does not read the Reshape's input through a plain Shape"


def sliced_one_dim(graph, root, name):
    """True when `name` is Squeeze(Slice(Shape(root))) with the Slice taking one element."""
    squeeze = graph.producer(name)
    if not is_version(graph, squeeze, "Squeeze", SQUEEZE):
        return False
    sl = graph.producer(squeeze.input_names[0])
    if not is_version(graph, sl, "Slice", SLICE):
        return False
    shape = graph.producer(sl.input_names[0])
    if not is_version(graph, shape, "Shape", SHAPE) or shape.input_names[0] != root:
        return False
    if len(sl.input_names) >= 3:
        starts, ends = (gu.constant(graph, n) for n in sl.input_names[1:3])
        if starts is None or ends is None:
            return False
        starts, ends = starts.reshape(-1).tolist(), ends.reshape(-1).tolist()
    else:
        starts, ends = sl.attribute("starts", []), sl.attribute("ends", [])
    if len(starts) != 1 or len(ends) != 1:
        return False
    return (starts[0] == -1 and ends[0] >= 2**31 - 1) or abs(ends[0] - starts[0]) == 1


def one_element(graph, root, name):
    """True when the Concat input `name` holds one number (ReshapeFusion::Is_One_Element_Output_Subgraph)."""
    if one_number(graph, name):
        return True
    chain = dim_chain(graph, name)
    if chain is not None:
        return one_number(graph, chain[1].input_names[1])
    unsq = graph.producer(name)
    if not is_version(graph, unsq, "Unsqueeze", UNSQUEEZE) or unsqueeze_axes(graph, unsq) != [0]:
        return False
    source = unsq.input_names[0]
    binary = graph.producer(source)
    if is_version(graph, binary, "Div", DIV_MUL) or is_version(graph, binary, "Mul", DIV_MUL):
        return all(one_number(graph, n) or sliced_one_dim(graph, root, n) for n in binary.input_names)
    return one_number(graph, source) or sliced_one_dim(graph, root, source)


def concat_part(graph, root, name, position):
    """The values a Concat input adds to the shape ([..] of a constant, [0], [-1]), or why none."""
    value = gu.constant(graph, name)
    if value is not None:
        if value.dtype not in INT_TYPES:
            return f"is a {value.dtype} constant, not int64 or int32"
        return [int(v) for v in value.reshape(-1)]
    why = kept_dim(graph, root, name, position)
    if not why:
        return [0]
    if one_element(graph, root, name):
        return [-1]
    return f"{why}, is no constant and may hold more than one number"


def readers(graph, node):
    """How many times the node's outputs are read (input slots, graph outputs)."""
    return sum(gu.uses(graph, o) for o in node.output_names if o)


def remove_bottom_up(graph, node):
    """Remove `node`, then each producer it alone read (graph_utils::RemoveNodesWithOneOutputBottomUp);
    returns the op types removed."""
    parents = {p.index: p for p in (graph.producer(n) for n in node.input_names if n)
               if p is not None and readers(graph, p) == 1}
    graph.remove_node(node)
    removed = [node.op_type]
    for parent in parents.values():
        if graph.has_node(parent):
            removed += remove_bottom_up(graph, parent)
    return removed


@register_transformer(level=1)
class ReshapeFusion(PatternFusion):
    """Reshape(x, Concat(dims of x, constants, one number)) -> Reshape(x, constant [0 | c | -1, ...])."""

    anchor = "Reshape"

    def match(self, graph, reshape):
        if not gu.is_op_version(graph, reshape, "Reshape", RESHAPE) or len(reshape.input_names) < 2:
            return None
        concat = graph.producer(reshape.input_names[1])
        if not is_version(graph, concat, "Concat", CONCAT):
            return None
        if reshape.attribute("allowzero", 0):
            return "allowzero=1: a 0 in the target shape is a dim of size 0, not 'keep this dim'"
        if gu.uses(graph, concat.output_names[0]) != 1:
            return "the Concat's shape is read by more than the Reshape"
        root, values = reshape.input_names[0], []
        for k, name in enumerate(concat.input_names):
            part = concat_part(graph, root, name, len(values))
            if isinstance(part, str):
                return f"Concat input {k} ('{name}') {part}"
            values += part
        if values.count(-1) > 1:
            return f"the fused shape {values} would hold more than one -1"
        return Match([concat], list(concat.input_names), [concat.output_names[0]], {"value": values})

    def rewrite(self, graph, match):
        """Remove the chains feeding the Concat (each while the Concat alone reads it), then the
        Concat; its output becomes an int64 initializer of the same name."""
        concat, = match.nodes
        removed = []
        for name in concat.input_names:
            producer = graph.producer(name)
            if producer is not None and graph.has_node(producer) and readers(graph, producer) == 1:
                removed += remove_bottom_up(graph, producer)
        graph.remove_node(concat)
        shape_name, = match.outputs
        graph.add_initializer(shape_name, np.array(match.attributes["value"], dtype=np.int64))
        reshape = graph.explicit_consumers(shape_name)[0]
        self.fused.append((label(reshape), "Reshape", ["Concat"] + removed))
        return reshape

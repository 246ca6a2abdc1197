"""Small graph queries and edits that every transformer needs.

Mirrors onnxruntime/core/optimizer/utils/graph_utils.h (IsSupportedOptypeVersionAndDomain,
CanRemoveNode, RemoveNode, FinalizeNodeFusion) and optimizer_utils.h
(IsInitializerWithExpectedValue, GetScalarInitializerValue, IsScalar).
"""
import numpy as np
from onnx import TensorProto, defs

from ortlab.onnx_defs import MS_DOMAIN, domain_of, opset_of

MS = MS_DOMAIN
FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}


def label(node):
    """'name (#index Op)' for messages and tables."""
    return f"{node.name or '(no name)'} (#{node.index} {node.op_type})"


def is_op(node, op_type, domain=""):
    """True when the node is `op_type` of `domain` ('' and 'ai.onnx' are the same domain)."""
    return node is not None and node.op_type == op_type and domain_of(node.domain) == domain_of(domain)


def since_version(graph, node):
    """The version of the node's op schema at the model's opset (Node::SinceVersion), or None."""
    opset = opset_of(graph.opset_imports, node.domain or "")
    if opset is None:
        return None
    try:
        return defs.get_schema(node.op_type, opset, node.domain or "").since_version
    except defs.SchemaError:
        return None


def is_op_version(graph, node, op_type, versions, domain=""):
    """is_op, and the op's schema at the model's opset is one of `versions`
    (graph_utils::IsSupportedOptypeVersionAndDomain): a rule written for Where-9 does not
    touch a Where-16."""
    return is_op(node, op_type, domain) and since_version(graph, node) in versions


def constant(graph, name, excluded=()):
    """The value of a constant initializer as a numpy array, or None.

    An initializer that is also a graph input can be overridden at run time, so it is
    not constant (graph_utils::IsConstantInitializer); neither are `excluded` names
    (the trainable weights, during training).
    """
    if not name or name not in graph.initializers or name in graph.inputs or name in excluded:
        return None
    return graph.initializer_value(name)


def scalar(graph, name):
    """A constant initializer holding one number, as a Python float, or None."""
    value = constant(graph, name)
    return None if value is None or value.size != 1 else float(value.reshape(-1)[0])


def is_scalar_close(graph, name, expected, rtol=1e-4):
    """True when `name` is a constant single number within rtol of `expected`."""
    value = scalar(graph, name)
    return value is not None and np.isclose(value, expected, rtol=rtol, atol=0)


def shape(graph, name):
    """Dims of a value (ints, symbols or None), or None when its rank is unknown."""
    arg = graph.node_arg(name)
    return None if arg is None else arg.shape


def elem_type(graph, name):
    arg = graph.node_arg(name)
    return None if arg is None else arg.elem_type


def is_float(graph, name):
    return elem_type(graph, name) in FLOAT_TYPES


def uses(graph, name):
    """How many times `name` is read: each consumer slot, each subgraph reader, one more for a graph output.

    A node whose subgraphs (If, Loop, Scan) read `name` counts once: ORT gives an implicit input an edge too."""
    return sum(c.input_names.count(name) for c in graph.consumers(name)) + graph.outputs.count(name) + \
        subgraph_readers(graph, name)


def subgraph_readers(graph, name):
    """How many nodes read `name` from inside a subgraph (If, Loop, Scan: Node::ImplicitInputDefs)."""
    return len(graph.implicit_consumers(name))


def single_consumer(graph, name):
    """The one node reading `name` once, when nothing else reads it and it is not a graph output.

    It reads `name` in an input slot: a node whose subgraph alone reads it has no slot to rewire."""
    consumers = graph.consumers(name)
    if len(consumers) != 1 or uses(graph, name) != 1 or consumers[0].input_names.count(name) != 1:
        return None
    return consumers[0]


def other_input(node, name):
    """For a two-input node, the input that is not `name` (None when both are `name`)."""
    names = node.input_names
    if len(names) != 2 or name not in names or names[0] == names[1]:
        return None
    return names[1] if names[0] == name else names[0]


def bypass_reason(graph, node, keep=0, rename_graph_output=True):
    """Why a node cannot be removed by wiring its input `keep` to its consumers, or None.

    Mirrors graph_utils::CanRemoveNode: the extra outputs (e.g. a Dropout mask) must be
    unused, and when its output is a graph output the value must be renamed upstream,
    which needs an input produced by a node whose output nothing else reads, and an output no
    node reads, in a slot or a subgraph (identity_elimination.cc). A subgraph that
    reads the output is made to read the input instead, unless it already has a value of that
    name (CanUpdateImplicitInputNameInSubgraphs, onnxruntime/core/graph/graph_utils.cc).
    rename_graph_output=False: a graph output is never bypassed (CanRemoveNode alone, as
    EliminateDropout and CastElimination ask).
    """
    if len(node.inputs) <= keep or not node.inputs[keep].exists():
        return "it has no data input"
    if any(uses(graph, o.name) for o in node.outputs[1:] if o.exists()):
        return "one of its extra outputs is used"
    inp, out = node.input_names[keep], node.output_names[0]
    if out not in graph.outputs and not all(c.can_rename_implicit_input(out, inp)
                                            for c in graph.implicit_consumers(out)):
        return f"a subgraph reads its output and already has a value called '{inp}'"
    if out in graph.outputs and not rename_graph_output:
        return "its output is a graph output"
    if out in graph.outputs and uses(graph, out) != graph.outputs.count(out):
        return "its output is a graph output that a node reads too"  # identity_elimination.cc: no output edge
    if out in graph.outputs:
        producer = graph.producer(inp)
        if producer is None:
            return "its output is a graph output and its input is a graph input or initializer"
        if uses(graph, inp) != 1:
            return "its output is a graph output and its input has other consumers"
    return None


def bypass(graph, node, keep=0):
    """Remove a node, its consumers reading its input `keep` instead (graph_utils::RemoveNode)."""
    inp, out = node.input_names[keep], node.output_names[0]
    graph.remove_node(node)
    if out in graph.outputs:
        producer = graph.producer(inp)
        graph.replace_node_output(producer, producer.output_names.index(inp), out)
        graph.replace_all_uses(inp, out)
    else:
        graph.replace_all_uses(out, inp)


def unique_node_name(graph, base):
    """A node name no live node has (Graph::GenerateNodeName)."""
    return graph.generate_node_name(base)


def unique_value_name(graph, base):
    """A value name no NodeArg has yet (Graph::GenerateNodeArgName)."""
    name, k = base, 0
    while graph.node_arg(name) is not None or name in graph.initializers:
        k += 1
        name = f"{base}_token_{k}"
    return name


def remove_unused_initializers(graph):
    """Drop initializers nothing reads (Graph::CleanUnusedInitializersAndNodeArgs); returns their names.

    A read from inside a subgraph (an If branch, a Loop body) counts as a read: graph.consumers sees it."""
    unused = [n for n in graph.initializers if not graph.consumers(n)
              and n not in graph.outputs and n not in graph.inputs]
    for name in unused:
        graph.remove_initializer(name)
    return unused


def fuse(owner, graph, nodes, op_type, inputs, outputs, domain="", **attributes):
    """Replace `nodes` by one new node (graph_utils::FinalizeNodeFusion); returns the new node.

    The new node takes the outputs of the pattern, so consumers and graph outputs are
    unchanged; `owner.fused` records (new node, its op type, the op types it replaced).
    """
    name = unique_node_name(graph, f"{op_type}_{nodes[0].name or nodes[0].index}")
    removed = [n.op_type for n in nodes]
    for node in nodes:
        graph.remove_node(node)
    if domain and domain not in graph.opset_imports:
        graph.opset_imports[domain] = 1  # ORT's contrib ops are all version 1
    new = graph.add_node(op_type, inputs, outputs, name=name, domain=domain, **attributes)
    owner.fused.append((label(new), op_type, removed))
    return new


def broadcasts_to_last_dim(graph, bias, x):
    """True when `bias` is 1-D and its length is the (known) last dim of `x`."""
    b, s = shape(graph, bias), shape(graph, x)
    return (b is not None and s is not None and len(b) == 1 and len(s) >= 1
            and isinstance(b[0], int) and b[0] == s[-1])


def normalized_axes(axes, rank):
    """Axes as non-negative ints, or None when the rank is unknown."""
    if rank is None:
        return None
    return sorted(a + rank if a < 0 else a for a in axes)


def reduce_axes(graph, node):
    """The axes a ReduceMean/ReduceSum reduces (attribute before opset 18, input after), or None."""
    if len(node.inputs) > 1 and node.inputs[1].exists():
        value = constant(graph, node.input_names[1])
        return None if value is None else [int(a) for a in value.reshape(-1)]
    return node.attribute("axes")

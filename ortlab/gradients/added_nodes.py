"""Which nodes a gradient graph builder added to a forward graph: ortlab's and ORT's alike.

Both name a builder's nodes '<forward node>_Grad/...' (orttraining/orttraining/core/graph/
gradient_builder_base.h, NodeDef names), and both keep the forward nodes (and the nodes
recomputing a forward value) as they were.
"""
from ortlab.ir import Graph


def gradient_nodes(gradient_model, forward_model, of=None):
    """The nodes a gradient builder added: those of `gradient_model` that are not forward nodes
    (same name, or a first output that a forward node produces), only those of forward node `of`
    when given. NodeProtos of `gradient_model`, in its order."""
    forward, gradient = Graph.from_model(forward_model), Graph.from_model(gradient_model)
    names = {n.name for n in forward.nodes() if n.name}
    added = [n for n in gradient.nodes() if n.name not in names and not computes_a_forward_value(forward, n)]
    return [gradient_model.graph.node[n.index] for n in added if of is None or n.name.startswith(f"{of}_Grad/")]


def computes_a_forward_value(forward, node):
    """Whether `node`'s first output is a value a node of the forward Graph produces."""
    return bool(node.outputs) and forward.producer(node.outputs[0].name) is not None

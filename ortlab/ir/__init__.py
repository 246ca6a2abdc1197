"""ortlab.ir: a teaching mirror of ORT's in-memory graph (graph.h, node_arg.h, graph_viewer.cc).

    Graph.from_model(model) / Graph.load(path) -> Graph;  graph.to_model() / graph.save(path)
    graph.nodes(), graph.node(index), graph.has_node(node), graph.producer(name), graph.consumers(name)
    graph.get_or_create_node_arg(name, type_proto), graph.add_node(...), graph.remove_node(node)
    graph.replace_node_input/replace_node_output(node, i, name), graph.append_node_output(node, name),
    graph.replace_all_uses(old, new)   (the producer and consumer maps change only through these)
    graph.resolve()  (checks + shape inference),  graph.topological_order("default" | "priority")
    Every error is a GraphError (ortlab/ir/errors.py).
"""
from ortlab.ir.errors import (DuplicateProducerError, GraphCycleError, GraphError, MissingInputError,
                              UnknownOpError)
from ortlab.ir.graph import Graph
from ortlab.ir.model_load import load_model
from ortlab.ir.node import Node
from ortlab.ir.node_arg import NodeArg, tensor_type
from ortlab.ir.topological_order import is_topological

__all__ = ["DuplicateProducerError", "Graph", "GraphCycleError", "GraphError", "MissingInputError",
           "Node", "NodeArg", "UnknownOpError", "is_topological", "load_model", "tensor_type"]

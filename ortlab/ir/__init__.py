"""ortlab.ir: a teaching mirror of ORT's in-memory graph (graph.h, node_arg.h, graph_viewer.cc).

    Graph.from_model(model) / Graph.load(path) -> Graph;  graph.to_model() / graph.save(path)
    graph.nodes(), graph.node(index), graph.producer(name), graph.consumers(name)
    graph.get_or_create_node_arg(name, type_proto), graph.add_node(...), graph.remove_node(node)
    graph.resolve()  (checks + shape inference),  graph.topological_order("default" | "priority")
"""
from ortlab.ir.graph import (DuplicateProducerError, Graph, GraphCycleError, GraphError,
                             MissingInputError, UnknownOpError, load_model)
from ortlab.ir.node import Node
from ortlab.ir.node_arg import NodeArg, tensor_type
from ortlab.ir.topological_order import is_topological

__all__ = ["DuplicateProducerError", "Graph", "GraphCycleError", "GraphError", "MissingInputError",
           "Node", "NodeArg", "UnknownOpError", "is_topological", "load_model", "tensor_type"]

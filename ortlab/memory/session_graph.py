"""The graph ORT 1.19.2 plans memory for, built from a model as an InferenceSession at
ORT_DISABLE_ALL on the CPU EP builds it.

Mirrors onnxruntime/core/graph/graph.cc (the Graph constructor turns each Constant node into an
initializer and numbers the other nodes in order; Graph::Resolve infers types and shapes, see
ortlab.ir.shape_inference), then the session-time transforms of ortlab.transformers.session_transforms
(InlineNodes, InsertCastTransformer, RemoveDuplicateCastTransformer) that every level runs.
"""
from typing import NamedTuple


from ortlab.ir import Graph
from ortlab.ir.shape_inference import infer_types

class SessionGraph(NamedTuple):
    """The graph ORT plans, its values' types (ORT's view) and the function ops it inlined."""

    graph: Graph
    types: dict
    inlined: list


def declarations(graph):
    """{value name: TypeProto} that `graph` declares, read before the engine re-infers its values: the types of
    its inputs, outputs and initializers and of every value a node produces (the value_info of the model it
    stands for, as Graph::ToGraphProto writes it). ortlab.engine reads them from its one Graph after the
    transformers ran, so they are the transformed model's declarations, which ORT's Graph::Resolve starts from."""
    named = set(graph.inputs) | set(graph.outputs) | set(graph.initializers)
    named |= {arg.name for node in graph.nodes() for arg in node.outputs}
    return {arg.name: arg.type_proto for arg in graph.node_args() if arg.type_proto is not None and arg.name in named}


def planning_view(graph, order, declared):
    """SessionGraph over a graph its owner already built the way ORT does (ortlab.engine's partitioned graph:
    constants as initializers, function ops inlined, duplicate Casts removed), the graph itself neither
    copied nor changed, so the plan is of the very graph that runs. Types: what ORT's Graph::Resolve infers
    over `order` from `declared` (the declarations of that graph, read before the engine resolved it), not the
    fuller shapes onnx's own inference may have given the graph's NodeArgs."""
    return SessionGraph(graph, infer_types(graph, order, declared), [])


def session_graph(model):
    """SessionGraph for an onnx.ModelProto: reusable by several plan() calls (orders, reuse, shapes)."""
    from ortlab.transformers.insert_cast_transformer import insert_casts  # lazy: loads every graph transformer
    from ortlab.transformers.remove_duplicate_cast import remove_duplicate_casts  # lazy: loads every graph transformer
    from ortlab.transformers.session_transforms import inline_nodes  # lazy: ortlab.memory loads no transformer
    graph = Graph.from_model(model, constants_as_initializers=True)
    types = infer_types(graph, graph.topological_order("default"))
    inlined = inline_nodes(graph, types)
    if inlined:
        types = infer_types(graph, graph.topological_order("default"), types)
    for node_arg in graph.node_args():         # InsertCastTransformer reads each value's declared type
        if node_arg.name in types:
            node_arg.type_proto = types[node_arg.name]
    casts = insert_casts(graph)                 # after partitioning, at every level: float16 nodes ORT's CPU EP
    if remove_duplicate_casts(graph, types) or casts:  # has no kernel for run in float32 between Casts
        types = infer_types(graph, graph.topological_order("default"), types)
    for name, type_proto in types.items():
        arg = graph.node_arg(name)
        if arg is not None:
            arg.type_proto = type_proto
    return SessionGraph(graph, types, inlined)

"""A subgraph (If's branches, Loop's and Scan's body) as a Graph of its own, and back to a GraphProto.

In ORT a subgraph is a Graph with a parent: a value it reads but does not define resolves in the graph
around it (onnxruntime/core/graph/graph.cc, the subgraph constructor and GetNodeArgIncludingParentGraphs),
and ORT's transformers work inside it as in the main graph (GraphTransformer::Recurse). Here a body's Graph
gets each outer value it reads as a graph input, or, for an outer constant initializer, as an initializer:
ORT's transformers treat those as constants (graph_utils::IsConstantInitializer with check_outer_scope).
Its Constant nodes become initializers, as ORT's Graph constructor makes them for a subgraph too. Back to a
GraphProto, the outer values are dropped again (a caller writes a body back only where it changed: ORT saves an
unchanged subgraph as it was loaded).
"""
import onnx
from onnx import helper

from ortlab.ir.graph import Graph
from ortlab.ir.node import subgraph_reads


def body_graph(outer, body):
    """(the Graph of `body`, a GraphProto held by a node of `outer`; the names it reads from `outer`)."""
    proto = onnx.GraphProto()
    proto.CopyFrom(body)
    reads = [name for name in dict.fromkeys(subgraph_reads(body)) if outer.node_arg(name) is not None]
    for name in reads:
        if name in outer.initializers and name not in outer.inputs:
            proto.initializer.append(outer.initializers[name])
        else:
            type_proto = outer.node_arg(name).type_proto
            proto.input.append(helper.make_value_info(name, type_proto) if type_proto is not None
                               else onnx.ValueInfoProto(name=name))
    model = helper.make_model(proto, opset_imports=[helper.make_opsetid(d, v) for d, v in outer.opset_imports.items()])
    model.ir_version = int(outer.model_fields.get("ir_version") or model.ir_version)
    return Graph.from_model(model, constants_as_initializers=True), set(reads)


def body_proto(graph, outer_reads, body):
    """`graph` (made by body_graph from `body`) as a GraphProto again, without the outer values it was given:
    `body`'s name, inputs in their order, and what the graph now computes."""
    proto = graph.to_model().graph
    kept_inputs = [vi for vi in proto.input if vi.name not in outer_reads]
    kept_initializers = [t for t in proto.initializer if t.name not in outer_reads]
    del proto.input[:]
    proto.input.extend(kept_inputs)
    del proto.initializer[:]
    proto.initializer.extend(kept_initializers)
    proto.name = body.name
    return proto


"""A subgraph (If's branches, Loop's and Scan's body) as a Graph of its own, and back to a GraphProto.

In ORT a subgraph is a Graph with a parent: a value it reads but does not define resolves in the graph
around it (onnxruntime/core/graph/graph.cc, the subgraph constructor and GetNodeArgIncludingParentGraphs),
and ORT's transformers work inside it as in the main graph (GraphTransformer::Recurse). Here a body's Graph
gets each outer value it reads as a graph input, or, for an outer constant initializer, as an initializer:
ORT's transformers treat those as constants (graph_utils::IsConstantInitializer with check_outer_scope).
Its Constant nodes become initializers, as ORT's Graph constructor makes them for a subgraph too. Back to a
GraphProto, the outer values are dropped again. ORT saves a model no transformer changed as it was loaded; a changed
one with every body written from its Graph (load_bodies), untouched bodies included.
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
    graph = Graph.from_model(model, constants_as_initializers=True)
    graph._infer_shapes()  # the body's own values typed, as ORT resolves a subgraph (lenient: a Loop body's
    # inputs may be untyped, their types coming from the Loop node)
    return graph, set(reads)


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



def inline_if_branch(graph, if_node, condition):
    """Replace `if_node` by the nodes of the branch `condition` picks (Graph::InlineIfSubgraph, graph.cc):
    the branch's own values and initializers get new names unique in `graph`, its outputs become the If's
    outputs, and subgraphs among its nodes read the renamed values. Returns the nodes added."""
    body = if_node.attribute("then_branch" if condition else "else_branch")
    outputs = dict(zip((vi.name for vi in body.output), if_node.output_names))
    rename = {}
    for name in [t.name for t in body.initializer] + [o for n in body.node for o in n.output if o]:
        rename[name] = outputs.get(name) or _fresh(graph, f"_inlined_if_{if_node.index}_{name}", rename)
    graph.remove_node(if_node)
    for tensor in body.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        graph.add_initializer(rename[tensor.name], copy)
    added = []
    for proto in body.node:
        node = graph.add_node(proto.op_type, [rename.get(i, i) for i in proto.input],
                              [rename.get(o, o) for o in proto.output],
                              name=graph.generate_node_name(proto.name or proto.op_type),
                              domain=proto.domain, _attributes=proto.attribute, _doc=proto.doc_string)
        for old in [n for n in node.implicit_input_names() if n in rename]:
            node.rename_implicit_input(old, rename[old])
        added.append(node)
    for source, target in outputs.items():  # a branch output that is an outer value: passed on by an Identity
        if source not in rename:
            added.append(graph.add_node("Identity", [source], [target],
                                        name=graph.generate_node_name(f"{target}_inlined_identity")))
    return added


def _fresh(graph, name, taken):
    """`name`, or `name` with a number appended, that `graph` has no value of and `taken` holds no value to."""
    candidate, k = name, 0
    while graph.node_arg(candidate) is not None or candidate in taken.values():
        k += 1
        candidate = f"{name}_{k}"
    return candidate


def load_bodies(graph):
    """Every body of `graph`, nested ones included, rewritten as ORT writes a subgraph from its Graph: Constant nodes
    as initializers (the subgraph constructor, graph.cc). ORT saves a model that any transformer changed this way,
    untouched bodies too; only a model left wholly unchanged is saved as it was loaded."""
    for node in [n for n in graph.nodes() if n.holds_subgraphs()]:
        for name, bodies in node.subgraphs():
            node.set_subgraphs(name, [_as_loaded(graph, body) for body in bodies])


def _as_loaded(outer, body):
    sub, outer_reads = body_graph(outer, body)
    load_bodies(sub)
    return body_proto(sub, outer_reads, body)


def transform_bodies(graph, transform):
    """`transform(body Graph)` on every body of `graph`'s nodes (If's branches, Loop's and Scan's body), as ORT's
    transformers call GraphTransformer::Recurse; returns its results. A body whose result is truthy (it changed)
    is written back, and the op domains it now imports become the model's; the others stay as loaded."""
    results = []
    for node in [n for n in graph.nodes() if n.holds_subgraphs()]:
        for name, bodies in node.subgraphs():
            new_bodies = []
            for body in bodies:
                sub, outer_reads = body_graph(graph, body)
                result = transform(sub)
                results.append(result)
                if result:
                    for domain, version in sub.opset_imports.items():  # a fusion's com.microsoft node
                        graph.opset_imports.setdefault(domain, version)
                new_bodies.append(body_proto(sub, outer_reads, body) if result else body)
            if any(new is not old for new, old in zip(new_bodies, bodies)):
                node.set_subgraphs(name, new_bodies)
    return results

"""Node: one operator call in a graph.

Mirrors include/onnxruntime/core/graph/graph.h (class Node). An Op is the
definition (a schema: op type, domain, since-version, inputs, outputs,
attributes); a Node is one use of an op in one graph, identified by its index.
"""
import weakref

import onnx
from onnx import helper

from ortlab.onnx_defs import node_op_name


class Node:
    """A node: index (identity), name (may be empty), op type, domain, attributes, inputs, outputs."""

    def __init__(self, graph, index, op_type, inputs, outputs, name="", domain="",
                 attributes=(), doc_string=""):
        self._graph = weakref.ref(graph)
        self.index = index
        self.name = name
        self.op_type = op_type
        self.domain = domain
        self.inputs = list(inputs)
        self.outputs = list(outputs)
        self.attribute_protos = {a.name: a for a in attributes}
        self.doc_string = doc_string

    @property
    def graph(self):
        return self._graph()

    @property
    def attributes(self):
        """Attribute values as Python objects (ints, floats, strings, lists, tensors)."""
        return {n: helper.get_attribute_value(a) for n, a in self.attribute_protos.items()}

    def attribute(self, name, default=None):
        """One attribute's value, or `default` when the node does not set it."""
        proto = self.attribute_protos.get(name)
        value = default if proto is None else helper.get_attribute_value(proto)
        return value.decode() if isinstance(value, bytes) else value

    @property
    def input_names(self):
        return [a.name for a in self.inputs]

    @property
    def output_names(self):
        return [a.name for a in self.outputs]

    def implicit_input_names(self):
        """Names this node's subgraphs (the bodies of If, Loop, Scan) read from the graph around them, in
        first-read order: ORT's Node::ImplicitInputDefs."""
        found = []
        for proto in self.attribute_protos.values():
            if proto.type == proto.GRAPH:
                _subgraph_reads(proto.g, found)
            elif proto.type == proto.GRAPHS:
                for sub in proto.graphs:
                    _subgraph_reads(sub, found)
        return list(dict.fromkeys(found))

    def holds_subgraphs(self):
        """True when an attribute of this node is a graph (If's branches, Loop's and Scan's body):
        ORT's Node::ContainsSubgraph."""
        return any(p.type in (p.GRAPH, p.GRAPHS) for p in self.attribute_protos.values())

    def can_rename_implicit_input(self, old, new):
        """True when the subgraphs' reads of the outer value `old` may be renamed `new`: no subgraph of this
        node has a value called `new` already (a graph input, output, initializer, value_info, or a node
        input or output), nor has a nested subgraph that reads `old` one (onnxruntime/core/graph/
        graph_utils.cc, CanUpdateImplicitInputNameInSubgraph). Like ORT, this refuses even when `new` is
        itself an outer value the subgraph already reads, where the rename would be harmless."""
        return old not in self.implicit_input_names() or all(
            _can_rename_in(sub, old, new) for sub in _graphs_of(self.attribute_protos.values()))

    def renames_implicit_input_safely(self, old, new):
        """True when renaming the subgraphs' outer reads of `old` to `new` keeps what they read: no subgraph
        that reads the outer `old` has its own value called `new` (which would shadow the outer one). Looser
        than can_rename_implicit_input: a subgraph that already reads the outer `new` is fine."""
        return all(_renames_safely(sub, old, new) for sub in _graphs_of(self.attribute_protos.values()))

    def rename_implicit_input(self, old, new):
        """Make this node's subgraphs read the outer value `new` where they read the outer value `old`
        (graph_utils.cc, UpdateImplicitInputNameInSubgraph): every read of `old` that is not a subgraph's own
        value, nested subgraphs included, is renamed (a subgraph with a value of its own called `old`, which
        ONNX's single-assignment rule forbids anyway, keeps reading it). The caller checks
        can_rename_implicit_input or renames_implicit_input_safely first."""
        for name, proto in list(self.attribute_protos.items()):
            if proto.type == proto.GRAPH:
                renamed = onnx.AttributeProto()
                renamed.CopyFrom(proto)
                _rename_outer_reads(renamed.g, old, new)
                self.attribute_protos[name] = renamed
            elif proto.type == proto.GRAPHS:
                renamed = onnx.AttributeProto()
                renamed.CopyFrom(proto)
                for sub in renamed.graphs:
                    _rename_outer_reads(sub, old, new)
                self.attribute_protos[name] = renamed

    def subgraphs(self):
        """[(attribute name, [GraphProto, ...])] for each attribute of this node that holds graphs."""
        return [(name, [p.g] if p.type == p.GRAPH else list(p.graphs))
                for name, p in self.attribute_protos.items() if p.type in (p.GRAPH, p.GRAPHS)]

    def set_subgraphs(self, name, bodies):
        """Attribute `name` holds `bodies` (a list of GraphProtos: one for a GRAPH attribute) from now on."""
        proto = self.attribute_protos[name]
        self.attribute_protos[name] = helper.make_attribute(name, bodies[0] if proto.type == proto.GRAPH
                                                            else list(bodies))

    def implicit_input_nodes(self):
        """Producers of the values this node's subgraphs read from outside, one per edge."""
        return [p for name in self.implicit_input_names() if (p := self.graph.producer(name))]

    def input_nodes(self):
        """Producers of this node's inputs, implicit ones included (ORT's Node::InputNodesBegin/End:
        Graph::BuildConnections gives a subgraph's outer reads edges too), one per edge."""
        explicit = [p for a in self.inputs if a.exists() and (p := self.graph.producer(a.name))]
        return explicit + self.implicit_input_nodes()

    def output_nodes(self):
        """Consumers of this node's outputs (ORT's Node::OutputNodesBegin/End), one per edge: one per input
        slot that reads an output, and one per output a consumer's subgraphs read (Graph::BuildConnections
        gives an implicit input an edge too, so a node whose output only a subgraph reads is no leaf)."""
        found = []
        for a in self.outputs:
            if a.exists():
                for c in self.graph.consumers(a.name):
                    found += [c] * (c.input_names.count(a.name) + (a.name in c.implicit_input_names()))
        return found

    @property
    def since_version(self):
        """The opset version of the schema this node resolves to, or None without a schema."""
        schema = self.schema
        return None if schema is None else schema.since_version

    @property
    def schema(self):
        """The onnx.defs.OpSchema this node resolves to under the model's opset, or None.

        None for domains whose schemas onnx.defs does not hold, such as ORT's own
        com.microsoft ops (registered in C++: onnxruntime/core/graph/contrib_ops/
        contrib_defs.cc and orttraining/.../training_op_defs.cc).
        """
        version = self.graph.opset_imports.get(self.domain or "")
        if version is None:
            return None
        try:
            return onnx.defs.get_schema(self.op_type, version, self.domain)
        except onnx.defs.SchemaError:
            return None

    def to_proto(self):
        """The NodeProto, attributes in the order they were set."""
        optional = {"name": self.name, "domain": self.domain, "doc_string": self.doc_string}
        proto = onnx.NodeProto(op_type=self.op_type, **{k: v for k, v in optional.items() if v})
        proto.input.extend(self.input_names)
        proto.output.extend(self.output_names)
        proto.attribute.extend(self.attribute_protos.values())
        return proto

    def __repr__(self):
        name = repr(self.name) if self.name else "(no name)"
        return (f"Node({self.index}, {name}, {node_op_name(self)}, inputs={self.input_names}, "
                f"outputs={self.output_names})")


def node_label(node):
    """How ir's messages name a node: 'name' (#index op_type), or #index op_type (no name)."""
    return f"'{node.name}' (#{node.index} {node.op_type})" if node.name else f"#{node.index} {node.op_type} (no name)"


def subgraph_reads(graph_proto):
    """The names a subgraph (a GraphProto) reads from the graph around it, in first-read order, repeats kept."""
    return _subgraph_reads(graph_proto, [])


def _subgraph_reads(graph_proto, found):
    """Append to `found` the names a subgraph reads without defining them (nested subgraphs included: what
    a nested subgraph reads from this one's inputs or nodes is this one's own, not an outer read)."""
    defined = {i.name for i in graph_proto.input} | {t.name for t in graph_proto.initializer}
    for node in graph_proto.node:
        found += [name for name in node.input if name and name not in defined]
        for attr in node.attribute:
            for sub in ([attr.g] if attr.type == attr.GRAPH else list(attr.graphs)):
                found += [name for name in _subgraph_reads(sub, []) if name not in defined]
        defined.update(node.output)
    return found


def _graphs_of(attributes):
    """The GraphProtos among AttributeProtos (a Node's attribute_protos.values(), a NodeProto's attribute)."""
    found = []
    for attr in attributes:
        found += [attr.g] if attr.type == attr.GRAPH else list(attr.graphs) if attr.type == attr.GRAPHS else []
    return found


def _names_in(graph_proto):
    """Every value name a subgraph has a NodeArg for in ORT: its inputs, outputs, initializers, value_info,
    and its nodes' inputs and outputs (not what only a nested subgraph reads)."""
    names = {v.name for v in list(graph_proto.input) + list(graph_proto.output) + list(graph_proto.value_info)}
    names |= {t.name for t in graph_proto.initializer}
    for node in graph_proto.node:
        names |= set(node.input) | set(node.output)
    return names - {""}


def _can_rename_in(graph_proto, old, new):
    """CanUpdateImplicitInputNameInSubgraph for one subgraph: it has no value called `new`, and neither has any
    subgraph of its nodes whose subgraphs read `old` from outside (checked level by level down)."""
    if new in _names_in(graph_proto):
        return False
    readers = [node for node in graph_proto.node
               if any(old in _subgraph_reads(sub, []) for sub in _graphs_of(node.attribute))]
    return all(_can_rename_in(sub, old, new) for node in readers for sub in _graphs_of(node.attribute))


def _defines(graph_proto, name):
    """True when a subgraph has its own value `name` (an input, initializer or node output), which shadows an
    outer one of that name."""
    return (any(v.name == name for v in graph_proto.input) or any(t.name == name for t in graph_proto.initializer)
            or any(name in node.output for node in graph_proto.node))


def _renames_safely(graph_proto, old, new):
    """False when this subgraph (or one nested in it) reads the outer `old` but has its own `new`."""
    if _defines(graph_proto, old):
        return True
    if old in _subgraph_reads(graph_proto, []) and _defines(graph_proto, new):
        return False
    return all(_renames_safely(sub, old, new) for node in graph_proto.node for sub in _graphs_of(node.attribute))


def _rename_outer_reads(graph_proto, old, new):
    """In place: reads of the outer value `old` in this subgraph and the subgraphs nested in it read `new`."""
    if _defines(graph_proto, old):
        return
    for node in graph_proto.node:
        for i, name in enumerate(node.input):
            if name == old:
                node.input[i] = new
        for sub in _graphs_of(node.attribute):
            _rename_outer_reads(sub, old, new)
    for vi in list(graph_proto.value_info) + list(graph_proto.output):
        if vi.name == old:
            vi.name = new

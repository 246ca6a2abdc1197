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

    def implicit_input_nodes(self):
        """Producers of the values this node's subgraphs read from outside, one per edge."""
        return [p for name in self.implicit_input_names() if (p := self.graph.producer(name))]

    def input_nodes(self):
        """Producers of this node's inputs, implicit ones included (ORT's Node::InputNodesBegin/End:
        Graph::BuildConnections gives a subgraph's outer reads edges too), one per edge."""
        explicit = [p for a in self.inputs if a.exists() and (p := self.graph.producer(a.name))]
        return explicit + self.implicit_input_nodes()

    def output_nodes(self):
        """Consumers of this node's outputs (ORT's Node::OutputNodesBegin/End), one per edge."""
        found = []
        for a in self.outputs:
            if a.exists():
                for c in self.graph.consumers(a.name):
                    found += [c] * c.input_names.count(a.name)
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

"""Graph: nodes, NodeArgs, inputs, outputs and initializers, with producer/consumer maps.

Mirrors include/onnxruntime/core/graph/graph.h and onnxruntime/core/graph/graph.cc
(Graph::Resolve, GetProducerNode, GetConsumerNodes, GetOrCreateNodeArg, AddNode,
RemoveNode) and the edge helpers of onnxruntime/core/optimizer/utils/graph_utils.h.
The maps change only through Graph methods, so they are always right. resolve() applies the
rules of load_rules.py; load_model (model_load.py) reads a file with its external data.
"""
import copy
from pathlib import Path

import numpy as np
import onnx
from onnx import helper, numpy_helper, shape_inference

from ortlab.errors import as_names
from ortlab.ir import load_rules
from ortlab.ir import topological_order as orders
from ortlab.ir.tensor_value import to_array
from ortlab.ir.errors import DuplicateProducerError, GraphError, MissingInputError
from ortlab.ir.model_load import load_model
from ortlab.ir.node import Node, node_label
from ortlab.ir.node_arg import NodeArg, type_of_tensor
from ortlab.ops import schemas
from ortlab.onnx_defs import DEFAULT_OPSET, IR_VERSION, ONNX_DOMAIN, domain_of


class Graph:
    """A mutable ONNX graph with ORT's bookkeeping: node indices, NodeArgs, producers, consumers."""

    def __init__(self, name="graph", opset_imports=None):
        self.name = name
        self.opset_imports = dict(opset_imports or {ONNX_DOMAIN: DEFAULT_OPSET})
        self.inputs, self.outputs = [], []
        self.initializers = {}
        self._nodes = []  # index -> Node, None once removed (indices are never reused)
        self._args = {}
        self._producers, self._consumers = {}, {}  # explicit input slots only; see consumers()
        self._holders = set()  # indices of the nodes that hold subgraphs (If, Loop, Scan, SequenceMap)
        self._missing = NodeArg("", graph=self)
        self.model_fields = {}  # ir_version, producer, metadata, functions, ... kept for to_model()
        self.doc_string = ""

    # --- loading and saving ------------------------------------------------------------------

    @classmethod
    def from_model(cls, model, constants_as_initializers=False):
        """Build a Graph from an onnx.ModelProto (or a path to one).

        Node k is model.graph.node[k] (index k), so a caller that reads the Graph can hand
        back the original NodeProtos: model.graph.node[node.index]. Nothing is checked here
        (unknown ops, ORT's com.microsoft ops, training graphs all load); resolve() checks.
        constants_as_initializers=True does what ORT's Graph constructor does on load
        (graph.cc): each Constant node becomes an initializer named after its output,
        so the node set and node indices are those ORT's own graph has (then node k is no
        longer proto k).
        """
        if isinstance(model, (str, Path)):
            model = load_model(model)
        if not isinstance(model, onnx.ModelProto):
            raise GraphError(f"from_model() takes an onnx.ModelProto or a path, not {type(model).__name__}")
        g = model.graph
        graph = cls(g.name, {o.domain: o.version for o in model.opset_import})
        graph.doc_string = g.doc_string
        keep = ("ir_version", "producer_name", "producer_version", "domain", "model_version",
                "doc_string", "metadata_props", "functions", "training_info", "opset_import")
        graph.model_fields = {f: copy.deepcopy(getattr(model, f)) for f in keep}
        graph.model_fields["sparse_initializer"] = copy.deepcopy(g.sparse_initializer)
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            graph.get_or_create_node_arg(vi.name, vi.type if vi.HasField("type") else None)
        for tensor in g.initializer:
            graph.initializers[tensor.name] = tensor
            graph.get_or_create_node_arg(tensor.name, type_of_tensor(tensor))
        graph.inputs = [vi.name for vi in g.input]
        graph.outputs = [vi.name for vi in g.output]
        for n in g.node:
            if constants_as_initializers and (value := constant_value(n)) is not None:
                graph.add_initializer(n.output[0], value)
                continue
            graph.add_node(n.op_type, list(n.input), list(n.output), name=n.name,
                           domain=n.domain, _attributes=n.attribute, _doc=n.doc_string)
        return graph

    @classmethod
    def load(cls, path):
        return cls.from_model(load_model(path))

    def to_model(self):
        """An onnx.ModelProto: nodes in index order when that is topological, else in ORT's
        default order (as Graph::ToGraphProto writes them); value_info for every known type."""
        order = self.proto_order()
        special = set(self.inputs) | set(self.outputs) | set(self.initializers)
        value_info = [self._value_info(a) for n, a in self._args.items()
                      if n not in special and a.type_proto is not None and n in self._producers]
        graph = helper.make_graph([n.to_proto() for n in order], self.name,
                                  [self._value_info(self._args[n]) for n in self.inputs],
                                  [self._value_info(self._args[n]) for n in self.outputs],
                                  list(self.initializers.values()), doc_string=self.doc_string or None,
                                  value_info=value_info)
        fields = self.model_fields
        graph.sparse_initializer.extend(fields.get("sparse_initializer", []))
        original = {(o.domain, o.version): o for o in fields.get("opset_import", [])}
        model = helper.make_model(graph, opset_imports=[original.get((d, v)) or helper.make_opsetid(d, v)
                                                        for d, v in self.opset_imports.items()])
        for name in ("ir_version", "producer_name", "producer_version", "domain", "model_version",
                     "doc_string"):
            if fields.get(name):
                setattr(model, name, fields[name])
        if "ir_version" not in fields:
            model.ir_version = IR_VERSION
        for name in ("metadata_props", "functions", "training_info"):
            getattr(model, name).extend(fields.get(name, []))
        return model

    def proto_order(self):
        """The live nodes in the order to_model() writes them: index order when that is topological, else
        ORT's default order."""
        try:
            return self.nodes() if orders.is_topological(self.nodes()) else orders.reverse_dfs_order(self)
        except orders.GraphCycleError:
            return self.nodes()  # keep what we have; resolve() explains the cycle

    def renumber(self, order):
        """Number the live nodes 0, 1, ... in `order` (each of them once), in place: the indices a Graph loaded
        from a model listing them so would give (with `proto_order()`, node k is then node k of to_model()).
        The Node objects stay the same; removed nodes leave no gap."""
        order = list(order)
        if len(order) != len(self.nodes()) or {id(n) for n in order} != {id(n) for n in self.nodes()}:
            raise GraphError("renumber() takes every live node of the graph once")
        self._nodes, self._producers, self._consumers = order, {}, {}
        for index, node in enumerate(order):
            node.index = index
            for arg in node.inputs:
                self._link(self._consumers, arg.name, index)
            for arg in node.outputs:
                self._link(self._producers, arg.name, index)
        self._holders = {n.index for n in order if n.holds_subgraphs()}

    def clean_node_args(self):
        """Drop the NodeArgs that no input, output, initializer or live node names (the NodeArg half of ORT's
        Graph::CleanUnusedInitializersAndNodeArgs, which Graph::Resolve runs), and list the others as
        from_model() creates them: inputs, outputs, initializers, then each node's inputs and outputs in index
        order. The NodeArg objects stay the same; to_model() writes value_info in this order."""
        names = list(self.inputs) + list(self.outputs) + list(self.initializers)
        names += [arg.name for node in self.nodes() for arg in node.inputs + node.outputs if arg.exists()]
        self._args = {name: self._args[name] for name in dict.fromkeys(names) if name in self._args}

    def save(self, path):
        onnx.save(self.to_model(), str(path))
        return Path(path)

    @staticmethod
    def _value_info(arg):
        vi = onnx.ValueInfoProto(name=arg.name)
        if arg.type_proto is not None:
            vi.type.CopyFrom(arg.type_proto)
        return vi

    # --- NodeArgs ----------------------------------------------------------------------------

    def get_or_create_node_arg(self, name, type_proto=None):
        """The NodeArg called `name`, created if new; the same object for the same name.

        Like ORT's Graph::GetOrCreateNodeArg, a type given for an existing NodeArg is
        used only when it had none.
        """
        if name == "":
            return self._missing
        arg = self._args.get(name)
        if arg is None:
            arg = self._args[name] = NodeArg(name, type_proto, self)
        elif arg.type_proto is None and type_proto is not None:
            arg.type_proto = type_proto
        return arg

    def node_arg(self, name):
        """The NodeArg called `name`, or None (ORT's Graph::GetNodeArg)."""
        return self._args.get(name)

    def node_args(self):
        """Every NodeArg, in creation order."""
        return list(self._args.values())

    # --- nodes -------------------------------------------------------------------------------

    def nodes(self):
        """Live nodes in index order."""
        return [n for n in self._nodes if n is not None]

    def node(self, index):
        """The live node with this index (ORT's Graph::GetNode); a GraphError for a removed one."""
        if not isinstance(index, int) or isinstance(index, bool):
            raise GraphError(f"node() takes a node index (an int), not {type(index).__name__} {index!r}; "
                             "find a node by name with [n for n in graph.nodes() if n.name == ...]")
        node = self._nodes[index] if 0 <= index < len(self._nodes) else None
        if node is None:
            raise GraphError(f"no node with index {index} (removed, or never added); "
                             f"live indices: {[n.index for n in self.nodes()]}")
        return node

    def add_node(self, op_type, inputs, outputs, name="", domain="", _attributes=(), _doc="",
                 **attributes):
        """Add a node (attributes as keyword arguments); returns it. Its index is the next free one.

        inputs, outputs: lists of value names ('' for an absent optional one); one str is one name."""
        inputs, outputs = (as_names(names, f"{what} of the new {op_type} node", GraphError)
                           for names, what in ((inputs, "inputs"), (outputs, "outputs")))
        if not isinstance(op_type, str) or not op_type:
            raise GraphError(f"add_node() takes the op type as a non-empty str, not {op_type!r}")
        attrs = list(_attributes)
        for k, v in attributes.items():
            try:
                attrs.append(helper.make_attribute(k, v))
            except Exception as exc:
                raise GraphError(f"attribute {k}={v!r} of the new {op_type} node is not an ONNX attribute "
                                 f"value ({str(exc).strip().splitlines()[0][:120]}); use an int, float, str, "
                                 "a list of one of those, a TensorProto or a GraphProto") from None
        node = Node(self, len(self._nodes), op_type,
                    [self.get_or_create_node_arg(i) for i in inputs],
                    [self.get_or_create_node_arg(o) for o in outputs],
                    name=name, domain=domain, attributes=attrs, doc_string=_doc)
        self._nodes.append(node)
        for arg in node.inputs:
            self._link(self._consumers, arg.name, node.index)
        for arg in node.outputs:
            self._link(self._producers, arg.name, node.index)
        if node.holds_subgraphs():
            self._holders.add(node.index)
        return node

    def generate_node_name(self, base):
        """`base`, or `base_<k>`, a name no live node has (Graph::GenerateNodeName)."""
        taken = {n.name for n in self.nodes()}
        name, k = base, 0
        while name in taken:
            k += 1
            name = f"{base}_{k}"
        return name

    def remove_node(self, node):
        """Remove a node and its edges (ORT's Graph::RemoveNode). Its index is not reused."""
        node = self._live(node)
        for arg in node.inputs:
            self._unlink(self._consumers, arg.name, node.index)
        for arg in node.outputs:
            self._unlink(self._producers, arg.name, node.index)
        self._holders.discard(node.index)
        self._nodes[node.index] = None

    def producer(self, name):
        """The node producing `name`, or None for graph inputs, initializers and unknown names
        (GetProducerNode); a DuplicateProducerError when two nodes produce it."""
        found = self._producers.get(name, [])
        if len(found) > 1:
            raise DuplicateProducerError(self._duplicate_message(name, found))
        return self._nodes[found[0]] if found else None

    def consumers(self, name):
        """Nodes reading `name`, each once, in index order: in an input slot, or from inside a subgraph
        (GetConsumerNodes).

        ORT's consumer map counts implicit inputs: Graph::BuildConnections (onnxruntime/core/graph/graph.cc)
        ends with PopulateNodeArgToProducerConsumerLookupsFromNodes, which records a consumer for every def
        Node::ForEachDef visits as an input, and ForEachDef visits ImplicitInputDefs too. So an If whose branch
        reads `name` is one of its consumers, and a rewrite that asks "does anything else read it?" sees it.
        ORT recomputes implicit inputs at Resolve; here they are read from the subgraphs at each call, so a
        subgraph changed after add_node counts at once (a node given its first subgraph after add_node counts
        from the next resolve()). explicit_consumers(name) gives only the nodes with an input slot to rewire.
        """
        _check_name(name)
        found = set(self._consumers.get(name, []))
        found |= {i for i in self._holders if name in self._nodes[i].implicit_input_names()}
        return [self._nodes[i] for i in sorted(found)]

    def explicit_consumers(self, name):
        """Nodes reading `name` in an input slot (Node::InputDefs), each once, in index order."""
        _check_name(name)
        return [self._nodes[i] for i in sorted(set(self._consumers.get(name, [])))]

    def implicit_consumers(self, name):
        """Nodes whose subgraphs read `name` from this graph (Node::ImplicitInputDefs), in index order."""
        _check_name(name)
        return [self._nodes[i] for i in sorted(self._holders) if name in self._nodes[i].implicit_input_names()]

    # --- rewiring (what transformers use) ----------------------------------------------------

    def replace_node_input(self, node, index, name):
        """Make input `index` of `node` read `name` (graph_utils::ReplaceNodeInput)."""
        node = self._live(node)
        self._rewire(node, node.inputs, self._consumers, index, name)

    def replace_node_output(self, node, index, name):
        """Make output `index` of `node` write `name`."""
        node = self._live(node)
        self._rewire(node, node.outputs, self._producers, index, name)

    def _rewire(self, node, args, table, slot, name):
        if not isinstance(slot, int) or not 0 <= slot < len(args):
            which = "input" if args is node.inputs else "output"
            listed = ", ".join(a.name or "''" for a in args)
            raise GraphError(f"node {node_label(node)} has no {which} {slot!r}: it has {len(args)} "
                             f"({listed}), numbered from 0")
        if not isinstance(name, str):
            raise GraphError(f"a value name is a str, not {type(name).__name__} {name!r}")
        self._unlink(table, args[slot].name, node.index)
        args[slot] = self.get_or_create_node_arg(name)
        self._link(table, name, node.index)

    def append_node_output(self, node, name=""):
        """Give `node` one more output, `name` ('' for an absent optional one); returns its index.
        ORT's node.MutableOutputDefs().push_back, with the producer map kept right."""
        node = self._live(node)
        if not isinstance(name, str):
            raise GraphError(f"a value name is a str, not {type(name).__name__} {name!r}")
        node.outputs.append(self.get_or_create_node_arg(name))
        self._link(self._producers, name, node.index)
        return len(node.outputs) - 1

    def has_node(self, node):
        """True when `node` (a Node) is a live node of this graph, i.e. not removed."""
        index = getattr(node, "index", None)
        return (isinstance(index, int) and 0 <= index < len(self._nodes)
                and self._nodes[index] is node)

    def replace_all_uses(self, old, new, exclude=()):
        """Every consumer of `old` (and the graph outputs) reads `new` instead, except the
        nodes in `exclude` (e.g. a node just inserted after `old`). Mirrors
        graph_utils::ReplaceDownstreamNodeInput and GraphEdge::RemoveGraphEdges + re-add: a node whose
        subgraphs read `old` gets them renamed (UpdateImplicitInputNameInSubgraph). When a subgraph
        cannot take the name `new` (can_replace_all_uses), a GraphError, and nothing is changed."""
        _check_name(new)
        skip = {n if isinstance(n, int) else n.index for n in exclude}
        readers = [c for c in self.implicit_consumers(old) if c.index not in skip]
        blocked = [c for c in readers if not c.renames_implicit_input_safely(old, new)]
        if blocked:
            raise GraphError(f"the subgraphs of {', '.join(node_label(c) for c in blocked)} read '{old}' and have "
                             f"a value of their own called '{new}', so renaming their reads would change what "
                             "they read; check graph.can_replace_all_uses(old, new) before rewiring")
        for consumer in readers:
            consumer.rename_implicit_input(old, new)
        for consumer in self.explicit_consumers(old):
            if consumer.index in skip:
                continue
            for i, arg in enumerate(consumer.inputs):
                if arg.name == old:
                    self.replace_node_input(consumer, i, new)
        self.outputs = [new if o == old else o for o in self.outputs]
        self.get_or_create_node_arg(new)

    def can_replace_all_uses(self, old, new, exclude=()):
        """True when replace_all_uses(old, new, exclude) can rename every subgraph read of `old` without
        changing what it reads (no subgraph reading `old` has a value of its own called `new`). ORT's
        eliminations ask more (Node.can_rename_implicit_input, CanUpdateImplicitInputNameInSubgraphs)."""
        skip = {n if isinstance(n, int) else n.index for n in exclude}
        return all(c.renames_implicit_input_safely(old, new) for c in self.implicit_consumers(old)
                   if c.index not in skip)

    # --- initializers and graph inputs/outputs -----------------------------------------------

    def add_initializer(self, name, value):
        """Add (or replace) an initializer from a numpy array or a TensorProto."""
        if not isinstance(name, str) or not name:
            raise GraphError(f"an initializer needs a name (a non-empty str), not {name!r}")
        try:
            tensor = value if isinstance(value, onnx.TensorProto) else numpy_helper.from_array(
                np.asarray(value), name)
        except Exception as exc:
            raise GraphError(f"initializer '{name}': {type(value).__name__} is not a tensor value "
                             f"({type(exc).__name__}); pass a numpy array (numbers, bools or strings) or "
                             "an onnx.TensorProto") from None
        tensor.name = name
        self.initializers[name] = tensor
        arg = self.get_or_create_node_arg(name)
        arg.type_proto = type_of_tensor(tensor)
        return arg

    def add_input(self, name, type_proto=None):
        """Declare `name` a graph input (once), with its NodeArg typed by `type_proto` when given."""
        if not isinstance(name, str) or not name:
            raise GraphError(f"a graph input needs a name (a non-empty str), not {name!r}")
        arg = self.get_or_create_node_arg(name, type_proto)
        if name not in self.inputs:
            self.inputs.append(name)
        return arg

    def remove_initializer(self, name):
        """Drop an initializer (and its graph input, if it is one); its NodeArg stays."""
        self.initializers.pop(name, None)
        if name in self.inputs:
            self.inputs.remove(name)

    def initializer_value(self, name):
        """An initializer as a numpy array."""
        if name not in self.initializers:
            raise GraphError(f"no initializer named {name!r}; initializers: {sorted(self.initializers)[:10]}"
                             f"{'...' if len(self.initializers) > 10 else ''}")
        return to_array(self.initializers[name])

    # --- Resolve -----------------------------------------------------------------------------

    def resolve(self, infer_shapes=True):
        """Check the graph and infer types and shapes; returns the nodes in ORT's default order.

        Like ORT's Graph::Resolve (onnxruntime/core/graph/graph.cc: VerifyNoDuplicateName,
        BuildConnections, VerifyNodeAndOpMatch, InferAndVerifyTypeMatch) and the opset check ORT
        makes on load (onnxruntime/core/graph/model_load_utils.h, ValidateOpsetForDomain): the
        opset imports are ones ORT 1.19.2 supports, no graph input is declared twice, every value
        has exactly one source, every op is known for the model's opset and each node has the
        inputs, outputs and attributes its schema allows, the graph is acyclic, then type and
        shape inference (onnx.shape_inference, strict, types checked) verifies and fills in the
        NodeArgs. Raises a GraphError subclass naming the node. ORT's own com.microsoft ops
        (schemas in C++ only) are checked by onnxruntime when a session loads the model.
        infer_shapes=False skips the inference (and the checks it makes). ORT's own ONNX-domain
        schemas (LayerNormalization-1 and the like, ortlab.ops.schemas) are installed first.
        """
        schemas.install()
        self._holders = {n.index for n in self.nodes() if n.holds_subgraphs()}  # BuildConnections' implicit inputs
        load_rules.check_opsets(self)
        load_rules.check_graph_inputs(self)
        load_rules.check_node_names(self)
        for name, found in self._producers.items():
            if len(found) > 1:
                raise DuplicateProducerError(self._duplicate_message(name, found))
        sources = set(self.inputs) | set(self.initializers) | set(self._producers)
        ctx = None
        for node in self.nodes():
            for arg in node.inputs:
                if arg.exists() and arg.name not in sources:
                    raise MissingInputError(
                        f"node {node_label(node)} reads '{arg.name}', which no node produces and which "
                        "is neither a graph input nor an initializer; add a producer, make it a graph "
                        "input, or fix the name")
            if load_rules.check_op(self, node):
                ctx = ctx or load_rules.checker_context(self)
                load_rules.check_node(self, node, ctx)
        for name in self.outputs:
            if name not in sources:
                raise MissingInputError(f"graph output '{name}' is produced by no node")
        order = orders.reverse_dfs_order(self)
        if infer_shapes:
            load_rules.check_inference(self)
            self._infer_shapes()
        return order

    def topological_order(self, kind="default"):
        """Nodes in ORT's DEFAULT (reverse DFS) or PRIORITY_BASED (Kahn) order."""
        return orders.topological_order(self, kind)

    def _infer_shapes(self):
        try:
            inferred = shape_inference.infer_shapes(self.to_model(), strict_mode=False, data_prop=True)
        except Exception as exc:
            raise GraphError(f"type and shape inference failed: {str(exc).splitlines()[0]}") from None
        g = inferred.graph
        for vi in list(g.value_info) + list(g.output) + list(g.input):
            if vi.name in self._args and vi.HasField("type"):
                self._args[vi.name].type_proto = vi.type

    # --- helpers -----------------------------------------------------------------------------

    def _live(self, node):
        index = node if isinstance(node, int) else node.index
        return self.node(index)

    @staticmethod
    def _link(table, name, index):
        if name:
            table.setdefault(name, []).append(index)

    @staticmethod
    def _unlink(table, name, index):
        if name and index in table.get(name, []):
            table[name].remove(index)
            if not table[name]:
                del table[name]

    def _duplicate_message(self, name, found):
        who = " and ".join(node_label(self._nodes[i]) for i in found)
        return (f"'{name}' is produced by {who}; each value must have exactly one producer. "
                "Rename one of the outputs")

    def __repr__(self):
        return (f"Graph('{self.name}': {len(self.nodes())} nodes, inputs={self.inputs}, "
                f"outputs={self.outputs}, {len(self.initializers)} initializers)")


def _check_name(name):
    if not isinstance(name, str):
        raise GraphError(f"a value name is a str, not {type(name).__name__} {name!r}")


_CONSTANT_DTYPES = {"value_float": np.float32, "value_floats": np.float32,
                    "value_int": np.int64, "value_ints": np.int64}


def constant_value(node):
    """The tensor a Constant node holds (a TensorProto or numpy array), or None for other nodes
    and for sparse or string constants."""
    if node.op_type != "Constant" or domain_of(node.domain) != ONNX_DOMAIN or len(node.attribute) != 1:
        return None
    attr = node.attribute[0]
    if attr.name == "value":
        return copy.deepcopy(attr.t)
    if attr.name in _CONSTANT_DTYPES:
        return np.array(helper.get_attribute_value(attr), dtype=_CONSTANT_DTYPES[attr.name])
    return None

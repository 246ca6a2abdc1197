"""Build the backward graph of a model: the gradient of a scalar loss w.r.t. chosen values.

Mirrors orttraining/orttraining/core/framework/gradient_graph_builder.h/.cc:
- forward reachability from the x's (skipping STOP_GRADIENT_EDGES and non-float values),
- backward reachability from the loss, whose intersection is the set of nodes to differentiate,
- a seed `<loss>_grad = 1`, then each node's builder in reverse topological order,
- contributions to one value from several consumers added by a Sum node (AccumulateGrad_<name>).
"""
import copy
import difflib
from collections import deque
from collections.abc import Mapping

import numpy as np
import onnx
from onnx import TensorProto

from ortlab.errors import OrtlabError, as_names
from ortlab.gradients.builder_base import MS, GradientBuilderBase, GradientBuilderError
from ortlab.gradients.graph_augmenter import GraphDefs, augment_graph
from ortlab.gradients.registry import get_gradient_builder, stop_edges
from ortlab.ir import Graph

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}


class GradientGraphError(OrtlabError):
    """The gradient graph cannot be built: a bad x or loss (see the message)."""


class GradientGraphBuilder:
    """Builds forward + backward graph; `build()` returns the onnx.ModelProto."""

    def __init__(self, model, x_names, loss_name, stop_gradient_edges=None):
        x_names, loss_name = check_x_names(x_names), check_loss_name(loss_name)
        if not isinstance(model, onnx.ModelProto):
            raise GradientGraphError(f"the model must be an onnx.ModelProto, not {type(model).__name__}")
        self.graph = Graph.from_model(model)
        self.graph.resolve()
        self.x_names, self.loss = x_names, loss_name
        self.extra_stops = check_stop_gradient_edges(self.graph, stop_gradient_edges)
        self._used = {a.name for a in self.graph.node_args()}
        self._check_inputs()
        self._used.update(f"{x}_grad" for x in self.x_names)  # reserved for the outputs

    # --- names -------------------------------------------------------------------------------

    def unique(self, name, reserve=True):
        candidate, k = name, 0
        while candidate in self._used:
            k += 1
            candidate = f"{name}_{k}"
        if reserve:
            self._used.add(candidate)
        return candidate

    # --- validation ----------------------------------------------------------------------------

    def _check_inputs(self):
        loss = self.graph.node_arg(self.loss)
        if loss is None or self.graph.producer(self.loss) is None:
            raise GradientGraphError(f"the loss {self.loss!r} is not produced by any node of the graph; "
                                     f"graph outputs are {self.graph.outputs}")
        if loss.shape is not None and any(d != 1 for d in loss.shape):
            raise GradientGraphError(f"the loss {self.loss!r} has shape {loss.shape}; it must be a scalar "
                                     "(reduce it, e.g. with ReduceSum or ReduceMean)")
        if not self.x_names:
            raise GradientGraphError("no x given: name the inputs or initializers to differentiate")
        for x in self.x_names:
            arg = self.graph.node_arg(x)
            if arg is None:
                raise GradientGraphError(f"x {x!r} is not a value of the graph; inputs: {self.graph.inputs}, "
                                         f"initializers: {sorted(self.graph.initializers)[:8]}...")
            if arg.elem_type is not None and arg.elem_type not in FLOAT_TYPES:
                raise GradientGraphError(f"x {x!r} is of type {arg.dtype}; only floating-point values "
                                         "have gradients")

    # --- reachability ----------------------------------------------------------------------------

    def stopped_edges(self):
        """(node, input index, input name) of every edge that carries no gradient here."""
        return [(n, i, n.inputs[i].name) for n in self.graph.nodes()
                for i in sorted(stop_edges(n.op_type, n.domain, self.extra_stops))
                if i < len(n.inputs) and n.inputs[i].exists()]

    def _differentiable_slots(self, node, values):
        stops = stop_edges(node.op_type, node.domain, self.extra_stops)
        return [i for i, a in enumerate(node.inputs) if a.exists() and i not in stops and a.name in values]

    def _is_float(self, name):
        et = self.graph.node_arg(name).elem_type
        return et is None or et in FLOAT_TYPES

    def reachable_values(self):
        """Values that depend on some x through differentiable edges (x's included)."""
        values, queue = set(self.x_names), deque(self.x_names)
        while queue:
            for consumer in self.graph.consumers(queue.popleft()):
                if self._differentiable_slots(consumer, values):
                    for out in consumer.outputs:
                        if out.exists() and out.name not in values and self._is_float(out.name):
                            values.add(out.name)
                            queue.append(out.name)
        return values

    def nodes_to_differentiate(self, values=None):
        """Indices of the nodes on some path from an x to the loss (reverse BFS from the loss's
        producer over differentiable edges)."""
        values = self.reachable_values() if values is None else values
        if self.loss not in values:
            raise GradientGraphError(f"the loss {self.loss!r} does not depend on any x "
                                     f"({', '.join(self.x_names)}) through differentiable edges")
        start = self.graph.producer(self.loss)
        seen, queue = {start.index}, deque([start])
        while queue:
            node = queue.popleft()
            for i in self._differentiable_slots(node, values):
                producer = self.graph.producer(node.inputs[i].name)
                if producer is not None and producer.index not in seen:
                    seen.add(producer.index)
                    queue.append(producer)
        return seen

    # --- building ------------------------------------------------------------------------------

    def build(self):
        values = self.reachable_values()
        relevant = self.nodes_to_differentiate(values)
        reached = {n.inputs[i].name for n in self.graph.nodes() if n.index in relevant
                   for i in self._differentiable_slots(n, values)}
        for x in self.x_names:
            if x not in reached:
                raise GradientGraphError(f"x {x!r} does not affect the loss {self.loss!r}: no path "
                                         "of differentiable edges leads from it to the loss")
        seed = self.unique(f"{self.loss}_grad")
        loss_type = self.graph.node_arg(self.loss)
        dtype = onnx.helper.tensor_dtype_to_np_dtype(loss_type.elem_type or TensorProto.FLOAT)
        self.graph.add_initializer(seed, np.ones(loss_type.shape or [], dtype=dtype))
        self.contributions = {self.loss: [seed]}
        self.grad_nodes, self.constants = [], {}
        self.grad_of = {}  # gradient name -> the forward value it is the gradient of (same type and shape)
        order = [n for n in self.graph.topological_order() if n.index in relevant]
        for node in reversed(order):
            self._differentiate(node, values)
        outputs = [self._finish(x, final=f"{x}_grad") for x in self.x_names]
        return self._assemble(outputs)

    def _differentiate(self, node, values):
        incoming = {i: g for i, out in enumerate(node.outputs)
                    if out.exists() and (g := self._finish(out.name)) is not None}
        if not incoming:
            return
        required = set(self._differentiable_slots(node, values))
        builder = get_gradient_builder(node.op_type, node.domain, node.name or f"#{node.index}")
        b = GradientBuilderBase(self.graph, node, incoming, required, self.unique)
        grads = _gradient_names(node, required, builder(b))
        self.grad_nodes += b.emitted
        self.constants.update(b.initializers)
        for i in sorted(required):
            self.contributions.setdefault(node.inputs[i].name, []).append(grads[i])
            self.grad_of.setdefault(grads[i], node.inputs[i].name)

    def _finish(self, value, final=None):
        """The name of `value`'s whole gradient: its one contribution, or their Sum.
        `final` (the x's `<x>_grad`) renames the result, as ORT names x gradients."""
        parts = self.contributions.pop(value, [])
        if not parts:
            return None
        if len(parts) == 1 and final is None:  # named '<value>_grad' as ORT does, when free to
            target = self.unique(f"{value}_grad", reserve=False)
            if not self._rename_output(parts[0], target):
                return parts[0]
            return self.unique(target)
        target = final or self.unique(f"{value}_grad")
        self.grad_of[target] = value
        if len(parts) > 1:
            self.grad_nodes.append(onnx.helper.make_node("Sum", parts, [target], name=f"AccumulateGrad_{target}"))
        elif not self._rename_output(parts[0], target):
            self.grad_nodes.append(onnx.helper.make_node("Identity", parts, [target], name=f"{target}_Identity"))
        return target

    def _rename_output(self, old, new):
        """Let the gradient node producing `old` write `new` instead, if nothing else reads `old`."""
        producers = [n for n in self.grad_nodes if old in n.output]
        if not producers or any(old in n.input for n in self.grad_nodes):
            return False
        outputs = producers[0].output
        outputs[list(outputs).index(old)] = new
        if old in self.grad_of:
            self.grad_of[new] = self.grad_of.pop(old)
        return True

    def graph_defs(self, x_grads):
        """What the backward pass adds to the forward graph, as ORT hands it to its GraphAugmenter: the
        live gradient nodes, the constants they read, and the x gradients as new graph outputs (after
        the forward graph's own outputs, as ORT keeps them)."""
        live = _live(self.grad_nodes, set(x_grads))
        read = {i for n in live for i in n.input}
        return GraphDefs(node_defs=live, initializers={k: v for k, v in self.constants.items() if k in read},
                         graph_outputs=list(x_grads))

    def _assemble(self, x_grads):
        defs = self.graph_defs(x_grads)
        if any(n.domain == MS for n in defs.node_defs):
            self.graph.opset_imports.setdefault(MS, 1)
        # ORT resolves the augmented graph; ortlab cannot here, because ORT registers training ops such as
        # MaxPoolGrad and ConvGrad in the ONNX domain, where onnx knows no schema: ORT's session load checks them.
        augment_graph(self.graph, defs, resolve=False)
        self._type_gradients()
        return self.graph.to_model()

    def _type_gradients(self):
        """Give every gradient the type and shape of its forward value where it has none, as
        ORT's GradientGraphBuilder does; ORT's kernels that read their output's static shape
        (MaxPoolGrad, AveragePoolGrad) crash the session without it."""
        for grad, value in self.grad_of.items():
            source, arg = self.graph.node_arg(value), self.graph.node_arg(grad)
            if source is not None and source.type_proto is not None and arg is not None:
                self.graph.get_or_create_node_arg(grad, copy.deepcopy(source.type_proto))


def check_x_names(x_names, error=GradientGraphError):
    """The x's as a list of names: a list (tuple, set...) of str, or one str as one name
    (not its letters). The same rule for every function of ortlab.gradients."""
    names = as_names(x_names, "x_names", error)
    for x in names:
        if not x:
            raise error(f"x_names must hold value names (non-empty str), got {x!r}")
    if not names:
        raise error("no x given: name the inputs or initializers to differentiate")
    twice = sorted({x for x in names if names.count(x) > 1})
    if twice:
        raise error(f"x_names names {twice[0]!r} more than once; name each x once")
    return names


def check_loss_name(loss_name, error=GradientGraphError):
    if not isinstance(loss_name, str) or not loss_name:
        raise error(f"loss_name must be the name (a non-empty str) of the scalar value to "
                    f"differentiate, not {loss_name!r}")
    return loss_name


def check_stop_gradient_edges(graph, edges):
    """{op_type: set of input indices} from what a user passed, checked against the graph:
    a mapping of op type (str) to an index or a collection of indices; every op type must be one
    the graph has and every index must be an input position the op can have (as ORT's
    register_custom_stop_gradient_edges takes {op_type: {indices}})."""
    if edges is None:
        return {}
    example = "e.g. stop_gradient_edges={'Mul': {1}}"
    if not isinstance(edges, Mapping):
        raise GradientGraphError(f"stop_gradient_edges must be a dict {{op type: input indices}}, {example}; "
                                 f"got {type(edges).__name__} {edges!r}"[:300])
    present = {}
    for node in graph.nodes():
        present.setdefault(node.op_type, []).append(node)
    checked = {}
    for op_type, indices in edges.items():
        if not isinstance(op_type, str):
            raise GradientGraphError(f"stop_gradient_edges keys are op types (str), got {op_type!r}; {example}")
        if op_type not in present:
            close = difflib.get_close_matches(op_type, list(present), n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise GradientGraphError(f"stop_gradient_edges names op type {op_type!r}, but no node of the "
                                     f"graph has that op type{hint}; op types present: "
                                     f"{', '.join(sorted(present))}")
        if isinstance(indices, int) and not isinstance(indices, bool):
            indices = {indices}
        try:
            indices = set(indices)
        except TypeError:
            raise GradientGraphError(f"stop_gradient_edges[{op_type!r}] must be an input index or a set of "
                                     f"them, not {type(indices).__name__}; {example}") from None
        limit = _max_inputs(present[op_type])
        for i in sorted(indices, key=repr):
            if not isinstance(i, int) or isinstance(i, bool) or not 0 <= i < limit:
                raise GradientGraphError(
                    f"stop_gradient_edges[{op_type!r}] holds {i!r}, which is not an input index of "
                    f"{op_type} (it takes inputs 0 to {limit - 1}); indices count from 0")
        checked[op_type] = indices
    return checked


def _max_inputs(nodes):
    """How many inputs an op can take: its schema's maximum, else the most any node of it has."""
    most = max(len(n.inputs) for n in nodes)
    schema = nodes[0].schema
    return max(most, schema.max_input) if schema is not None else most


def _gradient_names(node, required, grads):
    """A builder's result, checked: a gradient name (str) for every input that needs one."""
    what = f"the {node.op_type} builder (node {node.name or node.index})"
    if not isinstance(grads, (list, tuple)):
        raise GradientBuilderError(f"{what} returned {type(grads).__name__}; return a list with one "
                                   "gradient name per forward input (None where b.needs(i) is False)")
    grads = list(grads) + [None] * (len(node.inputs) - len(grads))
    for i in sorted(required):
        if not isinstance(grads[i], str) or not grads[i]:
            got = "nothing" if grads[i] is None else repr(grads[i])
            raise GradientBuilderError(
                f"{what} returned {got} for input {i} ({node.inputs[i].name}), which needs a gradient: "
                "return the name of the value holding it (what b.emit returns, or b.GI(i))")
    return grads


def _live(nodes, wanted):
    """The gradient nodes something needs (dead-code elimination from the wanted outputs)."""
    needed, keep = set(wanted), []
    for node in reversed(nodes):
        if any(o in needed for o in node.output):
            keep.append(node)
            needed.update(i for i in node.input if i)
    return keep[::-1]


def build_gradient_graph(model, x_names, loss_name, stop_gradient_edges=None):
    """A model computing `loss_name` and `<x>_grad` for every x, runnable in ORT's training build.

    x_names: the values to differentiate (a list of names, or one name as a str).
    stop_gradient_edges: {op_type: {input indices}} added to ORT's table of edges that never
    carry a gradient (an op type the graph lacks, or an index the op cannot have, raises).
    """
    return GradientGraphBuilder(model, x_names, loss_name, stop_gradient_edges).build()

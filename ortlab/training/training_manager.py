"""Turn an exported forward graph into a forward model and a backward model, and run them.

Mirrors orttraining/orttraining/python/training/ortmodule/_training_manager.py with
orttraining/orttraining/core/framework/ortmodule_graph_builder.cc: ORT builds one training
graph (forward + gradient) and splits it at a YieldOp, so that the forward run returns the
module's outputs plus the activations the backward needs, and the backward run, given the
gradients of the outputs, returns the gradients of the inputs and parameters. Here the split
is two ONNX models run by two InferenceSessions; the stashed activations travel between them.

The gradient graph needs a scalar to differentiate: for outputs Y_k with incoming gradients
G_k, loss = sum_k ReduceSum(Y_k * G_k), whose gradient w.r.t. any x is the vector-Jacobian
product torch's backward asks for.
"""
import copy
from dataclasses import dataclass

import onnx
import torch
from onnx import TensorProto, helper

from ortlab.env import providers as default_providers
from ortlab.errors import OrtlabError
from ortlab.gradients import build_gradient_graph, ort_gradient_graph
from ortlab.ir import Graph

FLOAT_TYPES = {TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16}
GRAD_OUTPUT = "{}_grad_output"
LOSS = "ortlab_vjp_loss"
BUILDERS = ("ort", "ortlab")


class TrainingGraphError(OrtlabError):
    """The training graph could not be built or split (the message says why)."""


def _elem_types(model):
    inferred = onnx.shape_inference.infer_shapes(model)
    values = list(inferred.graph.input) + list(inferred.graph.output) + list(inferred.graph.value_info)
    return {v.name: v.type.tensor_type.elem_type for v in values}


def add_vjp_loss(model, output_names):
    """A copy of `model` with G_k inputs and the scalar LOSS = sum_k ReduceSum(Y_k * G_k).

    Only floating-point outputs take part; returns (model, differentiable output names).
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    types = _elem_types(model)
    outputs = [n for n in output_names if types.get(n) in FLOAT_TYPES]
    terms = []
    for name in outputs:
        grad = GRAD_OUTPUT.format(name)
        model.graph.input.append(helper.make_tensor_value_info(grad, types[name], None))
        product, term = f"{name}_vjp_product", f"{name}_vjp_term"
        model.graph.node.extend([helper.make_node("Mul", [name, grad], [product], name=f"{name}_vjp_mul"),
                                 helper.make_node("ReduceSum", [product], [term], keepdims=0,
                                                  name=f"{name}_vjp_sum")])
        if types[name] != TensorProto.FLOAT:
            model.graph.node.append(helper.make_node("Cast", [term], [term + "_f"], to=TensorProto.FLOAT))
            term += "_f"
        terms.append(term)
    if terms:  # Add, not Sum: ORT 1.19.2 has no gradient builder for Sum
        total = terms[0]
        for k, term in enumerate(terms[1:], 1):
            model.graph.node.append(helper.make_node("Add", [total, term], [f"vjp_partial_{k}"]))
            total = f"vjp_partial_{k}"
        model.graph.node.append(helper.make_node("Identity", [total], [LOSS], name="vjp_loss"))
        model.graph.output.append(helper.make_tensor_value_info(LOSS, TensorProto.FLOAT, []))
    return model, outputs


def build_training_graph(model, output_names, x_names, builder="ort"):
    """Forward + backward graph of the VJP loss w.r.t. x_names, by ORT's C++ builder or ortlab's."""
    if builder not in BUILDERS:
        raise TrainingGraphError(f"gradient_builder must be one of {BUILDERS}, not {builder!r}")
    with_loss, differentiable = add_vjp_loss(model, output_names)
    if not differentiable:
        raise TrainingGraphError("no floating-point output: nothing to differentiate; call the "
                                 "module under torch.no_grad() or return a float tensor")
    build = ort_gradient_graph if builder == "ort" else build_gradient_graph
    return build(with_loss, x_names, LOSS), differentiable


def _used_initializers(graph, nodes):
    """The initializers (TensorProtos) that `nodes` (Nodes of the ortlab.ir `graph`) read."""
    indices = {n.index for n in nodes}
    return [t for name, t in graph.initializers.items() if _read_by(graph, name, indices)]


def _read_by(graph, name, indices):
    """True when a node whose index is in `indices` reads the value `name`."""
    return any(c.index in indices for c in graph.consumers(name))


def _initializer_outputs(graph, outputs, nodes):
    """The module's outputs that are initializers of the training graph and no node of `nodes` reads (a
    constant output, torch.ones(2): the gradient builder folds its Constant node into an initializer)."""
    return [t for name, t in graph.initializers.items()
            if name in outputs and not _read_by(graph, name, {n.index for n in nodes})]


def _forward_and_backward(graph, forward_graph):
    """Nodes of the training `graph` that compute a value of `forward_graph` (their first
    output has a producer there), and the others."""
    fwd, bwd = [], []
    for node in graph.nodes():
        first = next((o.name for o in node.outputs if o.exists()), None)
        (fwd if first is not None and forward_graph.producer(first) else bwd).append(node)
    return fwd, bwd


@dataclass
class SplitModels:
    """The forward and backward models of one training graph, and what flows between them."""

    forward: onnx.ModelProto
    backward: onnx.ModelProto
    stashed: list          # forward values the backward reads (ORT's stashed activations)
    backward_inputs: list  # graph inputs (user inputs, parameters) the backward also reads
    grad_outputs: list     # output names whose gradients the backward takes
    gradients: dict        # x name -> gradient output name


def split_training_graph(training, forward_model, outputs, differentiable, x_names):
    """Split `training` (forward + backward nodes) where ORT puts its YieldOp.

    A node is forward when it computes a value of `forward_model`; every other node is part
    of the backward. Values crossing from forward nodes to backward nodes are stashed: the
    forward model outputs them after the module's own outputs.
    """
    graph = Graph.from_model(training)
    fwd, bwd = _forward_and_backward(graph, Graph.from_model(forward_model))
    grad_inputs = [GRAD_OUTPUT.format(o) for o in differentiable]
    in_bwd = {n.index for n in bwd}
    stashed = [o.name for n in fwd for o in n.outputs if o.exists() and _read_by(graph, o.name, in_bwd)]
    backward_inputs = [i for i in graph.inputs if _read_by(graph, i, in_bwd) and i not in grad_inputs]
    gradients = {x: f"{x}_grad" for x in x_names}
    missing = [g for g in gradients.values() if graph.producer(g) not in bwd]
    if missing:
        raise TrainingGraphError(f"the gradient graph computes no {missing}; is every x connected?")
    inputs_by_name = {i.name: i for i in training.graph.input}
    forward = helper.make_graph(
        [training.graph.node[n.index] for n in fwd], "forward",
        [inputs_by_name[i] for i in graph.inputs if i not in grad_inputs],
        [onnx.ValueInfoProto(name=o) for o in outputs + [s for s in stashed if s not in outputs]],
        _used_initializers(graph, fwd) + _initializer_outputs(graph, outputs, fwd))
    produced = {o for n in bwd for o in training.graph.node[n.index].output}
    backward = helper.make_graph(
        [training.graph.node[n.index] for n in bwd], "backward", [],
        [onnx.ValueInfoProto(name=g) for g in gradients.values()], _used_initializers(graph, bwd),
        value_info=[v for v in training.graph.value_info if v.name in produced])  # dX shapes the builder knew
    make = lambda g: helper.make_model(g, opset_imports=training.opset_import, ir_version=training.ir_version)
    return SplitModels(make(forward), make(backward), stashed, backward_inputs, grad_inputs, gradients)


# Gradient ops whose kernel in ORT 1.19.2 reads dX's shape from the graph, not from its inputs
# (orttraining/orttraining/training_ops/cpu/nn/pool_gradient_op.cc): with a symbolic dim MaxPoolGrad crashes
# the process and AveragePoolGrad returns an empty gradient.
SHAPE_READING_GRADIENTS = ("MaxPoolGrad", "AveragePoolGrad")
SHAPE_READING_FORWARD = ("MaxPool", "AveragePool")


def refuse_shape_reading_gradients(backward):
    """Refuse a backward model holding a gradient op whose dX has no fully static shape in the graph
    (MiniORTModule builds for the inputs' concrete shapes when the forward holds a pooling op, as ORTModule
    does; this guards any other way such a graph could arise)."""
    static = {v.name for v in backward.graph.value_info
              if v.type.tensor_type.HasField("shape")
              and all(d.HasField("dim_value") for d in v.type.tensor_type.shape.dim)}
    found = sorted({n.op_type for n in backward.graph.node
                    if n.op_type in SHAPE_READING_GRADIENTS and not all(o in static for o in n.output if o)})
    if found:
        raise TrainingGraphError(
            f"the backward graph holds {', '.join(found)}, whose ORT 1.19.2 kernel reads dX's shape from the "
            "graph, and dX's shape is not static there, so ORT would crash "
            "(MaxPoolGrad) or return an empty gradient (AveragePoolGrad). Train this model with the real "
            "ORTModule (it builds the gradient graph for the inputs' concrete shapes), or use "
            "GlobalAveragePool or a strided Conv instead of the pooling layer")


def typed_inputs(model, names, types):
    """Give `model` graph inputs `names` typed from `types` ({name: (elem_type, dims)}, None for a dynamic dim)."""
    for name in names:
        elem, dims = types[name]
        model.graph.input.append(helper.make_tensor_value_info(name, elem, list(dims)))
    return model


def with_input_shapes(model, shapes):
    """A copy of `model` whose graph inputs named in `shapes` ({name: tuple of ints}) have those static dims,
    its other value shapes left to inference: ORTModule hands its graph builder the inputs' concrete
    shapes the same way (OrtModuleGraphBuilder.build(input_shapes))."""
    model = copy.deepcopy(model)
    for value in model.graph.input:
        if value.name in shapes:
            value.CopyFrom(helper.make_tensor_value_info(value.name, value.type.tensor_type.elem_type,
                                                         list(shapes[value.name])))
    for value in model.graph.output:
        value.CopyFrom(helper.make_tensor_value_info(value.name, value.type.tensor_type.elem_type, None))
    del model.graph.value_info[:]
    return model


def needs_static_shapes(model):
    """True when the model holds a forward op whose ORT gradient reads dX's shape from the graph."""
    return any(n.op_type in SHAPE_READING_FORWARD for n in model.graph.node)


def ort_type(session_arg):
    """(elem_type, dims) of an ORT NodeArg, None for a symbolic dim: tensor(float) [2, 'n'] -> (1, [2, None])."""
    name = session_arg.type[len("tensor("):-1]  # float, int64, bfloat16...: TensorProto's names in lower case
    return TensorProto.DataType.Value(name.upper()), [d if isinstance(d, int) else None for d in session_arg.shape]


def to_numpy(tensor):
    return tensor.detach().contiguous().cpu().numpy()


class ORTModuleFunction(torch.autograd.Function):
    """Forward and backward of a MiniORTModule in ORT, seen by torch as one autograd node.

    Mirrors the `_ORTModuleFunction` that _training_manager.py creates: torch calls
    backward() with the outputs' gradients; the parameters are inputs of the function, so
    their gradients land in `.grad` through torch's own AccumulateGrad (hooks included).
    """

    @staticmethod
    def forward(ctx, runner, *tensors):
        outputs, stash = runner.run_forward(tensors)
        ctx.runner, ctx.stash, ctx.inputs = runner, stash, tensors
        results = [torch.from_numpy(o) for o in outputs]
        ctx.mark_non_differentiable(*[r for r in results if not r.is_floating_point()])
        device = next((t.device for t in tensors), torch.device("cpu"))
        return tuple(r.to(device) for r in results)

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, *grad_outputs):
        grads = ctx.runner.run_backward(ctx.stash, ctx.inputs, grad_outputs)
        ctx.stash = None
        return (None, *grads)


def _session(model, providers, level, runtime="ort"):
    """An inference session over one of the two models: onnxruntime's, or ortlab.engine's."""
    if runtime == "ortlab":
        from ortlab.engine import InferenceSession, SessionOptions  # lazy: runtime='ortlab' only; loads the engine

        return InferenceSession(model, SessionOptions(graph_optimization_level=level), providers)
    from ortlab import session  # lazy: ortlab.session imports onnxruntime (2 s)

    return session.create(model, session.session_options(level), providers)


def _run(session, fetches, feeds, which):
    """session.run, with ORT's run-time error (a shape the export's graph cannot take...) as a
    TrainingGraphError: the same module is then wrong in PyTorch too, or the export fixed a size."""
    from ortlab.session import SessionError, run_session  # lazy: ortlab.session imports onnxruntime (2 s)

    try:
        return run_session(session, fetches, feeds)
    except SessionError as exc:
        raise TrainingGraphError(f"ORT's {which} run failed: {exc}; check the input against what "
                                 "the module expects (PyTorch would fail on it too), or whether the "
                                 "export baked in a size") from None


class TrainingManager:
    """The two sessions of one export and one set of trainable values, and how to feed them.

    feed_names: the graph inputs in the order the autograd function receives them (the
    used user inputs, then parameters, then buffers); x_names: those that need gradients.
    """

    def __init__(self, exported, feed_names, x_names, builder="ort", providers=None, level="basic", runtime="ort",
                 input_shapes=None):
        self.feed_names, self.x_names = list(feed_names), list(x_names)
        self.outputs = exported.output_names
        providers = providers or (None if runtime == "ortlab" else default_providers())
        forward = exported.processed if input_shapes is None else with_input_shapes(exported.processed, input_shapes)
        self.input_shapes = input_shapes
        self.training, differentiable = build_training_graph(forward, self.outputs, self.x_names, builder)
        self.split = split_training_graph(self.training, forward, self.outputs, differentiable, self.x_names)
        self.forward_session = _session(self.split.forward, providers, level, runtime)
        types = {a.name: ort_type(a) for a in self.forward_session.get_outputs()}
        types.update({a.name: ort_type(a) for a in self.forward_session.get_inputs()})
        grad_types = {g: types[o] for o, g in zip(differentiable, self.split.grad_outputs)}
        typed_inputs(self.split.backward, self.split.stashed + self.split.backward_inputs, types)
        typed_inputs(self.split.backward, self.split.grad_outputs, grad_types)
        refuse_shape_reading_gradients(self.split.backward)
        self.backward_session = _session(self.split.backward, providers, level, runtime)
        self._forward_feeds = {a.name for a in self.forward_session.get_inputs()}
        self._backward_feeds = {a.name for a in self.backward_session.get_inputs()}
        self._fetches = self.outputs + [s for s in self.split.stashed if s not in self.outputs]

    def run_forward(self, tensors):
        """Module outputs (numpy) and the stash {name: array} the backward will need."""
        feeds = {n: to_numpy(t) for n, t in zip(self.feed_names, tensors) if n in self._forward_feeds}
        values = _run(self.forward_session, self._fetches, feeds, "forward")
        by_name = dict(zip(self._fetches, values))
        return values[:len(self.outputs)], {s: by_name[s] for s in self.split.stashed}

    def run_backward(self, stash, tensors, grad_outputs):
        """Gradients for each fed tensor (None for those not in x_names), as torch tensors."""
        feeds = dict(stash)
        given = dict(zip(self.feed_names, tensors))
        feeds.update({n: to_numpy(given[n]) for n in self.split.backward_inputs})
        grads_by_output = dict(zip(self.outputs, grad_outputs))
        for grad_name in self.split.grad_outputs:
            output = grad_name[:-len(GRAD_OUTPUT.format(""))]
            feeds[grad_name] = to_numpy(grads_by_output[output])
        names = [self.split.gradients[x] for x in self.x_names]
        feeds = {n: v for n, v in feeds.items() if n in self._backward_feeds}
        values = dict(zip(self.x_names, _run(self.backward_session, names, feeds, "backward")))
        return [torch.from_numpy(values[n]).to(given[n].device, given[n].dtype) if n in values else None
                for n in self.feed_names]


class InferenceManager:
    """One session over the processed graph: outputs only, no gradients (ORT's _inference_manager.py)."""

    def __init__(self, exported, feed_names, providers=None, level="basic", runtime="ort"):
        self.feed_names, self.outputs = list(feed_names), exported.output_names
        providers = providers or (None if runtime == "ortlab" else default_providers())
        self.session = _session(exported.processed, providers, level, runtime)

    def run(self, tensors):
        device = next((t.device for t in tensors), torch.device("cpu"))
        values = _run(self.session, self.outputs, dict(zip(self.feed_names, map(to_numpy, tensors))), "forward")
        return [torch.from_numpy(v).to(device) for v in values]

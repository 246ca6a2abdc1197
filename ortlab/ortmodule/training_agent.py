"""ORTModule one layer down: OrtModuleGraphBuilder builds the graphs, TrainingAgent runs them.

What ORTModule does after its export, called directly from Python through onnxruntime's pybind
module (onnxruntime.capi._pybind_state, here `C`), with no ORTModule object anywhere:

1. `C.OrtModuleGraphBuilder().initialize(model bytes, C.OrtModuleGraphBuilderConfiguration)`, then
   `build(C.TrainingGraphTransformerConfiguration())`: the forward graph (`get_forward_model`), the
   training graph (`get_gradient_model`: forward, a YieldOp, the backward) and `get_graph_info`.
   Mirrors onnxruntime/training/ortmodule/_graph_execution_manager.py (_initialize_graph_builder,
   _build_graph); C++: orttraining/orttraining/core/framework/ortmodule_graph_builder.cc.
2. One InferenceSession over the training graph, and `C.TrainingAgent(session._sess, feed names,
   forward output devices, backward fetch names, backward output devices, rank)`.
   Mirrors ortmodule/_execution_agent.py (TrainingAgent) and _training_manager.py
   (_create_execution_agent); C++: orttraining/orttraining/core/agent/training_agent.cc.
3. `run_forward(feeds, fetches, C.PartialGraphExecutionState(), cache)` runs up to the YieldOp and
   returns the module's outputs; `run_backward(output grads, fetches, the same state)` resumes after
   it and returns the gradients. Tensors cross by dlpack, without a copy, as ORTModule's do
   (_training_manager.py: execution_session_run_forward and _ORTModuleFunction.backward).
The pybind definitions: orttraining/orttraining/python/orttraining_pybind_state.cc.
"""
from dataclasses import dataclass

import onnx
import torch
from onnx import helper
from torch.utils.dlpack import from_dlpack, to_dlpack

from ortlab.env import capi, quiet_import
from ortlab.errors import OrtlabError
from ortlab.training.graph_transition_manager import GraphTransitionManager, input_names
from ortlab.training.io import flatten_inputs

GRAPH_INFO_FIELDS = ("user_input_names", "initializer_names", "initializer_names_to_train",
                     "initializer_grad_names_to_train", "user_input_grad_names", "user_output_names",
                     "module_output_gradient_name", "output_grad_indices_non_differentiable",
                     "output_grad_indices_require_full_shape",
                     "module_output_indices_requires_save_for_backward", "frontier_node_arg_map",
                     "cached_node_arg_names")


class TrainingAgentError(OrtlabError):
    """The graph builder or the TrainingAgent was used out of order or given what it cannot take."""


@dataclass
class AgentGraphs:
    """What OrtModuleGraphBuilder built: the forward graph, the training graph (forward, YieldOp,
    backward) and its graph info as plain data (GRAPH_INFO_FIELDS)."""

    forward_model: onnx.ModelProto
    training_model: onnx.ModelProto
    info: dict

    def ops(self, which="training"):
        """The op types of one graph, in node order."""
        model = self.training_model if which == "training" else self.forward_model
        return [n.op_type for n in model.graph.node]


def builder_config(input_names, names_to_train, input_names_require_grad=()):
    """An OrtModuleGraphBuilderConfiguration as ORTModule fills it: `initializer_names` are all graph
    inputs (user inputs, parameters and buffers, after the post-export processing),
    `initializer_names_to_train` those needing a gradient, `input_names_require_grad` the user inputs
    among them."""
    config = capi().OrtModuleGraphBuilderConfiguration()
    config.initializer_names = list(input_names)
    config.initializer_names_to_train = list(names_to_train)
    config.input_names_require_grad = list(input_names_require_grad)
    config.build_gradient_graph = True
    config.enable_caching = False
    config.use_memory_efficient_gradient = False
    config.loglevel = capi().Severity.ERROR  # onnxruntime::logging::Severity
    return config


def build_graphs(model, names_to_train, input_names_require_grad=()):
    """Build the forward and training graphs of `model` (its parameters are graph inputs) with ORT's
    OrtModuleGraphBuilder; returns AgentGraphs."""
    C = capi()
    if not isinstance(model, onnx.ModelProto):
        raise TrainingAgentError(f"build_graphs takes an onnx.ModelProto (parameters as graph inputs, as "
                                 f"ORTModule exports them), not {type(model).__name__}")
    inputs = [i.name for i in model.graph.input]
    unknown = sorted(set(names_to_train) - set(inputs))
    if unknown:
        raise TrainingAgentError(f"{unknown} are not graph inputs; the names to train are among {inputs}")
    builder = C.OrtModuleGraphBuilder()
    config = builder_config(inputs, names_to_train, input_names_require_grad)
    builder.initialize(model.SerializeToString(), config)
    builder.build(C.TrainingGraphTransformerConfiguration())
    info = builder.get_graph_info()
    return AgentGraphs(onnx.load_from_string(builder.get_forward_model()),
                       onnx.load_from_string(builder.get_gradient_model()),
                       {name: _plain(getattr(info, name)) for name in GRAPH_INFO_FIELDS})


def _plain(value):
    return dict(value) if hasattr(value, "items") else list(value)


def session_options(mem_pattern=False, mem_reuse=False):
    """The SessionOptions ORTModule gives its training session (GraphExecutionManager._get_session_config):
    memory pattern and memory reuse off, weight prepacking off. With the memory pattern on (ORT's
    default), a forward output lives in the pattern's block, which the backward run writes over: a
    loss handed out by run_forward (dlpack, no copy) and read after run_backward is garbage."""
    options = quiet_import("onnxruntime").SessionOptions()
    options.enable_mem_pattern, options.enable_mem_reuse = mem_pattern, mem_reuse
    options.add_session_config_entry("session.disable_prepacking", "1")
    return options


def _ortvalues(tensors):
    """An OrtValueVector sharing the tensors' memory (dlpack), as ORTModule builds its feeds."""
    vector = capi().OrtValueVector()
    vector.reserve(len(tensors))
    for tensor in tensors:
        tensor = tensor.detach().contiguous()
        is_bool = tensor.dtype == torch.bool
        vector.push_back(to_dlpack(tensor.to(torch.uint8) if is_bool else tensor), is_bool)
    return vector


def _tensors(vector):
    """The OrtValues of a vector as torch tensors on the same memory (dlpack)."""
    return list(vector.to_dlpacks(from_dlpack)) if len(vector) else []


@dataclass
class ForwardRun:
    """One forward run: the module's outputs and the PartialGraphExecutionState backward resumes."""

    outputs: list
    state: object
    used: bool = False


class ModuleTrainingAgent:
    """A torch module exported once and run forward and backward by ORT's TrainingAgent.

        agent = ModuleTrainingAgent(module, x, labels)   # export, build the graphs, create the agent
        run = agent.forward(x, labels)                   # run_forward: up to the YieldOp
        grads = agent.backward(run)                      # run_backward: {input or parameter: gradient}

    Inputs that require grad (a float tensor with requires_grad=True) get a gradient too. The
    module's parameters are read at every forward (fed as graph inputs, as ORTModule feeds them).
    """

    def __init__(self, module, *example_args, providers=("CPUExecutionProvider",), sess_options=None):
        C, ort = capi(), quiet_import("onnxruntime")
        if not isinstance(module, torch.nn.Module):
            raise TrainingAgentError(f"ModuleTrainingAgent takes a torch.nn.Module, not {type(module).__name__}")
        self.module = module
        flat = flatten_inputs(example_args, {}, training=module.training)
        self.exported, _ = GraphTransitionManager(module).use_cache_or_reconstruct(flat)
        parameters = dict(module.named_parameters())
        required = [n for n, t in zip(self.exported.input_names, flat.tensors)
                    if n in self.exported.used_inputs and t.requires_grad and t.is_floating_point()]
        self.names_to_train = required + [n for n in self.exported.parameter_names
                                          if parameters[n].requires_grad]
        self.graphs = build_graphs(self.exported.processed, self.names_to_train, required)
        info = self.graphs.info
        self.session = ort.InferenceSession(self.graphs.training_model.SerializeToString(),
                                            sess_options or session_options(), providers=list(providers))
        device = C.OrtDevice(C.OrtDevice.cpu(), C.OrtDevice.default_memory(), 0)
        self.fetch_names = [o.name for o in self.graphs.training_model.graph.output]
        forward_outputs = len(info["user_output_names"]) + len(info["frontier_node_arg_map"])
        feed_names = [i.name for i in self.graphs.training_model.graph.input]
        self.agent = C.TrainingAgent(self.session._sess, feed_names, [device] * forward_outputs,
                                     self.fetch_names, [device] * len(self.fetch_names), 0)
        grad_of = dict(zip(info["initializer_grad_names_to_train"], info["initializer_names_to_train"]))
        grad_of.update({grad: name for name, grad in info["user_input_grad_names"].items()})
        self.gradient_of = grad_of  # {graph output name: the input it is the gradient of}

    def _feeds(self, args):
        bad = [type(a).__name__ for a in args if not isinstance(a, (torch.Tensor, list, tuple, dict))]
        if bad:
            raise TrainingAgentError(f"forward takes the module's arguments (torch tensors, or lists, tuples and "
                                     f"dicts of them), not {bad[0]}")
        flat = flatten_inputs(args, {}, training=self.module.training)
        by_name = dict(zip(self.exported.input_names, flat.tensors))
        state = dict(self.module.named_parameters())
        state.update(self.module.named_buffers())
        feeds = {**state, **by_name}
        feeds.update({n: feeds[source].detach() for n, source in self.exported.no_gradient_inputs.items()})
        names = [i.name for i in self.graphs.training_model.graph.input]
        missing = [n for n in names if n not in feeds]
        if missing:
            raise TrainingAgentError(f"no value for graph input(s) {missing}; call forward with the "
                                     "arguments the agent was built with")
        values = [feeds[n] for n in names]
        self._check_types(names, values)
        return values

    def _check_types(self, names, values):
        """Every feed a tensor of the graph input's element type and rank: TrainingAgent.run_forward checks
        neither (a float64 tensor reaches the first kernel and fails inside it, "Tensor type mismatch")."""
        declared = {i.name: i.type.tensor_type for i in self.graphs.training_model.graph.input}
        for name, value in zip(names, values):
            if not isinstance(value, torch.Tensor):
                raise TrainingAgentError(f"input {name!r} is a {type(value).__name__}; pass a torch tensor, as to "
                                         "the module")
            want = helper.tensor_dtype_to_np_dtype(declared[name].elem_type)
            have = torch.empty((), dtype=value.dtype).numpy().dtype
            if have != want:
                raise TrainingAgentError(f"input {name!r} is {value.dtype}, the graph takes {want}: pass "
                                         f"the dtype the agent was built with (e.g. tensor.to(torch.{want}))")
            rank = len(declared[name].shape.dim)
            if declared[name].HasField("shape") and value.dim() != rank:
                raise TrainingAgentError(f"input {name!r} has shape {list(value.shape)}, the graph takes rank {rank}")

    def forward(self, *args):
        """TrainingAgent.run_forward: the module's outputs (torch tensors) and the state to resume."""
        C = capi()
        state, fetches = C.PartialGraphExecutionState(), C.OrtValueVector()
        self.agent.run_forward(_ortvalues(self._feeds(args)), fetches, state, None)
        return ForwardRun(_tensors(fetches), state)

    def backward(self, run, grad_outputs=None):
        """TrainingAgent.run_backward from the gradients of the outputs (default: 1 for a scalar
        output); returns {input or parameter name: gradient}. A ForwardRun resumes once."""
        if not isinstance(run, ForwardRun):
            raise TrainingAgentError(f"backward takes the ForwardRun that forward returned, not "
                                     f"{type(run).__name__}")
        if run.used:
            raise TrainingAgentError("this forward run was already resumed; its state is spent (ORTModule "
                                     "deletes it after backward): run forward again")
        grads = self._output_grads(run.outputs, grad_outputs)
        fetches = capi().OrtValueVector()
        self.agent.run_backward(_ortvalues(grads), fetches, run.state)
        run.used = True
        return {self.gradient_of[name]: grad for name, grad in zip(self.fetch_names, _tensors(fetches))}

    def _output_grads(self, outputs, grad_outputs):
        """One gradient per differentiable output, as _ORTModuleFunction.backward feeds them."""
        info = self.graphs.info
        if grad_outputs is None:
            if any(o.dim() for o in outputs):
                raise TrainingAgentError("an output is not a scalar: pass grad_outputs, one tensor per "
                                         f"output (shapes {[tuple(o.shape) for o in outputs]})")
            grad_outputs = [torch.ones_like(o) for o in outputs]
        if len(grad_outputs) != len(outputs):
            raise TrainingAgentError(f"{len(grad_outputs)} grad_outputs for {len(outputs)} outputs")
        grads = []
        for index, (output, grad) in enumerate(zip(outputs, grad_outputs)):
            if index in info["output_grad_indices_non_differentiable"]:
                continue
            if grad is None:
                full = index in info["output_grad_indices_require_full_shape"]
                grad = torch.zeros_like(output) if full else torch.tensor(0.0, dtype=output.dtype)
            grads.append(grad)
        return grads

    def gradients(self, *args, grad_outputs=None):
        """Forward then backward: (outputs, {name: gradient})."""
        run = self.forward(*args)
        return run.outputs, self.backward(run, grad_outputs)

    def __repr__(self):
        nodes = len(self.graphs.training_model.graph.node)
        return (f"ModuleTrainingAgent({type(self.module).__name__}: {nodes} nodes in the training graph, "
                f"{len(self.names_to_train)} gradients)")


def torch_gradients(module, *args, grad_outputs=None):
    """The reference: torch autograd's gradients of the same module, {name: gradient}, named as
    ModuleTrainingAgent names them (inputs that require grad by their export names)."""
    flat = flatten_inputs(args, {}, training=module.training)
    names = input_names(module, flat.schema)
    outputs = module(*args)
    outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
    wanted = {n: t for n, t in zip(names, flat.tensors) if t.requires_grad}
    wanted.update({n: p for n, p in module.named_parameters() if p.requires_grad})
    grads = torch.autograd.grad(outputs, list(wanted.values()), grad_outputs=grad_outputs, allow_unused=True)
    return [o.detach() for o in outputs], dict(zip(wanted, grads))

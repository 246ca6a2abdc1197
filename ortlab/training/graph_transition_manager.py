"""Export a torch module to ONNX once per input schema, and prepare the graph for training.

Mirrors orttraining/orttraining/python/training/ortmodule/_graph_transition_manager.py:
(1) a re-export check on the input schema, (2) the export itself, with every tensor leaf a
graph input and every dimension dynamic, with the symbolics of export_symbolics in place (as
ORTModule exports with those of _custom_op_symbolic_registry.py), after one plain run of the
forward that must leave the module's state as it was (unchanged_state), (3) the post-export
processing: parameters and buffers become graph inputs, so that each run feeds torch's current
values (ORT's `_post_export_processed_model` does the same through initializer-to-input), and
each ortlab::NoGradient becomes an input fed with a detached copy (lower_no_gradient).
"""
import contextlib
import inspect
import io
import linecache
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import onnx
import torch

from ortlab.errors import OrtlabError
from ortlab.ir import Graph
from ortlab.ir.node_arg import type_of_tensor
from ortlab.onnx_defs import DEFAULT_OPSET
from ortlab.models import plain_torch_export
from ortlab.training import export_symbolics
from ortlab.training.gradient_cuts import refuse_gradient_cuts
from ortlab.training.io import flatten_outputs, leaf_paths, TensorStub

PREFIX = "module."


class ExportError(OrtlabError):
    """torch.onnx.export could not export the module (the message carries torch's reason)."""


class _FlattenedModule(torch.nn.Module):
    """forward(*tensors): rebuild (args, kwargs), call the module, return its tensor outputs.

    As ORTModule's _FlattenedModule (ortmodule/_io.py): the exporter sees a flat signature.
    """

    def __init__(self, module, flat_inputs):
        super().__init__()
        self.module, self.flat_inputs = module, flat_inputs
        self.output_schema, self.traced_schema = None, None  # of the plain run, of the trace
        # The module's mode, not nn.Module's default (train): torch.onnx.export puts this wrapper
        # back into the mode it found, recursively, and would switch an eval module to train.
        self.training = module.training

    def forward(self, *tensors):
        args, kwargs = self.flat_inputs.rebuild(tensors)
        tensors_out, schema = flatten_outputs(self.module(*args, **kwargs))
        if self.output_schema is None:
            self.output_schema = schema
        else:
            self.traced_schema = schema
        return tuple(tensors_out)


def input_names(module, schema):
    """Graph input names from the forward signature: x, x_1 (nested), mask (a keyword)..."""
    try:
        params = [p.name for p in inspect.signature(module.forward).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        params = []
    names = []
    for path, stub in zip(leaf_paths(schema.spec), schema.stubs):
        if not isinstance(stub, TensorStub):
            continue
        head, _, rest = path.partition("]")
        if path.startswith("args["):
            position = int(head[len("args["):])
            base = params[position] if position < len(params) else f"input_{position}"
        else:
            base = head[len("kwargs['"):-1]
        suffix = rest.replace("][", "_").strip("[]'").replace("'", "")
        names.append(f"{base}_{suffix}" if suffix else base)
    return names


@dataclass
class ExportedModel:
    """What one export produced: the raw and the processed graph, and how to feed and read them."""

    exported: onnx.ModelProto       # as torch.onnx.export wrote it
    processed: onnx.ModelProto      # parameters and buffers turned into graph inputs
    input_names: list               # one per tensor leaf of the inputs, in leaf order
    used_inputs: list               # those the graph really reads (the exporter drops the others)
    parameter_names: list           # graph inputs that are module parameters
    buffer_names: list              # graph inputs that are module buffers
    output_names: list
    output_schema: object
    reasons: list = field(default_factory=list)  # why this export happened
    no_gradient_inputs: dict = field(default_factory=dict)  # fed input -> the parameter it copies, detached


def _export(module, flat_inputs, names, opset):
    flat = _FlattenedModule(module, flat_inputs)
    mode = torch.onnx.TrainingMode.TRAINING if flat_inputs.schema.training else torch.onnx.TrainingMode.EVAL
    copies = input_copies(flat_inputs.tensors)
    try:
        with torch.no_grad(), unchanged_state(module), unchanged_inputs(flat_inputs.tensors, copies, names):
            n_out = len(flat(*copies))
    except OrtlabError:
        raise
    except Exception as exc:
        raise ExportError(f"the module's forward failed in PyTorch, before any export: {type(exc).__name__}: "
                          f"{_reason(exc)}; check the inputs against what the module expects") from exc
    out_names = [f"output_{i}" for i in range(n_out)]
    buffer = io.BytesIO()
    with warnings.catch_warnings(record=True) as caught, plain_torch_export(), export_symbolics.registered(opset):
        warnings.simplefilter("ignore")  # the exporter's deprecation notices...
        warnings.simplefilter("always", torch.jit.TracerWarning)  # ...but not the tracer's
        try:
            torch.onnx.export(flat, tuple(input_copies(flat_inputs.tensors)), buffer, input_names=names,
                              output_names=out_names, opset_version=opset, training=mode,
                              do_constant_folding=False, export_params=True,
                              dynamic_axes={n: {d: f"{n}_dim{d}" for d in range(t.dim())}
                                            for n, t in zip(names, flat_inputs.tensors)})
        except Exception as exc:
            raise ExportError(f"torch.onnx.export failed: {type(exc).__name__}: {_reason(exc)} (ORTModule "
                              "would fall back to PyTorch here; MiniORTModule has no fallback: run "
                              "this module in plain PyTorch or express the op with exportable ones)") from None
    check_tracer_warnings(caught)
    model = onnx.load_from_string(buffer.getvalue())
    # every graph output, in order: the trace may output more than out_names (sizes: OutputSchema.with_trace)
    return model, [o.name for o in model.graph.output], flat.output_schema.with_trace(flat.traced_schema)


def _reason(exc, limit=600):
    """The exporter's message without the Torch IR it appends ('[Caused by the value...',
    'Torch IR graph at exception'), on one line, cut at `limit` characters."""
    text = str(exc).split("Torch IR graph at exception")[0].split("[Caused by the value")[0]
    text = " ".join(line.strip() for line in text.splitlines() if line.strip())
    return text if len(text) <= limit else text[:limit] + "..."


class InputWriteError(ExportError):
    """The module's forward writes one of its inputs in place: the graph cannot write a caller's tensor."""


def input_copies(tensors):
    """Detached copies of the inputs (requires_grad kept; a tensor passed twice copied once), for the export's
    runs: ORTModule's _io.deepcopy_model_input, "since input values may change after model run"."""
    made = {}
    for t in tensors:
        if id(t) not in made:
            made[id(t)] = t.detach().clone().requires_grad_(t.requires_grad)
    return [made[id(t)] for t in tensors]


@contextlib.contextmanager
def unchanged_inputs(tensors, copies, names):
    """Run the block (one forward on `copies` of `tensors`) and refuse if it wrote a copy in place (its
    version moved, or its values differ from the caller's tensor: `x.data` writes bump no version)."""
    versions = [c._version for c in copies]
    yield
    written = [n for n, t, c, v in zip(names, tensors, copies, versions) if c._version != v or not _same(c, t)]
    if written:
        listed = ", ".join(f"'{n}'" for n in dict.fromkeys(written))
        raise InputWriteError(
            f"the module's forward writes its input {listed} in place (x.mul_(2), x += 1, x[0] = ..., "
            "x.data...): the exported graph cannot write a caller's tensor, so ORT computes from a copy and "
            "leaves yours as it was, where PyTorch changes it (ORTModule 1.19.2 does so silently, and loses "
            "the write's effect on a tensor passed twice). Nothing was changed. Write it out of place "
            "(x = x * 2, x = x + 1) or clone it first (x = x.clone()), or run the module in plain PyTorch")


class StateUpdateError(ExportError):
    """The module's forward writes one of its buffers or parameters: the graph cannot do that."""


@contextlib.contextmanager
def unchanged_state(module):
    """Run the block (one forward of `module`) and refuse if it wrote a buffer or a parameter
    (in place, `self.count += 1`, or by assignment, `self.avg = ...`) or changed a plain Python
    attribute (`self.steps += 1`); what it changed is put back first.

    The exported graph reads each buffer as an input and returns only the module's outputs, so an
    update made in forward is done by the export's trace and never again: ORTModule 1.19.2 trains
    such a module silently, its buffer frozen after one update (a step counter reads 1 after any
    number of steps; BatchNorm's running statistics stay at their first update)."""
    before = {n: (t, t._version, t.detach().clone()) for n, t in _state(module)
              if not torch.nn.parameter.is_lazy(t)}  # a lazy module's first forward creates them
    attributes = _plain_attributes(module)
    yield
    after = dict(_state(module))
    changed = [n for n, (t, version, value) in before.items()
               if after.get(n) is not t or t._version != version or not _same(t, value)]
    if changed:
        for name, (tensor, _, value) in before.items():
            _put_back(module, name, tensor, value)
    changed_attributes = _undo_attributes(module, attributes)
    if changed:
        kinds = {n: "parameter" if n in dict(module.named_parameters()) else "buffer" for n in changed}
        listed = ", ".join(f"{kinds[n]} {n!r}" for n in changed)
        raise StateUpdateError(
            f"the module's forward updates its {listed}: the exported graph reads it as an input and "
            "cannot write it back, so ORT would train with it frozen after the export's update (ORTModule "
            "does so silently: a step counter stays at 1, running statistics at their first update). "
            "Update it outside forward (e.g. in the training loop, under torch.no_grad()), or run the "
            "module in plain PyTorch")
    if changed_attributes:
        raise StateUpdateError(
            f"the module's forward changes its Python attribute(s) {', '.join(changed_attributes)}: the "
            "exported graph runs none of the module's Python code, so the change would happen at the "
            "export only, never at the later steps PyTorch would make it (ORTModule does so silently: a "
            "counter reads 1 after any number of steps). Keep such state outside forward (e.g. count "
            "steps in the training loop), or run the module in plain PyTorch")


PLAIN = (type(None), bool, int, float, str)
_MISSING = object()


def _plain_attributes(module, skip=None):
    """{(submodule path, attribute): value} of the Python numbers, strings and None the modules hold,
    and the paths left out: lazy modules (their first forward sets their sizes), or `skip`."""
    from torch.nn.modules.lazy import LazyModuleMixin  # heavy: torch

    if skip is None:
        skip = {path for path, sub in module.named_modules() if isinstance(sub, LazyModuleMixin)}
    return {(path, key): value for path, sub in module.named_modules() if path not in skip
            for key, value in vars(sub).items() if isinstance(value, PLAIN)}, skip


def _undo_attributes(module, before):
    """Put back the plain Python attributes a forward changed, added or removed (`self.steps += 1`);
    returns their names ('sub.attribute')."""
    before, skip = before
    after, _ = _plain_attributes(module, skip)
    changed = sorted(k for k in set(before) | set(after) if before.get(k, _MISSING) != after.get(k, _MISSING))
    for path, key in changed:
        owner = module.get_submodule(path)
        if (path, key) in before:
            setattr(owner, key, before[path, key])
        else:
            delattr(owner, key)
    return [f"{path + '.' if path else ''}{key}" for path, key in changed]



def _state(module):
    """(name, tensor) of every parameter and buffer."""
    return list(module.named_parameters()) + list(module.named_buffers())


def _same(tensor, value):
    """Equal values, NaN equal to NaN (a kernel may write a buffer without bumping its version:
    BatchNorm's running statistics)."""
    if tensor.is_floating_point() or tensor.is_complex():
        return torch.allclose(tensor.detach(), value, rtol=0, atol=0, equal_nan=True)
    return torch.equal(tensor.detach(), value)


def _put_back(module, name, tensor, value):
    """Make `name` the tensor it was before the forward, holding the value it had."""
    owner_path, _, attribute = name.rpartition(".")
    owner = module.get_submodule(owner_path) if owner_path else module
    with torch.no_grad():
        tensor.copy_(value)
    store = owner._parameters if attribute in owner._parameters else owner._buffers
    store[attribute] = tensor


# What the tracer says when the module turns a tensor into a Python value: the value seen at
# export is baked into the graph (an `if` takes the branch of the export's input for ever).
BAKED = ("Python boolean", "Python number", "Python integer", "Python float", "Python index")


class TracerWarningError(ExportError):
    """The export traced data-dependent Python control flow or values: the graph would be wrong
    for other inputs."""


def check_tracer_warnings(records):
    """Refuse an export whose trace baked in a value the module's own code computed from a tensor
    (torch.jit.TracerWarning 'Converting a tensor to a Python boolean/number/index...'); warn about
    the tracer's other warnings from the module's code, naming the line.

    ORTModule exports by tracing too and has the same limit: Python control flow on tensors is
    traced for the export's input only (its docs: such modules need care, e.g. torch.where instead
    of `if`, or running that part in PyTorch). MiniORTModule re-exports only when dtypes or ranks
    change, so a branch on a size is baked in as well. Warnings raised inside torch's own code
    (shape checks in torch.nn.functional, which torch's exporter traces by design) stay silent."""
    torch_dir = str(Path(torch.__file__).resolve().parent)
    traced = [r for r in records if issubclass(r.category, torch.jit.TracerWarning)
              and not str(Path(r.filename).resolve()).startswith(torch_dir)]
    for r in traced:
        message = str(r.message).strip().splitlines()[0]
        if any(word in message for word in BAKED):
            raise TracerWarningError(
                f"the export traced Python code that turns a tensor into a Python value, at "
                f"{r.filename}:{r.lineno} ({_source_line(r)}): torch.jit.TracerWarning: {message} The "
                "trace keeps the branch or value of the export's input for every later input, so ORT "
                "would compute something else than PyTorch for inputs that take another branch. Express "
                "it with tensor ops (torch.where instead of `if tensor:`, no .item()/int()/float()/bool() "
                "of a tensor, no `if` on a size), or run the module in plain PyTorch")
    for r in traced:
        message = str(r.message).strip().splitlines()[0]
        warnings.warn(f"MiniORTModule's export: torch.jit.TracerWarning at {r.filename}:{r.lineno}: "
                      f"{message} (the exported graph may not generalize to other inputs)",
                      RuntimeWarning, stacklevel=4)


def _source_line(record):
    return linecache.getline(record.filename, record.lineno).strip() or "source not available"


def post_export_process(model, module):
    """A copy of `model` whose parameter and buffer initializers are graph inputs (named as in
    module.named_parameters(), without the wrapper's prefix), and whose ortlab::NoGradient nodes
    are inputs of their own (lower_no_gradient). Returns (model, params, buffers, no_gradient_inputs)."""
    graph = Graph.from_model(model)
    params = {PREFIX + n for n, _ in module.named_parameters()}
    buffers = {PREFIX + n for n, _ in module.named_buffers()}
    param_names, buffer_names = [], []
    for name, tensor in list(graph.initializers.items()):
        if name not in params and name not in buffers:
            continue
        short = name[len(PREFIX):]
        (param_names if name in params else buffer_names).append(short)
        graph.remove_initializer(name)
        graph.replace_all_uses(name, short)
        graph.add_input(short, type_of_tensor(tensor))
    no_gradient = lower_no_gradient(graph)
    return graph.to_model(), param_names, buffer_names, no_gradient


def lower_no_gradient(graph):
    """Each ortlab::NoGradient(W) becomes a graph input `W_no_grad`, which MiniORTModule feeds
    with W detached: the same values, outside the set the gradient is taken for. Returns
    {input name: W}. (export_symbolics writes these nodes; ORT's own export has no such node,
    its ATen ops carry the same meaning.)"""
    fed = {}
    for node in [n for n in graph.nodes() if (n.domain, n.op_type) == (export_symbolics.DOMAIN,
                                                                        export_symbolics.NO_GRADIENT)]:
        source, output = node.inputs[0].name, node.outputs[0].name
        if source not in graph.inputs:
            raise ExportError(f"an embedding with padding_idx reads a weight computed inside forward "
                              f"({source!r}); MiniORTModule keeps the padding row's gradient at 0 only "
                              "for a weight that is a parameter, a buffer or an input: use nn.Embedding "
                              "or F.embedding on a parameter, or drop padding_idx")
        fed_name = f"{source}_no_grad"
        graph.remove_node(node)
        if fed_name not in fed:
            graph.add_input(fed_name, graph.node_arg(source).type_proto)
            fed[fed_name] = source
        graph.replace_all_uses(output, fed_name)
    if not any(n.domain == export_symbolics.DOMAIN for n in graph.nodes()):
        graph.opset_imports.pop(export_symbolics.DOMAIN, None)
    return fed


class GraphTransitionManager:
    """Decides when to re-export and keeps the current ExportedModel.

    `use_cache_or_reconstruct(flat_inputs)` returns (ExportedModel, reexported). `history`
    lists each export with its reasons (first call, a dtype change, train/eval...).
    """

    def __init__(self, module, opset=DEFAULT_OPSET):
        self.module, self.opset = module, opset
        self.schema, self.model, self.history = None, None, []

    def refuse_gradient_cuts(self, flat_inputs):
        """One more forward, gradients on, on copies of the inputs (the module's state and the RNG put back):
        GradientCutError where it cuts the gradient in a way the exported graph would not (gradient_cuts)."""
        copies = input_copies(flat_inputs.tensors)

        def run():
            args, kwargs = flat_inputs.rebuild(copies)
            return self.module(*args, **kwargs)

        try:
            with torch.random.fork_rng(devices=[]), unchanged_state(self.module):
                refuse_gradient_cuts(run)
        except OrtlabError:
            raise
        except Exception as exc:
            raise ExportError(f"the module's forward failed in PyTorch with gradients on: {type(exc).__name__}: "
                              f"{_reason(exc)}; it must run as it would in a plain PyTorch training step") from exc

    def use_cache_or_reconstruct(self, flat_inputs):
        reasons = flat_inputs.schema.differences(self.schema)
        if not reasons:
            return self.model, False
        names = input_names(self.module, flat_inputs.schema)
        exported, out_names, out_schema = _export(self.module, flat_inputs, names, self.opset)
        processed, params, buffers, no_gradient = post_export_process(exported, self.module)
        graph_inputs = {i.name for i in processed.graph.input}
        self.model = ExportedModel(exported, processed, names, [n for n in names if n in graph_inputs],
                                   params, buffers, out_names, out_schema, reasons, no_gradient)
        self.schema = flat_inputs.schema
        self.history.append(reasons)
        return self.model, True

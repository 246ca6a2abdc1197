"""MiniORTModule: a readable ORTModule. Wrap a torch module; forward and backward run in ORT.

Mirrors orttraining/orttraining/python/training/ortmodule/ortmodule.py and the managers behind
it (_graph_execution_manager.py, _training_manager.py, _inference_manager.py):

1. flatten the call's inputs and check their schema; export again only when it changed
   (GraphTransitionManager);
2. build the gradient graph of the export (ORT's C++ GradientGraphBuilder by default, or
   ortlab.gradients) and split it into a forward and a backward model (TrainingManager);
3. run the forward in ORT inside a torch.autograd.Function, whose backward runs the backward
   model, so that loss.backward(), torch optimizers, hooks and zero_grad work unchanged;
4. restore the outputs to the structure the module returned.
"""
from pathlib import Path

import onnx
import torch

from ortlab.env import quiet_import
from ortlab.errors import OrtlabError
from ortlab.training.graph_transition_manager import GraphTransitionManager
from ortlab.training.io import flatten_inputs
from ortlab.training.training_manager import (BUILDERS, InferenceManager, ORTModuleFunction, TrainingManager,
                                               needs_static_shapes)
from ortlab.viz import Table


class MiniORTModuleError(OrtlabError):
    """MiniORTModule was given something it cannot use (the message says what and what to pass)."""


RUNTIMES = ("ort", "ortlab")


def _check_arguments(module, gradient_builder, providers, level, opset, runtime="ort"):
    """Checked when the wrapper is built, not at the first forward (as ORTModule's constructor
    checks its module: orttraining/orttraining/python/training/ortmodule/ortmodule.py)."""
    from ortlab.session import LEVELS  # lazy: ortlab.session imports onnxruntime (2 s)

    if not isinstance(module, torch.nn.Module):
        raise MiniORTModuleError(f"MiniORTModule wraps a torch.nn.Module, not {type(module).__name__}; "
                                 "pass the module (an instance, e.g. torch.nn.Linear(4, 2))")
    if not isinstance(gradient_builder, str) or gradient_builder not in BUILDERS:
        raise MiniORTModuleError(f"gradient_builder must be one of {BUILDERS} ('ort': ORT's C++ builder, "
                                 f"'ortlab': ortlab.gradients), not {gradient_builder!r}")
    if not isinstance(level, str) or level not in LEVELS:
        raise MiniORTModuleError(f"level must be one of {list(LEVELS)} (ORT's graph optimization "
                                 f"levels), not {level!r}")
    if not isinstance(opset, int) or isinstance(opset, bool) or not 7 <= opset <= 21:
        raise MiniORTModuleError(f"opset must be an int from 7 to 21 (what torch's exporter writes and "
                                 f"ORT 1.19.2 runs), not {opset!r}")
    if not isinstance(runtime, str) or runtime not in RUNTIMES:
        raise MiniORTModuleError(f"runtime must be one of {RUNTIMES} ('ort': onnxruntime's sessions, 'ortlab': "
                                 f"ortlab.engine's), not {runtime!r}")
    if providers is not None:
        names = [providers] if isinstance(providers, str) else providers
        if runtime == "ortlab":
            from ortlab.engine import EXECUTION_PROVIDERS  # lazy: runtime='ortlab' only; loads the whole engine
            known = list(EXECUTION_PROVIDERS)
        else:
            known = quiet_import("onnxruntime").get_available_providers()
        name = lambda p: p[0] if isinstance(p, tuple) and len(p) == 2 and isinstance(p[1], dict) else p
        if not isinstance(names, (list, tuple)) or not names or any(name(p) not in known for p in names):
            raise MiniORTModuleError(f"providers must be a list of the execution providers this ORT has "
                                     f"({', '.join(known)}), not {providers!r}")


class MiniORTModule(torch.nn.Module):
    """Run `module`'s forward and backward in ONNX Runtime.

    gradient_builder: 'ort' (ORT's C++ builder) or 'ortlab' (ortlab.gradients);
    providers: ORT execution providers (default: ortlab.env.providers());
    level: ORT graph optimization level of the two sessions ('disable', 'basic', 'extended', 'all');
    runtime: 'ort' (onnxruntime.InferenceSession) or 'ortlab' (ortlab.engine.InferenceSession: with
    gradient_builder='ortlab', every layer of the stack is ortlab's; providers are then engine EPs).
    """

    def __init__(self, module, gradient_builder="ort", providers=None, level="basic", opset=17, runtime="ort"):
        super().__init__()
        _check_arguments(module, gradient_builder, providers, level, opset, runtime)
        self.runtime = runtime
        if isinstance(providers, str):
            providers = [providers]
        self.module = module
        self.gradient_builder, self.providers, self.level = gradient_builder, providers, level
        self._transition = GraphTransitionManager(module, opset)
        self._managers, self.calls = {}, 0
        self.train(module.training)  # the wrapped module's mode, as ORTModule's constructor does

    def forward(self, *args, **kwargs):
        self.calls += 1
        flat = flatten_inputs(args, kwargs, training=self.module.training)
        exported, reexported = self._transition.use_cache_or_reconstruct(flat)
        if reexported:
            self._managers.clear()
        names, tensors = self._feeds(exported, flat)
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            x_names = tuple(n for n, t in zip(names, tensors) if t.requires_grad and t.is_floating_point())
            # a pooling op's gradient reads dX's shape from the graph: build for these inputs' shapes, as
            # ORTModule does, and again for other shapes
            shapes = {n: tuple(t.shape) for n, t in zip(names, tensors)} if needs_static_shapes(
                exported.processed) else None
            key = (x_names, tuple(sorted(shapes.items())) if shapes else None)
            if key not in self._managers:
                self._transition.refuse_gradient_cuts(flat)
            manager = self._manager(key, lambda: TrainingManager(
                exported, names, x_names, self.gradient_builder, self.providers, self.level, self.runtime,
                input_shapes=shapes))
            outputs = ORTModuleFunction.apply(manager, *tensors)
        else:
            manager = self._manager("inference", lambda: InferenceManager(
                exported, names, self.providers, self.level, self.runtime))
            outputs = manager.run(tensors)
        return exported.output_schema.restore(outputs)

    def _feeds(self, exported, flat):
        """Graph input names and the tensors to feed them: user inputs, parameters, buffers, and
        the detached copies export_symbolics asked for (no gradient flows into them)."""
        by_name = dict(zip(exported.input_names, flat.tensors))
        state = dict(self.module.named_parameters())
        state.update(self.module.named_buffers())
        state.update(by_name)
        state.update({n: state[source].detach() for n, source in exported.no_gradient_inputs.items()})
        names = (exported.used_inputs + exported.parameter_names + exported.buffer_names
                 + list(exported.no_gradient_inputs))
        return names, [state[n] for n in names]

    def _manager(self, key, make):
        """One manager per set of values needing gradients (freezing a layer builds a new one)."""
        if key not in self._managers:
            self._managers[key] = make()
        return self._managers[key]

    # --- looking inside ---------------------------------------------------------------------

    @property
    def exports(self):
        """One list of reasons per export so far (why it happened)."""
        return list(self._transition.history)

    def export_table(self):
        """A table of the exports: which call, and why."""
        return Table(("export", "reasons"), [(i + 1, "; ".join(r)) for i, r in enumerate(self.exports)])

    def graphs(self):
        """The graphs of the current export: {'torch_exported', 'post_processed', and once trained,
        'training', 'forward', 'backward'} -> onnx.ModelProto."""
        exported = self._transition.model
        if exported is None:
            return {}
        found = {"torch_exported": exported.exported, "post_processed": exported.processed}
        training = self._training_manager()
        if training is not None:
            found.update(training=training.training, forward=training.split.forward,
                         backward=training.split.backward)
        return found

    def stashed(self):
        """Names of the forward values kept for the backward (ORT's stashed activations)."""
        training = self._training_manager()
        return list(training.split.stashed) if training else []

    def _training_manager(self):
        """The first TrainingManager built for the current export, or None."""
        return next((m for k, m in self._managers.items() if k != "inference"), None)

    def save_graphs(self, folder, prefix="model"):
        """Write graphs() as <prefix>_<kind>.onnx (the names ORTModule's DebugOptions use, roughly)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        paths = []
        for kind, model in self.graphs().items():
            paths.append(folder / f"{prefix}_{kind}.onnx")
            onnx.save(model, str(paths[-1]))
        return paths

    def __repr__(self):
        runtime = f"runtime={self.runtime!r}, " if self.runtime != "ort" else ""  # the default, left out
        return (f"MiniORTModule({type(self.module).__name__}, gradient_builder={self.gradient_builder!r}, "
                f"{runtime}"
                f"exports={len(self.exports)}, calls={self.calls})")

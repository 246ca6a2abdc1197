"""ortlab.training: a mini ORTModule, plain optimizers and a training loop.

    MiniORTModule(module, gradient_builder="ort")   forward and backward in ORT (mini_ortmodule.py)
    SGD, Adam, AdamW, LAMB                          optimizers, one update rule each (optimizers.py)
    train(model, batches, optimizer, steps)         the loop, with a progress bar and an on_step hook (loop.py)
    train_step(model, batch, optimizer)             one step: zero_grad, forward, backward, clip, step (loop.py)

The pieces mirror orttraining/orttraining/python/training/ortmodule/ (ortmodule.py, _io.py,
_graph_transition_manager.py, _training_manager.py) and ORT's optimizer kernels. The real ORTModule
is driven and observed in ortlab.ortmodule (ortmodule.driver.train puts it in the same loop).
"""
from ortlab.training.graph_transition_manager import ExportError, GraphTransitionManager, TracerWarningError
from ortlab.training.io import SchemaError, flatten_inputs, flatten_outputs
from ortlab.training.data import progression_batches, progressions
from ortlab.training.loop import History, TrainingError, curve_shape, global_norm, train, train_step
from ortlab.training.optimizers import LAMB, SGD, Adam, AdamW, OptimizerError
from ortlab.training.mini_ortmodule import MiniORTModule, MiniORTModuleError
from ortlab.training.training_manager import TrainingGraphError

__all__ = ["LAMB", "SGD", "Adam", "AdamW", "ExportError", "GraphTransitionManager", "History",
           "MiniORTModuleError", "TracerWarningError",
           "MiniORTModule", "OptimizerError", "SchemaError", "TrainingError", "TrainingGraphError",
           "curve_shape", "flatten_inputs", "progression_batches", "progressions", "flatten_outputs", "global_norm",
           "train", "train_step"]

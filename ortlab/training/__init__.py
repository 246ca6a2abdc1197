"""ortlab.training: a mini ORTModule, plain optimizers and a training loop.

    MiniORTModule(module, gradient_builder="ort")   forward and backward in ORT (ort_module.py)
    SGD, Adam, AdamW, LAMB                          optimizers, one update rule each (optimizers.py)
    train(model, batches, optimizer, steps)         the loop, with a progress bar (loop.py)
    ortmodule.train(module, batches, steps, ...)    the real ORTModule: variables, logs, dumps, profiles

The pieces mirror orttraining/orttraining/python/training/ortmodule/ (ortmodule.py, _io.py,
_graph_transition_manager.py, _training_manager.py) and ORT's optimizer kernels.
"""
from ortlab.training.graph_transition_manager import ExportError, GraphTransitionManager, TracerWarningError
from ortlab.training.io import SchemaError, flatten_inputs, flatten_outputs
from ortlab.training.data import progression_batches, progressions
from ortlab.training.loop import History, TrainingError, curve_shape, global_norm, train
from ortlab.training.optimizers import LAMB, SGD, Adam, AdamW, OptimizerError
from ortlab.training.ort_module import MiniORTModule, MiniORTModuleError
from ortlab.training.training_manager import TrainingGraphError

__all__ = ["LAMB", "SGD", "Adam", "AdamW", "ExportError", "GraphTransitionManager", "History",
           "MiniORTModuleError", "TracerWarningError",
           "MiniORTModule", "OptimizerError", "SchemaError", "TrainingError", "TrainingGraphError",
           "curve_shape", "flatten_inputs", "progression_batches", "progressions", "flatten_outputs", "global_norm", "train"]

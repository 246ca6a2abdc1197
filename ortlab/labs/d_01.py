"""Exercises of the walkthrough D_01_training_domain_knowledge: clipping gradients by their global norm, and the
dynamic loss scaler's update.

The cases the exercises are about are built here, so the notebook can show them; the checks live in
ortlab.labs.judges.d_01 ('global_norm_clip' against torch.nn.utils.clip_grad_norm_, torch/nn/utils/clip_grad.py;
'loss_scaler' against ORT's own DynamicLossScaler, onnxruntime/training/amp/loss_scaler.py), and the reference
answers in solutions/walkthroughs/D_01_training_domain_knowledge.py, outside the package.
"""
import types

import numpy as np
import torch

from ortlab.env import quiet_import
from ortlab.labs.checks import judge
from ortlab.labs.remote import learner, probe
from ortlab.viz import Table


# --- exercise 'global_norm_clip' --------------------------------------------------------------------------

def clip_cases():
    """[(gradients, max_norm)] the check clips: three gradient tensors each (float32)."""
    g = torch.Generator().manual_seed(3)
    big = [torch.randn(4, 3, generator=g) * 2.0, torch.randn(3, generator=g) * 0.1, torch.randn(2, 2, generator=g)]
    small = [torch.tensor([0.3, 0.4]), torch.tensor([[0.0, 0.2], [0.1, 0.0]]), torch.tensor([0.05])]
    spread = [torch.tensor([0.6, 0.0]), torch.tensor([0.0, 0.8]), torch.tensor([0.0])]  # norms 0.6, 0.8, 0
    return [(big, 1.0), (small, 1.0), (spread, 1.2)]


@probe
def clipped(fn, grads, max_norm):
    """The learner's fn(grads, max_norm) on copies of the gradients, as a list of float64 arrays, or a str saying
    what to return instead."""
    found = fn([g.clone() for g in grads], max_norm)
    if isinstance(found, (str, bytes, dict)) or not hasattr(found, "__iter__") or hasattr(found, "shape"):
        return (f"return a list with the clipped gradients, one per gradient given, not "
                f"{type(found).__name__}")
    found = list(found)
    if len(found) != len(grads):
        return f"return one clipped gradient per gradient given ({len(grads)}), not {len(found)}"
    out = []
    for k, (value, given) in enumerate(zip(found, grads)):
        try:
            array = np.asarray(value.detach() if hasattr(value, "detach") else value, dtype=np.float64)
        except (TypeError, ValueError):
            return f"gradient {k}: return a tensor, not {type(value).__name__}"
        if array.shape != tuple(given.shape):
            return f"gradient {k}: return it in its own shape {tuple(given.shape)}, not {array.shape}"
        out.append(array)
    return out


def check_global_norm_clip(fn):
    """Exercise 'global_norm_clip': fn(grads, max_norm) -> the gradients clipped by their global norm, checked
    against torch.nn.utils.clip_grad_norm_ on the check's own gradients."""
    judge("global_norm_clip", "d_01.global_norm_clip", learner(fn))


# --- exercise 'loss_scaler' -------------------------------------------------------------------------------

def show_scaler_run(flags, loss_scale=2.0 ** 16, up_scale_window=2000, min_loss_scale=1.0, max_loss_scale=2.0 ** 24):
    """A table of a short run of ORT's DynamicLossScaler: each step's flag and the scale after its update()."""
    scaler = quiet_import("onnxruntime.training.amp").DynamicLossScaler(
        automatic_update=True, loss_scale=loss_scale, up_scale_window=up_scale_window, min_loss_scale=min_loss_scale,
        max_loss_scale=max_loss_scale)
    rows = [(step, "finite" if flag else "overflow", f"{scaler.update(types.SimpleNamespace(all_finite=flag)):g}")
            for step, flag in enumerate(flags)]
    return Table(("step", "gradients", "scale after"), [("start", "", f"{loss_scale:g}")] + rows)


def scaler_cases():
    """[(all_finite flags, settings)] the check runs: settings are loss_scale, up_scale_window, min_loss_scale,
    max_loss_scale."""
    T, F = True, False
    return [([T, T, T, T, F, T, T, T, F, F, T], {"loss_scale": 2.0 ** 16, "up_scale_window": 3,
                                                  "min_loss_scale": 1.0, "max_loss_scale": 2.0 ** 24}),
            ([F, F, F, F, T, T], {"loss_scale": 4.0, "up_scale_window": 2, "min_loss_scale": 1.0,
                                  "max_loss_scale": 2.0 ** 24}),
            ([T, T, T, T, T, T], {"loss_scale": 2.0 ** 22, "up_scale_window": 2, "min_loss_scale": 1.0,
                                  "max_loss_scale": 2.0 ** 24})]


@probe
def scales(fn, flags, settings):
    """The learner's fn(flags, **settings), as a list of floats, or a str saying what to return instead."""
    found = fn(list(flags), **settings)
    if isinstance(found, (str, bytes, dict)) or not hasattr(found, "__iter__"):
        return f"return a list with the loss scale after each step, not {type(found).__name__}"
    out = []
    for value in found:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            return f"each loss scale must be a number, not {value!r}"[:160]
        out.append(float(value))
    return out


def check_loss_scaler(fn):
    """Exercise 'loss_scaler': fn(finite_flags, loss_scale, up_scale_window, min_loss_scale, max_loss_scale) ->
    the loss scale after each step, checked against ORT's DynamicLossScaler."""
    judge("loss_scaler", "d_01.loss_scaler", learner(fn))

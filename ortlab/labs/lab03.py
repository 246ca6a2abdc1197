"""Checks and helpers for lab03_gradient_definition: write gradient builders for Softplus (easy),
PRelu (broadcasting) and MatMul (hard), then a gradient definition in ORT's own format that
goes into ORT's C++ gradient builder, and train with it.

A learner's builder is checked on one-op models whose loss is sum(Y · R) for a fixed random R
(so the incoming gradient GO(0) is not all ones), against torch autograd, against central
differences (ortlab.gradients.check_gradient) and, where ORT has a builder, against ORT's graph
(ortlab.labs.judges.lab03; this module only builds the graph with the learner's builder).
"""
import contextlib
import warnings

import numpy as np
import torch

from ortlab.capture import os_level_streams
from ortlab.env import quiet_import, seed_everything
from ortlab.errors import OrtlabError
from ortlab.gradients import build_gradient_graph, ort_gradient_graph, register_ort_gradient, using_gradient
from ortlab.training import train
from ortlab.walkthroughs.per_op_gradients import op_model
from ortlab.labs.checks import judge
from ortlab.labs.remote import learner, probe


def example_inputs(shapes, seed=0):
    """Random float32 inputs away from 0 (PRelu's kink), so finite differences stay honest."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return [np.asarray(a + 0.2 * np.sign(a), dtype=np.float32) for a in arrays]


def one_op_model(op, arrays, seed=0):
    """Inputs x0, x1, ... -> op -> loss = ReduceSum(Y · R) (ortlab.walkthroughs.per_op_gradients.op_model)."""
    return op_model(op, {f"x{i}": a for i, a in enumerate(arrays)}, seed=seed + 100)


@probe
def gradient_graph(builder, op, model, names):
    """The gradient graph of `model` (loss 'loss', gradients of `names`) with the learner's builder for
    `op`; ortlab's own error message (a str) when ortlab rejects what the builder emitted."""
    try:
        with using_gradient(op, builder):
            return build_gradient_graph(model, names, "loss")
    except NotImplementedError:
        raise
    except OrtlabError as exc:
        return str(exc)


@probe
def register_definition(make_definition):
    """Register make_definition()'s Softplus gradient into ORT's C++ builder in this process (the
    notebook then trains with it); ortlab's message when ORT refuses it, else None."""
    try:
        register_ort_gradient("Softplus", make_definition())
    except OrtlabError as exc:
        return str(exc)
    return None


def check_softplus(builder):
    """Exercise 'softplus': Y = log(1 + exp(X)), so dX = dY · sigmoid(X)."""
    judge("softplus", "lab03.softplus", learner(builder))


def check_prelu(builder):
    """Exercise 'prelu': Y = X if X > 0 else slope · X, slope broadcast to X's shape."""
    judge("prelu", "lab03.prelu", learner(builder))


def check_matmul(builder):
    """Exercise 'matmul': Y = A·B, batched, with broadcast batch axes."""
    judge("matmul", "lab03.matmul", learner(builder))


def check_ort_definition(make_definition):
    """Exercise 'ort_definition': Softplus's gradient in ORT's format, checked with ortlab first
    (ORT keeps the first definition it is given), then registered into ORT's C++ gradient builder."""
    judge("ort_definition", "lab03.ort_definition", learner(make_definition))


class SoftplusMLP(torch.nn.Module):
    """Linear, Softplus, Linear: ORT 1.19.2 can train it only once Softplus has a gradient."""

    def __init__(self, features=8, hidden=16):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(features, hidden), torch.nn.Linear(hidden, 1)

    def forward(self, x):
        return self.l2(torch.nn.functional.softplus(self.l1(x)))


def train_softplus_mlp(use_ort, steps=20, seed=0, lr=0.05):
    """Losses of a short regression run, in ORTModule (no fallback to PyTorch) or in PyTorch."""
    from ortlab.ortmodule.driver import ortmodule_env  # lazy: the driver takes 1.5 s to import

    seed_everything(seed)
    model = SoftplusMLP()
    x = torch.randn(64, 8)
    y = torch.sin(x.sum(1, keepdim=True))
    if use_ort:
        try:
            case = one_op_model("Softplus", example_inputs([(2, 2)]))
            ort_gradient_graph(case.model, case.x_names, "loss")
        except OrtlabError:
            raise OrtlabError("ORT has no gradient for Softplus in this process yet, so ORTModule cannot "
                              "train this model: finish exercise 'ort_definition' (it registers yours) "
                              "and run its cell first") from None
    # ORTMODULE_FALLBACK_POLICY: fail rather than use PyTorch; set for this run only
    with ortmodule_env(FALLBACK_POLICY="FALLBACK_DISABLE") if use_ort else contextlib.nullcontext():
        if use_ort:
            model = quiet_import("onnxruntime.training.ortmodule").ORTModule(model)
        with warnings.catch_warnings(), os_level_streams():  # ORTModule's first run: no DeepSpeed, torch's notice
            warnings.filterwarnings("ignore", "DeepSpeed import error", UserWarning)
            warnings.filterwarnings("ignore", "Setting `training`", FutureWarning)
            return train(model, [(x, y)], torch.optim.SGD(model.parameters(), lr=lr), steps,
                         loss_fn=torch.nn.functional.mse_loss, progress=False).losses

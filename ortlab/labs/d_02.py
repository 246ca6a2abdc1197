"""Exercises of the walkthrough D_02_convergence_investigation: which loops keep the loss constant at lr = 0, and
which parameters' gradients differ between ORTModule and PyTorch.

The loops and models the exercises are about are built here, so the notebook can show them; the checks live in
ortlab.labs.judges.d_02 ('lr_zero' runs each loop in PyTorch; 'grad_parity' compares the learner's verdicts with
the gradients of the real ORTModule against PyTorch's), and the reference answers in
solutions/walkthroughs/D_02_convergence_investigation.py, outside the package.
"""
import inspect

import numpy as np
import torch
from torch import nn

from ortlab.labs.checks import judge
from ortlab.labs.remote import learner, probe
from ortlab.walkthroughs import ortmodule_feature_models as fm


# --- exercise 'lr_zero' -----------------------------------------------------------------------------------

def _mlp(*middle):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), *middle, nn.ReLU(), nn.Linear(16, 4))


def _batches():
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(6, 8, generator=g), torch.randint(0, 4, (6,), generator=g)) for _ in range(2)]


def dropout_loop(steps=4):
    model, (batch, _) = _mlp(nn.Dropout(0.1)), _batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def no_zero_grad_loop(steps=4):
    model, (batch, _) = _mlp(), _batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    losses = []
    for _ in range(steps):  # optimizer.zero_grad() forgotten: gradients pile up
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def weight_decay_loop(steps=4):
    model, (batch, _) = _mlp(), _batches()
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.0, weight_decay=0.1)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def batchnorm_loop(steps=4):
    model, (batch, _) = _mlp(nn.BatchNorm1d(16)), _batches()  # train mode: running statistics move
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


def warmup_loop(steps=4):
    model, (batch, _) = _mlp(), _batches()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / 10)  # lr 0 at step 0, then rising
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(batch[0]), batch[1])
        loss.backward()
        optimizer.step()
        warmup.step()
        losses.append(loss.item())
    return losses


LOOPS = {"dropout": dropout_loop, "no_zero_grad": no_zero_grad_loop, "weight_decay": weight_decay_loop,
         "batchnorm": batchnorm_loop, "warmup": warmup_loop}


def show_loops():
    """Each loop's source, as the exercise shows it."""
    print(inspect.getsource(_mlp) + "\n" + inspect.getsource(_batches))
    for name, fn in LOOPS.items():
        print(f"# --- {name}\n{inspect.getsource(fn)}")


@probe
def predicted_constant(fn):
    """The learner's fn(), as {loop: bool}, or a str saying what to return instead."""
    found = fn()
    if not isinstance(found, dict):
        return f"return a dict {{loop name: True or False}}, not {type(found).__name__}"
    out = {}
    for name, said in found.items():
        if not isinstance(said, (bool, np.bool_)):
            return f"for {name!r} give True (the same loss at every step) or False, not {said!r}"[:160]
        out[str(name)] = bool(said)
    return out


def check_lr_zero(fn):
    """Exercise 'lr_zero': fn() -> {loop: whether its four losses are all the same} for LOOPS, checked by running
    each loop in PyTorch."""
    judge("lr_zero", "d_02.lr_zero", learner(fn))


# --- exercise 'grad_parity' -------------------------------------------------------------------------------

class TinyAttention(nn.Module):
    """The model of comparison 1: one attention head over x [batch, seq, 8] (q, k, v projections with biases),
    averaged over the sequence, then a Linear to 4 classes; the cross-entropy loss is multiplied by
    `loss_scale`, as a loss scaler multiplies it before backward."""

    def __init__(self, d=8, classes=4, loss_scale=4096.0):
        super().__init__()
        with torch.random.fork_rng():
            torch.manual_seed(0)
            self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)
            self.out = nn.Linear(d, classes)
        self.d, self.loss_scale = d, loss_scale

    def forward(self, x, labels):
        scores = self.q(x) @ self.k(x).transpose(-1, -2) / self.d ** 0.5
        h = torch.softmax(scores, dim=-1) @ self.v(x)
        return nn.functional.cross_entropy(self.out(h.mean(1)), labels) * self.loss_scale

    def example_inputs(self):
        g = torch.Generator().manual_seed(2)
        return torch.randn(4, 6, self.d, generator=g), torch.randint(0, 4, (4,), generator=g)


def half_grad_net():
    """The HalfGradTanhNet of comparison 2 (L1_07: Linear a -> a custom tanh whose backward halves the gradient
    -> Linear b -> cross-entropy)."""
    return fm.HalfGradTanhNet()


def show_parameters():
    """The parameters of the two models the check compares gradients of: names and shapes."""
    for what, model in (("comparison 1, TinyAttention (its loss times 4096)", TinyAttention()),
                        ("comparison 2, HalfGradTanhNet", half_grad_net())):
        print(f"{what}:")
        print("\n".join(f"    {name}: {list(p.shape)}" for name, p in model.named_parameters()))


@probe
def differing(fn, ours, reference):
    """The learner's fn(ours, reference) on copies of two {parameter name: gradient} dicts, as a sorted list of
    names, or a str saying what to return instead."""
    found = fn({k: v.copy() for k, v in ours.items()}, {k: v.copy() for k, v in reference.items()})
    if isinstance(found, (str, bytes, dict)) or not hasattr(found, "__iter__"):
        return f"return a set of parameter names, not {type(found).__name__}"
    names = []
    for name in found:
        if not isinstance(name, str):
            return f"return parameter names (str), not {name!r}"[:160]
        names.append(name)
    return sorted(set(names))


def check_grad_parity(fn):
    """Exercise 'grad_parity': fn(ours, reference) -> the names of the parameters whose gradients differ beyond
    float32 rounding, checked on gradients of the real ORTModule against PyTorch's."""
    judge("grad_parity", "d_02.grad_parity", learner(fn))

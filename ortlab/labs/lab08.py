"""Checks for lab08_train_e2e: a training step, a run with ORTModule that reaches a stated loss, and
parity with PyTorch.

The task is ortlab.training.progressions (next token of x_t = start + stride·t mod 16) for the lab's
tiny GPT; the learner's code trains here (the probes below) and every reference run is plain
PyTorch, built from the same seeds, in ortlab.labs.judges.lab08.
"""
import torch

from ortlab import models
from ortlab.labs.checks import judge
from ortlab.labs.remote import learner, probe
from ortlab.training import progression_batches
from ortlab.ortmodule import driver as om

VOCAB, TARGET, MAX_STEPS = 16, 0.5, 300


def task(n=16, batch=16, seq=16, seed=0):
    """The lab's data: n batches of progressions."""
    return progression_batches(n, batch=batch, seq=seq, vocab=VOCAB, seed=seed)


def tiny_gpt(seed=0):
    """The lab's model: the tiny GPT with a vocabulary of 16 and no dropout (for parity)."""
    return models.get("gpt", vocab=VOCAB, dropout=0.0, seed=seed)


@probe
def training_steps(training_step, n):
    """([loss of each step], {parameter: values after}) of the learner's step on task(n=n), from
    tiny_gpt() with SGD lr 0.1."""
    model = tiny_gpt()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = [training_step(model, optimizer, b) for b in task(n=n)]
    return losses, {name: p.detach() for name, p in model.named_parameters()}


@probe
def e2e_facts(train_e2e):
    """What train_e2e() returned: whether the model is an ORTModule that did not fall back, its type,
    and the losses (None when it did not return (model, losses))."""
    result = train_e2e()
    if not isinstance(result, tuple) or len(result) != 2:
        return None
    model, losses = result
    ortmodule = __import__("onnxruntime.training.ortmodule", fromlist=["ORTModule"]).ORTModule
    is_ort = isinstance(model, ortmodule)
    return {"ortmodule": is_ort, "type": type(model).__name__, "fell_back": is_ort and om.fell_back(model),
            "losses": list(losses) if isinstance(losses, (list, tuple)) else losses}


def check_training_step(training_step):
    """Exercise 'training_step': training_step(model, optimizer, batch) -> the loss (a float)."""
    judge("training_step", "lab08.training_step", learner(training_step))


def check_reaches_target(train_e2e):
    """Exercise 'train_e2e': train_e2e() -> (model, losses): ORTModule, no fallback, the target reached."""
    judge("train_e2e", "lab08.train_e2e", learner(train_e2e))


def check_parity(parity_curves, steps=20):
    """Exercise 'parity': parity_curves(steps) -> (ORTModule losses, PyTorch losses), SGD lr 0.05."""
    judge("parity", "lab08.parity", learner(parity_curves), steps)

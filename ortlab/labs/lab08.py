"""Checks for lab08_train_e2e: a training step, a run with ORTModule that reaches a stated loss, and
parity with PyTorch.

The task is ortlab.training.progressions (next token of x_t = start + stride·t mod 16) for the lab's
tiny GPT; every reference run here is plain PyTorch, built from the same seeds.
"""
import torch

from ortlab import models
from ortlab.labs.checks import call_learner, check, compare
from ortlab.training import progression_batches, train, train_step
from ortlab.training import ortmodule as om

VOCAB, TARGET, MAX_STEPS = 16, 0.5, 300


def task(n=16, batch=16, seq=16, seed=0):
    """The lab's data: n batches of progressions."""
    return progression_batches(n, batch=batch, seq=seq, vocab=VOCAB, seed=seed)


def tiny_gpt(seed=0):
    """The lab's model: the tiny GPT with a vocabulary of 16 and no dropout (for parity)."""
    return models.get("gpt", vocab=VOCAB, dropout=0.0, seed=seed)


def _reference_step(model, optimizer, batch):
    loss, _, _ = train_step(model, batch, optimizer, skip_non_finite=False)  # a plain step
    return loss.item()


def check_training_step(training_step):
    """Exercise 'training_step': training_step(model, optimizer, batch) -> the loss (a float)."""
    def test():
        data = task(n=2)
        runs = {}
        for name, step in (("yours", training_step), ("reference", _reference_step)):
            model = tiny_gpt()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            losses = [call_learner(step, model, optimizer, b, what="training_step(model, optimizer, batch)") if name == "yours"
                      else step(model, optimizer, b) for b in data]
            runs[name] = (losses, model)
        (losses, model), (expected, reference) = runs["yours"], runs["reference"]
        if not all(isinstance(v, float) for v in losses):
            return f"return loss.item() (a float), not {type(losses[0]).__name__}"
        reason = compare(losses, expected, 1e-6, 1e-7, "the losses of two steps")
        if reason:
            return reason
        for (name, p), q in zip(model.named_parameters(), reference.parameters()):
            reason = compare(p.detach(), q.detach(), 1e-5, 1e-7, f"parameter {name} after two steps")
            if reason:
                return reason + " (did you zero the gradients before backward, and step after it?)"
        return None
    check("training_step", test)


def check_reaches_target(train_e2e):
    """Exercise 'train_e2e': train_e2e() -> (model, losses): ORTModule, no fallback, the target reached."""
    def test():
        result = call_learner(train_e2e, what="train_e2e()")
        if not isinstance(result, tuple) or len(result) != 2:
            return "return (model, losses): the ORTModule you trained and its list of losses"
        model, losses = result
        om_module = __import__("onnxruntime.training.ortmodule", fromlist=["ORTModule"])
        if not isinstance(model, om_module.ORTModule):
            return f"the model is a {type(model).__name__}: wrap the tiny GPT with ORTModule"
        if om.fell_back(model):
            return "ORTModule fell back to PyTorch: this run was not ORT's (set FALLBACK_POLICY=FALLBACK_DISABLE)"
        if not 10 <= len(losses) <= MAX_STEPS:
            return f"train for 10 to {MAX_STEPS} steps, not {len(losses)}"
        final = sum(losses[-10:]) / 10
        if not final < TARGET:
            return f"the mean of the last 10 losses is {final:.3f}, above the target {TARGET}: more steps or another lr"
        return None
    check("train_e2e", test)


def reference_torch_losses(steps, lr=0.05):
    """The PyTorch run that parity is measured against: SGD from tiny_gpt()'s initial weights."""
    model = tiny_gpt()
    return train(model, task(), torch.optim.SGD(model.parameters(), lr=lr), steps, progress=False).losses


def check_parity(parity_curves, steps=20):
    """Exercise 'parity': parity_curves(steps) -> (ORTModule losses, PyTorch losses), SGD lr 0.05."""
    def test():
        result = call_learner(parity_curves, steps, what=f"parity_curves({steps})")
        if not isinstance(result, tuple) or len(result) != 2:
            return "return (ort_losses, torch_losses)"
        ort_losses, torch_losses = (list(r) for r in result)
        expected = reference_torch_losses(steps)
        reason = compare(torch_losses, expected, 1e-6, 1e-7, "your PyTorch losses")
        if reason:
            return reason + " (start from lab08.tiny_gpt() and lab08.task(), SGD lr 0.05, one batch per step in order)"
        return compare(ort_losses, expected, 1e-4, 0.0, "your ORTModule losses against PyTorch's (rtol 1e-4)")
    check("parity", test)


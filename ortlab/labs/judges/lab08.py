"""The checks of lab08_train_e2e (run where the learner's code cannot reach them).

The learner's functions train in the learner's process (ortlab.labs.lab08's probes); the losses and
parameters come back as data and are compared here with plain PyTorch runs built from the same seeds.
"""
import torch

from ortlab.labs.checks import CheckFailed, compare
from ortlab.labs.lab08 import MAX_STEPS, TARGET, e2e_facts, task, tiny_gpt, training_steps
from ortlab.labs.remote import call
from ortlab.training import train, train_step


def _reference_step(model, optimizer, batch):
    loss, _, _ = train_step(model, batch, optimizer, skip_non_finite=False)  # a plain step
    return loss.item()


def _ask(remote, probe, *args, what):
    try:
        return remote.call(probe, *args)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:
        text = (str(exc).strip().splitlines() or [""])[0]
        raise CheckFailed(f"{what} raised {type(exc).__name__}: {text}"[:200]) from None


def training_step(remote, step):
    """Exercise 'training_step': training_step(model, optimizer, batch) -> the loss (a float)."""
    data = task(n=2)
    losses, params = _ask(remote, training_steps, step, len(data),
                          what="training_step(model, optimizer, batch)")
    reference = tiny_gpt()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    expected = [_reference_step(reference, optimizer, b) for b in data]
    if not all(isinstance(v, float) for v in losses):
        return f"return loss.item() (a float), not {type(losses[0]).__name__}"
    reason = compare(losses, expected, 1e-6, 1e-7, "the losses of two steps")
    if reason:
        return reason
    for name, q in reference.named_parameters():
        if name not in params:
            return f"parameter {name} is missing after two steps"
        reason = compare(params[name], q.detach(), 1e-5, 1e-7, f"parameter {name} after two steps")
        if reason:
            return reason + " (did you zero the gradients before backward, and step after it?)"
    return None


def train_e2e(remote, fn):
    """Exercise 'train_e2e': train_e2e() -> (model, losses): ORTModule, no fallback, the target reached."""
    facts = _ask(remote, e2e_facts, fn, what="train_e2e()")
    if facts is None:
        return "return (model, losses): the ORTModule you trained and its list of losses"
    if not facts["ortmodule"]:
        return f"the model is a {facts['type']}: wrap the tiny GPT with ORTModule"
    if facts["fell_back"]:
        return "ORTModule fell back to PyTorch: this run was not ORT's (set FALLBACK_POLICY=FALLBACK_DISABLE)"
    losses = facts["losses"]
    if not isinstance(losses, list) or not all(isinstance(v, (int, float)) for v in losses):
        return "the losses must be a list of numbers (loss.item() of each step)"
    if not 10 <= len(losses) <= MAX_STEPS:
        return f"train for 10 to {MAX_STEPS} steps, not {len(losses)}"
    final = sum(losses[-10:]) / 10
    if not final < TARGET:
        return f"the mean of the last 10 losses is {final:.3f}, above the target {TARGET}: more steps or another lr"
    return None


def reference_torch_losses(steps, lr=0.05):
    """The PyTorch run that parity is measured against: SGD from tiny_gpt()'s initial weights."""
    model = tiny_gpt()
    return train(model, task(), torch.optim.SGD(model.parameters(), lr=lr), steps, progress=False).losses


def parity(remote, parity_curves, steps=20):
    """Exercise 'parity': parity_curves(steps) -> (ORTModule losses, PyTorch losses), SGD lr 0.05."""
    result = _ask(remote, call, parity_curves, steps, what=f"parity_curves({steps})")
    if not isinstance(result, tuple) or len(result) != 2 \
            or not all(isinstance(r, (list, tuple)) for r in result):
        return "return (ort_losses, torch_losses)"
    ort_losses, torch_losses = (list(r) for r in result)
    expected = reference_torch_losses(steps)
    reason = compare(torch_losses, expected, 1e-6, 1e-7, "your PyTorch losses")
    if reason:
        return reason + " (start from lab08.tiny_gpt() and lab08.task(), SGD lr 0.05, one batch per step in order)"
    return compare(ort_losses, expected, 1e-4, 0.0, "your ORTModule losses against PyTorch's (rtol 1e-4)")

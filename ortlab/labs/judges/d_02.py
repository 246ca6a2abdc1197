"""The checks of D_02's exercises (run where the learner's code cannot reach them).

'lr_zero' runs each loop of ortlab.labs.d_02.LOOPS in PyTorch (torch's RNG state kept as it was) and compares the
learner's verdicts with whether its losses were all the same. 'grad_parity' gives the learner two comparisons of
real gradients: the real ORTModule's (onnxruntime.training.ortmodule) against PyTorch's for a one-head attention
whose loss is scaled by 4096, as a loss scaler scales it (they agree up to float32 rounding, and the key bias has
a gradient that is zero in exact arithmetic), and ORTModule with custom autograd support off against
PyTorch for HalfGradTanhNet (the first layer's gradients differ: ORT builds the true TanhGrad instead of the
function's backward, L1_07). The truth is which parameters differ by more than rounding, measured against the size
of the model's gradients.
"""
import copy
import functools

import numpy as np
import torch

from ortlab.labs.checks import CheckFailed, same_keys
from ortlab.ortmodule import driver as om
from ortlab.walkthroughs.ortmodule_optimizations import custom_autograd_support
from ortlab.labs.d_02 import LOOPS, TinyAttention, differing, half_grad_net, predicted_constant


# --- 'lr_zero' ------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def torch_constant():
    """{loop: (whether its losses are all the same, the losses)}, each loop run in PyTorch."""
    found = {}
    with torch.random.fork_rng():
        for name, loop in LOOPS.items():
            losses = loop()
            found[name] = (len(set(losses)) == 1, losses)
    return found


WHY = {
    "dropout": "at lr 0 the weights stay, but Dropout draws a new mask at every forward in train mode, so the loss "
               "changes from step to step: randomness, which is why a parity run sets dropout to 0",
    "no_zero_grad": "the gradients pile up without zero_grad(), but SGD multiplies them by lr = 0: the weights never "
                    "move and the same batch gives the same loss (a missing zero_grad() shows only once lr > 0)",
    "weight_decay": "AdamW's decoupled decay is p *= 1 - lr * weight_decay, and the Adam step is scaled by lr too: "
                    "with lr = 0 neither moves a weight",
    "batchnorm": "in train mode BatchNorm normalizes with the batch's own statistics; the running averages it "
                 "updates are read only in eval mode, so the same batch gives the same loss",
    "warmup": "the scheduler starts the lr at 0 and raises it at every step (0, 0.01, 0.02, ...): only the first "
              "update is an lr-0 update; an lr = 0 check must pin the lr itself, schedulers included",
}


def lr_zero(remote, fn):
    got = remote.call(predicted_constant, fn)
    if isinstance(got, str):
        raise CheckFailed(got)
    truth = torch_constant()
    same_keys(got, truth, "loop", "True or False")
    for name, (constant, losses) in truth.items():
        if got[name] != constant:
            shown = ", ".join(f"{v:.4f}" for v in losses)
            raise CheckFailed(f"{name}: its losses are {shown}: {'the same' if constant else 'not the same'} at "
                              f"every step; {WHY[name]}")
    return None


# --- 'grad_parity' --------------------------------------------------------------------------------------

def _grads(module):
    return {name: p.grad.detach().numpy().copy() for name, p in module.named_parameters()}


@functools.lru_cache(maxsize=1)
def comparisons():
    """[(what, ORTModule's gradients, PyTorch's gradients)] for the two comparisons the check gives."""
    found = []
    with torch.random.fork_rng(), om.captured_logs():  # ORTModule's export writes to the process's fds 1 and 2
        reference = TinyAttention()
        batch = reference.example_inputs()
        ours = copy.deepcopy(reference)
        reference(*batch).backward()
        om.ortmodule(ours)(*batch).backward()
        found.append(("ORTModule against PyTorch, TinyAttention with its loss scaled by 4096", _grads(ours),
                      _grads(reference)))
        net = half_grad_net()
        inputs = net.example_inputs(seed=0)
        reference, ours = copy.deepcopy(net), copy.deepcopy(net)
        reference(*inputs).backward()
        with custom_autograd_support(False):
            om.ortmodule(ours)(*inputs).backward()
        found.append(("ORTModule with custom autograd support off against PyTorch, HalfGradTanhNet", _grads(ours),
                      _grads(reference)))
    return found


def differs(ours, reference, rtol=1e-4, scale=1e-5):
    """The names whose gradients differ by more than rtol (relative) plus scale times the largest gradient of the
    model (absolute): float32 rounding is relative to the values, and a gradient zero in exact arithmetic holds
    noise on the order of the model's gradients times float32's epsilon."""
    largest = max(float(np.abs(g).max()) for g in reference.values())
    return sorted(name for name, g in reference.items()
                  if not np.allclose(ours[name], g, rtol=rtol, atol=scale * largest))


def _relative(a, b):
    return float(np.abs(a - b).max() / max(float(np.abs(b).max()), 1e-30))


def grad_parity(remote, fn):
    for number, (what, ours, reference) in enumerate(comparisons(), 1):
        got = remote.call(differing, fn, ours, reference)
        if isinstance(got, str):
            raise CheckFailed(got)
        truth = differs(ours, reference)
        unknown = [name for name in got if name not in reference]
        if unknown:
            raise CheckFailed(f"comparison {number}: {unknown[0]!r} is not a parameter of the model")
        if got == truth:
            continue
        largest = max(float(np.abs(g).max()) for g in reference.values())
        extra = [name for name in got if name not in truth]
        missing = [name for name in truth if name not in got]
        head = f"comparison {number} ({what})"
        unequal = sorted(name for name in reference if not np.array_equal(ours[name], reference[name]))
        if extra and set(got) == set(reference) and truth:
            raise CheckFailed(f"{head}: you flagged every parameter; only {', '.join(truth)} differ, the others "
                              "match to rounding: compare each parameter separately, which is how a parity gap is "
                              "located in a layer")
        if extra and got == unequal:
            name = max(extra, key=lambda n: float(np.abs(reference[n]).max()))
            raise CheckFailed(f"{head}: you flagged every parameter whose gradients are not equal bit for bit; "
                              f"{name}'s differ by {_relative(ours[name], reference[name]):.0e} of their size at most: "
                              "float32 rounding (ORT's kernels add in another order than PyTorch's), not a "
                              "difference; compare up to a tolerance")
        normal = [name for name in extra if float(np.abs(reference[name]).max()) >= 1e-4 * largest]
        if normal:
            name = max(normal, key=lambda n: float(np.abs(reference[n]).max()))
            gap = float(np.abs(ours[name] - reference[name]).max())
            raise CheckFailed(f"{head}: {name} differs by {gap:.1e} at most, "
                              f"{_relative(ours[name], reference[name]):.0e} of its size: float32 rounding. The loss "
                              "is scaled by 4096, so the gradients and their rounding are large: measure a gap "
                              "relative to the values, not against a fixed absolute tolerance")
        if extra:
            name = extra[0]
            gap, size = float(np.abs(ours[name] - reference[name]).max()), float(np.abs(reference[name]).max())
            why = (" (a bias added to every key shifts each row of scores by a constant, which softmax ignores)"
                   if name.endswith("k.bias") else "")
            raise CheckFailed(f"{head}: {name}'s gradient is zero in exact arithmetic{why}, so both sides hold "
                              f"rounding noise (largest {size:.1e}, gap {gap:.1e}); measure a gap against the size of "
                              f"the model's gradients (largest {largest:.3g}), not that tensor's own")
        name = missing[0]
        raise CheckFailed(f"{head}: {name} is missing: its gradients differ by "
                          f"{_relative(ours[name], reference[name]):.0%} of their size, far beyond rounding")
    return None

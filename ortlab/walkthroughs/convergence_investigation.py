"""D_02: shrinking a convergence repro from two ranks to one with ortlab.distributed.launch.

The bug planted here is a training-loop bug, not a distributed one: the loop never calls
`optimizer.zero_grad()`, so every backward adds its gradient to the previous ones (autograd
accumulates into `.grad`) and SGD steps with the running sum. Each rank trains
`DDP(ORTModule(model))`, the wrap order the ORTModule training guidelines recommend, on its slice of
the global batch. DDP averages the ranks' gradients, so with equal slices and a mean loss one rank
on the whole batch computes the same gradient: the global loss curve must be the same at every world
size. If the wrong curve is still there on one rank, the distributed part is ruled out.

`bug_job` is the rank function (it must live in a module: each rank is a spawned process);
`global_losses` runs it on N ranks and returns the loss of the whole batch at each step.
"""
import warnings

import torch
import torch.distributed as dist

from ortlab import models
from ortlab.distributed.launcher import launch
from ortlab.env import quiet_import
from ortlab.errors import OrtlabError
from ortlab.ortmodule.driver import captured_logs, fell_back, ortmodule
from ortlab.training.data import progression_batches

MODEL = {"vocab": 16, "dropout": 0.0, "layers": 1, "d_model": 16, "d_ff": 32}
DATA = {"n": 4, "batch": 8, "seq": 16, "vocab": 16}


class ReproError(OrtlabError):
    """The repro was asked for something it cannot run."""


def _slice(batch, rank, world_size):
    """Rank `rank`'s equal share of every tensor in `batch` (rows rank*B/W up to (rank+1)*B/W)."""
    rows = batch[0].shape[0]
    if rows % world_size:
        raise ReproError(f"the global batch of {rows} rows cannot be split equally over {world_size} ranks: "
                         f"use a world size that divides {rows}")
    share = rows // world_size
    return tuple(t[rank * share:(rank + 1) * share] for t in batch)


def bug_job(rank, world_size, steps=24, lr=1.0, zero_grad=False, seed=0):
    """Rank function: train DDP(ORTModule(tiny GPT)) with SGD on this rank's slice of each batch.

    zero_grad=False is the planted bug (gradients accumulate across steps). Returns this rank's loss
    per step (before the step) and whether ORTModule fell back to PyTorch."""
    from torch.nn.parallel import DistributedDataParallel as DDP  # heavy: torch

    quiet_import("onnxruntime.training.ortmodule")
    torch.manual_seed(seed)
    model = models.get("gpt", **MODEL)
    batches = [_slice(b, rank, world_size) for b in progression_batches(**DATA)]
    with captured_logs(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        wrapped = DDP(ortmodule(model))
        optimizer = torch.optim.SGD(wrapped.parameters(), lr=lr)
        losses = []
        for step in range(steps):
            if zero_grad:
                optimizer.zero_grad()
            loss = wrapped(*batches[step % len(batches)])
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        ort_fell_back = fell_back(wrapped.module)
    dist.barrier()
    return {"losses": losses, "fell_back": ort_fell_back}


def global_losses(world_size, steps=24, lr=1.0, zero_grad=False, timeout=300):
    """Run bug_job on `world_size` CPU ranks (gloo: the model stays on the CPU).

    Returns the whole batch's loss per step (the mean of the ranks' losses: equal slices) and the
    launch's wall time. Raises ReproError if ORTModule fell back to PyTorch on a rank."""
    if isinstance(world_size, int) and world_size > 0:
        _slice(progression_batches(**DATA)[0], 0, world_size)  # refuses an unequal split before any rank starts
    result = launch(bug_job, world_size, args=(steps, lr, zero_grad), timeout=timeout,
                    backend="gloo")
    if any(r["fell_back"] for r in result):
        raise ReproError("ORTModule fell back to PyTorch on a rank: the run is not ORT's")
    per_step = zip(*(r["losses"] for r in result))
    return [sum(values) / world_size for values in per_step], result.seconds


def pattern(losses):
    """The loss curve's shape in words: its lowest point, and how far above it the curve ends."""
    low = min(range(len(losses)), key=losses.__getitem__)
    if low == len(losses) - 1:
        return f"falls to its lowest, {losses[low]:.2f}, at the last step"
    return (f"falls to {losses[low]:.2f} at step {low}, then climbs to {losses[-1]:.2f} "
            f"({losses[-1] / losses[low]:.1f}x the lowest)")

"""A training loop for the notebooks: progress bar, loss curve, step times, global norm, loss scale.

The plain training loop (zero_grad, forward, backward, step) with what a training
engineer watches while it runs: the loss, the gradients' global norm, the time per step,
and, with loss scaling, the steps skipped because a gradient overflowed (as a dynamic loss
scaler does; ORT's is orttraining/orttraining/python/training/amp/loss_scaler.py).
"""
import math
import numbers
import time
from dataclasses import dataclass, field

import numpy as np
import torch
from tqdm import tqdm

from ortlab.errors import OrtlabError
from ortlab.training import tensorboard
from ortlab.viz import plot_curves


class TrainingError(OrtlabError):
    """The loop was given something it cannot train with (the message says what)."""


@dataclass
class History:
    """What a run recorded, one entry per step."""

    losses: list = field(default_factory=list)
    grad_norms: list = field(default_factory=list)
    step_times: list = field(default_factory=list)   # seconds
    skipped: list = field(default_factory=list)      # steps whose update was skipped (overflow)

    def median_step_time(self, warmup=2):
        """Median seconds per step after the first `warmup` steps (export and session set-up)."""
        times = sorted(self.step_times[warmup:] or self.step_times)
        return times[len(times) // 2] if times else float("nan")

    def plot(self, title="", **curves):
        """The loss curve, with other {label: History} runs beside it."""
        plot_curves({"this run": self.losses, **{k: h.losses for k, h in curves.items()}}, title=title)

    def __repr__(self):
        if not self.losses:
            return "History(no steps)"
        return (f"History({len(self.losses)} steps, loss {self.losses[0]:.4f} -> {self.losses[-1]:.4f}"
                f"{f', {len(self.skipped)} skipped' if self.skipped else ''})")


def global_norm(parameters):
    """‖g‖ over all gradients together: sqrt(Σ_p Σ g²), what clip_grad_norm_ clips."""
    grads = [p.grad for p in parameters if p.grad is not None]
    return math.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)) if grads else 0.0


def _batch(batches, step):
    return batches(step) if callable(batches) else batches[step % len(batches)]


def train_step(model, batch, optimizer, loss_fn=None, clip_norm=None, loss_scale=1.0, skip_non_finite=True):
    """One step, in this order: zero_grad, forward, backward (of loss · loss_scale), unscale, clip, step.

    Returns (loss, norm, stepped): the loss tensor, the gradients' global norm before clipping,
    and whether the optimizer stepped (not when the norm is not finite and skip_non_finite).
    Without loss_fn the model returns the loss itself; with it, loss_fn(model(*batch[:-1]), batch[-1]).
    """
    params = [p for g in optimizer.param_groups for p in g["params"]]
    optimizer.zero_grad()
    loss = model(*batch) if loss_fn is None else loss_fn(model(*batch[:-1]), batch[-1])
    if loss.dim() != 0:
        raise TrainingError(f"the loss must be a scalar, got shape {tuple(loss.shape)}: return "
                            "a reduced loss or pass loss_fn")
    (loss * loss_scale).backward()
    if loss_scale != 1.0:
        for p in params:
            if p.grad is not None:
                p.grad.div_(loss_scale)
    norm = global_norm(params)
    stepped = math.isfinite(norm) or not skip_non_finite
    if stepped:
        if clip_norm is not None:
            torch.nn.utils.clip_grad_norm_(params, clip_norm)
        optimizer.step()
    return loss, norm, stepped


def train(model, batches, optimizer, steps, loss_fn=None, clip_norm=None, loss_scale=1.0,
          progress=True, desc="train", on_step=None, skip_non_finite=True, log_dir=None, redraw_every=0.1):
    """Train for `steps` steps of train_step and return a History.

    batches: a list of input tuples (cycled) or a function step -> tuple. Without loss_fn the
    model returns the loss itself (the zoo's models do, given labels); with it,
    loss = loss_fn(model(*batch[:-1]), batch[-1]). clip_norm clips the global norm;
    loss_scale multiplies the loss before backward and divides the gradients after, skipping
    the update when a gradient is not finite (skip_non_finite=False steps anyway, as a plain
    loop does). on_step(step, history) is called after each step is recorded (to print, to
    change the learning rate, to look at the gradients). log_dir: a run folder (e.g. runs/lab08)
    where each step's loss, lr and norm are also written for TensorBoard (tensorboard.py). redraw_every: the
    progress bar redraws at most every this many seconds (tqdm's mininterval; 10 leaves a run of a few seconds
    its first and last lines only, which a stored notebook shows as one).
    """
    check_arguments(model, batches, optimizer, steps, clip_norm, loss_scale)
    if on_step is not None and not callable(on_step):
        raise TrainingError(f"on_step must be a function on_step(step, history) or None, not {on_step!r}")
    if isinstance(redraw_every, bool) or not isinstance(redraw_every, (int, float)) or not redraw_every >= 0:
        raise TrainingError(f"redraw_every is the progress bar's seconds between redraws, a number >= 0, "
                            f"not {redraw_every!r}")
    history = History()
    writer = None
    if log_dir is not None:
        writer = tensorboard.open_writer(log_dir)
    bar = tqdm(range(steps), desc=desc, disable=not progress, leave=True, mininterval=redraw_every)
    for step in bar:
        start = time.perf_counter()
        loss, norm, stepped = train_step(model, _batch(batches, step), optimizer, loss_fn, clip_norm, loss_scale,
                                         skip_non_finite)
        if not stepped:
            history.skipped.append(step)
        history.step_times.append(time.perf_counter() - start)
        history.losses.append(loss.item())
        history.grad_norms.append(norm)
        bar.set_postfix(loss=f"{history.losses[-1]:.4f}", refresh=False)
        if writer is not None:
            tensorboard.log_step(writer, step, history, optimizer)
        if on_step is not None:
            on_step(step, history)
    bar.close()
    if writer is not None:
        writer.close()
    return history


def check_arguments(model, batches, optimizer, steps, clip_norm=None, loss_scale=1.0):
    """What train() needs, checked before the first step: a callable model, batches (a non-empty list of
    input tuples, or a function step -> tuple), an optimizer with param_groups, steps an int >= 1,
    clip_norm None or a positive number, loss_scale a positive finite number."""
    if not callable(model):
        raise TrainingError(f"model must be a torch.nn.Module (callable), not {type(model).__name__}")
    if not callable(batches):
        if isinstance(batches, (str, bytes, dict)) or not (hasattr(batches, "__getitem__") and
                                                           hasattr(batches, "__len__")):
            raise TrainingError(f"batches must be a list of input tuples (cycled) or a function step -> tuple, not "
                                f"{type(batches).__name__}; for a DataLoader, pass list(loader) or a function")
        if not batches:
            raise TrainingError("batches is empty: need at least one batch")
    if not isinstance(getattr(optimizer, "param_groups", None), list):
        raise TrainingError(f"optimizer must be a torch.optim.Optimizer (with param_groups), not "
                            f"{type(optimizer).__name__}")
    if isinstance(steps, bool) or not isinstance(steps, (int, np.integer)) or steps < 1:
        raise TrainingError(f"steps must be an int >= 1, not {type(steps).__name__} {steps!r}")
    for name, value in (("clip_norm", clip_norm), ("loss_scale", loss_scale)):
        if value is None and name == "clip_norm":
            continue
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or not 0 < value < math.inf:
            raise TrainingError(f"{name} must be a positive finite number{' or None' if name == 'clip_norm' else ''}, "
                                f"not {value!r}")


def curve_shape(losses, window=5):
    """What a loss curve looks like, by the rules a training engineer applies by eye:

    'not finite' (a NaN or inf), 'plateau' (the end is within 2% of the start), 'diverging' (the
    end is above the start), 'spiky' (a step jumps up by more than half the curve's total descent),
    else 'decreasing'.
    """
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 1:
        raise TrainingError(f"window must be an int >= 1 (steps averaged at each end), not {window!r}")
    try:
        values = [float(v) for v in losses]
    except (TypeError, ValueError):
        raise TrainingError(f"curve_shape takes a list of losses (numbers, e.g. History.losses), not "
                            f"{losses!r:.80}") from None
    if len(values) < 2 * window:
        raise TrainingError(f"need at least {2 * window} losses to judge a curve, got {len(values)}")
    if not all(math.isfinite(v) for v in values):
        return "not finite"
    start, end = sum(values[:window]) / window, sum(values[-window:]) / window
    if abs(start - end) < 0.02 * abs(start):
        return "plateau"
    if end > start:
        return "diverging"
    jumps = [b - a for a, b in zip(values, values[1:])]
    return "spiky" if max(jumps) > 0.5 * (start - end) else "decreasing"

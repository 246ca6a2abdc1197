"""The checks of D_01's exercises (run where the learner's code cannot reach them).

'global_norm_clip' clips the check's gradients with torch.nn.utils.clip_grad_norm_ (torch/nn/utils/clip_grad.py:
one norm over all gradients, a scale max_norm / (norm + 1e-6) applied only when it is below 1) and names a wrong
answer by the usual variant it matches. 'loss_scaler' runs ORT's own DynamicLossScaler
(onnxruntime/training/amp/loss_scaler.py, update()) over each case's overflow flags and explains the first step
where the learner's scale differs.
"""
import types

import numpy as np
import torch

from ortlab.env import quiet_import
from ortlab.labs.checks import CheckFailed
from ortlab.labs.d_01 import clip_cases, clipped, scaler_cases, scales


# --- 'global_norm_clip' ---------------------------------------------------------------------------------

def torch_clip(grads, max_norm):
    """The gradients after torch.nn.utils.clip_grad_norm_(params, max_norm), as float64 arrays."""
    params = [torch.nn.Parameter(torch.zeros_like(g)) for g in grads]
    for p, g in zip(params, grads):
        p.grad = g.clone()
    torch.nn.utils.clip_grad_norm_(params, max_norm)
    return [p.grad.double().numpy() for p in params]


def variants(grads, max_norm):
    """{name: clipped gradients} for the usual ways of getting global-norm clipping wrong (float64)."""
    arrays = [g.double().numpy() for g in grads]
    norms = [float(np.linalg.norm(a)) for a in arrays]
    total = float(np.sqrt(sum(n * n for n in norms)))
    return {"per tensor": [a * min(1.0, max_norm / n) if n else a for a, n in zip(arrays, norms)],
            "always": [a * max_norm / total for a in arrays],
            "sum of norms": [a * min(1.0, max_norm / sum(norms)) for a in arrays],
            "values": [np.clip(a, -max_norm, max_norm) for a in arrays]}


def _why(name, grads, max_norm):
    norms = [float(g.double().norm()) for g in grads]
    total = float(np.sqrt(sum(n * n for n in norms)))
    shown = ", ".join(f"{n:.3f}" for n in norms)
    return {"per tensor": f"you clipped each gradient to its own norm; global-norm clipping takes one norm over "
                          f"all gradients together, sqrt(sum of their squared norms) = {total:.3f} here (norms "
                          f"{shown}), and scales every gradient by the same max_norm / that norm",
            "always": f"you scaled the gradients although their global norm, {total:.3f}, is within max_norm "
                      f"{max_norm}: clip only when the global norm exceeds max_norm; below it they stay as they are",
            "sum of norms": f"you added up the gradients' norms ({shown}); the global norm is sqrt(sum of their "
                            f"squares) = {total:.3f}, not the sum of their norms",
            "values": "you clamped each value to [-max_norm, max_norm], which is clip_grad_value_; clip_grad_norm_ "
                      "keeps the gradients' direction and scales them all by max_norm / their global norm"}[name]


def _close(got, want):
    return all(np.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(got, want))


def global_norm_clip(remote, fn):
    for number, (grads, max_norm) in enumerate(clip_cases(), 1):
        got = remote.call(clipped, fn, grads, max_norm)
        if isinstance(got, str):
            raise CheckFailed(got)
        truth = torch_clip(grads, max_norm)
        if _close(got, truth):
            continue
        where = f"case {number} (max_norm {max_norm}, gradients of shapes {[tuple(g.shape) for g in grads]})"
        for name, value in variants(grads, max_norm).items():
            if _close(got, value) and not _close(value, truth):
                raise CheckFailed(f"{where}: {_why(name, grads, max_norm)}")
        k = next(i for i, (a, b) in enumerate(zip(got, truth)) if not np.allclose(a, b, rtol=1e-5, atol=1e-7))
        raise CheckFailed(f"{where}: gradient {k} differs from what clip_grad_norm_ leaves: "
                          f"{np.round(got[k].ravel()[:4], 5).tolist()}... instead of "
                          f"{np.round(truth[k].ravel()[:4], 5).tolist()}...")
    return None


# --- 'loss_scaler' --------------------------------------------------------------------------------------

def ort_scales(flags, settings):
    """The loss scale after each step of ORT's DynamicLossScaler, fed the flags through update()."""
    amp = quiet_import("onnxruntime.training.amp")
    scaler = amp.DynamicLossScaler(automatic_update=True, **settings)
    return [scaler.update(types.SimpleNamespace(all_finite=flag)) for flag in flags]


def _trace(flags, settings):
    """[(scale before the step, stable steps counted before the step)] as ORT's scaler runs."""
    scale, stable, states = settings["loss_scale"], 0, []
    for flag in flags:
        states.append((scale, stable))
        if flag:
            stable += 1
            if stable >= settings["up_scale_window"]:
                scale, stable = min(settings["max_loss_scale"], scale * 2), 0
        else:
            scale, stable = max(settings["min_loss_scale"], scale / 2), 0
    return states


def _num(x):
    return f"{int(x)}" if float(x).is_integer() else f"{x:g}"


def loss_scaler(remote, fn):
    for number, (flags, settings) in enumerate(scaler_cases(), 1):
        got = remote.call(scales, fn, flags, settings)
        if isinstance(got, str):
            raise CheckFailed(got)
        truth = ort_scales(flags, settings)
        where = (f"case {number} (flags {''.join('T' if f else 'F' for f in flags)}, loss_scale "
                 f"{_num(settings['loss_scale'])}, up_scale_window {settings['up_scale_window']}, min_loss_scale "
                 f"{_num(settings['min_loss_scale'])}, max_loss_scale {_num(settings['max_loss_scale'])})")
        if len(got) != len(truth):
            raise CheckFailed(f"{where}: return the scale after each of the {len(flags)} steps, not {len(got)} "
                              "values")
        step = next((k for k, (a, b) in enumerate(zip(got, truth)) if a != b), None)
        if step is None:
            continue
        window, low, high = settings["up_scale_window"], settings["min_loss_scale"], settings["max_loss_scale"]
        before, stable = _trace(flags, settings)[step]
        said, real = got[step], truth[step]
        head = f"{where}, step {step}: you said {_num(said)}, ORT's scaler {_num(real)}"
        if flags[step]:
            counted = stable + 1
            reset = step - counted  # the step after which ORT's count of finite steps began again
            if real == before and counted < window and reset < 0:
                why = (f"this is finite step {counted} in a row, and the scale doubles only after {window} finite "
                       "steps in a row (up_scale_window)")
            elif real == before and counted < window and not flags[reset]:
                why = (f"step {reset} overflowed, and the count of finite steps starts again from 0 after an "
                       f"overflow: this is finite step {counted} since, of the {window} that double the scale")
            elif real == before and counted < window:
                why = (f"the scale doubled at step {reset}, and the count of finite steps starts again from 0 after "
                       f"each doubling: this is finite step {counted} since, of the {window} that double it again")
            elif real == before:
                why = f"the scale doubles here, but it is already at max_loss_scale {_num(high)}: never above it"
            elif said == before:
                why = (f"the window-th finite step in a row doubles the scale: this is finite step {counted} of "
                       f"up_scale_window {window} (stable count >= window)")
            elif said > high:
                why = f"never above max_loss_scale {_num(high)}"
            else:
                why = f"a finite step doubles the scale only at the {window}-th finite step in a row"
        else:
            why = (f"an overflow halves the scale, and it is never below min_loss_scale {_num(low)}"
                   if real == low and said < low else
                   "an overflow halves the scale (and starts the count of finite steps again from 0)")
        raise CheckFailed(f"{head}: {why}")
    return None

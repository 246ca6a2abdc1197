"""The checks of L1_07's exercises (run where the learner's code cannot reach them).

'label_sparsity' runs ORT's own hook (GraphTransitionManager._add_check_label_sparsity_hook,
onnxruntime/training/ortmodule/_graph_transition_manager.py: a forward pre-hook on every nn.CrossEntropyLoss
module, density = labels != ignore_index, ON below 90 %) on each case and reads what it logged and recorded.
'fused_adam_step' steps ORT's own FusedAdam (onnxruntime/training/optim/fused_adam.py) from each case's state,
its multi_tensor_adam running as ortlab.ortmodule.fused_adam's CPU transcription of multi_tensor_adam.cu (the
CUDA extension a CPU wheel does not build); a wrong answer is named by the variant it matches.
"""
import contextlib
import functools
import io
import logging
import types

import numpy as np
import torch

from ortlab.env import quiet_import
from ortlab.labs.checks import CheckFailed, same_keys
from ortlab.labs.l1_07 import ModuleLoss, VOCAB, adam_cases, label_cases, predicted_sparsity, stepped
from ortlab.ortmodule import fused_adam as fa


# --- 'label_sparsity' -----------------------------------------------------------------------------------

class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def ort_label_check(module, labels):
    """(what ORT logged about the labels' density, or None when no hook ran; the densities it recorded) for one
    forward of `module` with ORT's label-sparsity hook installed, as ORTModule installs it at export."""
    manager = quiet_import("onnxruntime.training.ortmodule._graph_transition_manager").GraphTransitionManager
    handler, logger = _Lines(), logging.Logger("ortlab.l1_07.label_sparsity", logging.INFO)
    logger.addHandler(handler)
    inspector = types.SimpleNamespace(_sceloss_module_to_ignore_density_map={})
    handles = manager._add_check_label_sparsity_hook(True, logger, inspector, module)
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # FlagAndPrintDensity prints the density
            module(torch.zeros(*labels.shape, VOCAB), labels)
    finally:
        for handle in handles:
            handle.remove()
    said = [line for line in handler.lines if line.startswith("Label sparsity-based optimization")]
    return (said[0] if said else None), dict(inspector._sceloss_module_to_ignore_density_map)


@functools.lru_cache(maxsize=1)
def ort_verdicts():
    """{case: ("ON" | "OFF" | None, ORT's log line or None)} over label_cases()."""
    found = {}
    for case, (module, labels) in label_cases().items():
        line, _ = ort_label_check(module, labels)
        verdict = None if line is None else ("ON" if " ON " in line else "OFF")
        found[case] = (verdict, line)
    return found


def _why(case, verdict, line):
    module, labels = label_cases()[case]
    if not isinstance(module, ModuleLoss):
        return ("its loss is torch.nn.functional.cross_entropy, no nn.CrossEntropyLoss module: ORT's check is a "
                "forward pre-hook registered on each CrossEntropyLoss module, so nothing looks at these labels "
                "and the optimization stays off whatever the padding")
    ignore = module.loss.ignore_index
    valid = int((labels != ignore).sum())
    density = (f"{valid} of {labels.numel()} labels differ from ignore_index={ignore}: density "
               f"{100 * valid / labels.numel():.0f}%")
    if case == "padded_with_zero":
        return (f"ORT counts the labels that differ from the loss module's ignore_index, not the padding token: "
                f"{density}, so it is OFF; padding is sparse to ORT only when it is marked with ignore_index")
    if case == "two_ignored":
        return f"{density}, and ORT turns it on only below 90% (label_density < 90), so it is OFF"
    if case == "ignore_index_zero":
        return (f"this loss ignores 0, so the 0s are the ignored labels: {density}, below 90%, so it is ON "
                "(ORT reads ignore_index from the module)")
    return f"{density}, below 90%, so it is ON"


def label_sparsity(remote, fn):
    got = remote.call(predicted_sparsity, fn)
    if isinstance(got, str):
        raise CheckFailed(got)
    truth = ort_verdicts()
    same_keys(got, truth, "case", "'ON', 'OFF' or None")
    for case, (verdict, line) in truth.items():
        if got[case] != verdict:
            said = "None (not checked)" if got[case] is None else got[case]
            real = "not checked at all" if verdict is None else f"{verdict} (ORT logs: '{line}')"
            raise CheckFailed(f"{case}: you said {said}, ORT's hook says {real}: {_why(case, verdict, line)}")
    return None


# --- 'fused_adam_step' ----------------------------------------------------------------------------------

def ort_step(case):
    """(p, m, v) after ORT's FusedAdam (adam_w_mode and eps left at FusedAdam's defaults but eps as given)
    takes step case['step'] from the case's state, as float64 arrays."""
    fused_adam, _ = fa.fused_adam_class()
    with fa.cpu_fused_ops():
        param = torch.nn.Parameter(torch.tensor(case["p"]))
        optimizer = fused_adam([param], lr=case["lr"], betas=(case["beta1"], case["beta2"]), eps=case["eps"],
                               weight_decay=case["weight_decay"])
        optimizer.state[param]["exp_avg"] = torch.tensor(case["m"])
        optimizer.state[param]["exp_avg_sq"] = torch.tensor(case["v"])
        if case["step"] > 1:
            optimizer.param_groups[0]["step"] = case["step"] - 1  # step() adds one
        param.grad = torch.tensor(case["g"])
        optimizer.step()
        state = optimizer.state[param]
        return tuple(t.detach().double().numpy().copy() for t in (param, state["exp_avg"], state["exp_avg_sq"]))


def variants(case):
    """{name: p after the step} for the usual ways of getting FusedAdam's default step wrong (float64)."""
    p, g, m, v = (case[k].astype(np.float64) for k in "pgmv")
    lr, b1, b2, eps, wd, t = (case[k] for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "step"))
    m, v = b1 * m + (1 - b1) * g, b2 * v + (1 - b2) * g * g
    bc1, bc2 = 1 - b1 ** t, 1 - b2 ** t
    lr_corrected = lr * np.sqrt(bc2) / bc1
    adam = lr_corrected * m / (np.sqrt(v) + eps)
    torch_adam = lr * m / bc1 / (np.sqrt(v) / np.sqrt(bc2) + eps)
    return {"torch's AdamW": p * (1 - lr * wd) - torch_adam,
            "decay before": p * (1 - lr * wd) - adam,
            "eps after bias correction": (p - torch_adam) * (1 - lr * wd),
            "no bias correction": (p - lr * m / (np.sqrt(v) + eps)) * (1 - lr * wd),
            "decay with lr_corrected": (p - adam) * (1 - lr_corrected * wd),
            "no decay": p - adam}


WHY = {
    "torch's AdamW": "that is torch.optim.AdamW's step (ADAMW_TORCH). FusedAdam's default, ADAMW_TRANSFORMERS, "
                     "decays after the Adam update, and adds eps to sqrt(v) before the bias correction: "
                     "p -= lr_corrected * m / (sqrt(v) + eps) with lr_corrected = lr * sqrt(1 - beta2**step) / "
                     "(1 - beta1**step), then p -= lr * weight_decay * p",
    "decay before": "you applied the weight decay before the Adam update (torch's order); ADAMW_TRANSFORMERS "
                    "decays after it, the updated p: p -= lr * weight_decay * p last",
    "eps after bias correction": "you added eps after un-biasing v (sqrt(v) / sqrt(1 - beta2**step) + eps, torch's "
                                 "way); ADAMW_TRANSFORMERS adds eps to sqrt(v) itself and puts both bias "
                                 "corrections into the step size lr * sqrt(1 - beta2**step) / (1 - beta1**step)",
    "no bias correction": "you left out the bias correction; FusedAdam has bias_correction=True by default: the "
                          "step size is lr * sqrt(1 - beta2**step) / (1 - beta1**step)",
    "decay with lr_corrected": "you decayed with the bias-corrected step size; the decay uses the plain lr: "
                               "p -= lr * weight_decay * p",
    "no decay": "you left out the weight decay: after the Adam update, p -= lr * weight_decay * p",
}


def _close(got, want):
    return np.allclose(got, want, rtol=1e-4, atol=1e-6 * max(1e-30, float(np.abs(want).max())))


def fused_adam_step(remote, fn):
    for number, case in enumerate(adam_cases(), 1):
        got = remote.call(stepped, fn, case)
        if isinstance(got, str):
            raise CheckFailed(got)
        p, m, v = ort_step(case)
        where = (f"case {number} (step {case['step']}, lr {case['lr']}, betas ({case['beta1']}, {case['beta2']}), "
                 f"eps {case['eps']}, weight_decay {case['weight_decay']})")
        if not _close(got[1], m):
            raise CheckFailed(f"{where}: m after the step is wrong: m = beta1 * m + (1 - beta1) * g")
        if not _close(got[2], v):
            raise CheckFailed(f"{where}: v after the step is wrong: v = beta2 * v + (1 - beta2) * g * g")
        if _close(got[0], p):
            continue
        for name, value in variants(case).items():
            if _close(got[0], value) and not _close(value, p):
                raise CheckFailed(f"{where}: p differs from ORT's FusedAdam: {WHY[name]}")
        k = int(np.argmax(np.abs(got[0] - p)))
        raise CheckFailed(f"{where}: p differs from ORT's FusedAdam: p[{k}] is {got[0][k]:.7g}, FusedAdam gives "
                          f"{p[k]:.7g}")
    return None

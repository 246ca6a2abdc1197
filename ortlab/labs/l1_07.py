"""Exercises of the walkthrough L1_07_ortmodule_optimizations: predicting which label batches turn ORTModule's
label sparsity on, and writing one step of FusedAdam's default update (ADAMW_TRANSFORMERS).

The cases the exercises are about are built here, so the notebook can show them; the checks live in
ortlab.labs.judges.l1_07 ('label_sparsity' against ORT's own hook, GraphTransitionManager.
_add_check_label_sparsity_hook in onnxruntime/training/ortmodule/_graph_transition_manager.py, run on each
case; 'fused_adam_step' against ORT's own FusedAdam.step(), onnxruntime/training/optim/fused_adam.py, whose
multi_tensor_adam runs as ortlab.ortmodule.fused_adam's CPU transcription of multi_tensor_adam.cu), and the
reference answers in solutions/walkthroughs/L1_07_ortmodule_optimizations.py, outside the package.
"""
import textwrap
from pathlib import Path

import numpy as np
import torch

from ortlab.env import quiet_import
from ortlab.labs.checks import judge
from ortlab.labs.remote import learner, probe

VOCAB = 16


# --- exercise 'label_sparsity' ----------------------------------------------------------------------------

class ModuleLoss(torch.nn.Module):
    """A model's last step: its loss is an nn.CrossEntropyLoss module, called as self.loss(logits, labels)."""

    def __init__(self, ignore_index=-100):
        super().__init__()
        self.loss = torch.nn.CrossEntropyLoss(ignore_index=ignore_index)

    def forward(self, logits, labels):
        return self.loss(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class FunctionalLoss(torch.nn.Module):
    """The same loss through torch.nn.functional.cross_entropy: no loss module."""

    def forward(self, logits, labels):
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


def _labels(pad, count):
    """2 x 10 labels: token ids 1..15, with the last `count` positions (taken from the end of the second row
    first) set to `pad`."""
    labels = (torch.arange(20).reshape(2, 10) * 7) % (VOCAB - 1) + 1
    flat = labels.reshape(-1)
    for k in range(count):
        flat[[19, 9, 18, 8, 17, 7, 16, 6, 15, 5][k]] = pad
    return labels


def label_cases():
    """{case: (loss module, labels [2, 10])} of exercise 'label_sparsity'."""
    return {"padded_with_ignore_index": (ModuleLoss(), _labels(-100, 6)),
            "padded_with_zero": (ModuleLoss(), _labels(0, 6)),
            "two_ignored": (ModuleLoss(), _labels(-100, 2)),
            "ignore_index_zero": (ModuleLoss(ignore_index=0), _labels(0, 6)),
            "functional_loss": (FunctionalLoss(), _labels(-100, 10))}


def show_label_cases():
    """Each case's loss and labels, as the exercise shows them."""
    for case, (module, labels) in label_cases().items():
        loss = (f"nn.CrossEntropyLoss(ignore_index={module.loss.ignore_index})" if isinstance(module, ModuleLoss)
                else "torch.nn.functional.cross_entropy(logits, labels)")
        print(f"{case}: loss {loss}")
        for row in labels.tolist():
            print("    " + " ".join(f"{v:4d}" for v in row))


@probe
def predicted_sparsity(fn):
    """The learner's fn(), as {case: "ON" | "OFF" | None}, or a str saying what to return instead."""
    found = fn()
    if not isinstance(found, dict):
        return f"return a dict {{case: 'ON', 'OFF' or None}}, not {type(found).__name__}"
    out = {}
    for case, said in found.items():
        if said is None or (isinstance(said, str) and said.strip().lower() in ("none", "not checked")):
            out[str(case)] = None
        elif isinstance(said, str) and said.strip().upper() in ("ON", "OFF"):
            out[str(case)] = said.strip().upper()
        else:
            return f"for {case!r} give 'ON', 'OFF' or None (ORT does not check it), not {said!r}"[:160]
    return out


def check_label_sparsity(fn):
    """Exercise 'label_sparsity': fn() -> {case: "ON" | "OFF" | None} for label_cases(), checked against ORT's
    own label-density hook run on each case."""
    judge("label_sparsity", "l1_07.label_sparsity", learner(fn))


# --- exercise 'fused_adam_step' ---------------------------------------------------------------------------

def kernel_excerpt():
    """The lines of ORT's multi_tensor_adam.cu (the wheel ships its source) that compute the bias corrections on
    the host and the ADAM_MODE_2 (torch AdamW) update of one element, dedented."""
    root = Path(quiet_import("onnxruntime.training.ortmodule.torch_cpp_extensions").__file__).parent
    lines = (root / "cuda" / "fused_ops" / "multi_tensor_adam.cu").read_text().splitlines()
    host = next(i for i, line in enumerate(lines) if "float bias_correction1 = 1.0" in line)
    mode2 = next(i for i, line in enumerate(lines) if "(mode == ADAM_MODE_2)" in line)
    end = next(i for i in range(mode2 + 1, len(lines)) if lines[i].strip() == "}")
    body = textwrap.indent(textwrap.dedent("\n".join(lines[mode2 + 1:end])), "    ")
    return (textwrap.dedent("\n".join(lines[host:host + 7])) + "\n...\nif (mode == ADAM_MODE_2) {\n" + body + "\n}")


def adam_cases():
    """The states the check steps from: dicts with p, g, m, v (float32 arrays), step (the step being taken,
    1-based) and lr, beta1, beta2, eps, weight_decay."""
    rng = np.random.default_rng(7)
    f32 = np.float32
    first = {"p": rng.standard_normal(6).astype(f32), "g": (rng.standard_normal(6) * 1e-4).astype(f32),
             "m": np.zeros(6, f32), "v": np.zeros(6, f32), "step": 1,
             "lr": 0.1, "beta1": 0.9, "beta2": 0.999, "eps": 1e-6, "weight_decay": 0.5}
    later = {"p": rng.standard_normal(6).astype(f32), "g": rng.standard_normal(6).astype(f32),
             "m": (rng.standard_normal(6) * 0.1).astype(f32), "v": (rng.random(6) * 0.01).astype(f32), "step": 4,
             "lr": 0.05, "beta1": 0.8, "beta2": 0.99, "eps": 1e-6, "weight_decay": 0.2}
    return [first, later]


@probe
def stepped(fn, case):
    """The learner's fn(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay) on copies of `case`, as a tuple
    of three float64 arrays (p, m, v after the step), or a str saying what to return instead."""
    args = {k: (np.array(v, np.float32) if isinstance(v, np.ndarray) else v) for k, v in case.items()}
    found = fn(args["p"], args["g"], args["m"], args["v"], args["step"], args["lr"], args["beta1"], args["beta2"],
               args["eps"], args["weight_decay"])
    if not isinstance(found, (tuple, list)):
        return f"return a tuple (p, m, v) of the values after the step, not {type(found).__name__}"[:160]
    if len(found) != 3:
        return f"return a tuple of three arrays (p, m, v) after the step; you returned {len(found)} values"
    out = []
    for name, value in zip("pmv", found):
        try:
            array = np.asarray(value.detach() if hasattr(value, "detach") else value, dtype=np.float64)
        except (TypeError, ValueError):
            return f"{name} must be an array of {case['p'].shape[0]} numbers, not {type(value).__name__}"
        if array.shape != case["p"].shape:
            return f"the {name} you return must have the shape of the p given, {case['p'].shape}, not {array.shape}"
        out.append(array)
    return tuple(out)


def check_fused_adam_step(fn):
    """Exercise 'fused_adam_step': fn(p, g, m, v, step, lr, beta1, beta2, eps, weight_decay) -> (p, m, v) after
    one step of FusedAdam's default mode, checked against ORT's FusedAdam.step() on the same state."""
    judge("fused_adam_step", "l1_07.fused_adam_step", learner(fn))

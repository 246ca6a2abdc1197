"""L1_07's exercises: 'label_sparsity' is judged by ORT's own label-density hook run on each case, and
'fused_adam_step' by ORT's own FusedAdam.step() on ortlab's CPU transcription of multi_tensor_adam.cu. Here: the
hook's verdicts are what the rule computes from the labels (density of labels != the module's ignore_index,
ON below 90 %, no hook without an nn.CrossEntropyLoss module), and the real ORTModule, exporting TinyGPT with
such a loss, logs the same verdicts; FusedAdam's default step is Hugging Face Transformers' AdamW (the
equivalence its docstring states) written out independently in float64, its ADAMW_TORCH step is
torch.optim.AdamW's, and every variant the judge names differs from the truth on some case."""
import numpy as np
import pytest
import torch

from ortlab import models
from ortlab.labs import l1_07
from ortlab.labs.judges.l1_07 import ort_step, ort_verdicts, variants
from ortlab.ortmodule import driver as om
from ortlab.ortmodule import fused_adam as fa


def test_the_hooks_verdicts_follow_the_density_rule():
    for case, (module, labels) in l1_07.label_cases().items():
        verdict, line = ort_verdicts()[case]
        if not isinstance(module, l1_07.ModuleLoss):
            assert verdict is None and line is None, case
            continue
        density = int((labels != module.loss.ignore_index).sum()) / labels.numel() * 100
        assert verdict == ("ON" if density < 90 else "OFF"), case
        assert line.endswith(f"for density: {density:.0f}%"), (case, line)
    assert [v for v, _ in ort_verdicts().values()] == ["ON", "OFF", "OFF", "ON", None]


@pytest.mark.parametrize("ignore_index, expected", [(-100, "OFF for density: 100%"), (0, "ON for density: 70%")])
def test_ortmodule_itself_logs_the_verdict_at_export(ignore_index, expected):
    gpt = models.get("gpt", vocab=16, layers=1, d_model=16, d_ff=32, dropout=0.0)
    ids, _ = gpt.example_inputs(batch=2, seq=10, seed=0)
    labels = l1_07._labels(0, 6)  # 6 of 20 labels are 0
    run = om.train(models.WithLossModule(gpt, ignore_index=ignore_index), [(ids, labels)], 1, log_level="INFO",
                   save_onnx=False)
    assert any(expected in line for line in run.grep("Label sparsity-based optimization")), run.log[-20:]


def transformers_adamw(case):
    """Hugging Face Transformers' AdamW.step (transformers/optimization.py, correct_bias=True), in float64."""
    p, g, m, v = (case[k].astype(np.float64) for k in "pgmv")
    b1, b2 = case["beta1"], case["beta2"]
    m = m * b1 + (1.0 - b1) * g
    v = v * b2 + (1.0 - b2) * g * g
    denom = np.sqrt(v) + case["eps"]
    step_size = case["lr"] * np.sqrt(1.0 - b2 ** case["step"]) / (1.0 - b1 ** case["step"])
    p = p - step_size * m / denom
    p = p + (-case["lr"] * case["weight_decay"]) * p
    return p, m, v


@pytest.mark.parametrize("number", range(len(l1_07.adam_cases())))
def test_fused_adams_default_step_is_transformers_adamw(number):
    case = l1_07.adam_cases()[number]
    for got, want in zip(ort_step(case), transformers_adamw(case)):
        np.testing.assert_allclose(got, want, rtol=2e-5, atol=1e-7)


def test_the_cpu_kernels_adamw_torch_mode_is_torchs_adamw():
    """The branch of the CPU transcription torch can check: ADAMW_TORCH over the same states (torch.optim.AdamW
    keeps its step count in its state, as FusedAdam keeps it in the group)."""
    fused_adam, mode = fa.fused_adam_class()
    for case in l1_07.adam_cases():
        params = [torch.nn.Parameter(torch.tensor(case["p"])) for _ in range(2)]
        kwargs = dict(lr=case["lr"], betas=(case["beta1"], case["beta2"]), eps=case["eps"],
                      weight_decay=case["weight_decay"])
        with fa.cpu_fused_ops():
            ours = fused_adam([params[0]], adam_w_mode=mode.ADAMW_TORCH, **kwargs)
            ours.state[params[0]].update(exp_avg=torch.tensor(case["m"]), exp_avg_sq=torch.tensor(case["v"]))
            ours.param_groups[0]["step"] = case["step"] - 1
            params[0].grad = torch.tensor(case["g"])
            ours.step()
        theirs = torch.optim.AdamW([params[1]], **kwargs)
        theirs.state[params[1]].update(step=torch.tensor(float(case["step"] - 1)), exp_avg=torch.tensor(case["m"]),
                                      exp_avg_sq=torch.tensor(case["v"]))
        params[1].grad = torch.tensor(case["g"])
        theirs.step()
        torch.testing.assert_close(params[0].detach(), params[1].detach(), rtol=1e-5, atol=1e-6)


def test_every_variant_the_judge_names_differs_from_fused_adam_on_some_case():
    differs = {name: False for name in variants(l1_07.adam_cases()[0])}
    for case in l1_07.adam_cases():
        p = ort_step(case)[0]
        for name, value in variants(case).items():
            differs[name] |= not np.allclose(value, p, rtol=1e-4, atol=1e-6 * np.abs(p).max())
    assert all(differs.values()), differs

"""D_01's exercises: 'global_norm_clip' is judged by torch.nn.utils.clip_grad_norm_, and 'loss_scaler' by ORT's
DynamicLossScaler. Here: what clip_grad_norm_ leaves is the numpy computation of one global norm and one factor
min(1, max_norm / (norm + 1e-6)), and every variant the judge names differs from it on some case; ORT's scaler
gives the scales of torch's own dynamic scaler (torch._amp_update_scale_, what torch.amp.GradScaler.update runs)
wherever no bound is reached, the judge's step-by-step trace of it (used to explain) gives ORT's scales, and the
cases reach both bounds."""
import numpy as np
import pytest
import torch

from ortlab.labs import d_01
from ortlab.labs.judges.d_01 import _trace, ort_scales, torch_clip, variants


@pytest.mark.parametrize("number", range(len(d_01.clip_cases())))
def test_clip_grad_norm_is_one_factor_from_the_global_norm(number):
    grads, max_norm = d_01.clip_cases()[number]
    arrays = [g.double().numpy() for g in grads]
    total = np.sqrt(sum(float((a * a).sum()) for a in arrays))
    factor = min(1.0, max_norm / (total + 1e-6))
    for got, a in zip(torch_clip(grads, max_norm), arrays):
        np.testing.assert_allclose(got, a * factor, rtol=1e-6, atol=1e-8)


def test_every_clipping_variant_differs_from_clip_grad_norm_on_some_case():
    differs = {name: False for name in variants(*d_01.clip_cases()[0])}
    for grads, max_norm in d_01.clip_cases():
        truth = torch_clip(grads, max_norm)
        for name, value in variants(grads, max_norm).items():
            differs[name] |= not all(np.allclose(a, b, rtol=1e-5, atol=1e-7) for a, b in zip(value, truth))
    assert all(differs.values()), differs
    norms = [np.sqrt(sum(float(g.double().pow(2).sum()) for g in grads)) for grads, _ in d_01.clip_cases()]
    assert [n > m for n, (_, m) in zip(norms, d_01.clip_cases())] == [True, False, False]


def torch_scales(flags, settings):
    scale = torch.tensor([settings["loss_scale"]])
    tracker = torch.tensor([0], dtype=torch.int32)
    found = []
    for flag in flags:
        torch._amp_update_scale_(scale, tracker, torch.tensor([0.0 if flag else 1.0]), 2.0, 0.5,
                                 settings["up_scale_window"])
        found.append(float(scale))
    return found


@pytest.mark.parametrize("number", range(len(d_01.scaler_cases())))
def test_orts_scaler_is_torchs_within_the_bounds_and_the_judges_trace(number):
    flags, settings = d_01.scaler_cases()[number]
    ort = ort_scales(flags, settings)
    ours = [scale for scale, _ in _trace(flags, settings)[1:]] + [None]
    assert ort[:-1] == ours[:-1]  # the scale before each step is the one after the step before
    theirs = torch_scales(flags, settings)
    low, high = settings["min_loss_scale"], settings["max_loss_scale"]
    for k, (a, b) in enumerate(zip(ort, theirs)):
        if low < b < high and all(low < t < high for t in theirs[:k]):
            assert a == b, (k, ort, theirs)


def test_the_cases_reach_both_bounds():
    reached = set()
    for flags, settings in d_01.scaler_cases():
        scales = ort_scales(flags, settings)
        reached |= {"min"} if settings["min_loss_scale"] in scales else set()
        reached |= {"max"} if settings["max_loss_scale"] in scales else set()
    assert reached == {"min", "max"}

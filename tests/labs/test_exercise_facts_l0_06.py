"""The facts L0_06's exercise judges read from ORT agree with an independent computation: torch's autograd.

'div_gradient': on every case the check uses, the gradients of A and B that ORT's backward graph computes are
torch's for loss = sum((A / B) · R), broadcasting included. 'gemm_grad': the gradients of A and B that ORT's
backward graph computes for gemm_case() are torch's for loss = sum((0.5 · A · Bᵀ + 2 · C) · R).
"""
import numpy as np
import pytest
import torch

from ortlab.labs import l0_06
from ortlab.labs.judges.l0_06 import div_cases, ort_gemm_gradients, ort_gradients, reduce_to


def _leaf(array):
    return torch.tensor(np.asarray(array, np.float64), requires_grad=True)


@pytest.mark.parametrize("k", range(len(div_cases())))
def test_ort_div_gradients_are_torchs(k):
    case = div_cases()[k]
    a, b = _leaf(case.feeds["A"]), _leaf(case.feeds["B"])
    ((a / b) * torch.from_numpy(case.loss_weights.astype(np.float64))).sum().backward()
    ort = ort_gradients(case)
    np.testing.assert_allclose(ort["A_grad"], a.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(ort["B_grad"], b.grad.numpy(), rtol=1e-4, atol=1e-5)


def test_reduce_to_sums_what_torch_sums():
    """The judge's numpy reduction (used to name a wrong formula) is torch's sum over broadcast axes."""
    for case in div_cases():
        b = _leaf(case.feeds["B"])
        (b * torch.ones(np.broadcast_shapes(case.feeds["A"].shape, case.feeds["B"].shape), dtype=torch.float64)
         ).sum().backward()
        ones = np.ones(np.broadcast_shapes(case.feeds["A"].shape, case.feeds["B"].shape))
        np.testing.assert_allclose(reduce_to(ones, case.feeds["B"].shape), b.grad.numpy())


def test_ort_gemm_gradients_are_torchs():
    spec = l0_06.gemm_case()
    a, b, c = (_leaf(spec["inputs"][n]) for n in "ABC")
    truth, values = ort_gemm_gradients()
    ((0.5 * a @ b.T + 2.0 * c) * torch.from_numpy(values["Y_grad"])).sum().backward()
    assert spec["attributes"] == {"transA": 0, "transB": 1, "alpha": 0.5, "beta": 2.0}
    np.testing.assert_allclose(truth["A"], a.grad.numpy(), rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(truth["B"], b.grad.numpy(), rtol=1e-4, atol=1e-5)

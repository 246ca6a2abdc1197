"""D_02's exercises: 'lr_zero' is judged by running each loop in PyTorch, and 'grad_parity' by which parameters'
gradients differ between the real ORTModule and PyTorch. Here: the loops judged constant leave every weight bit
for bit as it was, the dropout loop is constant once dropout is off, the warm-up's learning rates start at 0 and
rise; ORTModule with custom autograd support off gives HalfGradTanhNet's first layer exactly twice PyTorch's
gradient (the true TanhGrad instead of the half one) and the second layer PyTorch's own, the attention's key bias
has a gradient that is zero in float64, and the judge's verdicts do not move when its tolerances move tenfold."""
import copy

import numpy as np
import torch

from ortlab.labs import d_02
from ortlab.labs.judges.d_02 import comparisons, differs, torch_constant


def test_the_constant_loops_leave_every_weight_as_it_was():
    sources = {"no_zero_grad": d_02.no_zero_grad_loop, "weight_decay": d_02.weight_decay_loop,
               "batchnorm": d_02.batchnorm_loop}
    for name in sources:
        assert torch_constant()[name][0], name
    captured = {}
    original = d_02._mlp

    def watched(*middle):
        model = original(*middle)
        captured["model"], captured["before"] = model, copy.deepcopy(model.state_dict())
        return model

    d_02._mlp = watched
    try:
        for name, loop in sources.items():
            loop()
            after = captured["model"].state_dict()
            weights = [k for k in after if not k.endswith(("running_mean", "running_var", "num_batches_tracked"))]
            assert all(torch.equal(after[k], captured["before"][k]) for k in weights), name
    finally:
        d_02._mlp = original


def test_dropout_is_what_moves_the_dropout_loop_and_the_warmup_starts_at_zero():
    assert not torch_constant()["dropout"][0] and not torch_constant()["warmup"][0]
    model, (batch, _) = d_02._mlp(torch.nn.Dropout(0.1)), d_02._batches()
    model.eval()
    assert len({torch.nn.functional.cross_entropy(model(batch[0]), batch[1]).item() for _ in range(4)}) == 1
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    warmup = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: step / 10)
    rates = []
    for _ in range(4):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        warmup.step()
    assert rates[0] == 0.0 and all(b > a for a, b in zip(rates, rates[1:]))


def test_with_support_off_the_first_layer_gets_twice_the_custom_gradient():
    _, ours, reference = comparisons()[1]
    for name in ("a.weight", "a.bias"):
        np.testing.assert_allclose(ours[name], 2 * reference[name], rtol=1e-4, atol=1e-7)
    for name in ("b.weight", "b.bias"):
        np.testing.assert_allclose(ours[name], reference[name], rtol=1e-4, atol=1e-7)
    assert differs(ours, reference) == ["a.bias", "a.weight"]


def test_ortmodule_matches_pytorch_and_the_key_bias_gradient_is_zero_in_float64():
    _, ours, reference = comparisons()[0]
    assert differs(ours, reference) == []
    model = d_02.TinyAttention().double()
    x, labels = model.example_inputs()
    model(x.double(), labels).backward()
    largest = max(float(p.grad.abs().max()) for p in model.parameters())
    assert float(model.k.bias.grad.abs().max()) < 1e-12 * largest
    assert float(np.abs(reference["k.bias"]).max()) > 0  # float32 keeps noise


def test_the_verdicts_hold_for_tolerances_ten_times_larger_or_smaller():
    for _, ours, reference in comparisons():
        verdicts = {tuple(differs(ours, reference, rtol, scale)) for rtol in (1e-5, 1e-4, 1e-3)
                    for scale in (1e-6, 1e-5, 1e-4)}
        assert len(verdicts) == 1, verdicts

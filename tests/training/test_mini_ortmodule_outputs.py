"""Outputs that need no gradient beside one that does: a constant tensor (torch.ones(2)), an integer index
(argmax), the same tensor twice. MiniORTModule returns PyTorch's values and gives PyTorch's gradients."""
import copy

import pytest
import torch

from ortlab.training import MiniORTModule


class Outputs(torch.nn.Module):
    def __init__(self, extra):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0, -2.0, 3.0]))
        self.extra = extra

    def forward(self, x):
        y = (x * self.w).sum(1)
        return y, self.extra(x, y)


EXTRAS = {"a constant": lambda x, y: torch.ones(2), "an argmax": lambda x, y: (x * 2).argmax(1),
          "the same tensor": lambda x, y: y, "a constant beside the input": lambda x, y: torch.full((2,), 7.0) * 1}


@pytest.mark.parametrize("builder", ["ort", "ortlab"])
@pytest.mark.parametrize("extra", list(EXTRAS))
def test_an_output_beside_the_differentiable_one_trains_as_pytorch(extra, builder):
    module = Outputs(EXTRAS[extra])
    mini = MiniORTModule(copy.deepcopy(module), gradient_builder=builder)
    x_torch, x_mini = (torch.arange(6.0).reshape(2, 3).requires_grad_() for _ in range(2))
    expected, got = module(x_torch), mini(x_mini)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e)
    sum(o.sum() for o in expected if o.requires_grad).backward()
    sum(o.sum() for o in got if o.requires_grad).backward()
    torch.testing.assert_close(x_mini.grad, x_torch.grad)
    torch.testing.assert_close(mini.module.w.grad, module.w.grad)

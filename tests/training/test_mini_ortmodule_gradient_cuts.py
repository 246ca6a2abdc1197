"""A forward that cuts the gradient inside itself (x.detach(), torch.no_grad(), set_grad_enabled(False), w.data):
PyTorch's gradients stop there; the exported graph has no cut (the exporter writes detach as Identity, and a
no_grad block leaves no trace), so ORT differentiates through it. ORTModule 1.19.2 gives the other gradients
silently (run below). MiniORTModule refuses such a forward, naming the line; a forward whose cuts cannot
change a gradient (a mask from a comparison, zeros_like) gives PyTorch's gradients."""
import copy
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from ortlab.training import MiniORTModule
from ortlab.training.gradient_cuts import GradientCutError


class Cut(torch.nn.Module):
    def __init__(self, body):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
        self.body = body

    def forward(self, x):
        return self.body(self, x)


def _no_grad(m, x):
    with torch.no_grad():
        h = x * m.w
    return (h * m.w).sum(1)


def _detach(m, x):
    return ((x * m.w).detach() * m.w).sum(1)


def _grad_disabled(m, x):
    with torch.set_grad_enabled(False):
        h = m.w * 2
    return (x * m.w * h).sum(1)


def _data(m, x):
    return (x * m.w.data).sum(1) + (x * m.w).sum(1)


def _detached_output(m, x):
    y = x * m.w
    return y.detach().sum(1), y.sum(1)


def _chain_under_no_grad(m, x):
    with torch.no_grad():
        h = (x * m.w).exp() * 0.5
    return (h * m.w).sum(1)


CUTTING = {"torch.no_grad()": _no_grad, ".detach()": _detach, "set_grad_enabled(False)": _grad_disabled,
           ".data": _data, "a detached output": _detached_output, "a chain under no_grad": _chain_under_no_grad}


def _x():
    return torch.arange(6.0).reshape(2, 3).requires_grad_()


@pytest.mark.parametrize("body", list(CUTTING))
def test_a_forward_that_cuts_the_gradient_is_refused_naming_the_line(body):
    mini = MiniORTModule(Cut(CUTTING[body]))
    with pytest.raises(GradientCutError, match=r"cuts the gradient.*test_mini_ortmodule_gradient_cuts\.py:\d+"):
        mini(_x())


def _mask(m, x):
    with torch.no_grad():
        keep = (x.abs() > 1.0).float()
    return (x * m.w * keep).sum(1)


def _zeros_like(m, x):
    return (torch.zeros_like(x) + x * m.w).sum(1)


def _detach_of_a_constant(m, x):
    return (x * m.w + torch.ones(3).detach()).sum(1)


@pytest.mark.parametrize("body", [_mask, _zeros_like, _detach_of_a_constant], ids=lambda b: b.__name__)
def test_cuts_that_change_no_gradient_train_as_pytorch(body):
    module = Cut(body)
    mini = MiniORTModule(copy.deepcopy(module))
    x_torch, x_mini = _x(), _x()
    module(x_torch).sum().backward()
    mini(x_mini).sum().backward()
    torch.testing.assert_close(x_mini.grad, x_torch.grad)
    torch.testing.assert_close(mini.module.w.grad, module.w.grad)


def test_without_gradients_a_cut_changes_nothing_and_runs():
    module = Cut(_no_grad)
    with torch.no_grad():
        torch.testing.assert_close(MiniORTModule(copy.deepcopy(module))(_x()), module(_x()))


ORTMODULE_THROUGH_NO_GRAD = textwrap.dedent("""
    import json

    import torch
    from onnxruntime.training.ortmodule import ORTModule

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))

        def forward(self, x):
            with torch.no_grad():
                h = x * self.w
            return (h * self.w).sum(1)

    m = ORTModule(M())
    m(torch.arange(6.0).reshape(2, 3)).sum().backward()
    print(json.dumps(m._torch_module._original_module.w.grad.tolist()))
""")


def test_ortmodule_differentiates_through_a_no_grad_block():
    """What the refusal's message says of ORTModule 1.19.2: its gradient is not PyTorch's."""
    done = subprocess.run([sys.executable, "-c", ORTMODULE_THROUGH_NO_GRAD], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    module = Cut(_no_grad)
    module(torch.arange(6.0).reshape(2, 3)).sum().backward()
    assert json.loads(done.stdout.strip().splitlines()[-1]) != module.w.grad.tolist()

"""A forward that writes its input in place: PyTorch changes the caller's tensor once and computes from the
written value; the exported graph cannot write a caller's tensor. ORTModule 1.19.2 (run below) computes the
right outputs from copies but leaves the caller's tensor as it was, and loses the aliasing of a tensor passed
twice. MiniORTModule refuses such a forward with a clear error and leaves the caller's tensor untouched; every
forward that writes no input gives PyTorch's outputs, gradients and inputs."""
import copy
import json
import subprocess
import sys
import textwrap

import pytest
import torch

from ortlab.errors import OrtlabError
from ortlab.training import MiniORTModule
from ortlab.training.graph_transition_manager import InputWriteError, StateUpdateError


class Scaled(torch.nn.Module):
    """(x * w).sum(1) after `prepare(x)`, which may write x in place."""

    def __init__(self, prepare):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))
        self.prepare = prepare

    def forward(self, x, *more):
        x = self.prepare(x)
        for other in more:
            x = x * other
        return (x * self.w).sum(1)


def _mul_(x):
    x.mul_(2)
    return x


def _iadd(x):
    x += 1
    return x


def _row_mul_(x):
    x[0].mul_(2)
    return x


def _setitem(x):
    x[:, 0] = 5.0
    return x


def _data_write(x):
    x.data.mul_(3)  # bypasses the version counter: caught by value
    return x


WRITERS = {"x.mul_(2)": _mul_, "x += 1": _iadd, "x[0].mul_(2)": _row_mul_, "x[:, 0] = 5": _setitem,
           "x.data.mul_(3)": _data_write}


def _x():
    return torch.arange(6.0).reshape(2, 3)


@pytest.mark.parametrize("writer", list(WRITERS))
def test_a_forward_writing_its_input_is_refused_and_the_callers_tensor_is_untouched(writer):
    module = Scaled(WRITERS[writer])
    x = _x()
    expected_x = x.clone()
    torch_x = _x()
    module(torch_x)
    assert not torch.equal(torch_x, expected_x)  # PyTorch does change its caller's tensor
    with pytest.raises(InputWriteError, match=r"writes its input 'x' in place.*out of place") as info:
        MiniORTModule(copy.deepcopy(module))(x)
    assert isinstance(info.value, OrtlabError)
    assert torch.equal(x, expected_x)


def test_a_leaf_that_requires_grad_written_in_place_is_refused_as_pytorch_refuses_it():
    module = Scaled(_mul_)
    with pytest.raises(RuntimeError, match="leaf Variable that requires grad"):
        module(_x().requires_grad_())
    x = _x().requires_grad_()
    with pytest.raises(InputWriteError, match="'x'"):
        MiniORTModule(copy.deepcopy(module))(x)
    assert torch.equal(x.detach(), _x()) and x._version == 0


def test_a_non_leaf_input_written_in_place_is_refused_not_silently_detached():
    module, mini = Scaled(_mul_), MiniORTModule(Scaled(_mul_))
    base = _x().requires_grad_()
    module(base * 1)  # PyTorch runs it and differentiates through the write
    x = base * 1
    with pytest.raises(InputWriteError):
        mini(x)
    assert torch.equal(x.detach(), _x())


def test_writing_a_clone_of_the_input_is_fine_and_matches_pytorch():
    module = Scaled(lambda x: _mul_(x.clone()))
    mini = MiniORTModule(copy.deepcopy(module))
    x_torch, x_mini = _x().requires_grad_(), _x().requires_grad_()
    y_torch, y_mini = module(x_torch), mini(x_mini)
    torch.testing.assert_close(y_mini, y_torch)
    y_torch.sum().backward()
    y_mini.sum().backward()
    torch.testing.assert_close(x_mini.grad, x_torch.grad)
    torch.testing.assert_close(mini.module.w.grad, module.w.grad)
    assert torch.equal(x_mini.detach(), _x())


def test_the_same_tensor_passed_twice_matches_pytorch_and_its_gradient_sums_both_uses():
    module = Scaled(lambda x: x)
    mini = MiniORTModule(copy.deepcopy(module))
    x_torch, x_mini = _x().requires_grad_(), _x().requires_grad_()
    y_torch, y_mini = module(x_torch, x_torch), mini(x_mini, x_mini)
    torch.testing.assert_close(y_mini, y_torch)
    y_torch.sum().backward()
    y_mini.sum().backward()
    torch.testing.assert_close(x_mini.grad, x_torch.grad)


def test_the_same_tensor_passed_twice_and_written_is_refused():
    x = _x()
    with pytest.raises(InputWriteError):
        MiniORTModule(Scaled(_mul_))(x, x)
    assert torch.equal(x, _x())


class ReturnsInput(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        return x, (x * self.w).sum(1)


@pytest.mark.parametrize("runtime", ["ort", "ortlab"])
def test_an_input_returned_as_an_output_has_pytorchs_values_and_the_input_is_untouched(runtime):
    module = ReturnsInput()
    mini = MiniORTModule(copy.deepcopy(module), runtime=runtime,
                         gradient_builder="ortlab" if runtime == "ortlab" else "ort")
    x = _x()
    (echo_torch, y_torch), (echo_mini, y_mini) = module(x), mini(x)
    torch.testing.assert_close(echo_mini, echo_torch)
    torch.testing.assert_close(y_mini, y_torch)
    y_mini.sum().backward()
    y_torch.sum().backward()
    torch.testing.assert_close(mini.module.w.grad, module.w.grad)
    assert torch.equal(x, _x())


def test_a_parameter_written_in_forward_is_refused_and_put_back():
    class WritesW(Scaled):
        def forward(self, x):
            with torch.no_grad():
                self.w.mul_(2)
            return (x * self.w).sum(1)

    module = WritesW(None)
    with pytest.raises(StateUpdateError, match="parameter 'w'"):
        MiniORTModule(module)(_x())
    torch.testing.assert_close(module.w.detach(), torch.tensor([1.0, 2.0, 3.0]))


ORTMODULE_ON_AN_INPLACE_WRITE = textwrap.dedent("""
    import json

    import torch
    from onnxruntime.training.ortmodule import ORTModule

    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.tensor([1.0, 2.0, 3.0]))

        def forward(self, x):
            x.mul_(2)
            return (x * self.w).sum(1)

    x = torch.arange(6.0).reshape(2, 3)
    y = ORTModule(M())(x)
    print(json.dumps([y.tolist(), x.tolist()]))
""")


def test_ortmodule_computes_from_a_copy_and_leaves_the_callers_tensor_as_it_was():
    """What the refusal's message says of ORTModule 1.19.2: right outputs, the caller's x not written."""
    done = subprocess.run([sys.executable, "-c", ORTMODULE_ON_AN_INPLACE_WRITE], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    y, x = json.loads(done.stdout.strip().splitlines()[-1])
    module = Scaled(_mul_)
    torch_x = _x()
    assert y == module(torch_x).tolist()
    assert x == _x().tolist() != torch_x.tolist()

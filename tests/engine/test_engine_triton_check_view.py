"""The Triton EP checks its kernels' inputs without copying float device tensors to the host.

Torch's 'meta' device stands in for a GPU: a meta tensor has a dtype and a shape but no values, and
`.cpu()` on it raises, so any device-to-host copy of a float input would fail these tests. Each
registered kernel's checks must give the same outcome (pass, or the same message) on the real numpy
values as on `check_view` of device tensors, for its example inputs and for inputs of wrong shapes.
"""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ortlab.engine.triton_execution_provider import check_view  # noqa: E402
from ortlab.errors import OrtlabError  # noqa: E402
from ortlab.triton_kernels.registry import KERNELS, load_builtin_kernels  # noqa: E402



def kernel_classes():
    load_builtin_kernels()
    return sorted({KERNELS.lookup(key) for key in KERNELS}, key=lambda c: (c.domain, c.op_type))


def on_device(array):
    """A float array of more than one element as a value-less 'meta' tensor (a GPU tensor's stand-in);
    everything else as a CPU tensor, as the EP holds host inputs."""
    array = np.asarray(array)
    if array.dtype.kind == "f" and array.size > 1:
        return torch.empty(array.shape, dtype=torch.from_numpy(array[:0].copy()).dtype, device="meta")
    return torch.from_numpy(np.array(array))


def outcome(kernel, inputs):
    try:
        kernel.validate(inputs)
    except OrtlabError as error:
        return type(error).__name__, str(error)
    return "ok"


def variants(inputs):
    """The example, then each float input of more than one element given one more row, then one more dim."""
    yield "example", inputs
    for i, value in enumerate(inputs):
        value = np.asarray(value)
        if value.dtype.kind == "f" and value.size > 1:
            taller = np.concatenate([value, value[:1]]) if value.ndim else value
            yield f"input {i} one row more", inputs[:i] + [taller] + inputs[i + 1:]
            yield f"input {i} one dim more", inputs[:i] + [value[None]] + inputs[i + 1:]


@pytest.mark.parametrize("cls", kernel_classes(), ids=lambda c: f"{c.domain or 'ai.onnx'}.{c.op_type}")
def test_checks_read_no_float_device_values(cls):
    inputs, attributes = cls.example(np.random.default_rng(0))
    kernel = cls(**attributes)
    seen = 0
    for label, case in variants(list(inputs)):
        expected = outcome(kernel, [np.asarray(v) for v in case])
        assert outcome(kernel, [check_view(on_device(v)) for v in case]) == expected, label
        seen += 1
    assert seen >= 1


def test_a_float_device_tensor_is_not_copied():
    x = torch.empty((3, 37), dtype=torch.float32, device="meta")
    with pytest.raises(NotImplementedError):
        x.cpu()  # the copy the EP no longer makes
    view = check_view(x)
    assert view.shape == (3, 37) and view.dtype == np.float32 and view.strides == (0, 0)


def test_host_values_are_read_for_real():
    labels = torch.tensor([2, 0, 5])
    ratio = torch.tensor(0.25)
    assert check_view(labels).tolist() == [2, 0, 5]
    assert float(check_view(ratio)) == 0.25
    assert check_view(None) is None

"""L0_05's exercises are judged by the real onnxruntime's data pointers. Here, independently of the judge:
ortvalue_from_numpy wraps exactly the arrays numpy calls C-contiguous (ORT's Tensor is dense and row-major),
checked through a write (seen through the OrtValue when it wraps, not when it copied); and each conversion's
sharing, checked by writing through the result and reading the source."""
import numpy as np
import onnxruntime as ort
import pytest
import torch

from ortlab.labs import l0_05
from ortlab.labs.judges.l0_05 import _truth


@pytest.mark.parametrize("label", [label for label, *_ in l0_05.ARRAYS])
def test_ort_wraps_what_numpy_calls_c_contiguous_and_a_write_shows_it(label):
    arr = l0_05.array(label)
    wrapped = l0_05.ort_wraps(arr)
    assert wrapped == arr.flags["C_CONTIGUOUS"]
    if arr.flags.writeable:
        value = ort.OrtValue.ortvalue_from_numpy(arr)
        first = (0,) * arr.ndim
        new = (not arr[first]) if arr.dtype == bool else 1234
        arr[first] = new
        assert (value.numpy().reshape(-1)[0] == new) == wrapped


def _written_through(label):
    """Write through the conversion's result; is it seen through the source?"""
    a = np.zeros((2, 3), np.float32)
    value = ort.OrtValue.ortvalue_from_numpy(a)
    if label in ("from_numpy", "numpy_of_value", "torch_from_dlpack", "torch_tensor"):
        result = {"from_numpy": lambda: value.numpy(), "numpy_of_value": lambda: value.numpy(),
                  "torch_from_dlpack": lambda: torch.from_dlpack(value._ortvalue).numpy(),
                  "torch_tensor": lambda: torch.tensor(value.numpy()).numpy()}[label]()
        result[0, 0] = 7
        return bool(a[0, 0] == 7 if label == "from_numpy" else value.numpy()[0, 0] == 7)
    if label == "from_torch_numpy":
        t = torch.zeros(6)
        ort.OrtValue.ortvalue_from_numpy(t.numpy()).numpy()[0] = 7
        return bool(t[0] == 7)
    made = {"from_numpy_transposed": lambda: np.ascontiguousarray(a.T), "astype_float32": lambda: a.astype(np.float32)}
    if label in made:
        ort.OrtValue.ortvalue_from_numpy(made[label]()).numpy().reshape(-1)[0] = 7
        return bool(a[0, 0] == 7)
    return None  # session outputs: pointers only (test below)


@pytest.mark.parametrize("label", [label for label, _ in l0_05.CONVERSIONS])
def test_each_conversions_sharing_is_what_a_write_shows(label):
    through = _written_through(label)
    if through is not None:
        assert _truth(label) == through
    else:
        assert _truth(label) is False  # a graph output: ORT's own buffer (kAllocateOutput)

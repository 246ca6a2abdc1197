"""Exercises of the walkthrough L0_05_ortvalue_tensor: which arrays ORT wraps without a copy, and which
conversions share memory.

The arrays and conversions the exercises are about are named here, so the notebook can show them; the
checks live in ortlab.labs.judges.l0_05, which asks the real onnxruntime (OrtValue.ortvalue_from_numpy in
onnxruntime/python/onnxruntime_pybind_ortvalue.cc, a Tensor over the numpy buffer when it is dense and
row-major; core/framework/tensor.h) and compares data pointers; the reference answers are in
solutions/walkthroughs/L0_05_ortvalue_tensor.py, outside the package.
"""
import numpy as np

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe

BASE = "a = np.arange(24, dtype=np.float32).reshape(4, 6)"
# (label, numpy expression over a, why ORT wraps it or copies it)
ARRAYS = [
    ("a", "a", "dense and row-major"),
    ("a[1:]", "a[1:]", "whole rows: dense, it starts one row into a's buffer"),
    ("a.reshape(6, 4)", "a.reshape(6, 4)", "the same dense buffer read with another shape"),
    ("a[2]", "a[2]", "one whole row: dense"),
    ("a[:, 1:]", "a[:, 1:]", "rows 24 bytes apart holding 20 bytes each: gaps, not dense"),
    ("a[::2]", "a[::2]", "every other row: gaps between rows, not dense"),
    ("a.T", "a.T", "column-major strides (4, 24): not row-major"),
    ("a[::-1]", "a[::-1]", "a negative stride: not row-major"),
    ("a[:, 2]", "a[:, 2]", "one column: elements 24 bytes apart"),
    ("a[None]", "a[None]", "a new axis of size 1 has stride 0, which no row-major layout has, but a size-1 "
     "dimension is never stepped along: numpy's C_CONTIGUOUS flag ignores it, and so does ORT"),
    ("np.broadcast_to(a[0], (4, 6))", "np.broadcast_to(a[0], (4, 6))", "stride 0 along a dimension of size 4: "
     "24 elements over 6 floats of memory"),
    ("a > 3", "a > 3", "a new bool array numpy made dense"),
]


def array(label):
    """The array of ARRAYS called `label`, built fresh from a = np.arange(24, float32).reshape(4, 6)."""
    a = np.arange(24, dtype=np.float32).reshape(4, 6)
    expression = dict((k, e) for k, e, _ in ARRAYS)[label]
    return eval(expression, {"np": np, "a": a})  # noqa: S307 - one of the expressions above


def ort_wraps(arr):
    """True when onnxruntime's OrtValue.ortvalue_from_numpy(arr) points into arr's memory (no copy)."""
    import onnxruntime as ort  # heavy: onnxruntime

    value = ort.OrtValue.ortvalue_from_numpy(arr)
    low, high = np.byte_bounds(arr)
    return bool(low <= value.data_ptr() < high)


# (label, the conversion, in words and code)
CONVERSIONS = [
    ("from_numpy", "value = ort.OrtValue.ortvalue_from_numpy(a)               # value and a"),
    ("from_numpy_transposed", "ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a.T))  # and a"),
    ("numpy_of_value", "value.numpy()                                         # and value"),
    ("torch_from_dlpack", "torch.from_dlpack(value._ortvalue)                    # and value"),
    ("torch_tensor", "torch.tensor(value.numpy())                           # and value"),
    ("from_torch_numpy", "ort.OrtValue.ortvalue_from_numpy(t.numpy())           # and the torch tensor t"),
    ("astype_float32", "ort.OrtValue.ortvalue_from_numpy(a.astype(np.float32))  # and a (a is float32)"),
    ("identity_output", "sess.run_with_ort_values(None, {'x': x})[0]           # and x, sess: y = Identity(x)"),
    ("reshape_output", "sess.run_with_ort_values(None, {'x': x})[0]           # and x, sess: y = Reshape(x, [-1])"),
]


@probe
def wraps(fn, label):
    """The learner's fn(array(label)), as a bool (the array is built on the learner's side: strides and all)."""
    found = fn(array(label))
    if not isinstance(found, (bool, np.bool_)):
        raise CheckFailed(f"return True or False, not {type(found).__name__}")
    return bool(found)


@probe
def predicted(fn):
    """The learner's fn(), as a dict {label: bool}."""
    found = fn()
    if not isinstance(found, dict):
        raise CheckFailed(f"return a dict {{conversion label: True or False}}, not {type(found).__name__}")
    return {str(k): (bool(v) if isinstance(v, (bool, np.bool_)) else repr(v)) for k, v in found.items()}


def check_wraps_without_copy(fn):
    """Exercise 'wraps_without_copy': fn(array) -> whether ortvalue_from_numpy(array) shares array's memory,
    checked on each array of ARRAYS against the real onnxruntime's data pointers."""
    judge("wraps_without_copy", "l0_05.wraps_without_copy", learner(fn))


def check_shares_memory(fn):
    """Exercise 'shares_memory': fn() -> {label: True when the conversion's result shares its source's memory},
    for each conversion of CONVERSIONS, checked by doing each with the real onnxruntime and torch."""
    judge("shares_memory", "l0_05.shares_memory", learner(fn))

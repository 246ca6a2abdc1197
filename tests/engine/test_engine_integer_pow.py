"""Pow of integers in ORT 1.19.2 and in ortlab's engine: negative exponents, overflow, and ORT's
x * x / x * x * x path for a one-value exponent 2 or 3 (onnxruntime/core/providers/cpu/math/
element_wise_ops.cc, PowImpl). numpy refuses integers to negative powers; ORT answers, and so must the engine.

Facts from ORT (asserted on the real session below, and on std::pow's rule computed independently with
Python floats): 2 ** -1 = 0, 1 ** -1 = 1, (-1) ** -3 = -1, 0 ** -1 = the type's minimum, an overflow
through std::pow = the type's minimum, an overflow through x * x wraps.
"""
import math

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from ortlab.engine import InferenceSession

NP2T = {np.dtype(np.int32): T.INT32, np.dtype(np.int64): T.INT64, np.dtype(np.float32): T.FLOAT}


def pow_model(a, b, opset=18):
    inputs = [h.make_tensor_value_info(n, NP2T[v.dtype], list(v.shape)) for n, v in (("a", a), ("b", b))]
    m = h.make_model(h.make_graph([h.make_node("Pow", ["a", "b"], ["y"])], "g", inputs,
                                  [h.make_tensor_value_info("y", NP2T[a.dtype], None)]),
                     opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def both(a, b, opset=18):
    m, feeds = pow_model(a, b, opset), {"a": a, "b": b}
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return InferenceSession(m).run(None, feeds)[0], theirs


def std_pow_cast(x, y, dtype):
    """static_cast<T>(std::pow(double x, double y)) on x86-64, in plain Python."""
    info = np.iinfo(dtype)
    try:
        value = math.pow(float(x), float(y))
    except (ZeroDivisionError, ValueError):
        return info.min
    return int(value) if info.min <= value <= info.max else info.min


CASES = [([2, 3, -2, 1, -1, 5, -5], [-1] * 7), ([2, 3, -2, 1, -1], [-2, -2, -2, -3, -3]),
         ([0, 0], [-1, -2]), ([2, -2, 3], [-63, -64, -100]), ([3, 2, -3], [40, 31, 21]), ([7, -7], [0, 0])]


@pytest.mark.parametrize("dtype", [np.int32, np.int64])
@pytest.mark.parametrize("base, exponent", CASES)
def test_integer_pow_as_ort(dtype, base, exponent):
    a, b = np.array(base, dtype), np.array(exponent, dtype)
    ours, theirs = both(a, b)
    expected = [std_pow_cast(x, y, dtype) for x, y in zip(base, exponent)]
    np.testing.assert_array_equal(theirs, expected)  # the rule, independently of ORT
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("base, exponent", [([100000, 3], [2]), ([2000, -2000], [3]), ([100000, 3], [2, 2]),
                                            ([100000], [2]), ([5, 6], [-1]), ([2], [-1, 1])])
def test_one_value_exponent_two_or_three_multiplies_in_the_type_as_ort(base, exponent):
    a, b = np.array(base, np.int32), np.array(exponent, np.int32)
    ours, theirs = both(a, b)
    np.testing.assert_array_equal(ours, theirs)


def test_int64_base_with_int32_exponent_as_ort():
    a, b = np.array([2, -1, 0, 4], np.int64), np.array([-1, -3, -1, 3], np.int32)
    ours, theirs = both(a, b)
    assert ours.dtype == theirs.dtype == np.int64
    np.testing.assert_array_equal(ours, theirs)


def test_float_pow_is_unchanged():
    a, b = np.array([2.0, 0.0, -8.0], np.float32), np.array([-1.0, -1.0, 1 / 3], np.float32)
    ours, theirs = both(a, b)
    np.testing.assert_array_equal(ours, theirs)

"""CPU kernels for Pow where ORT 1.19.2's C++ gives an answer numpy does not: ORT's behaviour wins.
Pow of integers: numpy refuses a negative exponent ("Integers to negative integer powers are not allowed")
and wraps an overflow; ORT computes std::pow in double and converts back. Pow of float32: ORT squares or
cubes for a one-value exponent 2 or 3 (x * x, bit for bit), and otherwise calls std::pow, which numpy's
float32 power misses in the last bit for about one element in five; computed in double and rounded, it
agrees with ORT on all but about one element in a thousand (one ulp). Checked against ORT by
tests/engine/test_engine_integer_pow.py and tests/engine/test_engine_float_pow.py.
"""
import numpy as np
from onnx.reference.ops import load_op

from ortlab.engine.cpu_execution_provider import override_reference_op


def double_to_integer(values, dtype):
    """static_cast<T>(double) as x86-64 computes it (cvttsd2si): truncation toward zero, and the type's
    minimum for NaN, infinities and values outside the type's range (C++ leaves those undefined)."""
    info = np.iinfo(dtype)
    inside = np.isfinite(values) & (values > float(info.min) - 1) & (values < float(info.max) + 1)
    return np.where(inside, np.trunc(np.where(inside, values, 0)), info.min).astype(dtype)


def ort_integer_pow(x, y):
    """Pow(x, y) for integer x and y as ORT's CPU kernel computes it: when y is one value (and x is not)
    and it is 2 or 3, x * x (* x) in x's type, wrapping on overflow; otherwise static_cast<T>(std::pow(x, y))
    in double, so 2 ** -1 is 0, 1 ** -1 is 1, (-1) ** -3 is -1, 0 ** -1 (infinity) and overflows give the
    type's minimum. ORT: onnxruntime/core/providers/cpu/math/element_wise_ops.cc (PowImpl)."""
    x = np.asarray(x)
    y = np.asarray(y)
    if y.size == 1 and x.size != 1 and int(y.reshape(-1)[0]) in (2, 3):
        with np.errstate(over="ignore"):
            return x * x if int(y.reshape(-1)[0]) == 2 else x * x * x
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        values = np.power(x.astype(np.float64), y.astype(np.float64))
    return double_to_integer(values, x.dtype)


def ort_float32_pow(x, y):
    """Pow(x, y) for float32 x as ORT's CPU kernel computes it: x * x or x * x * x when y is one value 2 or 3
    (and x is not one value), else std::pow per element, here in double rounded to float32."""
    if y.size == 1 and x.size != 1 and float(y.reshape(-1)[0]) in (2.0, 3.0):
        with np.errstate(over="ignore"):
            return x * x if float(y.reshape(-1)[0]) == 2.0 else x * x * x
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):
        return np.power(x.astype(np.float64), y.astype(np.float64)).astype(np.float32)


class OrtPow(load_op("", "Pow", 15)):
    """Pow with ORT's arithmetic: ort_integer_pow when both inputs are integers, ort_float32_pow for a float32
    base and a float32 or integer exponent; the reference (numpy's power) otherwise.
    ORT: onnxruntime/core/providers/cpu/math/element_wise_ops.cc (Pow, PowImpl)."""

    def _run(self, a, b):
        a, b = np.asarray(a), np.asarray(b)
        if a.dtype.kind in "iu" and b.dtype.kind in "iu":
            return (ort_integer_pow(a, b),)
        if a.dtype == np.float32 and (b.dtype == np.float32 or b.dtype.kind in "iu"):
            return (ort_float32_pow(a, b),)
        return super()._run(a, b)


override_reference_op("Pow", 12, 10 ** 6)(OrtPow)

"""Pow of float32 in ORT 1.19.2 and in ortlab's engine, compared element by element.

What ORT does (asserted on the real session, and each rule computed independently here): a one-value exponent
2 or 3 is a square or a cube (x * x, x * x * x: the same bits); any other exponent is std::pow, which a float32
power in numpy misses in the last bit for about one element in five and which a double pow rounded to float32
matches on all but a few elements in a thousand, by one ulp. The engine must give ORT's bits where ORT's rule is
exact, and never be further than one ulp from it.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from ortlab.engine import InferenceSession

BASE = (np.random.RandomState(0).randn(20_000) * 3).astype(np.float32)


def pow_model(exponent_type, exponent_shape):
    inputs = [h.make_tensor_value_info("a", T.FLOAT, [None]), h.make_tensor_value_info("b", exponent_type,
                                                                                          exponent_shape)]
    m = h.make_model(h.make_graph([h.make_node("Pow", ["a", "b"], ["y"])], "g", inputs,
                                  [h.make_tensor_value_info("y", T.FLOAT, None)]),
                     opset_imports=[h.make_opsetid("", 15)])
    m.ir_version = 8
    return m


def both(a, b, exponent_type=T.FLOAT):
    m, feeds = pow_model(exponent_type, list(b.shape)), {"a": a, "b": b}
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)[0]
    return InferenceSession(m).run(None, feeds)[0], theirs


def ulps(a, b):
    return np.abs(a.view(np.int32).astype(np.int64) - b.view(np.int32).astype(np.int64))


@pytest.mark.parametrize("exponent, rule", [(2.0, lambda x: x * x), (3.0, lambda x: x * x * x)])
@pytest.mark.parametrize("exponent_type, np_type", [(T.FLOAT, np.float32), (T.INT64, np.int64)])
def test_a_one_value_exponent_2_or_3_is_a_square_or_a_cube_bit_for_bit(exponent, rule, exponent_type, np_type):
    ours, theirs = both(BASE, np.array(exponent, np_type), exponent_type)
    np.testing.assert_array_equal(theirs, rule(BASE))  # ORT's rule, independently of ORT's code
    np.testing.assert_array_equal(ours, theirs)
    assert np.sum(np.power(BASE, np.float32(exponent)) != theirs) > 0  # numpy's float32 power is not ORT's


@pytest.mark.parametrize("exponent", [0.5, 1.7, -1.0, 4.0])
def test_any_other_exponent_is_within_one_ulp_of_ort_and_mostly_equal(exponent):
    base = np.abs(BASE)
    ours, theirs = both(base, np.array(exponent, np.float32))
    assert ulps(ours, theirs).max() <= 1
    assert np.mean(ours != theirs) < 0.01
    assert np.mean(np.power(base, np.float32(exponent)) != theirs) > 0.05  # what the reference alone gave


def test_an_exponent_tensor_follows_std_pow_per_element():
    base, exponent = np.abs(BASE[:1000]), np.full(1000, 2.0, np.float32)  # not one value: std::pow, not x * x
    ours, theirs = both(base, exponent)
    assert ulps(ours, theirs).max() <= 1 and np.mean(ours != theirs) < 0.01

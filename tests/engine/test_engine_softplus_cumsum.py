"""Softplus on large and very negative inputs, and CumSum of 32-bit integers, in ORT 1.19.2 and in ortlab's engine.

Facts from ORT (asserted on the real session below and against numpy's stable formula): Softplus(100) is 100 in
float32 (x + log1p(exp(-x)); activations.h), not inf; CumSum keeps its input's type (int32 stays int32).
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from ortlab.engine import InferenceSession

NP2T = {np.dtype(np.float32): T.FLOAT, np.dtype(np.float64): T.DOUBLE, np.dtype(np.int32): T.INT32,
        np.dtype(np.int64): T.INT64}


def run_both(node, x, opset=14, inits=()):
    m = h.make_model(h.make_graph([node], "g", [h.make_tensor_value_info("x", NP2T[x.dtype], list(x.shape))],
                                  [h.make_tensor_value_info("y", NP2T[x.dtype], None)], initializer=list(inits)),
                     opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    return InferenceSession(m).run(None, {"x": x})[0], theirs[0]


@pytest.mark.parametrize("dtype", [np.float32])  # ORT 1.19.2's CPU Softplus is float32 only
def test_softplus_of_large_and_very_negative_inputs_as_ort(dtype):
    x = np.array([100, -100, 0, 20, 89, 88, 1e30, -1e30, np.inf, -np.inf, np.nan], dtype)
    ours, theirs = run_both(h.make_node("Softplus", ["x"], ["y"]), x)
    finite = np.isfinite(x)
    stable = np.where(x > 0, x + np.log1p(np.exp(-np.abs(x))), np.log1p(np.exp(np.minimum(x, 0))))
    np.testing.assert_allclose(theirs[finite], stable[finite].astype(dtype), rtol=1e-6)
    assert ours.dtype == theirs.dtype
    np.testing.assert_allclose(ours, theirs, rtol=1e-6)


@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.float32])
@pytest.mark.parametrize("exclusive, reverse", [(0, 0), (1, 0), (0, 1)])
def test_cumsum_keeps_the_input_type_as_ort(dtype, exclusive, reverse):
    x = np.array([[1, 2, 3], [4, 5, 6]], dtype)
    node = h.make_node("CumSum", ["x", "a"], ["y"], exclusive=exclusive, reverse=reverse)
    ours, theirs = run_both(node, x, inits=[numpy_helper.from_array(np.array(1, np.int32), "a")])
    assert ours.dtype == theirs.dtype == dtype
    np.testing.assert_array_equal(ours, theirs)

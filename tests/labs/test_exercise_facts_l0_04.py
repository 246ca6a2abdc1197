"""The facts L0_04's exercise judges read from ORT agree with an independent computation.

'reshape_shape': on every case the check uses, the shape ORT's Reshape returns is the one onnx's reference
implementation (onnx.reference) computes. 'function_op': a model whose one node is a function of the model
computes in ORT what onnx.reference computes and what the judge's numpy x · sigmoid(x) says, and ORT runs it by
inlining the function (its graph keeps only the body's ONNX ops).
"""
import numpy as np
import pytest
from onnx import TensorProto, helper
from onnx.reference import ReferenceEvaluator

from ortlab import session
from ortlab.labs.judges.l0_04 import RESHAPE_CASES, _swish, ort_reshape

CPU = ["CPUExecutionProvider"]


@pytest.mark.parametrize("shape, target, allowzero", RESHAPE_CASES)
def test_ort_reshape_shapes_are_onnx_references(shape, target, allowzero):
    node = helper.make_node("Reshape", ["data", "shape"], ["out"], allowzero=allowzero)
    graph = helper.make_graph([node], "reshape", [helper.make_tensor_value_info("data", TensorProto.FLOAT, shape),
                                                  helper.make_tensor_value_info("shape", TensorProto.INT64, [None])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    (out,) = ReferenceEvaluator(model).run(None, {"data": np.zeros(shape, np.float32),
                                                  "shape": np.array(target, np.int64)})
    assert ort_reshape(shape, target, allowzero) == list(out.shape)


def _swish_model():
    body = [helper.make_node("Sigmoid", ["X"], ["s"]), helper.make_node("Mul", ["X", "s"], ["Y"])]
    swish = helper.make_function("lab", "Swish", ["X"], ["Y"], body, [helper.make_opsetid("", 17)])
    graph = helper.make_graph([helper.make_node("Swish", ["x"], ["y"], domain="lab")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
    return helper.make_model(graph, functions=[swish],
                             opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("lab", 1)])


def test_ort_runs_a_model_function_by_inlining_it_and_computes_what_onnx_reference_does():
    model = _swish_model()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32) * 3
    (ours,) = session.create(model, providers=CPU).run(None, {"x": x})
    (reference,) = ReferenceEvaluator(model).run(None, {"x": x})
    np.testing.assert_allclose(ours, reference, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ours, _swish(x.astype(np.float64)), rtol=1e-5, atol=1e-6)
    inlined = session.optimized_model(model, "disable", providers=CPU)
    assert [(n.domain, n.op_type) for n in inlined.graph.node] == [("", "Sigmoid"), ("", "Mul")]

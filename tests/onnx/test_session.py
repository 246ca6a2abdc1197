"""ortlab.session: what the helpers report is what ORT does."""
import numpy as np
import pytest

from ortlab import OrtlabError, models, session
from ortlab.ir import Graph
from ortlab.onnx_defs import make_model

CPU = ["CPUExecutionProvider"]


@pytest.fixture(scope="module")
def mlp():
    model = models.get("mlp").eval()
    return models.export(model, model.example_inputs()[:1]), model


def test_initialization_log_shows_transformers_and_placement(mlp):
    onx, _ = mlp
    log = session.initialization_log(onx, providers=CPU)
    assert session.grep(log, "GraphTransformer GemmActivationFusion modified: 1")
    assert session.grep(log, "All nodes placed on [CPUExecutionProvider]")
    assert session.grep(log, "Session successfully initialized")
    assert not any(line[:4].isdigit() for line in log)  # timestamps removed
    quiet = session.initialization_log(onx, severity=3)
    assert not session.grep(quiet, "GraphTransformer")


def test_optimized_model_is_orts_fused_graph(mlp):
    onx, _ = mlp
    ops = [n.op_type for n in session.optimized_model(onx, "extended", providers=CPU).graph.node]
    assert "FusedGemm" in ops and "Relu" not in ops
    assert [n.op_type for n in session.optimized_model(onx, "disable", providers=CPU).graph.node] == \
        [n.op_type for n in onx.graph.node]


def test_execution_order_is_a_topological_order_of_all_nodes(mlp):
    onx, model = mlp
    x = model.example_inputs()[0].numpy()
    names = session.execution_order(onx, {"x": x}, providers=CPU)
    graph = Graph.from_model(onx)
    assert names == [n.name for n in graph.topological_order("default")]


def test_run_node_matches_numpy_and_reports_orts_errors():
    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    (out,) = session.run_node("Transpose", [a], {"perm": [1, 0]})
    np.testing.assert_array_equal(out, a.T)
    (gelu,) = session.run_node("Gelu", [a], domain="com.microsoft")
    from math import erf
    expected = np.vectorize(lambda v: 0.5 * v * (1 + erf(v / np.sqrt(2))))(a)
    np.testing.assert_allclose(gelu, expected, rtol=1e-5)
    with pytest.raises(session.SessionError, match="onnxruntime could not load the model"):
        session.run_node("MatMul", [a, a])


def test_bad_options_are_explained():
    with pytest.raises(OrtlabError, match="level must be one of"):
        session.session_options(level="max")
    with pytest.raises(OrtlabError, match="SessionOptions has no option 'enable_turbo'"):
        session.session_options(enable_turbo=True)


def test_run_model_returns_outputs_by_name():
    from onnx import TensorProto, helper
    graph = helper.make_graph([helper.make_node("Neg", ["x"], ["y"]), helper.make_node("Abs", ["x"], ["z"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2]),
                               helper.make_tensor_value_info("z", TensorProto.FLOAT, [2])])
    model = make_model(graph, domains=())
    out = session.run_model(model, {"x": np.array([1.0, -2.0], np.float32)})
    assert list(out) == ["y", "z"]
    np.testing.assert_array_equal(out["y"], [-1.0, 2.0])
    np.testing.assert_array_equal(out["z"], [1.0, 2.0])


def test_node_outputs_are_every_intermediate_value_and_first_non_finite_finds_0_over_0():
    import torch
    from onnx import TensorProto, helper

    from ortlab import models

    nodes = [helper.make_node("Relu", ["X"], ["r"], name="relu"), helper.make_node("Neg", ["r"], ["Y"], name="neg")]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 3])])
    model = make_model(graph, domains=())
    x = np.array([[-1.0, 2.0, -3.0], [4.0, -5.0, 6.0]], dtype=np.float32)
    dumped = {output: (node, op, value) for node, op, output, value in session.node_outputs(model, {"X": x})}
    assert list(dumped) == ["r", "Y"]
    np.testing.assert_array_equal(dumped["r"][2], np.maximum(x, 0))
    np.testing.assert_array_equal(dumped["Y"][2], -np.maximum(x, 0))
    assert session.first_non_finite(model, {"X": x}) is None

    norm = models.LayerNorm(4, eps=0.0)       # (x - mean) / sqrt(var + 0): a constant row gives 0 / 0
    row = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 5.0, 5.0, 5.0]])
    exported = models.export(norm, (row,))
    node, op, _ = session.first_non_finite(exported, {"input_0": row.numpy()})
    assert op == "Div"


def test_captured_lines_collects_fds_prints_and_logging_and_restores_them():
    import logging
    import os
    import sys

    from ortlab.capture import captured_lines

    before = os.fstat(2).st_ino, sys.stdout, logging.getLogger("orttraining").propagate
    with captured_lines(loggers=("orttraining",), clean=lambda line: line.rstrip().upper()) as lines:
        os.write(2, b"from c++ on fd 2\n")
        os.write(1, b"from c++ on fd 1\n")
        print("from python")
        logging.getLogger("orttraining").warning("from a logger")
        assert lines == []                      # filled when the block ends
    assert lines == ["FROM C++ ON FD 2", "FROM C++ ON FD 1", "FROM PYTHON", "ORTTRAINING [WARNING] - FROM A LOGGER"]
    assert (os.fstat(2).st_ino, sys.stdout, logging.getLogger("orttraining").propagate) == before
    with captured_lines(fds=(2,), python=False) as dropped:
        os.write(2, b"dropped\n")
    assert dropped == ["dropped"]

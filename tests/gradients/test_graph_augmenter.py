"""GraphAugmenter (graph_augmenter.cc) and the gradient graph's outputs against ORT's builder."""
import numpy as np
import pytest
from onnx import TensorProto, helper

from ortlab.gradients import build_gradient_graph, ort_gradient_graph
from ortlab.gradients.graph_augmenter import GraphAugmentError, GraphDefs, augment_graph, override_graph_outputs
from ortlab.ir import Graph
from ortlab.session import run_model


def _model(outputs):
    x = helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])
    w = helper.make_tensor("W", TensorProto.FLOAT, [3, 4], np.linspace(-1, 1, 12, dtype=np.float32))
    nodes = [helper.make_node("MatMul", ["X", "W"], ["H"]), helper.make_node("Relu", ["H"], ["R"]),
             helper.make_node("ReduceSum", ["R"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [x], [helper.make_tensor_value_info(o, TensorProto.FLOAT, None)
                                                 for o in outputs], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("outputs", [["loss"], ["R"], ["H", "loss", "R"]])
def test_the_gradient_graph_keeps_the_forward_outputs_and_appends_the_gradients_as_orts_does(outputs):
    model = _model(outputs)
    ours, theirs = build_gradient_graph(model, ["W"], "loss"), ort_gradient_graph(model, ["W"], "loss")
    assert [o.name for o in ours.graph.output] == [o.name for o in theirs.graph.output] == outputs + ["W_grad"]


def test_augment_adds_nodes_and_initializers_and_appends_outputs_skipping_duplicates():
    graph = Graph.from_model(_model(["loss"]))
    defs = GraphDefs(node_defs=[helper.make_node("Mul", ["H", "two"], ["H2"], name="double")],
                     initializers={"two": np.float32(2.0), "W": np.zeros((3, 4), np.float32)},
                     graph_outputs=["H2", "loss", "H2"])
    augment_graph(graph, defs)
    assert graph.outputs == ["loss", "H2"]
    assert graph.producer("H2").op_type == "Mul"
    np.testing.assert_array_equal(graph.initializer_value("W"), np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4))
    x = np.ones((2, 3), np.float32)
    got = run_model(graph.to_model(), {"X": x})  # in ORT
    np.testing.assert_allclose(got["H2"], 2 * x @ graph.initializer_value("W"), rtol=1e-6)


def test_an_output_the_graph_lacks_is_refused_and_override_refuses_duplicates():
    graph = Graph.from_model(_model(["loss"]))
    with pytest.raises(GraphAugmentError, match="no value named 'nowhere'"):
        augment_graph(graph, GraphDefs(graph_outputs=["nowhere"]))
    with pytest.raises(GraphAugmentError, match="named twice"):
        override_graph_outputs(graph, ["H", "H"])
    assert override_graph_outputs(graph, ["H", "R"]).outputs == ["H", "R"]


def test_graph_defs_list_what_the_backward_pass_adds():
    from ortlab.gradients import GradientGraphBuilder

    builder = GradientGraphBuilder(_model(["loss"]), ["W"], "loss")
    ours = builder.build()
    defs = builder.graph_defs(["W_grad"])
    forward_nodes = 3
    assert len(ours.graph.node) == forward_nodes + len(defs.node_defs)
    assert defs.graph_outputs == ["W_grad"] and "GraphDefs(" in repr(defs)

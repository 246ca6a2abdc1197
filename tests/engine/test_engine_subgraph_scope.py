"""Subgraphs that read values of the graph around them (If, Loop): ORT resolves them in a lexical scope."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

from ortlab.engine import InferenceSession
from ortlab.errors import OrtlabError


def _branch_model(before, then_node, else_node, n):
    """Nodes `before`, then an If on input c whose branches are one node each (reading the outer scope);
    every value float32 [n]."""
    value = helper.make_tensor_value_info
    then_g = helper.make_graph([then_node], "then", [], [value(then_node.output[0], TensorProto.FLOAT, [n])])
    else_g = helper.make_graph([else_node], "else", [], [value(else_node.output[0], TensorProto.FLOAT, [n])])
    nodes = before + [helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g, name="branch")]
    graph = helper.make_graph(nodes, "g", [value("x", TensorProto.FLOAT, [n]), value("c", TensorProto.BOOL, [])],
                              [value("y", TensorProto.FLOAT, [n])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _if_model(else_reads="x"):
    return _branch_model([helper.make_node("Mul", ["x", "x"], ["w"])], helper.make_node("Add", ["x", "w"], ["t"]),
                         helper.make_node("Neg", [else_reads], ["e"]), 2)


@pytest.mark.parametrize("condition", [True, False])
def test_branches_reading_outer_values_run_as_in_ort(condition):
    model = _if_model()
    feeds = {"x": np.array([1.5, -2.0], np.float32), "c": np.array(condition)}
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    got = InferenceSession(model).run(None, feeds)
    np.testing.assert_array_equal(got[0], expected[0])


def test_a_branch_reading_a_value_nowhere_in_scope_is_still_refused():
    model = _if_model(else_reads="nowhere")
    with pytest.raises(Exception) as ort_refusal:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert "nowhere" in str(ort_refusal.value)
    with pytest.raises(OrtlabError, match="nowhere"):
        InferenceSession(model)


def test_a_node_whose_branch_reads_a_value_runs_after_its_producer_in_both_orders():
    from ortlab.ir import Graph

    model = _if_model()
    # put the If first in the file: only its implicit input ties it to the Mul
    model.graph.node.insert(0, model.graph.node.pop(1))
    graph = Graph.from_model(model)
    mul, branch = (next(n for n in graph.nodes() if n.op_type == op) for op in ("Mul", "If"))
    assert branch.implicit_input_names() == ["x", "w"] and branch.input_nodes() == [mul]
    for kind in ("default", "priority"):
        assert [n.op_type for n in graph.topological_order(kind)] == ["Mul", "If"]
    feeds = {"x": np.array([3.0, 1.0], np.float32), "c": np.array(True)}
    np.testing.assert_array_equal(InferenceSession(model).run(None, feeds)[0], [12.0, 2.0])


def _in_place_before_if_model():
    """t = Neg(x); u = Relu(t) (Relu may write in place over its input at its last use); then an If whose
    branches read t from the outer scope: t's last use is the If, not the Relu."""
    node = helper.make_node
    return _branch_model([node("Neg", ["x"], ["t"], name="neg"), node("Relu", ["t"], ["u"], name="relu")],
                         node("Add", ["t", "u"], ["a"]), node("Sub", ["t", "u"], ["b"]), 3)


@pytest.mark.parametrize("enable_mem_pattern", [False, True])
def test_a_value_a_subgraph_reads_is_neither_overwritten_in_place_nor_released_before_the_if(enable_mem_pattern):
    """ORT's planner counts a node's implicit inputs as uses (ComputeReuseCount, GenerateDeallocationPlan walk
    ImplicitInputDefs): Relu may not write over t, and t is released after the If."""
    from ortlab.engine import SessionOptions

    model = _in_place_before_if_model()
    feeds = {"x": np.array([1.5, -2.0, 0.25], np.float32), "c": np.array(True)}
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    sess = InferenceSession(model, SessionOptions(enable_mem_pattern=enable_mem_pattern))
    np.testing.assert_array_equal(sess.run(None, feeds)[0], expected[0])
    np.testing.assert_array_equal(expected[0], -feeds["x"] + np.maximum(-feeds["x"], 0))
    plan = sess.state.allocation_plan
    assert plan.value("u").kind == "kAllocate"      # not in place over t
    steps = [s.node.name for s in sess.state.steps]
    released = {sess.state.value_names[v]: steps[k] for k, s in enumerate(sess.state.steps) for v in s.releases}
    assert released["t"] == "branch" and released["u"] == "branch"

"""One ortlab.ir.Graph per InferenceSession, from load to execution, as ORT's InferenceSession::Initialize
(onnxruntime/core/session/inference_session.cc) loads one Graph and transforms it in place.

The session builds its Graph once; the transformers, partitioning, Memcpy insertion, the allocation plan, the
memory pattern and the executor all read that same object. A node holding subgraphs (If, Loop) is the one
exception worth naming: the transformers work inside each body on a Graph of its own (ortlab.ir.subgraph.
body_graph, ORT's GraphTransformer::Recurse; RemoveDuplicateCast after partitioning too, at every level), a
short-lived Graph per body and per pass, written back into the node's attribute; those are counted apart from
the session's own, top-level Graph.
"""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlab.engine import InferenceSession, SessionOptions
from ortlab.ir import Graph, subgraph

LEVELS = (0, 1, 2, 99)


@pytest.fixture
def built(monkeypatch):
    """Counts the Graphs built while it is active: every one (`graphs`) and the subgraph bodies' (`bodies`)."""
    built = {"graphs": [], "bodies": 0}
    init, body_graph = Graph.__init__, subgraph.body_graph

    def counting_init(self, *args, **kwargs):
        built["graphs"].append(self)
        init(self, *args, **kwargs)

    def counting_body_graph(*args, **kwargs):
        built["bodies"] += 1
        return body_graph(*args, **kwargs)

    monkeypatch.setattr(Graph, "__init__", counting_init)
    monkeypatch.setattr(subgraph, "body_graph", counting_body_graph)
    return built


def layer_norm_model():
    """x -> MatMul -> LayerNorm written out (ReduceMean, Sub, Pow, ...) -> Relu: the fusions rewrite it."""
    rng = np.random.default_rng(0)
    init = [numpy_helper.from_array(rng.standard_normal((8, 8)).astype(np.float32), "w"),
            numpy_helper.from_array(np.array(2.0, np.float32), "two"),
            numpy_helper.from_array(np.array(1e-5, np.float32), "eps"),
            numpy_helper.from_array(np.ones(8, np.float32), "gamma"),
            numpy_helper.from_array(np.zeros(8, np.float32), "beta")]
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]),
             helper.make_node("ReduceMean", ["h"], ["mean"], axes=[-1]),
             helper.make_node("Sub", ["h", "mean"], ["centred"]),
             helper.make_node("Pow", ["centred", "two"], ["squared"]),
             helper.make_node("ReduceMean", ["squared"], ["var"], axes=[-1]),
             helper.make_node("Add", ["var", "eps"], ["var_eps"]),
             helper.make_node("Sqrt", ["var_eps"], ["std"]),
             helper.make_node("Div", ["centred", "std"], ["normed"]),
             helper.make_node("Mul", ["normed", "gamma"], ["scaled"]),
             helper.make_node("Add", ["scaled", "beta"], ["shifted"]),
             helper.make_node("Relu", ["shifted"], ["y"])]
    graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 8])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [4, 8])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def if_model():
    """y = If(c) then (x + 1) * 1 else x - 1: the then branch holds a Mul by one that the transformers remove."""
    one = numpy_helper.from_array(np.array(1.0, np.float32), "one")
    then_branch = helper.make_graph(
        [helper.make_node("Add", ["x", "one"], ["t1"]), helper.make_node("Mul", ["t1", "one"], ["t"])], "then",
        [], [helper.make_tensor_value_info("t", TensorProto.FLOAT, [3])])
    else_branch = helper.make_graph([helper.make_node("Sub", ["x", "one"], ["e"])], "else", [],
                                    [helper.make_tensor_value_info("e", TensorProto.FLOAT, [3])])
    nodes = [helper.make_node("If", ["c"], ["y"], then_branch=then_branch, else_branch=else_branch)]
    graph = helper.make_graph(nodes, "if", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                            helper.make_tensor_value_info("x", TensorProto.FLOAT, [3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [3])], [one])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def session(model, level):
    return InferenceSession(model, SessionOptions(graph_optimization_level=level))


@pytest.mark.parametrize("level", LEVELS)
def test_a_session_builds_exactly_one_graph(built, level):
    sess = session(layer_norm_model(), level)
    assert built["graphs"] == [sess.graph]  # the one built is the one the session keeps
    ops = [n.op_type for n in sess.graph.nodes()]
    assert ("LayerNormalization" in ops) == (level >= 2)  # the level-2 fusion rewrote that same Graph


@pytest.mark.parametrize("level", LEVELS)
def test_subgraph_bodies_have_graphs_of_their_own_and_the_session_still_one(built, level):
    sess = session(if_model(), level)
    top_level = len(built["graphs"]) - built["bodies"]
    assert top_level == 1 and sess.graph in built["graphs"]
    assert built["bodies"] > 0  # RemoveDuplicateCast after partitioning opens them at every level, as in ORT
    x = np.arange(3, dtype=np.float32)
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(True), "x": x})[0], x + 1)
    np.testing.assert_array_equal(sess.run(None, {"c": np.array(False), "x": x})[0], x - 1)


def test_partitioning_memcpy_plan_pattern_and_executor_read_the_session_graph():
    sess = session(layer_norm_model(), 99)
    graph, state = sess.graph, sess.state
    sess.run(None, {"x": np.ones((4, 8), np.float32)})
    assert state.graph is graph and sess.executor.state is state
    assert sess.planning_graph().graph is graph  # the allocation plan's and the memory pattern's view
    assert set(sess.assignment) == {n.index for n in graph.nodes()}  # partitioning's
    assert all(graph.node(step.node.index) is step.node for step in state.steps)  # the executor's steps
    assert [n for n in state.allocation_plan.order] == [step.node for step in state.steps]
    assert sess.last_run.pattern_bytes > 0  # the memory pattern, planned over that same graph, was used


@pytest.mark.parametrize("level", LEVELS)
def test_node_k_of_the_session_graph_is_node_k_of_session_model(level):
    """After the transformers the nodes are numbered as session.model lists them (ortlab.memory's plan of
    session.model then walks the session's own order)."""
    sess = session(layer_norm_model(), level)
    assert [n.index for n in sess.graph.nodes()] == list(range(len(sess.model.graph.node)))
    assert [(n.op_type, n.output_names) for n in sess.graph.nodes()] == \
        [(p.op_type, list(p.output)) for p in sess.model.graph.node]


def test_the_callers_model_is_left_as_it_was():
    model = layer_norm_model()
    before = model.SerializeToString()
    session(model, 99)
    assert model.SerializeToString() == before

"""Held-out cases for RemoveDuplicateCastTransformer (ortlab.transformers.remove_duplicate_cast), live against
ORT 1.19.2.

ORT's remover calls GraphTransformer::Recurse for every node it keeps (insert_cast_transformer.cc), so Cast
pairs inside If/Loop bodies are removed as in the main graph. Removing a lossy first Cast changes values: in
x -> Cast(float16) -> Cast(int8) the first Cast goes and the child casts float -> int8 directly, so 2.9999 gives
2 (not 3, as through float16) and 70000.5 wraps instead of passing through inf.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from ortlab import session
from ortlab.errors import OrtlabError
from ortlab.engine import InferenceSession, SessionOptions
from ortlab.memory.session_graph import session_graph

X = np.array([2.9999, 70000.5, 1e-8, -3.7, 0.0], np.float32)


def vi(name, elem_type, shape=(5,)):
    return h.make_tensor_value_info(name, elem_type, list(shape))


def cast_chain_in_if(to):
    """If whose then-branch is x -> Cast(float16) 'c1' -> Cast(to) 'c2' -> Identity; else-branch one Cast."""
    chain = [h.make_node("Cast", ["x"], ["m"], to=T.FLOAT16, name="c1"),
             h.make_node("Cast", ["m"], ["b"], to=to, name="c2"),
             h.make_node("Identity", ["b"], ["o"], name="oi")]
    then = h.make_graph(chain, "then", [], [vi("o", to)])
    other = h.make_graph([h.make_node("Cast", ["x"], ["e"], to=to, name="ec")], "else", [], [vi("e", to)])
    node = h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")
    graph = h.make_graph([node], "g", [vi("x", T.FLOAT), vi("c", T.BOOL, ())], [vi("y", to)])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)


def ort_run(model, feeds, level):
    options = ort.SessionOptions()
    options.graph_optimization_level = level
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"]).run(
        None, feeds)[0]


def branch_nodes(graph_proto_node):
    return {a.name: [n.name for n in a.g.node] for a in graph_proto_node.attribute if a.type == a.GRAPH}


@pytest.mark.parametrize("to", [T.INT8, T.UINT8, T.BOOL])
def test_a_cast_pair_inside_an_if_body_is_removed_as_ort_removes_it(to):
    model = cast_chain_in_if(to)
    feeds = {"x": X, "c": np.array(True)}
    saved = session.optimized_model(model, level="disable", providers=["CPUExecutionProvider"])
    theirs = branch_nodes(saved.graph.node[0])
    assert theirs["then_branch"] == ["c2", "oi"]  # ORT's fact: the lossy first Cast went, the child reads x
    if_node = next(iter(session_graph(model).graph.nodes()))
    assert {name: [n.name for n in bodies[0].node] for name, bodies in if_node.subgraphs()} == theirs
    for ours_level, their_level in ((0, ort.GraphOptimizationLevel.ORT_DISABLE_ALL),
                                    (99, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)):
        expected = ort_run(model, feeds, their_level)
        ours = InferenceSession(model, SessionOptions(graph_optimization_level=ours_level)).run(None, feeds)[0]
        np.testing.assert_array_equal(ours, expected)


def test_copying_a_bfloat16_output_to_the_host_is_refused_as_ort_refuses_it():
    """IOBinding.copy_outputs_to_cpu() of a tensor(bfloat16) output: ORT 1.19.2 fails ('No corresponding Numpy
    type for Tensor Type'), as run() does; ortlab returned onnx.reference's bit patterns (16448 for 2.9999)."""
    graph = h.make_graph([h.make_node("Cast", ["x"], ["y"], to=T.BFLOAT16, name="c")], "g", [vi("x", T.FLOAT)],
                         [vi("y", T.BFLOAT16)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    binding = theirs.io_binding()
    binding.bind_cpu_input("x", X)
    binding.bind_output("y")
    theirs.run_with_iobinding(binding)
    with pytest.raises(Exception, match="No corresponding Numpy type"):
        binding.copy_outputs_to_cpu()
    ours = InferenceSession(model)
    binding = ours.io_binding()
    binding.bind_cpu_input("x", X)
    binding.bind_output("y")
    ours.run_with_iobinding(binding)
    with pytest.raises(OrtlabError, match="No corresponding Numpy type.*'y'.*bfloat16"):
        binding.copy_outputs_to_cpu()


def test_a_cast_pair_inside_a_loop_body_is_removed_as_ort_removes_it():
    """A Loop body whose carried value's type comes from the Loop node: the pair float -> float16 -> int8 loses
    its first Cast as in ORT, and the scan output holds ORT's values."""
    chain = [h.make_node("Cast", ["v"], ["m"], to=T.FLOAT16, name="c1"),
             h.make_node("Cast", ["m"], ["s"], to=T.INT8, name="c2"),
             h.make_node("Identity", ["cond_in"], ["cond_out"], name="ci"),
             h.make_node("Identity", ["v"], ["v_out"], name="vi")]
    body = h.make_graph(chain, "body", [vi("i", T.INT64, ()), vi("cond_in", T.BOOL, ()),
                                        h.make_tensor_value_info("v", T.FLOAT, None)],
                        [vi("cond_out", T.BOOL, ()), h.make_tensor_value_info("v_out", T.FLOAT, None),
                         h.make_tensor_value_info("s", T.INT8, None)])
    node = h.make_node("Loop", ["n", "", "x"], ["v_final", "scanned"], body=body, name="loop")
    graph = h.make_graph([node], "g", [vi("x", T.FLOAT), vi("n", T.INT64, ())],
                         [vi("v_final", T.FLOAT), vi("scanned", T.INT8, (2, 5))])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    feeds = {"x": X, "n": np.array(2)}
    saved = session.optimized_model(model, level="disable", providers=["CPUExecutionProvider"])
    theirs = sorted(n.name for n in saved.graph.node[0].attribute[0].g.node)
    assert theirs == ["c2", "ci", "vi"]
    loop = next(iter(session_graph(model).graph.nodes()))
    assert sorted(n.name for n in loop.subgraphs()[0][1][0].node) == theirs
    expected = ort_run(model, feeds, ort.GraphOptimizationLevel.ORT_DISABLE_ALL)
    np.testing.assert_array_equal(InferenceSession(model).run(None, feeds)[0], expected)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for ours, theirs_value in zip(InferenceSession(model).run(None, feeds), expected):
        np.testing.assert_array_equal(ours, theirs_value)

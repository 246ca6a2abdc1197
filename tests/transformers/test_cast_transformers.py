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

pytestmark = pytest.mark.heldout

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


# --- open gaps found by this review, outside this file's modules: pinned strict, so a fix shows -------------
def single_output_model(nodes, inputs, output, opset=17, initializers=()):
    graph = h.make_graph(nodes, "g", inputs, [output], initializer=list(initializers))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=10 if opset >= 21 else 9)


def assert_values_are_orts(model, feeds):
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for ours, theirs in zip(InferenceSession(model).run(None, feeds), expected):
        np.testing.assert_array_equal(ours, theirs)


def test_a_bfloat16_cast_inside_a_body_rounds_as_ort():
    then = h.make_graph([h.make_node("Cast", ["x"], ["b"], to=T.BFLOAT16, name="tb"),
                         h.make_node("Cast", ["b"], ["t"], to=T.FLOAT, name="tf")], "then", [], [vi("t", T.FLOAT)])
    other = h.make_graph([h.make_node("Identity", ["x"], ["e"], name="e")], "else", [], [vi("e", T.FLOAT)])
    node = h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other, name="if")
    model = single_output_model([node], [vi("x", T.FLOAT), vi("c", T.BOOL, ())], vi("y", T.FLOAT))
    assert_values_are_orts(model, {"x": X, "c": np.array(True)})  # ORT: 2.9999 -> 3.0; ortlab 2.984375


def test_a_float16_add_runs_in_float32_as_ort_inserts_casts_for_it():
    nodes = [h.make_node("Cast", ["x"], ["h"], to=T.FLOAT16, name="c"),
             h.make_node("Add", ["h", "h"], ["a"], name="add"),
             h.make_node("Cast", ["a"], ["y"], to=T.FLOAT, name="c2")]
    assert_values_are_orts(single_output_model(nodes, [vi("x", T.FLOAT)], vi("y", T.FLOAT)), {"x": X})


@pytest.mark.xfail(strict=True, reason="QuantizeLinear to int4/uint4 falls back to onnx.reference, which does not "
                   "saturate to [-8, 7] / [0, 15] as ORT does (ortlab/engine/cpu_kernels_elementwise.py, "
                   "OrtQuantizeLinear takes int8/uint8 only)")
@pytest.mark.parametrize("int4", [T.INT4, T.UINT4])
def test_quantize_linear_to_int4_saturates_as_ort(int4):
    scale_zero = [h.make_tensor("s", T.FLOAT, [], [0.5]), h.make_tensor("z", int4, [], [1])]
    nodes = [h.make_node("QuantizeLinear", ["x", "s", "z"], ["q"], name="q"),
             h.make_node("DequantizeLinear", ["q", "s", "z"], ["y"], name="dq")]
    model = single_output_model(nodes, [vi("x", T.FLOAT)], vi("y", T.FLOAT), opset=21, initializers=scale_zero)
    assert_values_are_orts(model, {"x": X})  # 70000.5: ORT 3.0 for int4 (saturates at 7); ortlab wraps


@pytest.mark.xfail(strict=True, reason="ortlab/ir/load_rules.py asks onnx.defs.get_schema for domain 'ai.onnx' "
                   "as spelled (onnx's registry names it ''), so the engine refuses a node ORT loads and runs")
def test_a_cast_pair_spelled_in_the_ai_onnx_domain_runs_as_ort():
    nodes = [h.make_node("Cast", ["x"], ["d"], to=T.DOUBLE, name="a", domain="ai.onnx"),
             h.make_node("Cast", ["d"], ["b"], to=T.FLOAT, name="b", domain="ai.onnx"),
             h.make_node("Identity", ["b"], ["y"], name="id")]
    assert_values_are_orts(single_output_model(nodes, [vi("x", T.FLOAT)], vi("y", T.FLOAT)), {"x": X})


def test_a_scan_of_scalars_stacks_to_orts_shape():
    chain = [h.make_node("Cast", ["e"], ["o"], to=T.INT8, name="c"), h.make_node("Identity", ["st"], ["st2"], name="i")]
    body = h.make_graph(chain, "body", [vi("st", T.FLOAT, (1,)), vi("e", T.FLOAT, ())],
                        [vi("st2", T.FLOAT, (1,)), vi("o", T.INT8, ())])
    node = h.make_node("Scan", ["s0", "x"], ["sf", "ys"], body=body, num_scan_inputs=1, name="scan")
    graph = h.make_graph([node], "g", [vi("x", T.FLOAT), vi("s0", T.FLOAT, (1,))],
                         [vi("sf", T.FLOAT, (1,)), vi("ys", T.INT8)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)
    feeds = {"x": X, "s0": np.zeros(1, np.float32)}
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert expected[1].shape == (5,)
    assert InferenceSession(model).run(None, feeds)[1].shape == expected[1].shape

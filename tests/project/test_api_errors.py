"""Hostile inputs at ortlab's public API (wrong types, None, missing names, bad shapes): each ends in an
OrtlabError that says what is wrong, never a raw error from numpy, onnx, ORT or torch."""
import numpy as np
import pytest
import torch
import onnx
import onnx.numpy_helper
from onnx import helper

import ortlab.triton_kernels as K
from ortlab import OrtlabError, session
from ortlab.gradients import check_gradient, register_gradient
from ortlab.ir import Graph
from ortlab.onnx_defs import make_model
from ortlab.training import MiniORTModule

pytestmark = pytest.mark.hostile


def vi(name, shape, t=1):
    return helper.make_tensor_value_info(name, t, shape)


def mul_model():
    graph = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["y"], name="mul"),
                               helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0, name="sum")],
                              "g", [vi("x", [2, 3]), vi("w", [2, 3])], [vi("loss", [])])
    return make_model(graph, domains=())


ONES = np.ones((2, 3), np.float32)


@pytest.mark.parametrize("call, words", [
    (lambda g: g.node("0"), "node\\(\\) takes a node index \\(an int\\), not str '0'"),
    (lambda g: g.add_node("Relu", ["y"], ["z"], alpha=object()), "attribute alpha=.* is not an ONNX attribute value"),
    (lambda g: g.add_node("Relu", ["y"], [3]), "outputs of the new Relu node must hold value names"),
    (lambda g: g.add_initializer("k", object()), "initializer 'k': object is not a tensor value"),
    (lambda g: g.initializer_value("nope"), "no initializer named 'nope'"),
    (lambda g: g.replace_node_input(g.nodes()[0], 5, "x"),
     "node 'mul' \\(#0 Mul\\) has no input 5: it has 2 \\(x, w\\)"),
    (lambda g: Graph.load("/tmp"), "is a folder, not a model file"),
])
def test_graph_methods_explain_bad_arguments(call, words):
    with pytest.raises(OrtlabError, match=words):
        call(Graph.from_model(mul_model()))


def test_add_node_takes_one_str_as_one_name():
    graph = Graph.from_model(mul_model())
    node = graph.add_node("Relu", "y", "yy_relu")
    assert node.input_names == ["y"] and node.output_names == ["yy_relu"]


@pytest.mark.parametrize("call, words", [
    (lambda: session.run_model(mul_model(), [ONES, ONES]), "feeds must be a dict"),
    (lambda: session.run_model(mul_model(), {"x": ONES}), "the feeds lack \\['w'\\]"),
    (lambda: session.run_model(mul_model(), {"x": ONES.astype(np.float64), "w": ONES.astype(np.float64)}),
     "could not run the model: .*Unexpected input data type.*fed: x float64\\[2, 3\\]"),
    (lambda: session.session_options(intra_op_num_threads="two"), "intra_op_num_threads takes a int, not str"),
    (lambda: session.create(mul_model(), providers=["NopeExecutionProvider"]),
     "unknown execution provider 'NopeExecutionProvider'"),
    (lambda: session.create(None), "needs an onnx.ModelProto, a path .* not NoneType"),
    (lambda: check_gradient(mul_model(), ["x"], "loss", {"x": ONES}), "the feeds lack \\['w'\\]"),
])
def test_session_helpers_explain_bad_feeds_options_and_providers(call, words):
    with pytest.raises(OrtlabError, match=words):
        call()


def test_register_gradient_refuses_what_is_not_a_builder():
    with pytest.raises(OrtlabError, match="decorates a builder function `f\\(b\\)`, not int"):
        register_gradient("MyOp")(42)
    with pytest.raises(OrtlabError, match="takes the op type as a non-empty str"):
        register_gradient(None)


def test_kernels_take_domain_none_as_the_default_domain():
    x = np.random.default_rng(0).standard_normal((2, 3)).astype(np.float32)
    np.testing.assert_array_equal(K.run("Softmax", x, domain=None)[0], K.run("Softmax", x)[0])


def test_mini_ort_module_explains_an_input_its_graph_cannot_take():
    wrapped = MiniORTModule(torch.nn.Linear(3, 1))
    wrapped(torch.ones(2, 3))
    with pytest.raises(OrtlabError, match="ORT's forward run failed: .*Dimension mismatch"):
        wrapped(torch.ones(2, 4))


def test_one_weight_name_to_train_is_one_name_not_letters():
    from onnx import TensorProto, helper, numpy_helper

    from ortlab.transformers.pre_training import optimize_for_training
    w = numpy_helper.from_array(np.ones((2, 2), np.float32), "Wq")
    graph = helper.make_graph([helper.make_node("Transpose", ["Wq"], ["Wt"]),
                               helper.make_node("MatMul", ["X", "Wt"], ["Y"])], "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    optimized, _ = optimize_for_training(model, "Wq")
    assert "Wq" in [i.name for i in optimized.graph.initializer]  # not folded into Transpose(Wq)
    assert "Transpose" in [n.op_type for n in optimized.graph.node]


def test_a_file_that_is_not_a_model_is_named(tmp_path):
    path = tmp_path / "weights.onnx"
    path.write_bytes(b"\x00\x01 not protobuf at all \xff" * 20)
    with pytest.raises(OrtlabError, match="is not an ONNX model"):
        session.create(path)


def test_an_integer_loss_is_refused_before_orts_builder():
    from onnx import TensorProto

    from ortlab.gradients import OrtGradientError, ort_gradient_graph
    nodes = [helper.make_node("MatMul", ["X", "W"], ["Y"]), helper.make_node("ArgMax", ["Y"], ["L"], keepdims=0)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("L", TensorProto.INT64, [2])],
                              [onnx.numpy_helper.from_array(np.ones((3, 4), np.float32), "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    with pytest.raises(OrtGradientError, match="is int64: a gradient needs a floating-point loss"):
        ort_gradient_graph(model, ["W"], "L")


@pytest.mark.parametrize("value, names", [("W", ["W"]), (("a", "b"), ["a", "b"]), ({"x"}, ["x"]), ([], [])])
def test_one_rule_for_names(value, names):
    from ortlab.errors import as_names
    assert as_names(value, "names") == names


@pytest.mark.parametrize("value, words", [(None, "not NoneType"), (3, "not int"), (b"W", "not bytes"),
                                          ({"W": 1}, "not dict"), (["a", 2], "got 2 \\(int\\)")])
def test_one_rule_for_bad_names(value, words):
    from ortlab.errors import as_names
    with pytest.raises(OrtlabError, match=f"names must .*{words}"):
        as_names(value, "names")


def test_one_check_for_provider_names():
    from ortlab.session import check_providers
    assert check_providers("CPUExecutionProvider") == ["CPUExecutionProvider"]
    assert check_providers([("CPUExecutionProvider", {})]) == [("CPUExecutionProvider", {})]
    for bad, words in ((["CPUExecutionProvidr"], "did you mean 'CPUExecutionProvider'"), ([], "must be a list"),
                       (42, "must be a list")):
        with pytest.raises(OrtlabError, match=words):
            check_providers(bad)

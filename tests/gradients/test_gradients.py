"""ortlab.gradients against torch autograd, central differences and ORT's C++ builder."""
import collections

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

import ortcheck
from gradient_cases import CASES
from ortlab import OrtlabError, models
from ortlab.gradients import (GRADIENT_BUILDERS, GradientGraphError, UnknownGradientError,
                              build_gradient_graph, check_gradient, ort_gradient_graph)
from ortlab.walkthroughs.per_op_gradients import gradient_nodes

# ORT 1.19.2's C++ builder cannot build these: it has no Sum or Softsign builder, and it seeds
# the loss gradient as float32, so a double loss (after Cast to double) fails its type check.
ORT_LACKS = {"Sum-broadcast", "Softsign", "Cast"}
# ...and builds a wrong gradient here: its Where builder does not reduce over broadcast axes.
ORT_WRONG = {"Where-broadcast"}


def run(model, feeds):
    outputs = [o.name for o in model.graph.output]
    return dict(zip(outputs, ortcheck.run(model, feeds)))


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_op_gradient_equals_torch_finite_differences_and_ort(case):
    model = case.model()
    expected = case.torch_gradients()
    ours = build_gradient_graph(model, case.x_names, "loss")
    got = run(ours, case.feeds)
    for x in case.x_names:
        np.testing.assert_allclose(got[f"{x}_grad"], expected[x], rtol=1e-4, atol=1e-5, err_msg=x)
    assert check_gradient(model, case.x_names, "loss", case.feeds, gradient_model=ours).passed
    try:
        theirs = run(ort_gradient_graph(model, case.x_names, "loss"), case.feeds)
    except OrtlabError:  # ORT's builder refused, or its graph did not load
        assert case.id in ORT_LACKS, f"ORT could not build {case.id}"
        return
    assert case.id not in ORT_LACKS, f"ORT now builds {case.id}: take it off ORT_LACKS"
    agree = all(np.allclose(got[f"{x}_grad"], theirs[f"{x}_grad"], rtol=1e-4, atol=1e-5) for x in case.x_names)
    assert agree == (case.id not in ORT_WRONG), "ORT's values " + ("differ" if not agree else "now agree")


def test_every_registered_builder_is_tested():
    tested = {(c.op, c.domain) for c in CASES}
    assert set(GRADIENT_BUILDERS) <= tested, set(GRADIENT_BUILDERS) - tested


def test_dropout_gradient_uses_the_forward_mask():
    a = np.random.default_rng(0).standard_normal((4, 50)).astype(np.float32)
    nodes = [helper.make_node("Dropout", ["x", "ratio", "train"], ["y", "mask"], seed=3),
             helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "d", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 50])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
                              [helper.make_tensor("ratio", TensorProto.FLOAT, [], [0.5]),
                               helper.make_tensor("train", TensorProto.BOOL, [], [True])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    grad_model = build_gradient_graph(model, ["x"], "loss")
    grad_model.graph.output.append(helper.make_tensor_value_info("mask", TensorProto.BOOL, None))
    loss, dx, mask = ortcheck.run(grad_model, {"x": a})
    assert 0.3 < mask.mean() < 0.7
    np.testing.assert_array_equal(dx, mask * 2.0)  # d(sum(y))/dx = mask / (1 - 0.5)


# --- the roadmap's examples: same op types as ORT's builder ------------------------------------

ROADMAP = ["Dropout-ratio0", "Sqrt", "Add-broadcast", "Sub-broadcast", "Mul-broadcast", "MatMul-2d",
           "Gemm-trans-alpha-beta"]


def gradient_op_types(model, forward):
    counts = collections.Counter(n.op_type for n in model.graph.node)
    counts.subtract(collections.Counter(n.op_type for n in forward.graph.node))
    return {op for op, n in counts.items() if n > 0}


@pytest.mark.parametrize("case", [c for c in CASES if c.id in ROADMAP], ids=lambda c: c.id)
def test_roadmap_examples_emit_orts_op_types(case):
    model = case.model()
    ours = gradient_op_types(build_gradient_graph(model, case.x_names, "loss"), model)
    theirs = gradient_op_types(ort_gradient_graph(model, case.x_names, "loss"), model)
    assert ours == theirs


# --- whole models ------------------------------------------------------------------------------

@pytest.mark.parametrize("name, kwargs", [(n, {}) for n in models.ZOO] + [("gpt", {"tie_embeddings": True})],
                         ids=list(models.ZOO) + ["gpt-tied"])
def test_model_parameter_gradients_equal_torch_and_use_no_more_nodes_than_ort(name, kwargs, record_property):
    model = models.get(name, **kwargs)
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0  # the same masks in torch and ORT: none
    inputs = model.example_inputs()
    onx = models.export(model, inputs, training=True)
    params = dict(model.named_parameters())
    x_names = [i.name for i in onx.graph.initializer if i.name in params]
    assert len(x_names) == len(params)
    ours = build_gradient_graph(onx, x_names, "loss")
    feeds = {i.name: t.numpy() for i, t in zip(onx.graph.input, inputs)}
    got = run(ours, feeds)
    model.zero_grad()
    model(*inputs).backward()
    for x in x_names:
        np.testing.assert_allclose(got[f"{x}_grad"], params[x].grad.numpy(), rtol=1e-4, atol=1e-5, err_msg=x)
    theirs = ort_gradient_graph(onx, x_names, "loss")
    # ORT turns Constant nodes into initializers, so count the nodes that are not forward nodes
    ours_count, ort_count = len(gradient_nodes(ours, onx)), len(gradient_nodes(theirs, onx))
    assert ours_count == len(ours.graph.node) - len(onx.graph.node)
    record_property("gradient_nodes", f"ours {ours_count}, ORT {ort_count}")
    assert ours_count <= ort_count, (ours_count, ort_count)


# --- bad inputs --------------------------------------------------------------------------------

def small(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


F = TensorProto.FLOAT
VX = helper.make_tensor_value_info("x", F, [2, 3])


@pytest.mark.parametrize("nodes, x_names, loss, error, words", [
    ([helper.make_node("Hardmax", ["x"], ["h"]), helper.make_node("ReduceSum", ["h"], ["loss"], keepdims=0)],
     ["x"], "loss", UnknownGradientError, "no gradient builder is registered for Hardmax"),
    ([helper.make_node("Relu", ["x"], ["loss"])], ["x"], "loss", GradientGraphError, "must be a scalar"),
    ([helper.make_node("Shape", ["x"], ["s"]), helper.make_node("Cast", ["s"], ["c"], to=F),
      helper.make_node("ReduceSum", ["c"], ["loss"], keepdims=0)],
     ["x"], "loss", GradientGraphError, "does not depend on any x"),
    ([helper.make_node("ReduceSum", ["x"], ["loss"], keepdims=0)], ["w"], "loss", GradientGraphError,
     "x 'w' is not a value of the graph"),
    ([helper.make_node("ReduceSum", ["x"], ["loss"], keepdims=0)], ["x"], "nope", GradientGraphError,
     "the loss 'nope' is not produced by any node"),
])
def test_bad_inputs_are_explained(nodes, x_names, loss, error, words):
    produced = nodes[-1].output[0]
    model = small(nodes, [VX], [helper.make_tensor_value_info(produced, F, None)])
    with pytest.raises(error, match=words):
        build_gradient_graph(model, x_names, loss)


def test_an_x_that_does_not_reach_the_loss_is_named():
    nodes = [helper.make_node("ReduceSum", ["x"], ["loss"], keepdims=0), helper.make_node("Relu", ["w"], ["r"])]
    model = small(nodes, [VX, helper.make_tensor_value_info("w", F, [2])],
                  [helper.make_tensor_value_info("loss", F, []), helper.make_tensor_value_info("r", F, [2])])
    with pytest.raises(GradientGraphError, match="x 'w' does not affect the loss 'loss'"):
        build_gradient_graph(model, ["x", "w"], "loss")


def test_a_reused_value_gets_its_gradients_summed():
    nodes = [helper.make_node("Mul", ["x", "x"], ["sq"]), helper.make_node("Add", ["sq", "x"], ["y"]),
             helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = small(nodes, [VX], [helper.make_tensor_value_info("loss", F, [])])
    grad = build_gradient_graph(model, ["x"], "loss")
    sums = [n for n in grad.graph.node if n.op_type == "Sum"]
    assert len(sums) == 1 and sums[0].name == "AccumulateGrad_x_grad" and len(sums[0].input) == 3
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    (_, dx) = ortcheck.run(grad, {"x": x})
    np.testing.assert_allclose(dx, 2 * x + 1)


def test_custom_stop_gradient_edges_cut_the_path():
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)]
    model = small(nodes, [VX, helper.make_tensor_value_info("w", F, [2, 3])],
                  [helper.make_tensor_value_info("loss", F, [])])
    with pytest.raises(GradientGraphError, match="x 'w' does not affect"):
        build_gradient_graph(model, ["x", "w"], "loss", stop_gradient_edges={"Mul": {1}})


def _mul_model():
    nodes = [helper.make_node("Mul", ["x", "w"], ["y"], name="mul"),
             helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0, name="sum")]
    return small(nodes, [VX, helper.make_tensor_value_info("w", F, [2, 3])],
                 [helper.make_tensor_value_info("loss", F, [])])


@pytest.mark.parametrize("edges, words", [
    ({"Mull": {1}}, r"names op type 'Mull', but no node of the graph has that op type \(did you mean 'Mul'\?\)"),
    ({"Mul": {2}}, r"stop_gradient_edges\['Mul'\] holds 2, which is not an input index of Mul \(it takes "
                   r"inputs 0 to 1\)"),
    ({"Mul": {-1}}, r"holds -1, which is not an input index"),
    ({"Mul": {"1"}}, r"holds '1', which is not an input index"),
    ("Mul", r"stop_gradient_edges must be a dict \{op type: input indices\}.*got str 'Mul'"),
    ({"Mul": None}, r"stop_gradient_edges\['Mul'\] must be an input index or a set of them, not NoneType"),
], ids=["unknown-op", "index-out-of-range", "negative-index", "str-index", "str-not-mapping", "none-indices"])
def test_bad_stop_gradient_edges_are_refused(edges, words):
    with pytest.raises(GradientGraphError, match=words):
        build_gradient_graph(_mul_model(), ["x", "w"], "loss", stop_gradient_edges=edges)


def test_one_stop_gradient_index_may_be_given_as_an_int():
    with pytest.raises(GradientGraphError, match="x 'w' does not affect"):
        build_gradient_graph(_mul_model(), ["x", "w"], "loss", stop_gradient_edges={"Mul": 1})


@pytest.mark.parametrize("build", [build_gradient_graph, ort_gradient_graph])
def test_one_x_name_given_as_a_str_is_one_name_in_both_builders(build):
    model = _mul_model()
    one = build(model, "w", "loss")
    assert [o.name for o in one.graph.output][-1] == "w_grad"
    x, w = np.arange(6, dtype=np.float32).reshape(2, 3), np.full((2, 3), 2.0, np.float32)
    got = dict(zip([o.name for o in one.graph.output], ortcheck.run(one, {"x": x, "w": w})))
    np.testing.assert_allclose(got["w_grad"], x)
    # a str that is not a value is named whole, not split into letters that happen to be values
    with pytest.raises(OrtlabError, match="x 'xw' is not a value of the graph"):
        build(model, "xw", "loss")


@pytest.mark.parametrize("build", [build_gradient_graph, ort_gradient_graph])
@pytest.mark.parametrize("x_names, loss, words", [
    (None, "loss", "x_names must be a name or a list of names.*not NoneType"),
    (42, "loss", "x_names must be a name or a list of names.*not int"),
    ([], "loss", "no x given"),
    (["x", 3], "loss", "x_names must hold value names.*got 3"),
    (["x", "x"], "loss", "x_names names 'x' more than once"),
    (["x"], None, "loss_name must be the name.*not None"),
    (["x"], "nope", "the loss 'nope' is not produced by any node"),
])
def test_bad_x_names_and_loss_are_explained_the_same_by_both_builders(build, x_names, loss, words):
    with pytest.raises(OrtlabError, match=words):
        build(_mul_model(), x_names, loss)


def test_check_gradient_takes_one_x_as_a_str_and_explains_bad_feeds():
    from ortlab.gradients.checker import GradientCheckError
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    w = np.full((2, 3), 2.0, np.float32)
    result = check_gradient(_mul_model(), "w", "loss", {"x": x, "w": w})
    assert list(result.max_error) == ["w"] and result.passed
    with pytest.raises(GradientCheckError, match="feeds must be a dict"):
        check_gradient(_mul_model(), ["w"], "loss", [x, w])

"""Exercises of the walkthrough L1_05_gradient_graph_building: which nodes get a gradient, and where the
builder adds a Sum.

The models the exercises are about are built here, so the notebook can show them; the checks themselves
live in ortlab.labs.judges.l1_05 (compared with ortlab's GradientGraphBuilder and with ORT's gradient
graph, orttraining/orttraining/core/framework/gradient_graph_builder.cc), and the reference answers in
solutions/walkthroughs/L1_05_gradient_graph_building.py, outside the package.
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe
from ortlab.onnx_defs import make_model

F = TensorProto.FLOAT


def _model(nodes, inputs, initializers, outputs=("loss",), name="exercise"):
    """A float model: `inputs` {name: shape}, `initializers` {name: shape} (seeded values), scalar outputs
    unless an output is named in `inputs`-style {name: shape} via a dict."""
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info(n, F, s) for n, s in inputs.items()],
        [helper.make_tensor_value_info(o, F, None) for o in outputs],
        [numpy_helper.from_array(rng.standard_normal(s).astype(np.float32), n) for n, s in initializers.items()])
    return make_model(graph)


def shared_values_model():
    """The model of exercise 'sum_contributions': W feeds two MatMuls, h feeds a MatMul, an Add and a Shape,
    y feeds both inputs of one Mul. Differentiated with respect to W."""
    n = helper.make_node
    nodes = [n("MatMul", ["X", "W"], ["h"], name="mm1"), n("MatMul", ["h", "W"], ["h2"], name="mm2"),
             n("Shape", ["h"], ["s"], name="shape"), n("Reshape", ["h2", "s"], ["r"], name="reshape"),
             n("Add", ["r", "h"], ["y"], name="add"), n("Mul", ["y", "y"], ["z"], name="square"),
             n("ReduceSum", ["z"], ["loss"], name="total", keepdims=0)]
    return _model(nodes, {"X": [2, 3]}, {"W": [3, 3]})


def branching_model():
    """A model with every kind of node the walk must leave out: a side output that does not reach the loss,
    a constant path that depends on no x, a shape path (Shape -> Reshape's shape input), an integer path
    (ArgMax -> Gather's indices). Differentiated with respect to W1 and W2."""
    n = helper.make_node
    nodes = [n("MatMul", ["X", "W1"], ["h"], name="mm1"), n("Relu", ["h"], ["a"], name="relu"),
             n("Sigmoid", ["a"], ["probe"], name="side_sigmoid"),
             n("Mul", ["C", "C"], ["c2"], name="const_square"), n("Add", ["a", "c2"], ["b"], name="add_const"),
             n("Shape", ["b"], ["s"], name="shape"), n("MatMul", ["b", "W2"], ["o"], name="mm2"),
             n("Reshape", ["o", "s"], ["o2"], name="reshape"),
             n("ArgMax", ["X"], ["idx"], name="argmax", axis=1, keepdims=0),
             n("Gather", ["o2", "idx"], ["g"], name="gather"),
             n("ReduceSum", ["g"], ["loss"], name="total", keepdims=0)]
    return _model(nodes, {"X": [3, 3]}, {"W1": [3, 3], "W2": [3, 3], "C": [3]}, outputs=("loss", "probe"))


@probe
def node_names(fn, model, x_names, loss_name):
    """The learner's fn(model, x_names, loss_name), as a sorted list of what it returned."""
    found = fn(model, list(x_names), loss_name)
    if isinstance(found, (str, bytes)) or not hasattr(found, "__iter__"):
        raise CheckFailed(f"return a set of node names, not {type(found).__name__}")
    return sorted((item if isinstance(item, (str, int)) else repr(item) for item in found), key=str)


@probe
def predicted(fn):
    """The learner's prediction fn(), as a dict."""
    found = fn()
    if not isinstance(found, dict):
        raise CheckFailed(f"return a dict {{value name: number of contributions}}, not {type(found).__name__}")
    return dict(found)


def check_nodes_to_differentiate(fn):
    """Exercise 'nodes_to_differentiate': fn(model, x_names, loss_name) -> the names of the nodes that get a
    gradient builder call, checked on several models against ortlab's GradientGraphBuilder."""
    judge("nodes_to_differentiate", "l1_05.nodes_to_differentiate", learner(fn))


def check_sum_contributions(fn):
    """Exercise 'sum_contributions': fn() -> {value: number of gradient contributions} for every value of
    shared_values_model() whose gradient is a Sum, checked against ORT's gradient graph."""
    judge("sum_contributions", "l1_05.sum_contributions", learner(fn))

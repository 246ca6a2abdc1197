"""Exercises of the walkthrough L0_03_graph_node_nodearg: walking producers (what a value depends on) and
putting the nodes in an order ORT could run them in.

The models the exercises are about are built here, so the notebook can show them; the checks live in
ortlab.labs.judges.l0_03 (ORT's Graph::GetProducerNode / GetConsumerNodes in
onnxruntime/core/graph/graph.cc, and the topological sorts of onnxruntime/core/graph/graph_viewer.cc), and
the reference answers in solutions/walkthroughs/L0_03_graph_node_nodearg.py, outside the package.
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe
from ortlab.onnx_defs import make_model

F = TensorProto.FLOAT


def _model(nodes, name, outputs):
    rng = np.random.default_rng(0)
    graph = helper.make_graph(
        nodes, name, [helper.make_tensor_value_info("X", F, [2, 3])],
        [helper.make_tensor_value_info(o, F, None) for o in outputs],
        [numpy_helper.from_array(rng.standard_normal([3, 3]).astype(np.float32), "W"),
         numpy_helper.from_array(np.array(1.5, np.float32), "hi")])
    return make_model(graph)


def diamond_model():
    """The model of exercise 'upstream_nodes': X and the weight W meet in a MatMul whose result splits into
    two branches that join again (a diamond); a side branch computes a second output; one Clip leaves its
    optional `min` input empty ("")."""
    n = helper.make_node
    nodes = [n("MatMul", ["X", "W"], ["h"], name="mm"), n("Relu", ["h"], ["left"], name="relu"),
             n("Sigmoid", ["h"], ["right"], name="sigmoid"), n("Add", ["left", "right"], ["joined"], name="join"),
             n("Clip", ["joined", "", "hi"], ["clipped"], name="clip"), n("Neg", ["X"], ["negx"], name="neg"),
             n("Mul", ["clipped", "clipped"], ["Y"], name="square"), n("Abs", ["negx"], ["side"], name="abs"),
             n("Tanh", ["right"], ["extra"], name="tanh"), n("Add", ["side", "extra"], ["Z"], name="side_sum")]
    return _model(nodes, "diamond", ["Y", "Z"])


def shuffled_model():
    """The model of exercise 'topological_order': the nodes of diamond_model() stored in the file in an
    order no one could run them in (ORT sorts them when it loads the model; ONNX's checker would refuse)."""
    model = diamond_model()
    nodes = list(model.graph.node)
    order = [6, 4, 9, 3, 0, 8, 2, 7, 1, 5]
    del model.graph.node[:]
    model.graph.node.extend(nodes[i] for i in order)
    model.graph.name = "shuffled"
    return model


def _names(found, what):
    if isinstance(found, (str, bytes)) or not hasattr(found, "__iter__"):
        raise CheckFailed(f"return {what}, not {type(found).__name__}")
    return [item if isinstance(item, (str, int)) else repr(item) for item in found]


@probe
def upstream(fn, model, value):
    """The learner's fn(model, value), as a sorted list of what it returned."""
    return sorted(_names(fn(model, value), "a set of node names"), key=str)


@probe
def ordered(fn, model):
    """The learner's fn(model), as a list (order kept)."""
    return _names(fn(model), "a list of node names")


def check_upstream_nodes(fn):
    """Exercise 'upstream_nodes': fn(model, value) -> the names of every node `value` depends on (the nodes
    that must run to compute it), checked on several values of diamond_model()."""
    judge("upstream_nodes", "l0_03.upstream_nodes", learner(fn))


def check_topological_order(fn):
    """Exercise 'topological_order': fn(model) -> every node's name once, each after the producers of its
    inputs; any such order passes. Checked on diamond_model() and shuffled_model()."""
    judge("topological_order", "l0_03.topological_order", learner(fn))

"""Exercises of the walkthrough L2_01_execution_engine: when the plan releases each value, and which steps
a run with only_execute_path_to_fetches keeps.

The model the exercises are about is built here, so the notebook can show it; the checks live in
ortlab.labs.judges.l2_01 (compared with the release plan of ortlab.engine's SessionState, which is ORT's
PlannerImpl::GenerateDeallocationPlan in onnxruntime/core/framework/allocation_planner.cc, and with the nodes
ORT 1.19.2 itself runs, read from its profiler: sequential_executor.cc, SessionState::UpdateToBeExecutedRange),
and the reference answers in solutions/walkthroughs/L2_01_execution_engine.py, outside the package.
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe


def loop_model():
    """x: float [2, 4]; h = x @ W, r = Relu(h), then two heads a = Sigmoid(r) -> c = Clip(a, max=hi) and
    b = Tanh(r) -> z = Neg(b), joined by y = c + b; and u = Exp(x) beside them. Outputs y, z, u. The Clip
    leaves its optional `min` input out (an empty name)."""
    f = TensorProto.FLOAT
    n = helper.make_node
    nodes = [n("MatMul", ["x", "W"], ["h"], name="fc"), n("Relu", ["h"], ["r"], name="relu"),
             n("Sigmoid", ["r"], ["a"], name="left"), n("Tanh", ["r"], ["b"], name="right"),
             n("Clip", ["a", "", "hi"], ["c"], name="clip"), n("Add", ["c", "b"], ["y"], name="add"),
             n("Neg", ["b"], ["z"], name="neg"), n("Exp", ["x"], ["u"], name="exp")]
    weights = [numpy_helper.from_array(np.random.default_rng(0).standard_normal((4, 4)).astype(np.float32), "W"),
               numpy_helper.from_array(np.array(0.5, np.float32), "hi")]
    graph = helper.make_graph(nodes, "loop", [helper.make_tensor_value_info("x", f, [2, 4])],
                              [helper.make_tensor_value_info(o, f, None) for o in ("y", "z", "u")], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def loop_feeds():
    return {"x": np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)}


def loop_session(model=None):
    """ortlab.engine's session of loop_model() (optimizations off, memory pattern off), as in the notebook."""
    from ortlab.engine import InferenceSession, SessionOptions  # lazy: loaded only when this runs

    return InferenceSession(loop_model() if model is None else model,
                            SessionOptions(graph_optimization_level="disable", enable_mem_pattern=False))


@probe
def predicted_releases(fn):
    """The learner's fn(), as a dict {value name: step}."""
    found = fn()
    if not isinstance(found, dict):
        raise CheckFailed(f"return a dict {{value name: the step after which it is released}}, not "
                          f"{type(found).__name__}")
    return {str(k): (v if isinstance(v, int) or v is None else repr(v)) for k, v in found.items()}


@probe
def steps_kept(fn, model, fetches):
    """The learner's fn(state, fetches) on loop_session(model)'s SessionState, as a list of node names."""
    state = loop_session(model).state
    found = fn(state, list(fetches))
    if isinstance(found, (str, bytes, dict)) or not hasattr(found, "__iter__"):
        raise CheckFailed(f"return the steps (or their node names) in run order, not {type(found).__name__}")
    names = []
    for item in found:
        node = getattr(item, "node", None)
        names.append(node.name if node is not None else item if isinstance(item, str) else repr(item))
    return names


def check_released_after(fn):
    """Exercise 'released_after': fn() -> {value: the step after which the plan releases it} for every value
    of loop_model() released during a run, checked against the session's plan (ORT's release actions)."""
    judge("released_after", "l2_01.released_after", learner(fn))


def check_needed_steps(fn):
    """Exercise 'needed_steps': fn(state, fetch_names) -> the steps a run of only those fetches needs, in run
    order, checked against the nodes ORT runs with only_execute_path_to_fetches."""
    judge("needed_steps", "l2_01.needed_steps", learner(fn))

"""Exercises of the walkthrough L0_01_inference_session: which inputs a session asks for, and the shapes and
types of the outputs its run returns.

The models the exercises are about are built here, so the notebook can show them; the checks live in
ortlab.labs.judges.l0_01 (against onnxruntime.InferenceSession itself: get_inputs and
get_overridable_initializers come from InferenceSession::GetModelInputs / GetOverridableInitializers in
onnxruntime/core/session/inference_session.cc), and the reference answers in
solutions/walkthroughs/L0_01_inference_session.py, outside the package.
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe
from ortlab.labs.model_text import describe  # noqa: F401 - the notebook shows its models with it

F, I64 = TensorProto.FLOAT, TensorProto.INT64


def _model(nodes, inputs, outputs, inits, name):
    graph = helper.make_graph(nodes, name, inputs, outputs, [numpy_helper.from_array(v, n) for n, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def inputs_model():
    """The model of exercise 'needed_inputs': graph inputs x, scale (which also has an initializer) and unused
    (which no node reads); initializers w (not an input) and scale."""
    n = helper.make_node
    rng = np.random.default_rng(0)
    nodes = [n("MatMul", ["x", "w"], ["h"], name="matmul"), n("Mul", ["h", "scale"], ["y"], name="scale_it")]
    inputs = [helper.make_tensor_value_info("x", F, ["batch", 3]), helper.make_tensor_value_info("scale", F, []),
              helper.make_tensor_value_info("unused", F, [2])]
    inits = [("w", rng.standard_normal([3, 4]).astype(np.float32)), ("scale", np.array(2.0, np.float32))]
    return _model(nodes, inputs, [helper.make_tensor_value_info("y", F, ["batch", 4])], inits, "inputs")


def shapes_model():
    """The model of exercise 'output_shapes': x [batch, 6] through Reshape [-1, 2, 3], Transpose, ReduceSum
    (keepdims=0), ArgMax (keepdims left at its default), Shape and a MatMul; six outputs."""
    n = helper.make_node
    rng = np.random.default_rng(0)
    nodes = [n("Reshape", ["x", "target"], ["r"], name="reshape"),
             n("Transpose", ["r"], ["t"], perm=[0, 2, 1], name="transpose"),
             n("ReduceSum", ["t", "axes"], ["summed"], keepdims=0, name="reduce_sum"),
             n("ArgMax", ["x"], ["best"], axis=1, name="argmax"),
             n("Shape", ["x"], ["shape"], name="shape"),
             n("MatMul", ["x", "w"], ["projected"], name="matmul")]
    outputs = [helper.make_tensor_value_info(o, F, None) for o in ("r", "t", "summed", "projected")]
    outputs[3:3] = [helper.make_tensor_value_info("best", I64, None), helper.make_tensor_value_info("shape", I64, None)]
    inits = [("target", np.array([-1, 2, 3], np.int64)), ("axes", np.array([1], np.int64)),
             ("w", rng.standard_normal([6, 4]).astype(np.float32))]
    return _model(nodes, [helper.make_tensor_value_info("x", F, ["batch", 6])], outputs, inits, "shapes")


def shapes_feeds():
    """The feed of exercise 'output_shapes': x of shape [5, 6]."""
    return {"x": np.arange(30, dtype=np.float32).reshape(5, 6)}




@probe
def predicted(fn):
    """The learner's prediction fn(), as plain data."""
    found = fn()
    if not isinstance(found, dict):
        raise CheckFailed(f"return a dict, not {type(found).__name__}")
    return {str(k): ([str(x) for x in v] if isinstance(v, (list, tuple)) else
                     {str(a): b for a, b in v.items()} if isinstance(v, dict) else v) for k, v in found.items()}


@probe
def predicted_shapes(fn):
    """The learner's fn(), as {output: (shape as a list of ints, dtype name)}."""
    found = fn()
    if not isinstance(found, dict):
        raise CheckFailed(f"return a dict {{output name: (shape, dtype)}}, not {type(found).__name__}")
    out = {}
    for name, value in found.items():
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            raise CheckFailed(f"for {name!r}: give a pair (shape, dtype), e.g. ((5, 6), 'float32'), not {value!r}")
        shape, dtype = value
        out[str(name)] = ([int(d) for d in shape], np.dtype(dtype).name)
    return out


def check_needed_inputs(fn):
    """Exercise 'needed_inputs': fn() -> {"inputs": [...], "overridable": [...]}, the names
    InferenceSession(inputs_model()).get_inputs() and .get_overridable_initializers() list, checked against ORT."""
    judge("needed_inputs", "l0_01.needed_inputs", learner(fn))


def check_output_shapes(fn):
    """Exercise 'output_shapes': fn() -> {output: (shape, dtype)} of what run(None, shapes_feeds()) returns for
    shapes_model(), checked against ORT's run."""
    judge("output_shapes", "l0_01.output_shapes", learner(fn))

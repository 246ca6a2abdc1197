"""The checks of lab01_compose_onnx_model (run where the learner's code cannot reach them).

Each check has the learner's function run on several inputs (through the remote: the models come
back as bytes), validates each model with onnx.checker, runs it in ORT and compares with numpy.
"""
import copy

import numpy as np
import onnx

from ortlab import models, session
from ortlab.labs.checks import CheckFailed, compare
from ortlab.labs.remote import call_with_arguments, function


def as_valid_model(model, what):
    """The model, or CheckFailed saying why it is not a valid ONNX model.

    A graph input or output declared without a shape (make_tensor_value_info(name, type, None)) is
    accepted, as ORT accepts it: onnx.checker alone requires every one to have a shape, so the checker
    reads a copy in which each has one of unknown size."""
    if not isinstance(model, onnx.ModelProto):
        raise CheckFailed(f"{what} returned {type(model).__name__}, not an onnx.ModelProto "
                          "(build it with onnx.helper.make_model)")
    try:
        onnx.checker.check_model(_with_shapes(model))
    except Exception as exc:
        raise CheckFailed(f"onnx.checker rejects {what}'s model: {str(exc).splitlines()[0]}") from None
    return model


def _with_shapes(model):
    """A copy of `model` in which each tensor input and output of the graph declared without a shape
    has one (of one dimension of unknown size: the checker reads only that the field is there)."""
    model = copy.deepcopy(model)
    for value in (*model.graph.input, *model.graph.output):
        if value.type.HasField("tensor_type") and not value.type.tensor_type.HasField("shape"):
            value.type.tensor_type.shape.dim.add()
    return model


def run_in_ort(model, feeds, what):
    """The model's outputs in graph order (ortlab.session.run_model), or CheckFailed with ORT's reason."""
    try:
        return list(session.run_model(model, feeds).values())
    except Exception as exc:
        reason = str(exc).splitlines()[0].split("] : ")[-1]  # ORT's message, without "[ONNXRuntimeError]"
        raise CheckFailed(f"ORT could not run {what}'s model: {reason}") from None


def _io(model):
    return [i.name for i in model.graph.input if i.name not in {t.name for t in model.graph.initializer}]


def mlp_model_to_scale():
    """The model the insert_scale check edits: ortlab's MLP, exported (what the notebook shows)."""
    net = models.get("mlp").eval()
    return models.export(net, net.example_inputs()[:1])


def transpose_matmul(remote, build):
    """Exercise 'transpose_matmul': build(k, m, n) -> model computing Y = Transpose(A) @ B."""
    build = function(remote, build)
    rng = np.random.default_rng(0)
    for k, m, n in ((3, 2, 4), (5, 1, 7)):
        model = as_valid_model(build(k, m, n), f"build({k}, {m}, {n})")
        ops = [node.op_type for node in model.graph.node]
        if ops != ["Transpose", "MatMul"]:
            return f"build({k}, {m}, {n}) has nodes {ops}; expected exactly Transpose then MatMul"
        if _io(model) != ["A", "B"] or [o.name for o in model.graph.output] != ["Y"]:
            return ("inputs must be named A, B and the output Y; "
                    f"got {_io(model)} -> {[o.name for o in model.graph.output]}")
        a = rng.standard_normal((k, m)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        reason = compare(run_in_ort(model, {"A": a, "B": b}, "build")[0], a.T @ b, 1e-5, 1e-5,
                         f"Y for A[{k}, {m}], B[{k}, {n}]")
        if reason:
            return reason
    return None


def mlp_model(remote, build):
    """Exercise 'mlp_model': build(w1, b1, w2, b2) -> model computing Relu(X·w1 + b1)·w2 + b2."""
    build = function(remote, build)
    rng = np.random.default_rng(1)
    w1, b1 = rng.standard_normal((4, 6)).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    w2, b2 = rng.standard_normal((6, 3)).astype(np.float32), rng.standard_normal(3).astype(np.float32)
    model = as_valid_model(build(w1, b1, w2, b2), "build(w1, b1, w2, b2)")
    if len(model.graph.initializer) != 4:
        return (f"the weights should be 4 initializers in the model; found "
                f"{len(model.graph.initializer)} (use onnx.numpy_helper.from_array)")
    if _io(model) != ["X"]:
        return f"the model's only input should be X; it has {_io(model)}"
    dims = model.graph.input[0].type.tensor_type.shape.dim  # none when X is declared without a shape
    if dims and dims[0].HasField("dim_value"):
        return (f"X's batch dimension is fixed to {dims[0].dim_value}; make it symbolic "
                "(a string such as 'batch') so the model takes any batch size")
    for batch in (1, 5):  # the batch dimension must not be fixed
        x = rng.standard_normal((batch, 4)).astype(np.float32)
        expected = np.maximum(x @ w1 + b1, 0) @ w2 + b2
        reason = compare(run_in_ort(model, {"X": x}, "build")[0], expected, 1e-5, 1e-5,
                         f"the output for a batch of {batch}")
        if reason:
            return reason
    return None


def insert_scale(remote, insert):
    """Exercise 'insert_scale': insert(model, s) -> a new model whose output is s times the old one
    (the check's own model: never the notebook's)."""
    model = mlp_model_to_scale()
    original = copy.deepcopy(model)
    rng = np.random.default_rng(2)
    feeds = {name: rng.standard_normal([d.dim_value or 2 for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for name, i in ((i.name, i) for i in model.graph.input) if name in _io(model)}
    before = run_in_ort(model, feeds, "the original")
    for scale in (3.0, -0.5):
        edited, given = remote.call(call_with_arguments, insert, model, scale)
        edited = as_valid_model(edited, f"insert(model, {scale})")
        if given[0] != original:
            return "your function changed the model it was given; build a new one (Graph.from_model copies)"
        outputs = [o.name for o in edited.graph.output]
        if outputs != [o.name for o in model.graph.output]:
            return f"the graph outputs must keep their names {[o.name for o in model.graph.output]}; got {outputs}"
        added = len(edited.graph.node) - len(model.graph.node)
        if added != 1 or "Mul" not in [n.op_type for n in edited.graph.node]:
            return f"expected exactly one new node, a Mul; the model has {added} more node(s)"
        reason = compare(run_in_ort(edited, feeds, "insert")[0], scale * before[0], 1e-5, 1e-5,
                         f"the output with scale {scale}")
        if reason:
            return reason
    return None


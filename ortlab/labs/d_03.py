"""Exercises of the walkthrough D_03_debugging_knowhows: where, in a dump of every node's inputs and outputs, the
first non-finite value is born, and how many bytes each node's output takes in ORT's profile.

The models the exercises are about are built here, so the notebook can show them; the checks live in
ortlab.labs.judges.d_03, which reads ORT 1.19.2's own values (every value made a graph output:
ortlab.session.node_outputs, the release build's stand-in for onnxruntime_DEBUG_NODE_INPUTS_OUTPUTS' dumps) and
ORT's profiler (the output_size of each node's kernel_time event, onnxruntime/core/framework/
sequential_executor.cc), and the reference answers in solutions/walkthroughs/D_03_debugging_knowhows.py, outside
the package.
"""
from collections import namedtuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe, register_tuple
from ortlab.labs.model_text import describe  # noqa: F401 - the notebook shows its models with it
from ortlab.onnx_defs import make_model

F = TensorProto.FLOAT

NodeIO = register_tuple(namedtuple("NodeIO", "name op inputs outputs"))
NodeIO.__doc__ = """One node of a dump: its name, op, and {value name: array} of what it read and what it wrote."""


def _model(nodes, inputs, outputs, initializers=(), name="model"):
    inits = [numpy_helper.from_array(v, k) for k, v in initializers]
    return make_model(helper.make_graph(nodes, name, inputs, outputs, inits))


# --- exercise 'nan_birth': the models ----------------------------------------------------------------------
def _layer_norm():
    """LayerNorm over the last axis written op by op, with no epsilon (the notebook's), then scale and bias."""
    n = helper.make_node
    nodes = [n("ReduceMean", ["x"], ["mean"], name="mean", axes=[-1], keepdims=1),
             n("Sub", ["x", "mean"], ["centered"], name="center"),
             n("Mul", ["centered", "centered"], ["squared"], name="square"),
             n("ReduceMean", ["squared"], ["variance"], name="variance", axes=[-1], keepdims=1),
             n("Sqrt", ["variance"], ["std"], name="std"),
             n("Div", ["centered", "std"], ["normed"], name="normalize"),
             n("Mul", ["normed", "gamma"], ["scaled"], name="scale"),
             n("Add", ["scaled", "beta"], ["y"], name="shift")]
    inits = [("gamma", np.full(4, 2.0, np.float32)), ("beta", np.full(4, 0.5, np.float32))]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 4])],
                   [helper.make_tensor_value_info("y", F, None)], inits, name="layer_norm")
    return model, {"x": np.array([[1, 2, 3, 4], [5, 5, 5, 5]], np.float32)}


def _entropy():
    """-sum(p log p) of Softmax(x): an entry of x far below the others underflows to p = 0."""
    n = helper.make_node
    nodes = [n("Softmax", ["x"], ["p"], name="softmax", axis=-1), n("Log", ["p"], ["logp"], name="log"),
             n("Mul", ["p", "logp"], ["plogp"], name="p_times_logp"),
             n("ReduceSum", ["plogp", "axes"], ["total"], name="sum", keepdims=0),
             n("Neg", ["total"], ["y"], name="negate")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [2, 3])],
                   [helper.make_tensor_value_info("y", F, None)], [("axes", np.array([-1], np.int64))], name="entropy")
    return model, {"x": np.array([[0.0, 1.0, 2.0], [0.0, 1.0, -200.0]], np.float32)}


def _fed_inf():
    """A scaled residual; the feed itself holds an inf."""
    n = helper.make_node
    nodes = [n("Mul", ["x", "w"], ["scaled"], name="scale"), n("Add", ["scaled", "x"], ["res"], name="residual"),
             n("Sub", ["res", "res"], ["y"], name="difference")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [4])], [helper.make_tensor_value_info("y", F, None)],
                   [("w", np.full(4, 0.5, np.float32))], name="fed_inf")
    return model, {"x": np.array([1.0, np.inf, -2.0, 0.5], np.float32)}


def _masked():
    """Sqrt of a value that is negative for some entries, then the NaNs replaced by zeros: a finite output."""
    n = helper.make_node
    nodes = [n("Sub", ["x", "three"], ["shifted"], name="shift"), n("Sqrt", ["shifted"], ["root"], name="sqrt"),
             n("IsNaN", ["root"], ["bad"], name="isnan"), n("Where", ["bad", "zero", "root"], ["y"], name="mask")]
    model = _model(nodes, [helper.make_tensor_value_info("x", F, [4])], [helper.make_tensor_value_info("y", F, None)],
                   [("three", np.array(3.0, np.float32)), ("zero", np.array(0.0, np.float32))], name="masked")
    return model, {"x": np.array([4.0, 7.0, 1.0, 12.0], np.float32)}


def _clean():
    """The layer norm again, on rows that are not constant: nothing non-finite anywhere."""
    model, _ = _layer_norm()
    return model, {"x": np.array([[1, 2, 3, 4], [4, 3, 1, 0]], np.float32)}


NAN_CASES = {"layer_norm": _layer_norm, "entropy": _entropy, "fed_inf": _fed_inf, "masked": _masked,
             "clean": _clean}


def nan_case(name):
    """(model, feeds) of one case of the exercise: 'layer_norm' is the notebook's, the check adds the others."""
    return NAN_CASES[name]()


def io_dump(model, feeds):
    """[NodeIO] in graph order (every node after the nodes it reads from): what each node read and wrote, the
    values computed by ORT 1.19.2 with every value made a graph output (ortlab.session.node_outputs)."""
    from ortlab import session  # lazy: loaded when this runs, not when the notebook imports the exercises

    values = {k: np.asarray(v) for k, v in feeds.items()}
    values.update({t.name: numpy_helper.to_array(t) for t in model.graph.initializer})
    written = {}
    for node, _, output, value in session.node_outputs(model, feeds):
        written.setdefault(node, {})[output] = np.asarray(value)
    dump = []
    for node in model.graph.node:
        inputs = {name: values[name] for name in node.input if name}
        outputs = written.get(node.name, {})
        values.update(outputs)
        dump.append(NodeIO(node.name, node.op_type, inputs, outputs))
    return dump


def show_dump(dump):
    """A dump as text: one block per node, what it read and what it wrote."""
    def short(value):
        return np.array2string(np.asarray(value), precision=3, separator=", ", max_line_width=200).replace("\n", "")
    lines = []
    for node in dump:
        lines.append(f"{node.name} ({node.op})")
        lines += [f"    reads  {k} = {short(v)}" for k, v in node.inputs.items()]
        lines += [f"    writes {k} = {short(v)}" for k, v in node.outputs.items()]
    return "\n".join(lines)


@probe
def birth_named(fn, dump):
    """The learner's fn(dump): a name, or None."""
    found = fn(list(dump))
    if found is not None and not isinstance(found, str):
        raise CheckFailed(f"return the name (a str) of the node, feed or initializer where the first non-finite value "
                          f"is born, or None when every value is finite, not {type(found).__name__}")
    return found


def check_nan_birth(fn):
    """Exercise 'nan_birth': fn(dump) -> where the first non-finite value of an I/O dump is born, checked on each
    case of NAN_CASES against ORT's values."""
    judge("nan_birth", "d_03.nan_birth", learner(fn))


# --- exercise 'plan_bytes': the model ----------------------------------------------------------------------
def bytes_model():
    """x float32 [4, 16] -> MatMul(W [16, 8]) -> h, and seven nodes reading h: a Cast to float16, Shape, ArgMax
    (axis 1), ReduceSum (axis 1, keepdims 0), Greater than 0, Reshape to [-1], Transpose."""
    n = helper.make_node
    rng = np.random.default_rng(0)
    nodes = [n("MatMul", ["x", "W"], ["h"], name="matmul"),
             n("Cast", ["h"], ["h16"], name="to_half", to=TensorProto.FLOAT16),
             n("Shape", ["h"], ["dims"], name="shape"),
             n("ArgMax", ["h"], ["best"], name="argmax", axis=1),
             n("ReduceSum", ["h", "axes"], ["rowsum"], name="rowsum", keepdims=0),
             n("Greater", ["h", "zero"], ["positive"], name="positive"),
             n("Reshape", ["h", "flat"], ["v"], name="flatten"),
             n("Transpose", ["h"], ["ht"], name="transpose", perm=[1, 0])]
    inits = [("W", rng.standard_normal((16, 8)).astype(np.float32)), ("axes", np.array([1], np.int64)),
             ("zero", np.array(0, np.float32)), ("flat", np.array([-1], np.int64))]
    outputs = [onnx.ValueInfoProto(name=o) for o in ("h16", "dims", "best", "rowsum", "positive", "v", "ht")]
    return _model(nodes, [helper.make_tensor_value_info("x", F, [4, 16])], outputs, inits, name="bytes")


def bytes_feeds():
    return {"x": np.random.default_rng(1).standard_normal((4, 16)).astype(np.float32)}


BYTES_LEVEL = "extended"  # the level of the notebook's profile




@probe
def predicted_bytes(fn):
    """The learner's fn(), as {node name: bytes}."""
    found = fn()
    if not isinstance(found, dict):
        raise CheckFailed(f"return a dict {{node name: output bytes}}, not {type(found).__name__}")
    out = {}
    for name, value in found.items():
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise CheckFailed(f"for {name!r} give a whole number of bytes, not {value!r}")
        out[str(name)] = int(value)
    return out


def check_plan_bytes(fn):
    """Exercise 'plan_bytes': fn() -> {node: output bytes} of one profiled run of bytes_model() at level
    'extended', checked against ORT's profiler."""
    judge("plan_bytes", "d_03.plan_bytes", learner(fn))

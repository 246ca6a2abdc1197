"""Put ortlab's gradient graph next to ORT's: one-op models to differentiate, the gradient
nodes each builder added, and counts by op type.

The ORT side is onnxruntime.capi._pybind_state.GradientGraphBuilder (see ort.py), which runs
orttraining/orttraining/core/framework/gradient_graph_builder.cc.
"""
from collections import Counter
from dataclasses import dataclass

import numpy as np
from onnx import helper, numpy_helper

from ortlab.errors import OrtlabError
from ortlab.gradients.added_nodes import gradient_nodes  # noqa: F401 (the notebooks read it here)
from ortlab.gradients.checker import DELTA, numeric_gradient
from ortlab.gradients.graph_builder import build_gradient_graph
from ortlab.gradients.ort import ort_gradient_graph
from ortlab.gradients.registry import GRADIENT_BUILDERS
from ortlab.onnx_defs import DEFAULT_OPSET, domain_of, make_model, node_op_name, op_name
from ortlab.viz import Table


@dataclass
class OpModel:
    """A one-node model with loss = ReduceSum(Y · R), its feeds and the inputs to differentiate."""

    model: object
    feeds: dict
    x_names: list
    loss_weights: object = None  # R: the gradient that arrives at Y
    loss: str = "loss"


def op_model(op_type, inputs, constants=(), attributes=None, domain="", outputs=1, seed=0, opset=DEFAULT_OPSET):
    """Y = op(inputs...) and loss = ReduceSum(Y · R) for a fixed random R of Y's shape.

    inputs: {name: array} in the node's input order ('' for an absent optional input);
    constants: the names among them that are initializers (shapes, axes, ratios), not x's;
    outputs: how many outputs the node has (Y, Y1, ...; only Y feeds the loss).
    Not onnx_defs.one_node_model: the inputs keep the caller's names (X, A, B...), which the
    gradient nodes printed beside ORT's carry.
    """
    from ortlab.session import run_node  # lazy: ortlab.session imports onnxruntime (2 s)

    present = {n: np.asarray(a) for n, a in inputs.items() if n}
    y = run_node(op_type, list(present.values()), attributes, domain, opset, outputs)[0]
    r = np.random.default_rng(seed).standard_normal(np.shape(y)).astype(y.dtype)
    names = ["Y"] + [f"Y{k}" for k in range(1, outputs)]
    nodes = [helper.make_node(op_type, list(inputs), names, name=op_type, domain=domain_of(domain) or None,
                              **(attributes or {})),
             helper.make_node("Mul", ["Y", "R"], ["YR"], name="loss_scale"),
             helper.make_node("ReduceSum", ["YR"], ["loss"], name="loss_sum", keepdims=0)]
    xs = [n for n in present if n not in constants]
    graph = helper.make_graph(
        nodes, op_type,
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(present[n].dtype), present[n].shape)
         for n in xs],
        [helper.make_tensor_value_info("loss", helper.np_dtype_to_tensor_dtype(y.dtype), [])],
        [numpy_helper.from_array(present[n], n) for n in constants] + [numpy_helper.from_array(r, "R")])
    model = make_model(graph, opset, domains=(domain_of(domain),) if domain_of(domain) else ())
    return OpModel(model, {n: present[n] for n in xs}, xs, r)


def _describe(node):
    return f"{node_op_name(node)}({', '.join(node.input)}) -> {', '.join(node.output)}"


def side_by_side(forward_model, ours, theirs, of=None):
    """The gradient nodes of ours and ORT's (of forward node `of`), one per row, in graph order."""
    a = [_describe(n) for n in gradient_nodes(ours, forward_model, of)]
    b = [_describe(n) for n in gradient_nodes(theirs, forward_model, of)]
    rows = [(x, y) for x, y in zip(a + [""] * (len(b) - len(a)), b + [""] * (len(a) - len(b)))]
    return Table(("ortlab", "ORT"), rows)


def count_by_type(forward_model, **gradient_models):
    """Gradient nodes by op type for each named gradient model, with totals."""
    counts = {name: Counter(node_op_name(n) for n in gradient_nodes(m, forward_model))
              for name, m in gradient_models.items()}
    ops = sorted(set().union(*counts.values()), key=lambda op: (-max(c[op] for c in counts.values()), op))
    rows = [(op, *(c[op] for c in counts.values())) for op in ops]
    rows.append(("total", *(sum(c.values()) for c in counts.values())))
    return Table(("op", *gradient_models), rows)


def builders_table():
    """Every registered gradient builder: op, the builder function, what it computes and emits."""
    rows = []
    for (op, domain), fn in sorted(GRADIENT_BUILDERS.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        doc = " ".join((fn.__doc__ or "").split())
        math, _, ort = doc.partition(" ORT")
        rows.append((op_name(op, domain), fn.__name__, math, ("ORT" + ort) if ort else ""))
    return Table(("op", "builder", "computes", "ORT's builder"), rows)


def value_table(case, **gradient_models):
    """Per x: the largest |gradient - central differences| of each gradient model (float32)."""
    from ortlab.session import run_model  # lazy: ortlab.session imports onnxruntime (2 s)

    numeric = numeric_gradient(case.model, case.x_names, case.loss, case.feeds, DELTA)
    results = {name: run_model(model, case.feeds) for name, model in gradient_models.items()}
    rows = [(x, *(f"{np.max(np.abs(r[f'{x}_grad'] - numeric[x]), initial=0.0):.1e}" for r in results.values()))
            for x in case.x_names]
    return Table(("x", *(f"{n}: max |grad - numeric|" for n in gradient_models)), rows)


def ort_verdict(case):
    """What ORT's C++ builder does with a one-op case: builds it (and agrees with ortlab or not),
    or refuses (with its reason)."""
    from ortlab.session import run_model  # lazy: ortlab.session imports onnxruntime (2 s)

    ours = run_model(build_gradient_graph(case.model, case.x_names, case.loss), case.feeds)
    try:
        theirs = run_model(ort_gradient_graph(case.model, case.x_names, case.loss), case.feeds)
    except OrtlabError as exc:
        return f"ORT cannot: {str(exc).split(': ', 1)[-1][:160]}"
    for x in case.x_names:
        if np.shape(theirs[f"{x}_grad"]) != np.shape(ours[f"{x}_grad"]):
            return (f"ORT builds it, but its gradient of {x} has shape {list(np.shape(theirs[f'{x}_grad']))}, "
                    f"not {list(np.shape(case.feeds[x]))}")
    worst = max(float(np.max(np.abs(ours[f"{x}_grad"] - theirs[f"{x}_grad"]), initial=0.0)) for x in case.x_names)
    return "ORT builds it, same values" if worst < 1e-4 else f"ORT builds it, values differ by up to {worst:.2g}"

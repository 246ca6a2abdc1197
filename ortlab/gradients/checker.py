"""A numeric gradient checker in the spirit of ORT's GradientChecker.

Mirrors orttraining/orttraining/test/gradient/gradient_checker.cc: central differences with
delta 1e-3, one element at a time, compared with the analytic gradient by the largest
absolute difference; ORT's op tests pass at max error <= 1.5e-2 (float32). Runs in ORT.
"""
from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import onnx

from ortlab.errors import OrtlabError
from ortlab.gradients.graph_builder import build_gradient_graph, check_loss_name, check_x_names
from ortlab.ir import Graph

DELTA, TOLERANCE = 1e-3, 1.5e-2


class GradientCheckError(OrtlabError):
    """The check cannot run (an x with no value, too many elements)."""


@dataclass
class GradientCheck:
    """Largest |analytic - numeric| per x; passes when every one is within the tolerance."""

    max_error: dict = field(default_factory=dict)
    tolerance: float = TOLERANCE

    @property
    def passed(self):
        return all(e <= self.tolerance for e in self.max_error.values())

    def __repr__(self):
        rows = [f"  {x:24} max error {e:.2e} {'ok' if e <= self.tolerance else 'TOO LARGE'}"
                for x, e in self.max_error.items()]
        verdict = "passed" if self.passed else "FAILED"
        return "\n".join([f"GradientCheck {verdict} (tolerance {self.tolerance:g})"] + rows)


def _session(model):
    from ortlab import session  # lazy: ortlab.session imports onnxruntime (2 s)

    return session.create(model, session.session_options("disable"), ["CPUExecutionProvider"])


def _check_arguments(model, x_names, loss_name, feeds):
    if not isinstance(model, onnx.ModelProto):
        raise GradientCheckError(f"the model must be an onnx.ModelProto, not {type(model).__name__}")
    x_names = check_x_names(x_names, GradientCheckError)
    check_loss_name(loss_name, GradientCheckError)
    if not isinstance(feeds, Mapping):
        raise GradientCheckError(f"feeds must be a dict {{graph input name: array}}, not {type(feeds).__name__}")
    return x_names, dict(feeds)


def _values(graph, feeds, x_names):
    values = {}
    for x in x_names:
        if x in feeds:
            values[x] = np.array(feeds[x])
        elif x in graph.initializers:
            values[x] = graph.initializer_value(x)
        else:
            raise GradientCheckError(f"x {x!r} is neither fed nor an initializer, so it has no value to perturb")
    return values


def numeric_gradient(model, x_names, loss_name, feeds, delta=DELTA, max_elements=2000):
    """Central differences of the loss w.r.t. each x, perturbing one element at a time.

    x_names: a list of names, or one name as a str; feeds: {graph input name: array}."""
    x_names, feeds = _check_arguments(model, x_names, loss_name, feeds)
    graph = Graph.from_model(model)
    values = _values(graph, feeds, x_names)
    graph.inputs += [x for x in x_names if x not in graph.inputs]  # initializers become overridable
    graph.outputs = [loss_name]
    from ortlab.session import run_session  # lazy: ortlab.session imports onnxruntime (2 s)

    session = _session(graph.to_model())
    base = {**{k: np.asarray(v) for k, v in feeds.items()}, **values}
    grads = {}
    for x, value in values.items():
        if value.size > max_elements:
            raise GradientCheckError(f"x {x!r} has {value.size} elements; the numeric check perturbs "
                                     f"each one, so keep it under {max_elements}")
        grad = np.zeros(value.shape, dtype=np.float64)
        for index in np.ndindex(value.shape):
            runs = []
            for sign in (1, -1):
                moved = value.copy()
                moved[index] += sign * delta
                runs.append(float(np.asarray(run_session(session, None, {**base, x: moved})[0])))
            grad[index] = (runs[0] - runs[1]) / (2 * delta)
        grads[x] = grad
    return grads


def check_gradient(model, x_names, loss_name, feeds, gradient_model=None, delta=DELTA,
                   tolerance=TOLERANCE):
    """Compare a gradient graph's `<x>_grad` outputs with central differences of the loss.

    gradient_model defaults to ortlab's build_gradient_graph(model, x_names, loss_name); pass
    ORT's (ort_gradient_graph) or your own to check that one instead.
    """
    from ortlab.session import run_model  # lazy: ortlab.session imports onnxruntime (2 s)

    x_names, feeds = _check_arguments(model, x_names, loss_name, feeds)
    gradient_model = gradient_model or build_gradient_graph(model, x_names, loss_name)
    analytic = run_model(gradient_model, dict(feeds))
    numeric = numeric_gradient(model, x_names, loss_name, feeds, delta)
    errors = {x: float(np.max(np.abs(analytic[f"{x}_grad"] - numeric[x]), initial=0.0)) for x in x_names}
    return GradientCheck(errors, tolerance)

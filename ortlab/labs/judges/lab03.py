"""The checks of lab03_gradient_definition (run where the learner's code cannot reach them).

A learner's builder is checked on one-op models whose loss is sum(Y · R) for a fixed random R
(so the incoming gradient GO(0) is not all ones): the learner's process builds the gradient graph
with it (ortlab.labs.lab03.gradient_graph) and sends it back; here it runs in ORT and is compared
with torch autograd, with central differences (ortlab.gradients.check_gradient) and, where ORT has
a builder, with ORT's graph. Wrong answers are matched against the usual mistakes to say which one
it probably is.
"""
from dataclasses import dataclass

import numpy as np
import torch

from ortlab import session
from ortlab.capture import captured_lines
from ortlab.errors import OrtlabError
from ortlab.gradients import (build_gradient_graph, builder_from_definition, check_gradient,
                              ort_gradient_graph, register_ort_gradient, using_gradient)
from ortlab.labs.checks import CheckFailed, compare, describe
from ortlab.labs.lab03 import example_inputs, gradient_graph, one_op_model, register_definition
from ortlab.labs.remote import call


@dataclass
class Op:
    torch_fn: object
    cases: list          # shapes of the inputs, one tuple per case
    in_ort: bool         # whether ORT 1.19.2 has a builder to compare with


def _prelu(x, slope):
    return torch.where(x > 0, x, x * slope)


OPS = {
    "Softplus": Op(torch.nn.functional.softplus, [((3, 4),), ((),), ((2, 1, 5),)], False),
    "PRelu": Op(_prelu, [((3, 4), (3, 4)), ((2, 3, 4), (3, 1)), ((4, 5), (5,)), ((2, 3), ())], False),
    "MatMul": Op(torch.matmul, [((3, 4), (4, 5)), ((4, 4), (4, 4)), ((2, 3, 4), (4, 5)),
                                ((2, 1, 3, 4), (3, 4, 3))], True),
}


def torch_gradients(op, arrays, r):
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    (OPS[op].torch_fn(*tensors) * torch.tensor(r)).sum().backward()
    return [t.grad.numpy() for t in tensors]


def _run(model, feeds, whose, shown=None):
    """Run a gradient graph; `shown` (e.g. 'MatMul(float32[2, 3, 4], float32[4, 5])') names the case."""
    try:
        with captured_lines(fds=(2,), python=False):  # ORT's C++ warnings, not the learner's business
            return session.run_model(model, feeds)
    except Exception as exc:
        reason = str(exc).splitlines()[0].split("] : ")[-1]
        where = f"for {shown}, " if shown else ""
        raise CheckFailed(f"{where}ORT could not run {whose} gradient graph: {reason}. Check the inputs of the "
                          "nodes you emit (shapes that do not fit usually mean a missing or wrong "
                          "transpose, or a gradient reduced over the wrong axes)") from None


def _shape_mistake(i, got, expected):
    try:
        reducible = np.broadcast_shapes(got, expected) == got
    except ValueError:
        reducible = False
    if reducible:
        return (f"the gradient of input {i} has the shape of the output {got}, but input {i} has "
                f"shape {expected}: sum it over the broadcast axes, e.g. b.handle_broadcasting(grad, b.I({i}))")
    if len(got) >= 2 and got[:-2] + got[-2:][::-1] == expected:
        return (f"the gradient of input {i} has shape {got}, input {i} has {expected}: it is "
                "transposed the wrong way (for MatMul, dA = dY·Bᵀ and dB = Aᵀ·dY)")
    return f"the gradient of input {i} has shape {got}, but input {i} has shape {expected}"


def _value_mistake(i, got, expected, ones):
    close = lambda a, b: a.shape == b.shape and np.allclose(a, b, rtol=1e-4, atol=1e-5)  # noqa: E731
    if close(got, -expected):
        return f"the gradient of input {i} has the wrong sign"
    if close(got, ones):
        return (f"the gradient of input {i} ignores the incoming gradient: multiply by b.GO(0), "
                "the gradient of the output, which is not all ones in general (chain rule)")
    if got.ndim >= 2 and close(got, np.swapaxes(expected, -1, -2)):
        return (f"the gradient of input {i} is transposed the wrong way (for MatMul, dA = dY·Bᵀ and "
                "dB = Aᵀ·dY: Gemm with transB=1 for A, transA=1 for B)")
    return None


def _learners_graph(remote, builder):
    """make(op, model, names): the gradient graph the learner's builder gives (built on their side)."""
    def make(op, model, names):
        found = remote.call(gradient_graph, builder, op, model, names)
        if isinstance(found, str):  # ortlab's own error, which says what is wrong and what to do
            raise OrtlabError(found)
        return found
    return make


def _local_graph(builder):
    def make(op, model, names):
        with using_gradient(op, builder):
            return build_gradient_graph(model, names, "loss")
    return make


def check_builder(op, make, what="your builder"):
    """None when make(op, model, x names) gives op's gradients on every case; else the first problem."""
    spec = OPS[op]
    for k, shapes in enumerate(spec.cases):
        arrays = example_inputs(shapes, k)
        case = one_op_model(op, arrays, k)
        model, feeds, r = case.model, case.feeds, case.loss_weights
        shown = f"{op}({', '.join(describe(a) for a in arrays)})"
        try:
            grad_model = make(op, model, list(feeds))
        except NotImplementedError:
            raise
        except OrtlabError as exc:  # ortlab's own errors say what is wrong and what to do
            raise CheckFailed(f"for {shown}: {exc}") from None
        except Exception as exc:
            raise CheckFailed(f"for {shown}, {what} raised {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
        got = _run(grad_model, feeds, "your", shown)
        expected = torch_gradients(op, arrays, r)
        ones = torch_gradients(op, arrays, np.ones_like(r))
        for i, (name, e) in enumerate(zip(feeds, expected)):
            g = np.asarray(got[f"{name}_grad"])
            if g.shape != e.shape:
                return f"for {shown}, {_shape_mistake(i, g.shape, e.shape)}"
            reason = _value_mistake(i, g, e, ones[i]) or compare(g, e, 1e-4, 1e-5, f"the gradient of input {i}")
            if reason:
                return f"for {shown}, {reason}"
        if k == 0:
            result = check_gradient(model, list(feeds), "loss", feeds, gradient_model=grad_model)
            if not result.passed:
                return f"for {shown}, the numeric check fails: {result.max_error}"
        if spec.in_ort:
            theirs = _run(ort_gradient_graph(model, list(feeds), "loss"), feeds, "ORT's", shown)
            for i, name in enumerate(feeds):
                reason = compare(got[f"{name}_grad"], theirs[f"{name}_grad"], 1e-4, 1e-5,
                                 f"the gradient of input {i}, next to ORT's")
                if reason:
                    return f"for {shown}, {reason}"
    return None



def softplus(remote, builder):
    """Exercise 'softplus': Y = log(1 + exp(X)), so dX = dY · sigmoid(X)."""
    return check_builder("Softplus", _learners_graph(remote, builder))


def prelu(remote, builder):
    """Exercise 'prelu': Y = X if X > 0 else slope · X, slope broadcast to X's shape."""
    return check_builder("PRelu", _learners_graph(remote, builder))


def matmul(remote, builder):
    """Exercise 'matmul': Y = A·B, batched, with broadcast batch axes."""
    return check_builder("MatMul", _learners_graph(remote, builder))


def ort_definition(remote, make_definition):
    """Exercise 'ort_definition': Softplus's gradient in ORT's format, checked with ortlab first
    (ORT keeps the first definition it is given), then registered into ORT's C++ gradient builder
    (here, and on the learner's side, where the notebook trains with it)."""
    definition = remote.call(call, make_definition)
    try:
        builder = builder_from_definition(definition)
    except OrtlabError as exc:
        raise CheckFailed(str(exc)) from None
    reason = check_builder("Softplus", _local_graph(builder), "your definition")
    if reason:
        return f"{reason} (checked with ortlab; nothing was registered into ORT)"
    try:
        register_ort_gradient("Softplus", definition)
    except OrtlabError as exc:
        raise CheckFailed(str(exc)) from None
    case = one_op_model("Softplus", example_inputs([(3, 4)]))
    model, feeds, r = case.model, case.feeds, case.loss_weights
    theirs = _run(ort_gradient_graph(model, list(feeds), "loss"), feeds, "ORT's")
    reason = compare(theirs["x0_grad"], torch_gradients("Softplus", [feeds["x0"]], r)[0], 1e-4, 1e-5,
                     "the gradient from ORT's graph with your definition")
    if reason:
        return reason
    problem = remote.call(register_definition, make_definition)
    if problem:
        raise CheckFailed(problem)
    return None

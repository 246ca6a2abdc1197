"""Checks and helpers for lab03_gradient_definition: write gradient builders for Softplus (easy),
PRelu (broadcasting) and MatMul (hard), then a gradient definition in ORT's own format that
goes into ORT's C++ gradient builder, and train with it.

A learner's builder is checked on one-op models whose loss is sum(Y · R) for a fixed random R
(so the incoming gradient GO(0) is not all ones), against torch autograd, against central
differences (ortlab.gradients.check_gradient) and, where ORT has a builder, against ORT's graph.
Wrong answers are matched against the usual mistakes to say which one it probably is.
"""
import contextlib
import warnings
from dataclasses import dataclass

import numpy as np
import torch

from ortlab.capture import captured_lines
from ortlab.errors import OrtlabError
from ortlab.gradients import (build_gradient_graph, builder_from_definition, check_gradient,
                              ort_gradient_graph, register_ort_gradient, using_gradient)
from ortlab.gradients.compare import op_model
from ortlab.labs.checks import CheckFailed, check, compare, describe


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


def example_inputs(shapes, seed=0):
    """Random float32 inputs away from 0 (PRelu's kink), so finite differences stay honest."""
    rng = np.random.default_rng(seed)
    arrays = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    return [np.asarray(a + 0.2 * np.sign(a), dtype=np.float32) for a in arrays]


def one_op_model(op, arrays, seed=0):
    """Inputs x0, x1, ... -> op -> loss = ReduceSum(Y · R) (ortlab.gradients.compare.op_model)."""
    return op_model(op, {f"x{i}": a for i, a in enumerate(arrays)}, seed=seed + 100)


def torch_gradients(op, arrays, r):
    tensors = [torch.tensor(a, requires_grad=True) for a in arrays]
    (OPS[op].torch_fn(*tensors) * torch.tensor(r)).sum().backward()
    return [t.grad.numpy() for t in tensors]


def _run(model, feeds, whose, shown=None):
    """Run a gradient graph; `shown` (e.g. 'MatMul(float32[2, 3, 4], float32[4, 5])') names the case."""
    from ortlab import session

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


def check_builder(op, builder, what="your builder"):
    """None when `builder` gives op's gradients on every case; else the first problem found."""
    spec = OPS[op]
    for k, shapes in enumerate(spec.cases):
        arrays = example_inputs(shapes, k)
        case = one_op_model(op, arrays, k)
        model, feeds, r = case.model, case.feeds, case.loss_weights
        shown = f"{op}({', '.join(describe(a) for a in arrays)})"
        try:
            with using_gradient(op, builder):
                grad_model = build_gradient_graph(model, list(feeds), "loss")
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



def check_softplus(builder):
    """Exercise 'softplus': Y = log(1 + exp(X)), so dX = dY · sigmoid(X)."""
    check("softplus", lambda: check_builder("Softplus", builder))


def check_prelu(builder):
    """Exercise 'prelu': Y = X if X > 0 else slope · X, slope broadcast to X's shape."""
    check("prelu", lambda: check_builder("PRelu", builder))


def check_matmul(builder):
    """Exercise 'matmul': Y = A·B, batched, with broadcast batch axes."""
    check("matmul", lambda: check_builder("MatMul", builder))


def check_ort_definition(make_definition):
    """Exercise 'ort_definition': Softplus's gradient in ORT's format, checked with ortlab first
    (ORT keeps the first definition it is given), then registered into ORT's C++ builder."""
    check("ort_definition", ort_definition_test(make_definition))


def ort_definition_test(make_definition):
    """The test behind check_ort_definition (returns None, or what is wrong)."""
    def test():
        definition = make_definition()
        try:
            builder = builder_from_definition(definition)
        except OrtlabError as exc:
            raise CheckFailed(str(exc)) from None
        reason = check_builder("Softplus", builder, "your definition")
        if reason:
            return f"{reason} (checked with ortlab; nothing was registered into ORT)"
        try:
            register_ort_gradient("Softplus", definition)
        except OrtlabError as exc:
            raise CheckFailed(str(exc)) from None
        case = one_op_model("Softplus", example_inputs([(3, 4)]))
        model, feeds, r = case.model, case.feeds, case.loss_weights
        theirs = _run(ort_gradient_graph(model, list(feeds), "loss"), feeds, "ORT's")
        return compare(theirs["x0_grad"], torch_gradients("Softplus", [feeds["x0"]], r)[0], 1e-4, 1e-5,
                       "the gradient from ORT's graph with your definition")
    return test


class SoftplusMLP(torch.nn.Module):
    """Linear, Softplus, Linear: ORT 1.19.2 can train it only once Softplus has a gradient."""

    def __init__(self, features=8, hidden=16):
        super().__init__()
        self.l1, self.l2 = torch.nn.Linear(features, hidden), torch.nn.Linear(hidden, 1)

    def forward(self, x):
        return self.l2(torch.nn.functional.softplus(self.l1(x)))


def train_softplus_mlp(use_ort, steps=20, seed=0, lr=0.05):
    """Losses of a short regression run, in ORTModule (no fallback to PyTorch) or in PyTorch."""
    from ortlab.capture import os_level_streams
    from ortlab.env import quiet_import, seed_everything
    from ortlab.training import train
    from ortlab.training.ortmodule import ortmodule_env

    seed_everything(seed)
    model = SoftplusMLP()
    x = torch.randn(64, 8)
    y = torch.sin(x.sum(1, keepdim=True))
    if use_ort:
        try:
            case = one_op_model("Softplus", example_inputs([(2, 2)]))
            ort_gradient_graph(case.model, case.x_names, "loss")
        except OrtlabError:
            raise OrtlabError("ORT has no gradient for Softplus in this process yet, so ORTModule cannot "
                              "train this model: finish exercise 'ort_definition' (it registers yours) "
                              "and run its cell first") from None
    # ORTMODULE_FALLBACK_POLICY: fail rather than use PyTorch; set for this run only
    with ortmodule_env(FALLBACK_POLICY="FALLBACK_DISABLE") if use_ort else contextlib.nullcontext():
        if use_ort:
            model = quiet_import("onnxruntime.training.ortmodule").ORTModule(model)
        with warnings.catch_warnings(), os_level_streams():  # ORTModule's first run: no DeepSpeed, torch's notice
            warnings.filterwarnings("ignore", "DeepSpeed import error", UserWarning)
            warnings.filterwarnings("ignore", "Setting `training`", FutureWarning)
            return train(model, [(x, y)], torch.optim.SGD(model.parameters(), lr=lr), steps,
                         loss_fn=torch.nn.functional.mse_loss, progress=False).losses

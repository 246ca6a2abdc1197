"""Exercises of the walkthrough L0_06_per_op_gradients: a gradient builder for Div, and the two Gemm nodes that
compute the gradients of a Gemm.

The checks live in ortlab.labs.judges.l0_06, against ORT's own C++ gradient builder
(orttraining/orttraining/core/graph/gradient_builder.cc, run through ortlab.gradients.ort_gradient_graph): the
backward graph built with the learner's Div builder must compute, in ORT, what ORT's backward graph computes;
the Gemms the learner describes must compute the gradients ORT's backward graph computes. The reference answers
are in solutions/walkthroughs/L0_06_per_op_gradients.py, outside the package.
"""
import numpy as np

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe

GEMM_INPUTS = ("A", "B", "Y_grad")


def gemm_case():
    """The Gemm of exercise 'gemm_grad': Y = 0.5 · A · Bᵀ + 2 · C, the layout of torch's Linear
    (transA=0, transB=1), with A [3, 4], B [5, 4], C [5]: {"inputs": {name: array}, "attributes": {...}}."""
    rng = np.random.default_rng(1)
    inputs = {"A": rng.standard_normal((3, 4)).astype(np.float32), "B": rng.standard_normal((5, 4)).astype(np.float32),
              "C": rng.standard_normal(5).astype(np.float32)}
    return {"inputs": inputs, "attributes": {"transA": 0, "transB": 1, "alpha": 0.5, "beta": 2.0}}


@probe
def div_backward(fn, model, x_names):
    """The backward graph ortlab builds for `model` with the learner's builder in place of ortlab's Div builder."""
    from ortlab.gradients import build_gradient_graph, using_gradient  # lazy: loaded only when this runs

    if not callable(fn):
        raise CheckFailed(f"give your builder function itself (my_div_gradient), not {type(fn).__name__}")
    with using_gradient("Div", fn):
        return build_gradient_graph(model, list(x_names), "loss")


@probe
def predicted_gemms(fn):
    """The learner's fn(), as {"A": (input, input, transA, transB, alpha), "B": (...)}."""
    found = fn()
    if not isinstance(found, dict):
        raise CheckFailed(f"return a dict {{'A': (first input, second input, transA, transB, alpha), 'B': (...)}}, "
                          f"not {type(found).__name__}")
    out = {}
    for key, spec in found.items():
        if not (isinstance(spec, (tuple, list)) and len(spec) == 5):
            raise CheckFailed(f"for {key!r}, give five things: (first input, second input, transA, transB, alpha), "
                              f"e.g. ('A', 'Y_grad', 0, 1, 1.0); not {spec!r}")
        first, second, trans_a, trans_b, alpha = spec
        for name in (first, second):
            if name not in GEMM_INPUTS:
                raise CheckFailed(f"for {key!r}: a Gemm input is one of {', '.join(GEMM_INPUTS)} (the forward's "
                                  f"inputs and the gradient arriving at Y), not {name!r}")
        for flag in (trans_a, trans_b):
            if flag not in (0, 1) or isinstance(flag, float) and not float(flag).is_integer():
                raise CheckFailed(f"for {key!r}: transA and transB are 0 or 1, not {flag!r}")
        if isinstance(alpha, bool) or not isinstance(alpha, (int, float, np.number)):
            raise CheckFailed(f"for {key!r}: alpha is a number, not {alpha!r}")
        out[str(key)] = (first, second, int(trans_a), int(trans_b), float(alpha))
    return out


def check_div_gradient(fn):
    """Exercise 'div_gradient': fn(b) -> [dA, dB], a gradient builder for Div; the backward graphs it builds are run
    in ORT and compared with ORT's own builder's, on cases with broadcasting."""
    judge("div_gradient", "l0_06.div_gradient", learner(fn))


def check_gemm_grad(fn):
    """Exercise 'gemm_grad': fn() -> the Gemm that computes each of A's and B's gradients for gemm_case(), checked
    against the gradients ORT's backward graph computes."""
    judge("gemm_grad", "l0_06.gemm_grad", learner(fn))

"""The checks of L0_06's exercises (run where the learner's code cannot reach them).

Both compare with ORT's own C++ gradient builder (ortlab.gradients.ort_gradient_graph: GradientGraphBuilder of
the training build). 'div_gradient' runs, in ORT, the backward graph ortlab builds with the learner's Div builder
and the backward graph ORT builds (its Div gradient is one DivGrad, com.microsoft), on one-op models with
broadcasting on either side, and compares the gradients. 'gemm_grad' evaluates the learner's two Gemms in numpy
on the case's values and compares with the gradients ORT's backward graph computes. Each wrong answer is
recognised by computing the usual wrong formulas in numpy.
"""
import numpy as np

from ortlab import session
from ortlab.gradients import ort_gradient_graph
from ortlab.labs.checks import CheckFailed
from ortlab.labs.l0_06 import div_backward, gemm_case, predicted_gemms
from ortlab.walkthroughs.per_op_gradients import op_model

DIV_SHAPES = [((2, 3, 4), (4,)), ((3, 1), (2, 1, 4)), ((2, 3), ()), ((2, 3), (2, 3))]


def div_cases():
    """One-op Div models (ortlab.walkthroughs.per_op_gradients.op_model: loss = ReduceSum(Y · R)), A and B both
    differentiated; B kept away from 0."""
    rng = np.random.default_rng(11)
    cases = []
    for a_shape, b_shape in DIV_SHAPES:
        a = rng.standard_normal(a_shape).astype(np.float32)
        b = (np.sign(rng.standard_normal(b_shape)) * (0.5 + rng.random(b_shape))).astype(np.float32)
        cases.append(op_model("Div", {"A": a, "B": b}))
    return cases


def reduce_to(grad, shape):
    """numpy: sum `grad` over the axes broadcasting added to an input of `shape`."""
    grad = np.asarray(grad, np.float64)
    lead = grad.ndim - len(shape)
    grad = grad.sum(axis=tuple(range(lead))) if lead else grad
    axes = tuple(i for i, d in enumerate(shape) if d == 1 and grad.shape[i] != 1)
    return grad.sum(axis=axes, keepdims=True).reshape(shape) if axes else grad.reshape(shape)


def ort_gradients(case):
    return session.run_model(ort_gradient_graph(case.model, case.x_names, "loss"), case.feeds)


def _div_why(x, got, case):
    """Which usual slip gives `got` for x's gradient, or None."""
    a, b = (case.feeds[n].astype(np.float64) for n in ("A", "B"))
    dy = case.loss_weights.astype(np.float64)
    shape = case.feeds[x].shape
    if x == "A":
        slips = {"dY · B, Mul's gradient: for Y = A / B it is dA = dY / B": dy * b,
                 "dY, Add's gradient: for Y = A / B it is dA = dY / B": dy}
    else:
        slips = {"+dY · A / B²: the sign is missing. Y = A / B falls where B grows (for A > 0), so dB = -dY · A / B²":
                 dy * a / b ** 2,
                 "-dY / B², without A: the derivative of A / B with respect to B is -A / B², so dB = -dY · A / B²":
                 -dy / b ** 2,
                 "-dY · A / B: the derivative of A / B with respect to B is -A / B² (or -Y / B), so "
                 "dB = -dY · A / B²": -dy * a / b}
    for why, value in slips.items():
        expected = reduce_to(np.broadcast_to(value, np.broadcast_shapes(a.shape, b.shape)), shape)
        if np.allclose(got, expected, rtol=1e-4, atol=1e-5):
            return why
    return None


def div_gradient(remote, fn):
    for case in div_cases():
        shapes = f"A {list(case.feeds['A'].shape)} / B {list(case.feeds['B'].shape)}"
        backward = remote.call(div_backward, fn, case.model, case.x_names)
        if any(n.op_type == "DivGrad" for n in backward.graph.node):
            raise CheckFailed("your builder emits ORT's DivGrad, the fused kernel; the exercise is to write what it "
                              "computes with ONNX ops (Div, Mul, Neg, ...)")
        try:
            got = session.run_model(backward, case.feeds)
        except Exception as exc:  # ORT's refusal (an OrtlabError) or its run's error
            text = str(exc).splitlines()[0]
            raise CheckFailed(f"for {shapes}, ORT could not run the backward graph your builder made: "
                              f"{text[-220:]}") from None
        truth = ort_gradients(case)
        for x in ("A", "B"):
            name = f"{x}_grad"
            if name not in got:
                raise CheckFailed(f"for {shapes}, your builder gave no gradient for {x}: return [dA, dB], one name per "
                                  "forward input")
            mine, want = np.asarray(got[name]), truth[name]
            if mine.shape != want.shape:
                raise CheckFailed(f"for {shapes}, the gradient of {x} has shape {list(mine.shape)}, {x} has shape "
                                  f"{list(want.shape)}: each element of {x} was used for every element of Y it was "
                                  f"broadcast to, so sum its gradient over those axes: b.handle_broadcasting(grad, "
                                  f"b.I({'AB'.index(x)}))")
            if not np.allclose(mine, want, rtol=1e-4, atol=1e-5):
                why = _div_why(x, mine, case)
                if why:
                    raise CheckFailed(f"for {shapes}, your gradient of {x} is {why}")
                at = np.unravel_index(int(np.argmax(np.abs(mine - want))), want.shape)
                raise CheckFailed(f"for {shapes}, your gradient of {x} is {mine[at]:.4f} at {tuple(map(int, at))} "
                                  f"where ORT's is {want[at]:.4f}: dA = dY / B and dB = -dY · A / B², each summed "
                                  "over its input's broadcast axes")
    return None


def ort_gemm_gradients():
    """A_grad and B_grad of gemm_case() computed by ORT's backward graph, and the case's values (R is dY)."""
    spec = gemm_case()
    case = op_model("Gemm", spec["inputs"], attributes=spec["attributes"])
    got = session.run_model(ort_gradient_graph(case.model, case.x_names, "loss"), case.feeds)
    values = {**{n: v.astype(np.float64) for n, v in spec["inputs"].items()},
              "Y_grad": case.loss_weights.astype(np.float64)}
    return {"A": got["A_grad"], "B": got["B_grad"]}, values


def _gemm(values, first, second, trans_a, trans_b, alpha):
    """What Gemm(first, second) computes with these flags (no C), or why it cannot."""
    left = values[first].T if trans_a else values[first]
    right = values[second].T if trans_b else values[second]
    if left.shape[1] != right.shape[0]:
        return None, (f"Gemm multiplies op({first}) {list(left.shape)} by op({second}) {list(right.shape)}, whose "
                      "inner sizes differ")
    return alpha * left @ right, None


HINTS = {"A": "Y = alpha · A · Bᵀ, so dA = alpha · dY · B: B as it is, since the forward used it transposed",
         "B": "Y = alpha · A · Bᵀ, so dB = alpha · dYᵀ · A (the transpose of alpha · Aᵀ · dY), shaped like B"}


def gemm_grad(remote, fn):
    got = remote.call(predicted_gemms, fn)
    truth, values = ort_gemm_gradients()
    alpha = gemm_case()["attributes"]["alpha"]
    for x in ("A", "B"):
        if x not in got:
            raise CheckFailed(f"your dict has no {x!r} key: give the Gemm that computes the gradient of {x}")
    for x in ("A", "B"):
        want = truth[x]
        first, second, trans_a, trans_b, said_alpha = got[x]
        value, problem = _gemm(values, *got[x])
        hint = HINTS[x]
        if problem:
            raise CheckFailed(f"for {x}'s gradient: {problem}; {hint}")
        if value.shape != want.shape:
            raise CheckFailed(f"for {x}'s gradient: your Gemm gives shape {list(value.shape)}, {x} has shape "
                              f"{list(want.shape)}; {hint}")
        if np.allclose(value, want, rtol=1e-4, atol=1e-5):
            continue
        if said_alpha != alpha and np.allclose(value * alpha / (said_alpha or 1), want, rtol=1e-4, atol=1e-5):
            raise CheckFailed(f"for {x}'s gradient: alpha {said_alpha}: Y scales with alpha, and so does the "
                              f"gradient of every input multiplied into it, so the Gemm keeps alpha = {alpha} (beta "
                              "scales only C)")
        raise CheckFailed(f"for {x}'s gradient: Gemm({first}, {second}, transA={trans_a}, transB={trans_b}) has the "
                          f"right shape but not ORT's values; {hint}")
    return None

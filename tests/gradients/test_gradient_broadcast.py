"""Every gradient builder that broadcasts, on generated shape pairs: unequal ranks in both
orders, size-1 dimensions, scalars. ortlab's gradient graph (run in ORT) must equal torch
autograd; ORT's own C++ builder (run in ORT) is checked against torch too, and where ORT 1.19.2
is wrong its behaviour is pinned."""
import numpy as np
import pytest
import torch

import ortcheck
from gradient_cases import Case
from ortlab import OrtlabError
from ortlab.gradients import OrtGradientError, build_gradient_graph, ort_gradient_graph


def shape_pairs(count=14, seed=0):
    """Broadcast-compatible (a, b) shapes: a random full shape, a size 1 in a or b at random dims,
    leading dims dropped from one side (down to a scalar), the sides swapped at random; plus the
    pairs that matter most, written out."""
    rng = np.random.default_rng(seed)
    pairs = [((3, 4), (4,)), ((4,), (3, 4)), ((2, 3), ()), ((), (2, 3)), ((1,), (3, 1, 4)),
             ((2, 1, 4), (3, 1)), ((3, 1), (1, 4))]
    while len(pairs) < count:
        full = [int(d) for d in rng.integers(2, 4, rng.integers(1, 5))]
        a, b = list(full), list(full)
        for i in range(len(full)):
            which = rng.integers(0, 3)
            if which == 1:
                a[i] = 1
            elif which == 2:
                b[i] = 1
        b = b[rng.integers(0, len(full) + 1):]
        pair = (tuple(a), tuple(b)) if rng.random() < 0.5 else (tuple(b), tuple(a))
        if pair not in pairs:
            pairs.append(pair)
    return pairs


PAIRS = shape_pairs()
rng = np.random.default_rng(7)


def arr(shape, positive=False):
    a = rng.standard_normal(shape).astype(np.float32)
    return np.asarray(np.abs(a) + 0.5 if positive else a, dtype=np.float32)


def ids(pair):
    return "x".join(map(str, pair[0])) + "_" + "x".join(map(str, pair[1]))


def binary_cases():
    cases = []
    for a, b in PAIRS:
        tag = ids((a, b))
        cases += [Case("Add", [(arr(a), True), (arr(b), True)], torch.add, id=f"Add-{tag}"),
                  Case("Sub", [(arr(a), True), (arr(b), True)], torch.sub, id=f"Sub-{tag}"),
                  Case("Mul", [(arr(a), True), (arr(b), True)], torch.mul, id=f"Mul-{tag}"),
                  Case("Div", [(arr(a), True), (arr(b, True), True)], torch.div, id=f"Div-{tag}"),
                  Case("Div", [(arr(a), True), (arr(b, True), False)], torch.div, id=f"Div-A-only-{tag}"),
                  Case("Div", [(arr(a), False), (arr(b, True), True)], torch.div, id=f"Div-B-only-{tag}"),
                  Case("Pow", [(arr(a, True), True), (arr(b), False)], torch.pow, id=f"Pow-{tag}"),
                  Case("Max", [(arr(a), True), (arr(b), True)], torch.maximum, id=f"Max-{tag}"),
                  Case("Min", [(arr(a), True), (arr(b), True)], torch.minimum, id=f"Min-{tag}"),
                  Case("Sum", [(arr(a), True), (arr(b), True)], torch.add, id=f"Sum-{tag}"),
                  Case("Where", [(rng.random(a) > 0.5, False), (arr(b), True), (arr(a), True)],
                       torch.where, id=f"Where-{tag}")]
    cases += [Case("Max", [(arr((2, 3)), True), (arr((3,)), True), (arr((2, 1)), True)],
                   lambda a, b, c: torch.maximum(torch.maximum(a, b), c), id="Max-three-inputs"),
              Case("Sum", [(arr((2, 3)), True), (arr((3,)), True), (arr((4, 1, 1)), True)],
                   lambda a, b, c: a + b + c, id="Sum-three-inputs")]
    return cases


def matmul_cases():
    """A[batch_a..., 3, 4] @ B[batch_b..., 4, 2] with the batch shapes of the generated pairs."""
    cases = []
    for a, b in PAIRS:
        cases.append(Case("MatMul", [(arr(a + (3, 4)), True), (arr(b + (4, 2)), True)], torch.matmul,
                          id=f"MatMul-{ids((a, b))}"))
    return cases


CASES = binary_cases() + matmul_cases()


def run(model, feeds):
    return dict(zip([o.name for o in model.graph.output], ortcheck.run(model, feeds)))


def input_shape(case, x):
    return case.inputs[int(x[2:])][0].shape


def output_shape(case):
    return tuple(case.torch_outputs(grad=False)[0].shape)


def ort_expected(case):
    """What ORT 1.19.2's builder does with a case: 'agrees', 'no builder', or 'wrong shape'.
    Its Where and Pow builders do not reduce a broadcast input's gradient (gradient_builder.cc:
    GetWhereGradient, GetPowGradient emit no HandleBroadcasting); it has no Sum builder."""
    if case.op == "Sum":
        return "no builder"
    if case.op in ("Where", "Pow"):
        broadcast = any(input_shape(case, x) != output_shape(case) for x in case.x_names)
        return "wrong shape" if broadcast else "agrees"
    return "agrees"


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_broadcast_gradient_equals_torch(case):
    model = case.model()
    expected = case.torch_gradients()
    got = run(build_gradient_graph(model, case.x_names, "loss"), case.feeds)
    for x in case.x_names:
        assert np.shape(got[f"{x}_grad"]) == expected[x].shape, (x, np.shape(got[f"{x}_grad"]))
        np.testing.assert_allclose(got[f"{x}_grad"], expected[x], rtol=1e-4, atol=1e-5, err_msg=x)


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_orts_builder_on_the_same_case(case):
    model = case.model()
    expected = case.torch_gradients()
    verdict = ort_expected(case)
    try:
        theirs = run(ort_gradient_graph(model, case.x_names, "loss"), case.feeds)
    except OrtlabError as exc:
        assert verdict == "no builder", f"ORT's builder failed: {exc}"
        assert "has not been registered" in str(exc)
        return
    assert verdict != "no builder", "ORT now has a builder for " + case.op
    shapes_right = all(np.shape(theirs[f"{x}_grad"]) == expected[x].shape for x in case.x_names)
    if verdict == "wrong shape":
        assert not shapes_right, f"ORT's {case.op} builder now reduces over broadcast axes"
        return
    for x in case.x_names:
        np.testing.assert_allclose(theirs[f"{x}_grad"], expected[x], rtol=1e-4, atol=1e-5, err_msg=x)


def test_the_generated_pairs_cover_both_orders_size_one_dims_and_scalars():
    assert any(len(a) < len(b) for a, b in PAIRS) and any(len(a) > len(b) for a, b in PAIRS)
    assert any(1 in a + b for a, b in PAIRS) and any(a == () or b == () for a, b in PAIRS)
    assert len(PAIRS) >= 14


def test_div_by_a_lower_rank_divisor_keeps_its_shape():
    """a[3,4] / b[4]: b's gradient has shape [4] (it once came out as a scalar: DivGrad's
    outputs, already reduced, were reduced a second time)."""
    case = Case("Div", [(arr((3, 4)), True), (arr((4,), True), True)], torch.div)
    got = run(build_gradient_graph(case.model(), case.x_names, "loss"), case.feeds)
    assert got["in1_grad"].shape == (4,)
    np.testing.assert_allclose(got["in1_grad"], case.torch_gradients()["in1"], rtol=1e-4, atol=1e-5)


def test_max_shares_the_gradient_among_ties_as_torch_and_ort_do():
    a = np.array([[1.0, 2.0, 3.0]], np.float32)
    b = np.array([1.0, 5.0, 3.0], np.float32)
    case = Case("Max", [(a, True), (b, True)], torch.maximum)
    model = case.model()
    expected = case.torch_gradients()
    ours = run(build_gradient_graph(model, case.x_names, "loss"), case.feeds)
    theirs = run(ort_gradient_graph(model, case.x_names, "loss"), case.feeds)
    for x in case.x_names:
        np.testing.assert_allclose(ours[f"{x}_grad"], expected[x], rtol=1e-5)
        np.testing.assert_allclose(theirs[f"{x}_grad"], expected[x], rtol=1e-5)


def symbolic(model):
    """The model with every dim of its inputs a symbol of its own (and no shape for the loss
    weights' product): builders must then take their run-time (Shape, BroadcastGradientArgs) path."""
    for vi in model.graph.input:
        for k, dim in enumerate(vi.type.tensor_type.shape.dim):
            dim.dim_param = f"{vi.name}_d{k}"
    return model


DYNAMIC = [c for c in CASES if c.op in ("Add", "Sub", "Mul", "Div", "Max", "Min", "MatMul")]


@pytest.mark.parametrize("case", DYNAMIC, ids=lambda c: c.id)
def test_broadcast_gradient_with_symbolic_shapes_equals_torch(case):
    model = symbolic(case.model())
    expected = case.torch_gradients()
    got = run(build_gradient_graph(model, case.x_names, "loss"), case.feeds)
    for x in case.x_names:
        assert np.shape(got[f"{x}_grad"]) == expected[x].shape, (x, np.shape(got[f"{x}_grad"]))
        np.testing.assert_allclose(got[f"{x}_grad"], expected[x], rtol=1e-4, atol=1e-5, err_msg=x)
    ORT_SYMBOLIC[case.id] = outcome = ort_symbolic_outcome(case, model, expected)
    if case.op in ("Max", "Min", "MatMul") or case.id.startswith("Div-") and "only" not in case.id:
        assert outcome == "agrees"  # these read Y's shape or reduce inside DivGrad at run time
    assert outcome in ("agrees", "refuses", "wrong shape", "fails at run time")


# What ORT 1.19.2's builder does with symbolic shapes (gradient_builder_base.cc,
# ComputeBroadcastBackwardAxes): two different symbols are taken as equal ("a relaxing case",
# logged at INFO), so a symbol that is 1 at run time is not reduced: a gradient of the wrong shape,
# no error. Its Div builder (A only) can build a Reshape that fails at run time. Axes missing on one side
# (different ranks) send it to HandleBroadcasting, which needs dY's static shape and fails its ORT_ENFORCE.
ORT_SYMBOLIC = {}


def ort_symbolic_outcome(case, model, expected):
    try:
        graph = ort_gradient_graph(model, case.x_names, "loss")
    except OrtGradientError as exc:
        assert "GetShape(input_grad, input_grad_shape).IsOK() was false" in str(exc), exc
        return "refuses"
    try:
        theirs = run(graph, case.feeds)
    except OrtlabError as exc:  # a Reshape of the reduced gradient to a wrong shape
        assert "cannot be reshaped to the requested shape" in str(exc), exc
        return "fails at run time"
    if any(np.shape(theirs[f"{x}_grad"]) != expected[x].shape for x in case.x_names):
        return "wrong shape"
    for x in case.x_names:
        np.testing.assert_allclose(theirs[f"{x}_grad"], expected[x], rtol=1e-4, atol=1e-5, err_msg=x)
    return "agrees"


def test_orts_symbolic_shape_outcomes_include_a_silently_wrong_shape():
    case = Case("Add", [(arr((3, 1)), True), (arr((1, 4)), True)], torch.add)
    model = symbolic(case.model())
    assert ort_symbolic_outcome(case, model, case.torch_gradients()) == "wrong shape"
    case = Case("Mul", [(arr((3, 4)), True), (arr((4,)), True)], torch.mul)
    assert ort_symbolic_outcome(case, symbolic(case.model()), case.torch_gradients()) == "refuses"

"""The builders ortlab added after the first set (GatherElements, Expand, Abs, Clip, Max/Min,
LeakyRelu, Tile, Conv, pools): ortlab's gradient graph, run in ORT and in ortlab's reference
kernels (onnx.reference plus ortlab.transformers.contrib_ops), against torch autograd, central
differences, and ORT's own C++ builder's graph run in ORT."""
import numpy as np
import pytest
import torch
import torch.nn.functional as tf

import ortcheck
from gradient_cases import Case
from ortlab import OrtlabError
from ortlab.gradients import build_gradient_graph, check_gradient, ort_gradient_graph
from ortlab.gradients.compare import gradient_nodes
from ortlab.transformers.contrib_ops import reference_run

rng = np.random.default_rng(11)


def x(*shape):
    return (rng.standard_normal(shape).astype(np.float32), True)


def const(array):
    return (np.asarray(array), False)


def gather(axis):
    return lambda a, i: torch.gather(a, axis % a.dim(), i)


CASES = [
    Case("GatherElements", [x(3, 4), const([[0, 2], [1, 1], [3, 0]])], gather(1), {"axis": 1}, id="GatherElements-axis1-repeats"),
    Case("GatherElements", [x(3, 4), const([[2, 0, 2, 1], [2, 2, 0, 0]])], gather(0), {"axis": 0}, id="GatherElements-axis0"),
    Case("GatherElements", [x(2, 3, 4), const(rng.integers(0, 4, (2, 3, 6)))], gather(-1), {"axis": -1},
         id="GatherElements-axis-negative-3d"),
    Case("GatherElements", [x(3, 4), const([[-1, 0], [-4, 3], [1, -1]])], lambda a, i: torch.gather(a, 1, i % 4),
         {"axis": 1}, id="GatherElements-negative-indices"),
    Case("Expand", [x(3, 1), const([2, 3, 4])], lambda a, s: a.expand(2, 3, 4), id="Expand-rank-up-size1"),
    Case("Expand", [x(3, 4), const([2, 1, 1])], lambda a, s: a.expand(2, 3, 4), id="Expand-shape-of-ones"),
    Case("Expand", [x(3, 4), const([4])], lambda a, s: a * 1, id="Expand-noop-lower-rank-shape"),
    Case("Expand", [x(1, 4, 1), const([3, 1, 5])], lambda a, s: a.expand(3, 4, 5), id="Expand-both-ways"),
    Case("Expand", [x(), const([2, 3])], lambda a, s: a.expand(2, 3), id="Expand-scalar"),
    Case("Tile", [x(2, 3), const([2, 1])], lambda a, r: a.repeat(2, 1), id="Tile-2d"),
    Case("Tile", [x(2, 1, 3), const([1, 4, 2])], lambda a, r: a.repeat(1, 4, 2), id="Tile-3d"),
    Case("Tile", [x(4), const([3])], lambda a, r: a.repeat(3), id="Tile-1d"),
    Case("Abs", [x(3, 4)], torch.abs, id="Abs"),
    Case("Clip", [x(3, 4), const(np.float32(-0.3)), const(np.float32(0.4))],
         lambda a, lo, hi: torch.clamp(a, lo, hi), id="Clip-both"),
    Case("Clip", [x(3, 4), const(np.float32(0.1))], lambda a, lo: torch.clamp(a, min=lo), id="Clip-min-only"),
    Case("Clip", [x(3, 4), None, const(np.float32(0.1))], lambda a, _, hi: torch.clamp(a, max=hi), id="Clip-max-only"),
    Case("Clip", [x(3, 4)], lambda a: a * 1, id="Clip-no-bounds"),
    Case("Max", [x(2, 3), x(3), x(2, 1)], lambda a, b, c: torch.maximum(torch.maximum(a, b), c), id="Max-three"),
    Case("Min", [x(4), x(3, 1)], torch.minimum, id="Min-broadcast"),
    Case("Max", [x(2, 3)], lambda a: a * 1, id="Max-one-input"),
    Case("LeakyRelu", [x(3, 4)], tf.leaky_relu, id="LeakyRelu-default-alpha"),
    Case("LeakyRelu", [x(3, 4)], lambda a: tf.leaky_relu(a, 0.3), {"alpha": 0.3}, id="LeakyRelu-alpha"),
]

# onnx.reference's GatherElements (onnx/reference/ops/op_gather_elements.py) slices the shapes
# with the axis as given, so a negative axis compares the wrong dimensions and refuses the forward
# node; ORT runs it.
REFERENCE_FORWARD_FAILS = {"GatherElements-axis-negative-3d"}

# ORT 1.19.2 builds a wrong or no gradient here (its behaviour is pinned below)
ORT_DIFFERS = {}


def run(model, feeds):
    return dict(zip([o.name for o in model.graph.output], ortcheck.run(model, feeds)))


def assert_gradients(got, expected, names, what):
    for name in names:
        assert np.shape(got[f"{name}_grad"]) == expected[name].shape, (what, name)
        np.testing.assert_allclose(got[f"{name}_grad"], expected[name], rtol=1e-4, atol=1e-5, err_msg=f"{what} {name}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_gradient_equals_torch_in_ort_and_in_ortlabs_kernels(case):
    model = case.model()
    expected = case.torch_gradients()
    ours = build_gradient_graph(model, case.x_names, "loss")
    assert_gradients(run(ours, case.feeds), expected, case.x_names, "ortlab's graph in ORT")
    if case.id in REFERENCE_FORWARD_FAILS:  # the forward op, not the gradient, fails there
        with pytest.raises(ValueError, match="all dimensions of index and self should be the same size"):
            reference_run(ours, case.feeds)
    else:
        assert_gradients(reference_run(ours, case.feeds), expected, case.x_names, "ortlab's graph in reference kernels")
    assert check_gradient(model, case.x_names, "loss", case.feeds, gradient_model=ours).passed


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.id)
def test_orts_builder_gives_torchs_gradient(case):
    model = case.model()
    expected = case.torch_gradients()
    if case.id in ORT_DIFFERS:
        ORT_DIFFERS[case.id](case, model, expected)
        return
    assert_gradients(run(ort_gradient_graph(model, case.x_names, "loss"), case.feeds), expected, case.x_names,
                     "ORT's graph")


@pytest.mark.parametrize("case", [c for c in CASES if c.op in ("GatherElements", "LeakyRelu", "Tile", "Expand")],
                         ids=lambda c: c.id)
def test_ortlab_emits_the_op_types_ort_emits(case):
    model = case.model()
    ours = {n.op_type for n in gradient_nodes(build_gradient_graph(model, case.x_names, "loss"), model)}
    theirs = {n.op_type for n in gradient_nodes(ort_gradient_graph(model, case.x_names, "loss"), model)}
    assert ours == theirs

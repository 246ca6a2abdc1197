"""The pre-training transformers: fused before the gradient graph is built, smaller forward and
backward graphs (ortlab's builder and ORT's), and the same parameter gradients as torch."""
import numpy as np
import pytest
import torch

import ortcheck
from ortlab import models
from ortlab.gradients import build_gradient_graph, ort_gradient_graph
from ortlab.walkthroughs import graph_transformers as ex
from ortlab.transformers import optimize_for_training, ort_pre_training_table


def run(model, feeds):
    return dict(zip([o.name for o in model.graph.output], ortcheck.run(model, feeds)))


@pytest.fixture(scope="module", params=["bert", "gpt"])
def case(request):
    model = models.get(request.param, dropout=0.0)
    onx, x, y = ortcheck.clean_export(request.param, True, dropout=0.0)
    inputs = (torch.from_numpy(x), torch.from_numpy(y))
    params = dict(model.named_parameters())
    weights = [i.name for i in onx.graph.initializer if i.name in params]
    feeds = {i.name: t.numpy() for i, t in zip(onx.graph.input, inputs)}
    model.zero_grad()
    model(*inputs).backward()
    return onx, weights, feeds, {w: params[w].grad.numpy() for w in weights}


def test_fusions_happen_and_weights_stay_trainable(case):
    onx, weights, _, _ = case
    fused, manager = optimize_for_training(onx, weights)
    counts = ex.op_counts(fused)
    assert counts["LayerNormalization"] == 5 and counts["com.microsoft:Gelu"] == 2
    assert "Dropout" not in counts  # ratio 0 in training mode: EliminateDropout
    read = {i for n in fused.graph.node for i in n.input}
    assert set(weights) <= read  # no Transpose(W) folded away from its weight
    assert len(fused.graph.node) < len(onx.graph.node) / 2
    assert "LayerNormFusion" in manager.fire_counts()


@pytest.mark.parametrize("builder", ["ortlab", "ort"])
def test_gradients_equal_torch_and_backward_is_smaller(case, builder):
    onx, weights, feeds, expected = case
    fused, _ = optimize_for_training(onx, weights)
    build = build_gradient_graph if builder == "ortlab" else ort_gradient_graph
    before, after = build(onx, weights, "loss"), build(fused, weights, "loss")
    backward_before = len(before.graph.node) - len(onx.graph.node)
    backward_after = len(after.graph.node) - len(fused.graph.node)
    assert backward_after < backward_before / 1.5, (backward_before, backward_after)
    got = run(after, feeds)
    for w in weights:
        np.testing.assert_allclose(got[f"{w}_grad"], expected[w], rtol=1e-4, atol=1e-5, err_msg=w)


def test_the_table_maps_orts_list_to_ortlab():
    rows = ort_pre_training_table().rows
    assert any(r[0].startswith("LayerNormFusion") and r[1] == "LayerNormFusion" for r in rows)

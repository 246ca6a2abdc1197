"""ortlab.models: deterministic, fast, and exporting the patterns ORT's optimizers look for."""
import collections
import time

import numpy as np
import onnx
import pytest
import torch

import ortcheck
from ortlab import OrtlabError, models
from ortlab.ir import Graph

NAMES = list(models.ZOO)


def op_counts(model):
    return collections.Counter(n.op_type for n in model.graph.node)


def pairs(model, first, second):
    """How many `first` nodes feed a `second` node directly."""
    graph = Graph.from_model(model)
    return sum(1 for n in graph.nodes() if n.op_type == first
               for c in graph.consumers(n.outputs[0].name) if c.op_type == second)


@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_model_and_the_global_rng_is_untouched(name):
    torch.manual_seed(123)
    before = torch.rand(1)
    torch.manual_seed(123)
    a, b, c = models.get(name, seed=1), models.get(name, seed=1), models.get(name, seed=2)
    assert torch.equal(torch.rand(1), before)
    for (pa, ta), (_, tb), (_, tc) in zip(a.state_dict().items(), b.state_dict().items(), c.state_dict().items()):
        assert torch.equal(ta, tb), pa
    assert any(not torch.equal(ta, tc) for ta, tc in zip(a.state_dict().values(), c.state_dict().values()))
    assert all(torch.equal(x, y) for x, y in zip(a.example_inputs(seed=3), b.example_inputs(seed=3)))


@pytest.mark.parametrize("name", NAMES)
def test_a_training_step_takes_well_under_a_second(name):
    model = models.get(name)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = model.example_inputs()
    model(*inputs).backward()  # warm up
    times, threads = [], torch.get_num_threads()
    torch.set_num_threads(1)  # one thread, timed by its own CPU time: other jobs on the same cores do not count
    try:
        for _ in range(3):
            start = time.thread_time()
            opt.zero_grad()
            loss = model(*inputs)
            loss.backward()
            opt.step()
            times.append(time.thread_time() - start)
    finally:
        torch.set_num_threads(threads)
    assert min(times) < 0.5, times
    assert loss.ndim == 0 and torch.isfinite(loss)


@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_transformer_exports_hold_the_fusion_and_gradient_patterns(name):
    model = models.get(name)
    inference = models.export(model, model.example_inputs()[:1])
    training = models.export(model, model.example_inputs(), training=True)
    ops = op_counts(inference)
    layer_norms = 2 * len(model.blocks) + 1
    for op in ("Sub", "Pow", "Sqrt"):  # one each per LayerNorm subgraph
        assert ops[op] >= layer_norms, op
    assert ops["ReduceMean"] >= 2 * layer_norms
    assert ops["Erf"] == len(model.blocks) and ops["Softmax"] == len(model.blocks)
    assert pairs(inference, "MatMul", "Add") >= 4 * len(model.blocks)
    assert pairs(training, "Transpose", "MatMul") >= len(model.blocks)
    assert op_counts(training)["Dropout"] > 0 and ops["Dropout"] == 0
    assert op_counts(training)["SoftmaxCrossEntropyLoss"] == 1
    if name == "gpt":
        assert ops["Where"] == len(model.blocks)


@pytest.mark.parametrize("name", NAMES)
def test_exported_graphs_run_in_ort_like_torch_and_round_trip_through_ortlab_ir(name):
    model = models.get(name).eval()
    inputs = model.example_inputs()
    for given in (inputs[:1], inputs):
        onx = models.export(model, given)
        onnx.checker.check_model(onx)
        feeds = {i.name: t.numpy() for i, t in zip(onx.graph.input, given)}
        (ort_out,) = ortcheck.run(onx, feeds)
        np.testing.assert_allclose(ort_out, model(*given).detach().numpy(), rtol=1e-4, atol=1e-5)
        back = Graph.from_model(onx)
        back.resolve()
        (again,) = ortcheck.run(back.to_model(), feeds)
        np.testing.assert_array_equal(again, ort_out)


def test_unknown_model_and_too_long_sequence_are_explained():
    with pytest.raises(OrtlabError, match="no model 'resnet' in ortlab.models; choose one of mlp, bert, gpt"):
        models.get("resnet")
    with pytest.raises(OrtlabError, match="longer than the model's max_len=16"):
        models.get("bert").example_inputs(seq=32)

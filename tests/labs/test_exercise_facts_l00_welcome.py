"""The facts 00_welcome's exercise judges read from ORT agree with an independent computation.

'relu': ORT's Relu on every array the check feeds is numpy's max(x, 0), with the input's shape and dtype.
'ort_ops': the nodes ORT's session runs for the notebook's first graph are those ortlab's mirror of ORT's
transformers leaves at level 2 (where GeluFusion is), and that graph still computes what torch computes.
"""
import numpy as np
import torch

from ortlab import session
from ortlab.labs import l00_welcome
from ortlab.labs.judges.l00_welcome import ort_relu, relu_cases, session_ops
from ortlab.transformers import GraphTransformerManager

CPU = ["CPUExecutionProvider"]


def test_ort_relu_is_numpys_maximum_with_zero_of_the_inputs_type():
    for x in relu_cases():
        got, want = ort_relu(x), np.maximum(x, x.dtype.type(0))
        assert got.shape == want.shape and got.dtype == x.dtype
        np.testing.assert_array_equal(got, want)


def test_the_nodes_ort_runs_are_those_ortlabs_transformers_leave():
    model = l00_welcome.first_model()
    ours = GraphTransformerManager.from_registry(2, providers=CPU).optimize(model)
    assert session_ops(model) == [n.op_type for n in ours.graph.node]
    assert "Constant" not in session_ops(model) and len(session_ops(model)) < len(model.graph.node)


def test_the_graph_ort_runs_computes_the_torch_models_output():
    model = l00_welcome.first_model()
    torch.manual_seed(0)  # what env.seed_everything(0) seeds: first_model's weights, then its x
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.Linear(8, 2)).eval()
    x = torch.randn(3, 4)
    optimized = session.optimized_model(model, "all", providers=CPU)
    got = session.run_model(optimized, {"x": x.numpy()})["y"]
    np.testing.assert_allclose(got, net(x).detach().numpy(), rtol=1e-5, atol=1e-6)

"""ortlab.ortmodule.training_agent: ORTModule one layer down (OrtModuleGraphBuilder and TrainingAgent
called directly), its gradients checked against torch autograd on the zoo's MLP and TinyGPT."""
import pytest
import torch

from ortlab import models
from ortlab.ortmodule.training_agent import (ModuleTrainingAgent, TrainingAgentError, _ortvalues, build_graphs,
                                            session_options, torch_gradients)


def _assert_same_gradients(ours, reference, rtol=1e-4, atol=1e-6):
    assert set(ours) == set(reference)
    for name, grad in reference.items():
        torch.testing.assert_close(ours[name], grad, rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def test_the_graph_builder_splits_forward_and_backward_at_a_yield_op():
    mlp = models.get("mlp", dropout=0.0)
    agent = ModuleTrainingAgent(mlp, *mlp.example_inputs())
    graphs, info = agent.graphs, agent.graphs.info
    assert "YieldOp" not in graphs.ops("forward") and graphs.ops("training").count("YieldOp") == 1
    forward_ops = graphs.ops("forward")
    assert graphs.ops("training")[:len(forward_ops)] == forward_ops  # the training graph begins with it
    parameters = [n for n, _ in mlp.named_parameters()]
    assert info["initializer_names_to_train"] == parameters
    assert info["initializer_grad_names_to_train"] == [f"{n}_grad" for n in parameters]
    assert [o.name for o in graphs.training_model.graph.output] == [f"{n}_grad" for n in parameters]
    assert info["user_output_names"] == ["output_0"] and info["output_grad_indices_require_full_shape"] == [0]


def test_mlp_loss_and_parameter_gradients_equal_torchs():
    mlp = models.get("mlp", dropout=0.0)
    x, labels = mlp.example_inputs()
    agent = ModuleTrainingAgent(mlp, x, labels)
    outputs, grads = agent.gradients(x, labels)
    torch_outputs, reference = torch_gradients(mlp, x, labels)
    torch.testing.assert_close(outputs[0], torch_outputs[0])
    _assert_same_gradients(grads, reference)
    assert all(p.grad is None for p in mlp.parameters())  # the agent leaves torch's .grad alone


def test_an_input_that_requires_grad_gets_its_gradient_and_non_scalar_outputs_take_grad_outputs():
    mlp = models.get("mlp", dropout=0.0)
    x = mlp.example_inputs()[0].requires_grad_()
    agent = ModuleTrainingAgent(mlp, x)  # logits, no loss
    info = agent.graphs.info  # as ORTModule configures the builder, every graph input is an "initializer"
    assert info["initializer_grad_names_to_train"][0] == "x_grad" and info["user_input_grad_names"] == {}
    grad_logits = torch.randn(8, 4, generator=torch.Generator().manual_seed(3))
    with pytest.raises(TrainingAgentError, match="not a scalar: pass grad_outputs"):
        agent.gradients(x)
    outputs, grads = agent.gradients(x, grad_outputs=[grad_logits])
    torch_outputs, reference = torch_gradients(mlp, x, grad_outputs=[grad_logits])
    torch.testing.assert_close(outputs[0], torch_outputs[0])
    assert "x" in grads
    _assert_same_gradients(grads, reference)


def test_the_parameters_are_read_at_every_forward():
    mlp = models.get("mlp", dropout=0.0)
    x, labels = mlp.example_inputs()
    agent = ModuleTrainingAgent(mlp, x, labels)
    with torch.no_grad():
        for p in mlp.parameters():
            p.mul_(0.5)
    outputs, grads = agent.gradients(x, labels)
    torch_outputs, reference = torch_gradients(mlp, x, labels)
    torch.testing.assert_close(outputs[0], torch_outputs[0])
    _assert_same_gradients(grads, reference)


@pytest.mark.parametrize("tie", [False, True])
def test_gpt_gradients_equal_torchs(tie):
    gpt = models.get("gpt", dropout=0.0, tie_embeddings=tie)
    ids, labels = gpt.example_inputs()
    agent = ModuleTrainingAgent(gpt, ids, labels)
    outputs, grads = agent.gradients(ids, labels)
    torch_outputs, reference = torch_gradients(gpt, ids, labels)
    torch.testing.assert_close(outputs[0], torch_outputs[0], rtol=1e-5, atol=1e-6)
    assert ("lm_head.weight" in grads) != tie and "tok.weight" in grads  # a tied weight has one gradient
    _assert_same_gradients(grads, reference)


def test_a_forward_run_resumes_once_and_backward_needs_one():
    mlp = models.get("mlp", dropout=0.0)
    x, labels = mlp.example_inputs()
    agent = ModuleTrainingAgent(mlp, x, labels)
    run = agent.forward(x, labels)
    first = agent.backward(run)
    with pytest.raises(TrainingAgentError, match="already resumed"):
        agent.backward(run)
    with pytest.raises(TrainingAgentError, match="takes the ForwardRun"):
        agent.backward(run.outputs)
    again = agent.backward(agent.forward(x, labels))
    _assert_same_gradients(again, first, rtol=0, atol=0)


def test_build_graphs_refuses_a_name_that_is_not_a_graph_input():
    mlp = models.get("mlp", dropout=0.0)
    agent = ModuleTrainingAgent(mlp, *mlp.example_inputs())
    with pytest.raises(TrainingAgentError, match=r"\['net\.9\.weight'\] are not graph inputs"):
        build_graphs(agent.exported.processed, ["net.9.weight"])


def test_with_orts_default_memory_pattern_backward_overwrites_the_forward_output_ortmodule_turns_it_off():
    mlp = models.get("mlp", dropout=0.0)
    x, labels = mlp.example_inputs()
    expected = torch_gradients(mlp, x, labels)[0][0]
    for pattern in (False, True):  # ORTModule's setting, ORT's default
        agent = ModuleTrainingAgent(mlp, x, labels, sess_options=session_options(mem_pattern=pattern))
        run = agent.forward(x, labels)
        torch.testing.assert_close(run.outputs[0], expected)  # right after forward: the loss
        agent.backward(run)
        assert torch.equal(run.outputs[0], expected) != pattern  # after backward: overwritten in the block


def test_wrong_arguments_are_explained_before_they_reach_a_kernel():
    """TrainingAgent.run_forward checks no feed: ORT 1.19.2 fails inside the first kernel on a float64 input
    ("Tensor type mismatch"). ortlab checks dtype and rank first and names the input."""
    import onnxruntime.capi._pybind_state as C

    module = models.get("mlp")
    x = module.example_inputs()[0]
    agent = ModuleTrainingAgent(module, x)
    state, fetches = C.PartialGraphExecutionState(), C.OrtValueVector()
    feeds = agent._feeds((x,))
    feeds[0] = feeds[0].double()
    with pytest.raises(RuntimeError, match="Tensor type mismatch"):   # ORT's own behaviour, pinned
        agent.agent.run_forward(_ortvalues(feeds), fetches, state, None)
    for args, words in (((x.double(),), "is torch.float64, the graph takes float32"),
                        ((x[0],), "the graph takes rank 2"), (("x",), "not str"), ((), "no value for graph input")):
        with pytest.raises(TrainingAgentError, match=words):
            agent.forward(*args)
    with pytest.raises(TrainingAgentError, match="takes a torch.nn.Module"):
        ModuleTrainingAgent("mlp", x)
    with pytest.raises(TrainingAgentError, match="takes an onnx.ModelProto"):
        build_graphs(b"not a model", ["w"])

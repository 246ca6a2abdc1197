"""Training on ortlab's own stack (ortlab.ir, transformers, gradients, engine, optimizers) gives the
losses of the real ORTModule and of PyTorch from the same weights and batches.

(Named to run after test_stack: ORTModule registers export symbolics process-wide.)
"""
import copy

import numpy as np
import pytest
import torch

from ortlab import models
from ortlab.training import SGD, MiniORTModule, MiniORTModuleError, train
from ortlab.ortmodule import driver as om

STEPS, LR = 50, 0.05


@pytest.fixture(scope="module")
def runs():
    torch.manual_seed(0)
    module = models.get("gpt", dropout=0.0)
    batches = [module.example_inputs(batch=4, seq=8, seed=s) for s in range(4)]
    reference = copy.deepcopy(module)
    torch_losses = train(reference, batches, torch.optim.SGD(reference.parameters(), lr=LR), STEPS,
                         progress=False, skip_non_finite=False).losses
    ours = MiniORTModule(copy.deepcopy(module), gradient_builder="ortlab", runtime="ortlab", level="basic")
    ortlab_losses = train(ours, batches, SGD(ours.parameters(), lr=LR), STEPS, progress=False,
                          skip_non_finite=False).losses
    ortmodule_losses = om.train(copy.deepcopy(module), batches, STEPS, lr=LR, save_onnx=False).losses
    return torch_losses, ortlab_losses, ortmodule_losses, ours


def test_tinygpt_on_ortlabs_stack_matches_ortmodule_and_pytorch(runs):
    torch_losses, ortlab_losses, ortmodule_losses, _ = runs
    assert len(ortlab_losses) == STEPS
    assert ortlab_losses[-1] < ortlab_losses[0] - 0.5  # it learns
    np.testing.assert_allclose(ortlab_losses, ortmodule_losses, rtol=1e-4)
    np.testing.assert_allclose(ortlab_losses, torch_losses, rtol=1e-4)


def test_every_layer_was_ortlabs(runs):
    *_, ours = runs
    manager = ours._training_manager()
    from ortlab.engine import InferenceSession

    assert isinstance(manager.forward_session, InferenceSession)
    assert isinstance(manager.backward_session, InferenceSession)
    ops = {(s.node.domain, s.node.op_type) for s in manager.backward_session.state.steps}
    assert ("com.microsoft", "SoftmaxCrossEntropyLossGrad") in ops  # a training kernel, run by the CPU EP


def test_runtime_is_checked():
    with pytest.raises(MiniORTModuleError, match="runtime must be one of"):
        MiniORTModule(torch.nn.Linear(2, 2), runtime="tvm")
    with pytest.raises(MiniORTModuleError, match="TritonExecutionProvider"):
        MiniORTModule(torch.nn.Linear(2, 2), runtime="ortlab", providers=["ROCMExecutionProvider"])

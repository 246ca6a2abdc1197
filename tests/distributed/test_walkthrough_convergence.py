"""D_02's repro shrinking: the whole batch's loss curve of DDP(ORTModule) on 2 ranks and on 1 rank, against
the same SGD loop in plain PyTorch in this process (torch autograd, no ORT, no DDP)."""
import numpy as np
import pytest
import torch

from torch_reference import sgd_losses
from ortlab import models
from ortlab.training.data import progression_batches
from ortlab.walkthroughs import convergence_investigation as ci


def torch_losses(steps=24, lr=1.0, zero_grad=False):
    """The reference: one process, plain PyTorch, the whole batch, the same loop."""
    torch.manual_seed(0)
    model = models.get("gpt", **ci.MODEL)
    batches = progression_batches(**ci.DATA)
    return sgd_losses(model, batches, steps, lr=lr, zero_grad=zero_grad)


@pytest.fixture(scope="module")
def buggy_reference():
    return torch_losses()


def test_the_planted_bug_makes_plain_pytorch_diverge_and_zero_grad_fixes_it(buggy_reference):
    fixed = torch_losses(zero_grad=True)
    assert buggy_reference[-1] > 2 * min(buggy_reference)
    assert fixed[-1] == min(fixed) and fixed[-1] < fixed[0]


@pytest.mark.parametrize("world_size", [2, 1])
def test_ddp_ortmodule_curve_is_pytorchs_whole_batch_curve_at_every_world_size(world_size, buggy_reference):
    losses, _ = ci.global_losses(world_size)
    # the 17 steps before the divergence agree to float32 rounding; after it the rounding is amplified
    np.testing.assert_allclose(losses[:17], buggy_reference[:17], rtol=1e-4)
    assert ci.pattern(losses).startswith(f"falls to {min(buggy_reference):.2f}")


def test_fixed_loop_on_one_rank_is_pytorchs_fixed_curve():
    losses, _ = ci.global_losses(1, zero_grad=True)
    np.testing.assert_allclose(losses, torch_losses(zero_grad=True), rtol=1e-4)
    assert ci.pattern(losses).endswith("at the last step")


def test_a_world_size_that_does_not_divide_the_batch_is_refused():
    with pytest.raises(ci.ReproError, match="cannot be split equally over 3 ranks"):
        ci._slice(progression_batches(**ci.DATA)[0], 0, 3)


def test_an_unequal_split_is_refused_before_any_rank_starts_and_bad_world_sizes_by_the_launcher():
    from ortlab.distributed.launcher import LaunchError

    with pytest.raises(ci.ReproError, match="over 3 ranks"):
        ci.global_losses(3)
    for bad in (0, "2", 2.0):
        with pytest.raises(LaunchError, match="world_size must be a positive int"):
            ci.global_losses(bad)

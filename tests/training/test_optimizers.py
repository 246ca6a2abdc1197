"""ortlab's optimizers against torch.optim (where torch has them) and LAMB against its paper;
the training loop's bookkeeping."""
import math

import numpy as np
import pytest
import torch

from ortlab import models
from ortlab.training import LAMB, SGD, Adam, AdamW, OptimizerError, TrainingError, global_norm, train


def _run(cls, kwargs, steps=6, seed=0):
    """Parameters after `steps` updates with a fixed sequence of random gradients."""
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter(torch.randn(5, 3, generator=g)), torch.nn.Parameter(torch.randn(4, generator=g))]
    optimizer = cls(params, **kwargs)
    for _ in range(steps):
        optimizer.zero_grad()
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()
    return [p.detach() for p in params]


@pytest.mark.parametrize("ours, theirs, kwargs", [
    (SGD, torch.optim.SGD, dict(lr=0.1)),
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9)),
    (SGD, torch.optim.SGD, dict(lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)),
    (Adam, torch.optim.Adam, dict(lr=0.01)),
    (Adam, torch.optim.Adam, dict(lr=0.01, betas=(0.8, 0.99), weight_decay=0.1)),
    (AdamW, torch.optim.AdamW, dict(lr=0.01)),
    (AdamW, torch.optim.AdamW, dict(lr=0.01, weight_decay=0.3, eps=1e-6)),
])
def test_equal_to_torch(ours, theirs, kwargs):
    for a, b in zip(_run(ours, kwargs), _run(theirs, kwargs)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _lamb_paper(w, grads, lr, b1, b2, eps, wd):
    """Algorithm 2 of You et al. 2019 (LAMB), in numpy, one layer, phi(z) = z."""
    m, v = np.zeros_like(w), np.zeros_like(w)
    for t, g in enumerate(grads, 1):
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        m_hat, v_hat = m / (1 - b1 ** t), v / (1 - b2 ** t)
        r = m_hat / (np.sqrt(v_hat) + eps)
        u = r + wd * w
        w_norm, u_norm = np.linalg.norm(w), np.linalg.norm(u)
        ratio = w_norm / u_norm if w_norm > 0 and u_norm > 0 else 1.0
        w = w - lr * ratio * u
    return w


@pytest.mark.parametrize("wd", [0.0, 0.01])
def test_lamb_follows_the_papers_update_rule(wd):
    rng = np.random.default_rng(0)
    w0 = rng.standard_normal((6, 4))
    grads = [rng.standard_normal((6, 4)) for _ in range(5)]
    p = torch.nn.Parameter(torch.tensor(w0))
    optimizer = LAMB([p], lr=0.05, betas=(0.9, 0.999), eps=1e-6, weight_decay=wd)
    for g in grads:
        p.grad = torch.tensor(g)
        optimizer.step()
    np.testing.assert_allclose(p.detach().numpy(), _lamb_paper(w0, grads, 0.05, 0.9, 0.999, 1e-6, wd),
                               rtol=1e-10)
    assert 0 < optimizer.state[p]["trust_ratio"]


def test_lamb_trust_ratio_is_one_for_a_zero_tensor():
    p = torch.nn.Parameter(torch.zeros(3))
    optimizer = LAMB([p], lr=0.1)
    p.grad = torch.ones(3)
    optimizer.step()
    assert optimizer.state[p]["trust_ratio"] == 1.0
    torch.testing.assert_close(p.detach(), torch.full((3,), -0.1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("cls, kwargs, words", [
    (SGD, dict(lr=-1), "need lr >= 0"), (SGD, dict(momentum=1.0), "momentum"),
    (Adam, dict(betas=(0.9, 1.0)), "betas must lie in"), (LAMB, dict(eps=-1), "eps >= 0")])
def test_bad_hyperparameters_are_explained(cls, kwargs, words):
    with pytest.raises(OptimizerError, match=words):
        cls([torch.nn.Parameter(torch.ones(2))], **kwargs)


# --- the loop ------------------------------------------------------------------------------------

def _mlp_run(**kwargs):
    torch.manual_seed(0)
    model = models.get("mlp", dropout=0.0)
    batches = [model.example_inputs(seed=s) for s in range(4)]
    optimizer = SGD(model.parameters(), lr=0.1)
    return train(model, batches, optimizer, steps=12, progress=False, **kwargs), model


def test_train_records_a_falling_loss_and_matches_a_hand_written_loop():
    history, _ = _mlp_run()
    torch.manual_seed(0)
    model = models.get("mlp", dropout=0.0)
    batches = [model.example_inputs(seed=s) for s in range(4)]
    optimizer, losses = torch.optim.SGD(model.parameters(), lr=0.1), []
    for step in range(12):
        optimizer.zero_grad()
        loss = model(*batches[step % 4])
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    np.testing.assert_allclose(history.losses, losses, rtol=1e-6)
    assert history.losses[-1] < history.losses[0]
    assert len(history.step_times) == 12 and history.median_step_time() > 0
    assert repr(history).startswith("History(12 steps, loss ")


def test_global_norm_is_what_torch_clips():
    model = models.get("mlp", dropout=0.0)
    model(*model.example_inputs()).backward()
    ours = global_norm(model.parameters())
    theirs = torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm=1e9)
    assert math.isclose(ours, float(theirs), rel_tol=1e-5)


def test_clipping_bounds_the_update_and_overflow_skips_the_step():
    clipped, _ = _mlp_run(clip_norm=1e-3)
    plain, _ = _mlp_run()
    assert clipped.grad_norms[0] == pytest.approx(plain.grad_norms[0])   # recorded before clipping
    assert abs(clipped.losses[-1] - clipped.losses[0]) < abs(plain.losses[-1] - plain.losses[0])
    overflow, model = _mlp_run(loss_scale=1e39)        # float32 overflows: inf gradients
    assert overflow.skipped == list(range(12))
    assert all(torch.isfinite(p).all() for p in model.parameters())


def test_on_step_sees_each_recorded_step_and_can_change_the_learning_rate():
    seen = []

    def halve_lr(step, history):
        seen.append((step, len(history.losses)))
        for group in optimizer.param_groups:
            group["lr"] *= 0.5

    torch.manual_seed(0)
    model = models.get("mlp", dropout=0.0)
    optimizer = SGD(model.parameters(), lr=0.1)
    train(model, [model.example_inputs()], optimizer, steps=3, progress=False, on_step=halve_lr)
    assert seen == [(0, 1), (1, 2), (2, 3)] and optimizer.param_groups[0]["lr"] == pytest.approx(0.0125)


@pytest.mark.parametrize("redraw_every", ["10", -1, None, True, float("nan")])
def test_a_redraw_interval_that_is_not_seconds_is_refused_before_any_step(redraw_every):
    model = models.get("mlp", dropout=0.0)
    with pytest.raises(TrainingError, match="redraw_every is the progress bar's seconds"):
        train(model, [model.example_inputs()], SGD(model.parameters(), lr=0.1), steps=1, redraw_every=redraw_every)


def test_a_progress_bar_that_redraws_seldom_still_counts_every_step(capsys):
    model = models.get("mlp", dropout=0.0)
    history = train(model, [model.example_inputs()], SGD(model.parameters(), lr=0.1), steps=3, redraw_every=60)
    assert len(history.losses) == 3 and "3/3" in capsys.readouterr().err


def test_train_step_is_the_loops_step_and_a_plain_step_on_non_finite_gradients():
    from ortlab.training import train_step

    history, looped = _mlp_run()
    torch.manual_seed(0)
    model = models.get("mlp", dropout=0.0)
    batches = [model.example_inputs(seed=s) for s in range(4)]
    optimizer = SGD(model.parameters(), lr=0.1)
    losses = [train_step(model, batches[k % 4], optimizer)[0].item() for k in range(12)]
    assert losses == history.losses
    assert all(torch.equal(p, q) for p, q in zip(model.parameters(), looped.parameters()))
    overflow, model = _mlp_run(loss_scale=1e39, skip_non_finite=False)   # steps anyway, as a plain loop
    assert overflow.skipped == [] and not all(torch.isfinite(p).all() for p in model.parameters())


def test_a_non_scalar_loss_is_explained():
    model = models.get("mlp", dropout=0.0)
    x, _ = model.example_inputs()
    with pytest.raises(TrainingError, match="must be a scalar"):
        train(model, [(x,)], SGD(model.parameters()), steps=1, progress=False)


def test_progressions_follow_their_rule_and_labels_are_the_next_token():
    from ortlab.training import progressions

    ids, labels = progressions(batch=6, seq=10, vocab=16, max_stride=3, seed=1)
    assert ids.shape == labels.shape == (6, 10) and ids.dtype == torch.int64
    torch.testing.assert_close(labels[:, :-1], ids[:, 1:])
    strides = (ids[:, 1] - ids[:, 0]) % 16
    assert ((ids[:, 2:] - ids[:, 1:-1]) % 16 == strides[:, None]).all() and (strides >= 1).all()
    with pytest.raises(Exception, match="need seq >= 2"):
        progressions(2, 1)


@pytest.mark.parametrize("losses, shape", [
    ([4.0 - 0.1 * k for k in range(20)], "decreasing"),
    ([4.0 + 0.001 * (k % 2) for k in range(20)], "plateau"),
    ([4.0 + 0.2 * k for k in range(20)], "diverging"),
    ([4.0 - 0.1 * k + (2.0 if k == 10 else 0.0) for k in range(20)], "spiky"),
    ([4.0] * 10 + [float("nan")] * 10, "not finite"),
])
def test_curve_shape(losses, shape):
    from ortlab.training import curve_shape

    assert curve_shape(losses) == shape


def test_curve_shape_needs_enough_points():
    from ortlab.training import curve_shape

    with pytest.raises(TrainingError, match="need at least 10"):
        curve_shape([1.0, 0.5])

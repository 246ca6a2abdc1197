"""Optimizers written out plainly: SGD (momentum), Adam, AdamW, LAMB.

Each is a torch.optim.Optimizer, so param groups, zero_grad and state_dict work as usual,
and each `step` is the update rule in a few lines of tensor maths, one parameter at a time.
ORT's counterparts: the training API's optimizer kernels
(orttraining/orttraining/training_ops/cpu/optimizer/sgd/sgd.cc, adamw/adamw.cc), LAMB in
orttraining/orttraining/training_ops/cuda/optimizer/lamb.cc, and FusedAdam's multi-tensor
apply in orttraining/orttraining/python/training/optim/fused_adam.py.
"""
import math
import numbers

import torch

from ortlab.errors import OrtlabError


class OptimizerError(OrtlabError):
    """An optimizer was given a value it cannot use (negative learning rate, betas outside [0, 1))."""


def _number(name, value, upper=None):
    """A hyperparameter as torch's optimizers take it: a real number (a 1-element tensor too), >= 0 and, with
    `upper`, < upper; and finite. torch.optim.Adam's checks (`not 0.0 <= lr`, ...) refuse NaN, which
    torch.optim.SGD's (`lr < 0.0`) lets through; both accept inf. Here NaN and inf are refused alike: either
    turns the parameters into NaN or inf at the first step, without an error."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise OptimizerError(f"{name} must be a number (a float such as 1e-3), not {type(value).__name__} {value!r}")
    if upper is not None and not 0 <= value < upper:
        raise OptimizerError(f"{name.split('[')[0]} must lie in [0, {upper}), got {name}={value}")
    if not value >= 0:
        raise OptimizerError(f"Invalid {name}: {value}; need {name} >= 0 (torch.optim.Adam raises ValueError for "
                             "a negative or NaN value)")
    if not math.isfinite(value):
        raise OptimizerError(f"Invalid {name}: {value}; need a finite {name} (torch accepts inf, but no step "
                             "means anything then: the parameters turn inf or NaN, or never move)")


def check_hyperparameters(lr, betas=(0.0, 0.0), eps=0.0, weight_decay=0.0, momentum=0.0):
    """torch's rules for lr, eps, weight_decay (>= 0) and betas (each in [0, 1)); momentum in [0, 1) here
    (torch only asks >= 0); every value a finite number (torch fails on lr="0.1" with a bare TypeError)."""
    _number("lr", lr)
    _number("eps", eps)
    _number("weight_decay", weight_decay)
    _number("momentum", momentum, upper=1)
    if isinstance(betas, (str, bytes)) or not isinstance(betas, (tuple, list)) or len(betas) != 2:
        raise OptimizerError(f"betas must be a pair (beta1, beta2) such as (0.9, 0.999), not {betas!r}")
    for k, beta in enumerate(betas):
        _number(f"betas[{k}]", beta, upper=1)


class _Plain(torch.optim.Optimizer):
    """Calls `update(p, grad, state, group)` for every parameter that has a gradient."""

    def __init__(self, params, defaults):
        try:
            super().__init__(params, defaults)
        except (TypeError, ValueError) as exc:  # torch's: an empty or non-iterable params
            raise OptimizerError(f"{type(self).__name__}'s params must be the parameters to train, e.g. "
                                 f"model.parameters() (or a list of param-group dicts): {exc}") from None

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    if p.grad.is_sparse:
                        raise OptimizerError(f"{type(self).__name__} does not take sparse gradients")
                    self.update(p, p.grad, self.state[p], group)
        return loss


class SGD(_Plain):
    """v = momentum·v + g (+ weight_decay·p in g); p -= lr·v (nesterov: p -= lr·(g + momentum·v))."""

    def __init__(self, params, lr=0.01, momentum=0.0, weight_decay=0.0, nesterov=False):
        check_hyperparameters(lr, weight_decay=weight_decay, momentum=momentum)
        if not isinstance(nesterov, bool):
            raise OptimizerError(f"nesterov takes True or False, not {nesterov!r}")
        if nesterov and momentum <= 0:  # torch.optim.SGD: "Nesterov momentum requires a momentum ..."
            raise OptimizerError("Nesterov momentum requires a momentum > 0 (as torch.optim.SGD); pass "
                                 "momentum=0.9, or nesterov=False")
        super().__init__(params, dict(lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov))

    def update(self, p, g, state, group):
        if group["weight_decay"]:
            g = g + group["weight_decay"] * p
        if group["momentum"]:
            if "velocity" not in state:
                state["velocity"] = g.clone()
            else:
                state["velocity"].mul_(group["momentum"]).add_(g)
            v = state["velocity"]
            g = g + group["momentum"] * v if group["nesterov"] else v
        p.sub_(group["lr"] * g)


class Adam(_Plain):
    """m = β1·m + (1-β1)·g, v = β2·v + (1-β2)·g², p -= lr·m̂ / (√v̂ + ε) with the bias corrections
    m̂ = m/(1-β1^t), v̂ = v/(1-β2^t). weight_decay adds λ·p to g (L2, as torch.optim.Adam)."""

    decoupled = False

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        check_hyperparameters(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def update(self, p, g, state, group):
        (b1, b2), lr, wd = group["betas"], group["lr"], group["weight_decay"]
        if wd and self.decoupled:
            p.mul_(1 - lr * wd)
        elif wd:
            g = g + wd * p
        m, v, t = adam_moments(state, g, b1, b2)
        denominator = v.sqrt() / math.sqrt(1 - b2 ** t) + group["eps"]
        p.sub_(lr / (1 - b1 ** t) * m / denominator)


class AdamW(Adam):
    """Adam with decoupled weight decay (Loshchilov & Hutter): p *= 1 - lr·λ, then the Adam step."""

    decoupled = True

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, lr, betas, eps, weight_decay)


def adam_moments(state, g, b1, b2):
    """Update and return (m, v, t): the first and second moments and the step count."""
    if not state:
        state.update(step=0, m=torch.zeros_like(g), v=torch.zeros_like(g))
    state["step"] += 1
    state["m"].mul_(b1).add_(g, alpha=1 - b1)
    state["v"].mul_(b2).addcmul_(g, g, value=1 - b2)
    return state["m"], state["v"], state["step"]


class LAMB(_Plain):
    """Layer-wise adaptive moments (You et al., 2019, Algorithm 2), one trust ratio per tensor:

    r = m̂ / (√v̂ + ε),  u = r + λ·p,  p -= lr · (‖p‖ / ‖u‖) · u,
    the ratio taken as 1 when either norm is 0.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.0):
        check_hyperparameters(lr, betas, eps, weight_decay)
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def update(self, p, g, state, group):
        (b1, b2), lr = group["betas"], group["lr"]
        m, v, t = adam_moments(state, g, b1, b2)
        r = (m / (1 - b1 ** t)) / ((v / (1 - b2 ** t)).sqrt() + group["eps"])
        u = r + group["weight_decay"] * p
        p_norm, u_norm = p.norm(), u.norm()
        trust = p_norm / u_norm if p_norm > 0 and u_norm > 0 else torch.ones((), dtype=p.dtype)
        state["trust_ratio"] = float(trust)
        p.sub_(lr * trust * u)


"""Megatron-style tensor parallelism checked across ranks: rank functions that train a few steps and return what
to compare with one process, and the table of results. The layers themselves are
ortlab/distributed/tensor_parallel.py.
"""
import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ortlab.viz.tables import Table, within
from ortlab.distributed.tensor_parallel import (causal_mask, ColumnParallelLinear, count_collectives, MLP,
                                                ParallelMLP, ParallelSelfAttention, RowParallelLinear,
                                                TensorParallelError)


# ---------------------------------------------------------------------------------------------
# Rank functions: train a few steps and return what to compare.


def _max_diff(a, b):
    return (a.detach() - b.detach()).abs().max().item()


def _rank_slice(full, rank, world_size, dim):
    return full.detach().chunk(world_size, dim=dim)[rank]


def _train(model, data, target, steps, lr):
    """SGD on a mean-squared error: the losses and the outputs and grads of the first step."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses, first = [], None
    for _ in range(steps):
        optimizer.zero_grad()
        x = data.clone().requires_grad_(True)
        out = model(x)
        loss = F.mse_loss(out, target)
        loss.backward()
        if first is None:
            first = {"out": out.detach().clone(), "x_grad": x.grad.clone(),
                     "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters()}}
        optimizer.step()
        losses.append(loss.item())
    return losses, first


def _mlp_part(rank, world_size, d_model, d_hidden, steps, lr, seed):
    torch.manual_seed(seed)
    reference = MLP(d_model, d_hidden)
    data, target = torch.randn(4, 6, d_model), torch.randn(4, 6, d_model)
    parallel = ParallelMLP(reference, rank, world_size)
    dtensor = _dtensor_mlp(reference, world_size)
    ref_losses, ref = _train(reference, data, target, steps, lr)
    par_losses, par = _train(parallel, data, target, steps, lr)
    dt_losses, dt = _train(dtensor, data, target, steps, lr)
    pairs = {"fc1.weight": 0, "fc1.bias": 0, "fc2.weight": 1, "fc2.bias": None}

    def local(full, name):
        dim = pairs[name]
        return full.detach() if dim is None else _rank_slice(full, rank, world_size, dim)

    ref_params, dt_params = dict(reference.named_parameters()), dict(dtensor.named_parameters())
    return {
        "losses": {"reference": ref_losses, "megatron": par_losses, "dtensor": dt_losses},
        "out": _max_diff(par["out"], ref["out"]), "x_grad": _max_diff(par["x_grad"], ref["x_grad"]),
        "grads": {n: _max_diff(g, local(ref["grads"][n], n)) for n, g in par["grads"].items()},
        "weights": {n: _max_diff(p, local(ref_params[n], n)) for n, p in parallel.named_parameters()},
        "dtensor_out": _max_diff(dt["out"], par["out"]),
        "dtensor_weights": {n: _max_diff(local(dt_params[n].full_tensor(), n), p)
                            for n, p in parallel.named_parameters()},
        "dtensor_local_shapes": {n: tuple(p.to_local().shape) for n, p in dt_params.items()},
        "local_shapes": {n: tuple(p.shape) for n, p in parallel.named_parameters()},
        "counts": _mlp_counts(parallel, dtensor, data),
    }


def _dtensor_mlp(reference, world_size):
    """A copy of the reference MLP parallelized by DTensor: fc1 ColwiseParallel, fc2 RowwiseParallel."""
    from torch.distributed.device_mesh import init_device_mesh  # heavy: torch
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module  # heavy: torch

    mesh = init_device_mesh("cpu", (world_size,))
    plan = {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()}
    return parallelize_module(copy.deepcopy(reference), mesh, plan)


def _count_calls(run):
    """Count the torch.distributed.all_reduce calls `run()` makes (patching the module attribute)."""
    calls, original = [], dist.all_reduce

    def counting(tensor, *args, **kwargs):
        calls.append(tensor.numel())
        return original(tensor, *args, **kwargs)

    dist.all_reduce = counting
    try:
        run()
    finally:
        dist.all_reduce = original
    return len(calls)


def _mlp_counts(parallel, dtensor, data):
    """All-reduces per forward and backward: our counter, dist.all_reduce calls, DTensor's CommDebugMode."""
    from torch.distributed.tensor.debug import CommDebugMode  # heavy: torch

    result = {}
    for needs_grad in (True, False):
        x, outs = data.clone().requires_grad_(needs_grad), []
        with count_collectives() as counter:
            forward_calls = _count_calls(lambda: outs.append(parallel(x)))
            backward_calls = _count_calls(lambda: outs[0].sum().backward())
        result["input_grad" if needs_grad else "no_input_grad"] = {
            "forward": counter.count("all_reduce", "forward"),
            "backward": counter.count("all_reduce", "backward"),
            "forward_dist_calls": forward_calls, "backward_dist_calls": backward_calls}
    x = data.clone().requires_grad_(True)
    mode = CommDebugMode()
    with mode:
        dtensor(x).sum().backward()
    result["dtensor"] = {str(op): n for op, n in mode.get_comm_counts().items()}
    parallel.zero_grad()
    dtensor.zero_grad()
    return result


def _attention_part(rank, world_size, d_model, heads, steps, lr, seed):
    torch.manual_seed(seed + 1)
    reference = nn.MultiheadAttention(d_model, heads, batch_first=True)
    length = 5
    data, target = torch.randn(3, length, d_model), torch.randn(3, length, d_model)
    mask = causal_mask(length)

    class Reference(nn.Module):
        def __init__(self):
            super().__init__()
            self.attention = reference

        def forward(self, x):
            return self.attention(x, x, x, attn_mask=mask, need_weights=False)[0]

    wrapped = Reference()
    parallel = ParallelSelfAttention(reference, rank, world_size, causal=True)
    before = {"in_proj_weight": reference.in_proj_weight.detach().clone()}
    ref_losses, ref = _train(wrapped, data, target, steps, lr)
    with count_collectives() as counter:
        par_losses, par = _train(parallel, data, target, steps, lr)
    d, local = d_model, d_model // world_size
    rows = torch.cat([torch.arange(p * d + rank * local, p * d + (rank + 1) * local) for p in range(3)])
    expected = {
        "qkv.weight": lambda t: t["attention.in_proj_weight"][rows],
        "qkv.bias": lambda t: t["attention.in_proj_bias"][rows],
        "out.weight": lambda t: _rank_slice(t["attention.out_proj.weight"], rank, world_size, 1),
        "out.bias": lambda t: t["attention.out_proj.bias"],
    }
    ref_params = {n: p.detach() for n, p in wrapped.named_parameters()}
    return {
        "losses": {"reference": ref_losses, "megatron": par_losses},
        "out": _max_diff(par["out"], ref["out"]), "x_grad": _max_diff(par["x_grad"], ref["x_grad"]),
        "grads": {n: _max_diff(par["grads"][n], f(ref["grads"])) for n, f in expected.items()},
        "weights": {n: _max_diff(dict(parallel.named_parameters())[n], f(ref_params))
                    for n, f in expected.items()},
        "moved": _max_diff(reference.in_proj_weight, before["in_proj_weight"]),
        "all_reduces_per_step": {"forward": counter.count("all_reduce", "forward") / steps,
                                 "backward": counter.count("all_reduce", "backward") / steps},
        "repr": repr(parallel),
    }


def _gather_scatter_part(rank, world_size, d_model, d_hidden, seed):
    """Column-parallel with gather_output=True feeding a row-parallel that splits its own (full) input."""
    torch.manual_seed(seed + 2)
    reference = MLP(d_model, d_hidden)
    column = ColumnParallelLinear(reference.fc1, rank, world_size, gather_output=True)
    row = RowParallelLinear(reference.fc2, rank, world_size, input_is_parallel=False)
    data = torch.randn(4, d_model)
    x_ref, x = data.clone().requires_grad_(True), data.clone().requires_grad_(True)
    hidden_ref = reference.fc1(x_ref)
    out_ref = reference.fc2(hidden_ref)
    out_ref.square().sum().backward()
    with count_collectives() as counter:
        hidden = column(x)
        out = row(hidden)
        forward = {op: counter.count(op, "forward") for op in ("all_reduce", "all_gather")}
        out.square().sum().backward()

    def mine(full, dim):
        return _rank_slice(full, rank, world_size, dim)

    return {
        "hidden": _max_diff(hidden, hidden_ref), "out": _max_diff(out, out_ref),
        "x_grad": _max_diff(x.grad, x_ref.grad),
        "fc1_grad": _max_diff(column.weight.grad, mine(reference.fc1.weight.grad, 0)),
        "fc1_bias_grad": _max_diff(column.bias.grad, mine(reference.fc1.bias.grad, 0)),
        "fc2_grad": _max_diff(row.weight.grad, mine(reference.fc2.weight.grad, 1)),
        "fc2_bias_grad": _max_diff(row.bias.grad, reference.fc2.bias.grad),
        "forward": forward,
        "backward": {op: counter.count(op, "backward") for op in ("all_reduce", "all_gather")},
    }


def tp_check(rank, world_size, d_model=8, d_hidden=16, heads=4, steps=3, lr=0.1, seed=0):
    """Rank function: train a Megatron MLP and attention block next to one-process and DTensor copies.

    Every rank builds the same full models (same seed), trains the one-process reference itself, its
    Megatron shard and (for the MLP) DTensor's parallelize_module copy on the same data, and returns the
    largest differences of outputs, input gradients, parameter gradients and updated weights (compared on
    this rank's slice), the losses, and the collectives counted per forward and backward; and the same for
    a ColumnParallelLinear(gather_output=True) feeding a RowParallelLinear(input_is_parallel=False).
    """
    return {"rank": rank, "world_size": world_size,
            "mlp": _mlp_part(rank, world_size, d_model, d_hidden, steps, lr, seed),
            "attention": _attention_part(rank, world_size, d_model, heads, steps, lr, seed),
            "gather_scatter": _gather_scatter_part(rank, world_size, d_model, d_hidden, seed)}


# ---------------------------------------------------------------------------------------------
# The launch's results as one table.



def _worst(results, part, key):
    """The largest difference `key` of `part` over ranks (a number, or the max of a {name: number})."""
    values = [r[part][key] for r in results]
    return max(max(v.values()) if isinstance(v, dict) else v for v in values)


def check_table(results):
    """A Table from tp_check's results (one per rank): for the MLP and the attention block, the largest
    difference from the one-process model (output, input gradient, parameter gradients, weights after
    the steps, over every rank's slice) and the all-reduces per forward and backward; the MLP also
    against DTensor's ColwiseParallel/RowwiseParallel."""
    if not isinstance(results, (list, tuple)) or not results or not all("mlp" in r for r in results):
        raise TensorParallelError("check_table takes the list launch(tp_check, N) returned")
    mlp_counts = results[0]["mlp"]["counts"]["input_grad"]
    attention_counts = results[0]["attention"]["all_reduces_per_step"]
    rows = [("ParallelMLP", *(within(_worst(results, "mlp", k)) for k in ("out", "x_grad", "grads", "weights")),
             f"{mlp_counts['forward']} / {mlp_counts['backward']}",
             f"out {within(_worst(results, 'mlp', 'dtensor_out'))}, "
             f"weights {within(_worst(results, 'mlp', 'dtensor_weights'))}"),
            ("ParallelSelfAttention",
             *(within(_worst(results, "attention", k)) for k in ("out", "x_grad", "grads", "weights")),
             f"{attention_counts['forward']:g} / {attention_counts['backward']:g}", "")]
    return Table(("layer", "output", "input grad", "param grads", "weights after steps",
                  "all-reduces fwd / bwd", "vs DTensor"), rows)

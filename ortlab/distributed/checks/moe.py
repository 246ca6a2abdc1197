"""Mixture of experts checked across ranks: the rank function comparing DistributedMoE with one process for each
configuration, and the table of results. The layers themselves are ortlab/distributed/moe.py.
"""
import torch
import torch.distributed as dist
from torch import nn

from ortlab.patch import patched
from ortlab.viz.tables import Table, within
from ortlab.distributed.moe import DistributedMoE, MoE, MoEError


# ---------------------------------------------------------------------------------------------
# Rank function.

CONFIGS = ({"num_experts": 2, "k": 1, "capacity_factor": 1.0},
           {"num_experts": 4, "k": 2, "capacity_factor": 1.0},
           # a router of zeros: every token ties, top-k picks expert 0, rank 1 receives nothing at first
           {"num_experts": 2, "k": 1, "capacity_factor": 1.0, "zero_router": True})


def _batch(world_size, tokens, d_model, seed):
    """Every rank's tokens and targets (the same on every rank), skewed per rank so routing differs."""
    generator = torch.Generator().manual_seed(seed)
    data = torch.randn(world_size, tokens, d_model, generator=generator)
    data += torch.arange(world_size).reshape(-1, 1, 1) * torch.linspace(-1, 1, d_model)
    return data, torch.randn(world_size, tokens, d_model, generator=generator)


def _loss(out, target, aux, total_tokens, world_size, aux_weight):
    return ((out - target) ** 2).sum() / total_tokens + aux_weight * aux / world_size


def _max_diff(a, b):
    return (a.detach() - b.detach()).abs().max().item() if a.numel() else 0.0


def _reference_step(moe, data, target, aux_weight):
    """One-process step: each rank's tokens routed as its own group; grads of the summed loss."""
    world_size, tokens = data.shape[:2]
    x = data.clone().requires_grad_(True)
    outs, routings, loss = [], [], 0.0
    for src in range(world_size):
        outs.append(moe(x[src]))
        routings.append(moe.last_routing)
        loss = loss + _loss(outs[-1], target[src], moe.last_routing.aux_loss, world_size * tokens, world_size,
                            aux_weight)
    loss.backward()
    return torch.stack(outs), x.grad, routings, loss.item()


def _counting_all_to_all(original, calls):
    """A stand-in for dist.all_to_all_single that records the rows each call sends, then calls it."""
    def counting(output, tensor, *args, **kwargs):
        calls.append(tensor.shape[0])
        return original(output, tensor, *args, **kwargs)

    return counting


def _distributed_step(layer, data, target, aux_weight):
    """One expert-parallel step on this rank's group; counts the all_to_all_single calls each way."""
    world_size, tokens = data.shape[:2]
    x = data[layer.rank].clone().requires_grad_(True)
    forward_calls, backward_calls = [], []
    original = dist.all_to_all_single
    with patched(dist, "all_to_all_single", _counting_all_to_all(original, forward_calls)):
        out = layer(x)
        loss = _loss(out, target[layer.rank], layer.last_routing.aux_loss, world_size * tokens, world_size,
                     aux_weight)
    with patched(dist, "all_to_all_single", _counting_all_to_all(original, backward_calls)):
        loss.backward()
    layer.sync_router_grads()
    total = torch.tensor([loss.item()])
    dist.all_reduce(total)
    return out, x.grad, total.item(), {"forward": len(forward_calls), "backward": len(backward_calls)}


def _compare(layer, reference, prefix):
    """Largest differences of the local layer's tensors (`prefix` 'grad' or 'data') from the reference's."""
    def value(p):
        return p.grad if prefix == "grad" else p

    diffs = {"router": _max_diff(value(layer.router.weight), value(reference.router.weight))}
    for i, expert in enumerate(layer.experts):
        full = reference.experts[layer.first_expert + i]
        for (name, p), q in zip(expert.named_parameters(), full.parameters()):
            diffs[f"experts.{layer.first_expert + i}.{name}"] = _max_diff(value(p), value(q))
    return diffs


def _check_config(rank, world_size, config, d_model, d_hidden, tokens, steps, lr, seed, aux_weight):
    torch.manual_seed(seed)
    settings = {key: value for key, value in config.items() if key != "zero_router"}
    reference = MoE(d_model, d_hidden, **settings)
    if config.get("zero_router"):
        nn.init.zeros_(reference.router.weight)
    layer = DistributedMoE(reference, rank, world_size)
    data, target = _batch(world_size, tokens, d_model, seed)
    ref_opt = torch.optim.SGD(reference.parameters(), lr=lr)
    opt = torch.optim.SGD(layer.parameters(), lr=lr)
    record = {"config": dict(config), "steps": []}
    local = range(layer.first_expert, layer.first_expert + layer.local_experts)
    for step in range(steps):
        ref_opt.zero_grad()
        opt.zero_grad()
        ref_out, ref_x_grad, routings, ref_loss = _reference_step(reference, data, target, aux_weight)
        out, x_grad, loss, calls = _distributed_step(layer, data, target, aux_weight)
        mine = routings[rank]
        record["steps"].append({
            "loss": loss, "reference_loss": ref_loss,
            "out": _max_diff(out, ref_out[rank]), "x_grad": _max_diff(x_grad, ref_x_grad[rank]),
            "grads": _compare(layer, reference, "grad"),
            "tokens_per_expert": layer.last_routing.tokens_per_expert(),
            "reference_tokens_per_expert": mine.tokens_per_expert(),
            "wanted_per_expert": layer.last_routing.wanted_per_expert(),
            "dropped": layer.last_routing.dropped, "reference_dropped": mine.dropped,
            "dropped_tokens": layer.last_routing.dropped_tokens, "capacity": layer.last_routing.capacity,
            "exchange": dict(layer.last_exchange), "all_to_all_calls": calls,
            "reference_received": [sum(r.tokens_per_expert()[e] for r in routings) for e in local],
        })
        ref_opt.step()
        opt.step()
    record["weights"] = _compare(layer, reference, "data")
    record["routing"] = {"tokens_per_expert": record["steps"][0]["tokens_per_expert"],
                         "dropped": record["steps"][0]["dropped"]}
    record["repr"] = repr(layer)
    return record


def moe_check(rank, world_size, configs=CONFIGS, d_model=8, d_hidden=16, tokens=12, steps=2, lr=0.1, seed=0,
              aux_weight=0.01):
    """Rank function: train the expert-parallel MoE next to the one-process MoE on the same tokens.

    For each config (num_experts, k, capacity_factor; zero_router=True starts from a router of zeros, so
    every token goes to expert 0 and some split sizes are 0) every rank builds the same reference MoE and batch
    (world_size groups of `tokens` tokens), trains the reference on all groups and its DistributedMoE on
    group `rank`, and returns per step the largest differences of outputs, input gradients and parameter
    gradients (router all-reduced, local experts), tokens per expert, dropped assignments and the
    all_to_all split sizes; then the differences of the updated weights.
    """
    return [_check_config(rank, world_size, config, d_model, d_hidden, tokens, steps, lr, seed, aux_weight)
            for config in configs]


# ---------------------------------------------------------------------------------------------
# The launch's results as one table.



def _config_name(config):
    extra = ", router of zeros" if config.get("zero_router") else ""
    return f"{config['num_experts']} experts, top-{config['k']}, capacity x{config['capacity_factor']:g}{extra}"


def check_table(results):
    """A Table from moe_check's results (one list of per-setting records per rank): for each setting, the
    largest difference from the one-process MoE over ranks and steps (output, input gradient, parameter
    gradients, weights after training), whether tokens per expert and drops equal the reference's, and
    what rank 0 sent to each rank in the first step (the uneven all_to_all_single splits)."""
    if not isinstance(results, (list, tuple)) or not results or not all(isinstance(r, list) for r in results):
        raise MoEError("check_table takes the list launch(moe_check, N) returned")
    rows = []
    for index, record in enumerate(results[0]):
        per_rank = [r[index] for r in results]
        steps = [s for rec in per_rank for s in rec["steps"]]
        same_routing = all(s["tokens_per_expert"] == s["reference_tokens_per_expert"]
                           and s["dropped"] == s["reference_dropped"] for s in steps)
        rows.append((_config_name(record["config"]),
                     within(max(s["out"] for s in steps)), within(max(s["x_grad"] for s in steps)),
                     within(max(max(s["grads"].values()) for s in steps)),
                     within(max(max(rec["weights"].values()) for rec in per_rank)),
                     "yes" if same_routing else "NO",
                     str(record["steps"][0]["exchange"]["input_splits"])))
    return Table(("setting", "output", "input grad", "grads", "weights after", "routing equal",
                  "rank 0 sends (step 1)"), rows)

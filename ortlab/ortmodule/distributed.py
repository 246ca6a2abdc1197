"""ONNX Runtime's side of distributed training: ORTModule with DDP, and ORT's load-balancing sampler.

1. Wrap order. `DDP(ORTModule(model))` is right: DDP sees ORTModule as an ordinary module, its
   reducer's hooks fire on the gradients ORT's backward hands to autograd, and it all-reduces them.
   `ORTModule(DDP(model))` runs without an error and is wrong: ORTModule exports DDP's forward into an
   ONNX graph and from then on runs that graph, so DDP.forward (which arms the reducer for each
   backward: `prepare_for_backward`) never runs again and no gradient is all-reduced; each rank trains
   on its own data and the ranks' parameters drift apart (measured: each rank's parameters are those
   of SGD on its own batch alone). Wrap ORTModule first, then DDP (or DeepSpeed).
   `wrap_order_job` trains the three set-ups on real ranks and returns per-rank losses and parameters.
2. `LoadBalancingDistributedSampler` (orttraining/orttraining/python/training/utils/data/sampler.py,
   adapted from Bagua): sorts the dataset by a complexity function (e.g. a sequence's length) and deals
   it to the ranks round-robin, so the samples the ranks get at the same step have similar cost. ORT
   1.19.2's sampler fails on its second iteration (`if not self.sample_complexities:` on the numpy array
   it cached the first time: `ValueError: The truth value of an array with more than one element is
   ambiguous`). `FixedLoadBalancingDistributedSampler` resets the cache before each pass.

onnxruntime.training takes seconds to import: it is imported on first use, not with this module.
"""
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ortlab.env import quiet_import
from ortlab.distributed.group import rank_and_world_size
from ortlab.errors import OrtlabError
from ortlab.viz.tables import Table

WRAP_ORDERS = ("ddp", "ddp_ortmodule", "ortmodule_ddp")
WRAP_LABELS = {"ddp": "DDP(model)", "ddp_ortmodule": "DDP(ORTModule(model))",
               "ortmodule_ddp": "ORTModule(DDP(model))"}
SAMPLER_MODULE = "onnxruntime.training.utils.data"


class OrtDistributedError(OrtlabError):
    """A distributed ORT helper was given something it cannot use."""


# ---------------------------------------------------------------------------------------------
# 1. DDP and ORTModule: the wrap order.


def make_model(seed=0, n_in=4, hidden=8, n_out=2):
    """A small MLP Linear(n_in, hidden) -> Tanh -> Linear(hidden, n_out), built from `seed`."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(n_in, hidden), torch.nn.Tanh(), torch.nn.Linear(hidden, n_out))


def rank_batch(rank, seed=0, batch=4, n_in=4, n_out=2):
    """Rank `rank`'s (inputs, targets): different data on every rank, as data parallelism has."""
    generator = torch.Generator().manual_seed(seed + 100 * (rank + 1))
    return torch.randn(batch, n_in, generator=generator), torch.randn(batch, n_out, generator=generator)


def _wrap(order, model):
    """The module to train for `order`: DDP(model), DDP(ORTModule(model)) or ORTModule(DDP(model))."""
    from torch.nn.parallel import DistributedDataParallel as DDP  # heavy: torch

    from ortlab.ortmodule.driver import ortmodule  # lazy: the driver takes 1.5 s to import

    if order == "ddp":
        return DDP(model)
    if order == "ddp_ortmodule":
        return DDP(ortmodule(model))
    return ortmodule(DDP(model))


def _ort_fell_back(wrapped):
    """True when the ORTModule inside `wrapped` (either order) handed its work back to PyTorch."""
    from ortlab.ortmodule.driver import fell_back  # lazy: the driver takes 1.5 s to import

    inner = getattr(wrapped, "module", wrapped)
    for candidate in (wrapped, inner):
        if hasattr(candidate, "_torch_module"):
            return fell_back(candidate)
    return None


def train_wrapped(order, rank, seed=0, steps=3, lr=0.1, batch=4):
    """Train `make_model(seed)` wrapped as `order` for `steps` SGD steps on this rank's batch.

    Returns {'losses': loss per step (before the step), 'params': {name: tensor} after the last step,
    'fell_back': whether ORTModule fell back to PyTorch (None for plain DDP)}."""
    if order not in WRAP_ORDERS:
        raise OrtDistributedError(f"order must be one of {WRAP_ORDERS}, got {order!r}")
    model = make_model(seed)
    x, y = rank_batch(rank, seed, batch)
    wrapped = _wrap(order, model)
    optimizer = torch.optim.SGD(wrapped.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = F.mse_loss(wrapped(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    params = {name: p.detach().clone() for name, p in model.named_parameters()}
    return {"losses": losses, "params": params, "fell_back": _ort_fell_back(wrapped)}


def wrap_order_job(rank, world_size, seed=0, steps=3, lr=0.1, batch=4, orders=WRAP_ORDERS):
    """Rank function: train each wrap order in `orders` (fresh model each) with fallback disabled and
    ORT's logs captured. Returns {order: train_wrapped's result} plus 'log_lines' (ORT's lines kept quiet)."""
    from ortlab.ortmodule.driver import captured_logs, ortmodule_env  # lazy: the driver takes 1.5 s to import

    quiet_import("onnxruntime.training.ortmodule")
    found = {}
    with ortmodule_env(FALLBACK_POLICY="FALLBACK_DISABLE"), captured_logs() as log, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for order in orders:
            found[order] = train_wrapped(order, rank, seed, steps, lr, batch)
            dist.barrier()
    found["log_lines"] = list(log)
    return found


def one_process_ddp(world_size=2, seed=0, steps=3, lr=0.1, batch=4):
    """What DDP must give, in one process: SGD on all ranks' batches at once (mean loss), each rank's
    loss recorded. Returns {'losses': [[rank 0's loss per step], ...], 'params': {name: tensor}}."""
    model = make_model(seed)
    batches = [rank_batch(r, seed, batch) for r in range(world_size)]
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    losses = [[] for _ in range(world_size)]
    for _ in range(steps):
        with torch.no_grad():
            for r, (xr, yr) in enumerate(batches):
                losses[r].append(F.mse_loss(model(xr), yr).item())
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return {"losses": losses, "params": {n: p.detach().clone() for n, p in model.named_parameters()}}


def largest_difference(first, second):
    """The largest absolute difference between two {name: tensor} dicts with the same names."""
    if sorted(first) != sorted(second):
        raise OrtDistributedError(f"the two parameter sets name different tensors: {sorted(first)} vs "
                                  f"{sorted(second)}")
    return max((first[k] - second[k]).abs().max().item() for k in first)


def wrap_order_table(results, reference=None):
    """One row per wrap order: each rank's first and last loss, the ranks' parameter difference and,
    given one_process_ddp's result, the largest difference from one process."""
    rows = []
    for order in (o for o in WRAP_ORDERS if o in results[0]):
        per_rank = [r[order] for r in results]
        row = {"wrapping": WRAP_LABELS[order]}
        for rank, found in enumerate(per_rank):
            row[f"rank {rank} loss first -> last"] = f"{found['losses'][0]:.4f} -> {found['losses'][-1]:.4f}"
        row["params rank 0 vs 1"] = f"{largest_difference(per_rank[0]['params'], per_rank[-1]['params']):.1e}"
        if reference is not None:
            difference = largest_difference(per_rank[0]["params"], reference["params"])
            row["params vs one process"] = f"{difference:.1e}"
        rows.append(row)
    return Table.from_dicts(rows)


# ---------------------------------------------------------------------------------------------
# 2. ORT's load-balancing sampler.


def _sampler_module():
    return quiet_import(SAMPLER_MODULE)


def _fixed_class():
    """Build FixedLoadBalancingDistributedSampler (a subclass of ORT's, so ORT's batch sampler takes it)."""
    base = _sampler_module().LoadBalancingDistributedSampler

    class FixedLoadBalancingDistributedSampler(base):
        """ORT's LoadBalancingDistributedSampler that can be iterated more than once (every epoch).

        ORT 1.19.2 caches the complexities in a numpy array after the first pass, then tests it with
        `if not self.sample_complexities:`, which raises ValueError for an array of more than one
        element. This subclass resets the cache to None before each pass (so complexity_fn runs once
        per pass); everything else is ORT's own code."""

        def _sort_shard_and_shuffle_dataset(self):
            self.sample_complexities = None
            return super()._sort_shard_and_shuffle_dataset()

        def __repr__(self):
            return (f"FixedLoadBalancingDistributedSampler({len(self.dataset)} samples, rank {self.rank} of "
                    f"{self.world_size}, {self.num_samples} per rank, shuffle={self.shuffle}, "
                    f"group_size={self.group_size}, epoch={self.epoch})")

    FixedLoadBalancingDistributedSampler.__module__ = __name__  # picklable as ortlab.ortmodule.distributed.<name>
    FixedLoadBalancingDistributedSampler.__qualname__ = "FixedLoadBalancingDistributedSampler"
    return FixedLoadBalancingDistributedSampler


def __getattr__(name):
    """Build FixedLoadBalancingDistributedSampler on first use (importing ORT's training package)."""
    if name == "FixedLoadBalancingDistributedSampler":
        if name not in globals():
            globals()[name] = _fixed_class()
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def fixed_sampler_class():
    """FixedLoadBalancingDistributedSampler (built once, on first use)."""
    return __getattr__("FixedLoadBalancingDistributedSampler")


def _check_world(world_size, rank):
    rank, world_size = rank_and_world_size(
        rank, world_size, OrtDistributedError,
        hint="run inside a process group (ORT's sampler reads them from the default process group)")
    return world_size, rank


def load_balancing_sampler(dataset, complexity_fn, world_size=None, rank=None, fixed=True, **options):
    """ORT's LoadBalancingDistributedSampler over `dataset` (the fixed subclass unless fixed=False).

    `options` are ORT's: shuffle (True), group_size (None), seed (0), drop_last (False), random_level (0).
    ORT calls the number of ranks `world_size` (torch's DistributedSampler calls it num_replicas)."""
    if "num_replicas" in options:
        raise OrtDistributedError("ORT's LoadBalancingDistributedSampler has no num_replicas (that is "
                                  "torch's DistributedSampler's name): pass world_size= instead")
    known = {"shuffle", "group_size", "seed", "drop_last", "random_level"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise OrtDistributedError(f"unknown option(s) {unknown}: ORT's sampler takes {sorted(known)}")
    if not callable(complexity_fn):
        raise OrtDistributedError(f"complexity_fn must be a function sample -> int (e.g. len), "
                                  f"got {type(complexity_fn).__name__}")
    try:
        size = len(dataset)
    except TypeError:
        raise OrtDistributedError(f"dataset must be map-style (len and indexing), got "
                                  f"{type(dataset).__name__}") from None
    if size == 0:
        raise OrtDistributedError("dataset is empty: the sampler needs at least one sample")
    world_size, rank = _check_world(world_size, rank)
    cls = fixed_sampler_class() if fixed else _sampler_module().LoadBalancingDistributedSampler
    return cls(dataset, complexity_fn, world_size=world_size, rank=rank, **options)


def token_budget_batches(lengths, budget):
    """A batch_fn for ORT's batch sampler: cut a rank's indices, in order, into batches whose summed
    lengths stay within `budget` (a sample longer than the budget gets a batch of its own)."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise OrtDistributedError(f"budget must be a positive int (a sum of lengths), got {budget!r}")

    def batch_fn(indices):
        batches, current, used = [], [], 0
        for index in indices:
            if current and used + lengths[index] > budget:
                batches.append(current)
                current, used = [], 0
            current.append(index)
            used += lengths[index]
        return batches + ([current] if current else [])

    return batch_fn


def load_balancing_batch_sampler(sampler, batch_fn, drop_last=False):
    """ORT's LoadBalancingDistributedBatchSampler over a (fixed) load-balancing sampler: variable-size
    batches from batch_fn, every rank padded (or cut, drop_last) to the same number of batches."""
    data = _sampler_module()
    if not isinstance(sampler, data.LoadBalancingDistributedSampler):
        raise OrtDistributedError(f"sampler must be a LoadBalancingDistributedSampler (see "
                                  f"load_balancing_sampler), got {type(sampler).__name__}")
    return data.LoadBalancingDistributedBatchSampler(sampler, batch_fn, drop_last=drop_last)


def second_epoch_error(dataset, complexity_fn, world_size=2, rank=0):
    """Iterate ORT's own sampler twice; returns the exception the second pass raises (None if none)."""
    sampler = load_balancing_sampler(dataset, complexity_fn, world_size, rank, fixed=False)
    list(sampler)
    sampler.set_epoch(1)
    try:
        list(sampler)
    except ValueError as exc:
        return exc
    return None


@dataclass
class RankLoad:
    """What one rank gets in one epoch from one sampler: indices, their lengths, the total."""

    sampler: str
    epoch: int
    rank: int
    indices: list
    lengths: list

    @property
    def total(self):
        """The summed length of the rank's samples (its work for the epoch)."""
        return sum(self.lengths)

    def __repr__(self):
        return f"RankLoad({self.sampler}, epoch {self.epoch}, rank {self.rank}, total {self.total})"


def _torch_sampler(dataset, world_size, rank, shuffle, seed):
    from torch.utils.data import DistributedSampler  # heavy: torch

    return DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=shuffle, seed=seed)


def rank_loads(lengths, world_size=2, epochs=2, shuffle=True, seed=0):
    """Per epoch and rank, what torch's DistributedSampler and ORT's (fixed) load-balancing sampler
    hand out on a dataset whose sample i has length lengths[i] (complexity_fn = the length)."""
    lengths = list(lengths)
    if not lengths or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in lengths):
        raise OrtDistributedError("lengths must be a non-empty list of non-negative ints (one per sample)")
    found = []
    for rank in range(world_size):
        samplers = {"torch DistributedSampler": _torch_sampler(lengths, world_size, rank, shuffle, seed),
                    "ORT LoadBalancing": load_balancing_sampler(lengths, int, world_size, rank,
                                                                shuffle=shuffle, seed=seed)}
        for name, sampler in samplers.items():
            for epoch in range(epochs):
                sampler.set_epoch(epoch)
                indices = list(sampler)
                found.append(RankLoad(name, epoch, rank, indices, [lengths[i] for i in indices]))
    return found


def step_cost(loads):
    """The time a synchronous job spends over an epoch: at each step every rank waits for the longest
    sample of that step, so the cost is the sum over steps of the largest length across ranks."""
    return sum(max(step) for step in zip(*(load.lengths for load in loads)))


def workload_table(lengths, world_size=2, epochs=2, shuffle=True, seed=0):
    """One row per sampler and epoch: each rank's summed length, the spread between ranks, and the step
    cost (sum over steps of the longest sample of the step) against the ideal (all lengths / ranks)."""
    loads = rank_loads(lengths, world_size, epochs, shuffle, seed)
    rows = []
    for name in dict.fromkeys(load.sampler for load in loads):
        for epoch in range(epochs):
            group = sorted((x for x in loads if x.sampler == name and x.epoch == epoch), key=lambda x: x.rank)
            row = {"sampler": name, "epoch": epoch}
            row.update({f"rank {x.rank} total": x.total for x in group})
            totals = [x.total for x in group]
            row["max - min"] = max(totals) - min(totals)
            row["step cost"] = step_cost(group)
            row["ideal"] = f"{sum(lengths) / world_size:g}"
            rows.append(row)
    return Table.from_dicts(rows)

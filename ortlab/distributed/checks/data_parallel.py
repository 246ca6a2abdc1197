"""DistributedDataParallel checked across ranks: rank functions (ortlab's DDP against torch's, no_sync, hostile
inputs) with the one-process reference, and the table of results. The wrapper itself is
ortlab/distributed/data_parallel.py.
"""
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ortlab.distributed.checks.collectives import error_texts
from ortlab.viz.tables import Table, within
from ortlab.distributed.data_parallel import bucket_layout, DataParallelError, DistributedDataParallel


# ---------------------------------------------------------------------------------------------
# Rank functions and the one-process reference.


class MLP(nn.Module):
    """A small three-layer perceptron (fc1, tanh, fc2, tanh, fc3) for the checks."""

    def __init__(self, n_in=4, hidden=16, n_out=2):
        super().__init__()
        self.fc1 = nn.Linear(n_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, n_out)

    def forward(self, x):
        """fc3(tanh(fc2(tanh(fc1(x)))))."""
        return self.fc3(torch.tanh(self.fc2(torch.tanh(self.fc1(x)))))


def make_model(seed=0):
    """An MLP initialised from `seed` (ranks use seed + rank, so they start different)."""
    torch.manual_seed(seed)
    return MLP()


def global_batch(world_size, per_rank=4, steps=3, seed=0):
    """The global batches (inputs, targets) of every step: tensors (steps, world_size * per_rank, ...)."""
    generator = torch.Generator().manual_seed(seed + 101)
    x = torch.randn(steps, world_size * per_rank, 4, generator=generator)
    y = torch.randn(steps, world_size * per_rank, 2, generator=generator)
    return x, y


def shard(tensor, rank, world_size):
    """Rank `rank`'s contiguous slice of dim 0 (the global batch cut in world_size equal parts)."""
    return tensor.tensor_split(world_size, dim=0)[rank]


def _params(model):
    module = getattr(model, "module", model)
    return {name: p.detach().clone() for name, p in module.named_parameters()}


def _grads(model):
    module = getattr(model, "module", model)
    return {name: p.grad.detach().clone() for name, p in module.named_parameters()}


def train_one_process(world_size, steps=3, per_rank=4, lr=0.1, seed=0):
    """The reference: one process, rank 0's initial model, SGD on the global batch (mean loss).

    Returns {'losses': [float], 'grads': [dict], 'params': [dict]} per step."""
    return _train(make_model(seed), None, world_size, steps, per_rank, lr, seed)


def _train(model, rank, world_size, steps, per_rank, lr, seed):
    """SGD steps on rank `rank`'s shard of each global batch (the whole batch when rank is None)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = global_batch(world_size, per_rank, steps, seed)
    out = {"losses": [], "grads": [], "params": []}
    for step in range(steps):
        optimizer.zero_grad()
        xs, ys = (x[step], y[step]) if rank is None else (shard(x[step], rank, world_size),
                                                          shard(y[step], rank, world_size))
        loss = F.mse_loss(model(xs), ys)
        loss.backward()
        out["grads"].append(_grads(model))
        optimizer.step()
        out["losses"].append(loss.item())
        out["params"].append(_params(model))
    return out


def _recording_hook(names, world_size):
    """A DDP comm hook that records each bucket's parameter names, then all-reduces SUM and divides."""

    def hook(calls, bucket):
        calls.append([names[id(p)] for p in bucket.parameters()])
        future = dist.all_reduce(bucket.buffer(), async_op=True).get_future()
        return future.then(lambda f: f.value()[0].div_(world_size))

    return hook


def _torch_ddp(rank, world_size, steps, per_rank, lr, seed, bucket_cap_mb):
    module = make_model(seed + rank)
    ddp = nn.parallel.DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)
    names = {id(p): name for name, p in module.named_parameters()}
    calls = []
    ddp.register_comm_hook(calls, _recording_hook(names, world_size))
    per_step = []
    splitter = _StepSplitter(ddp, calls, per_step)
    result = _train(splitter, rank, world_size, steps, per_rank, lr, seed)
    splitter.finish()
    result["buckets_per_step"] = per_step
    return result


class _StepSplitter(nn.Module):
    """Wraps torch's DDP to file the comm hook's calls under the step they belong to (at each forward)."""

    def __init__(self, ddp, calls, per_step):
        super().__init__()
        self.ddp, self.calls, self.per_step = ddp, calls, per_step
        self.module = ddp.module

    def forward(self, x):
        """Close the previous step's record, then run DDP."""
        if self.calls:
            self.per_step.append(list(self.calls))
            self.calls.clear()
        return self.ddp(x)

    def parameters(self, recurse=True):
        """The DDP module's parameters (for the optimizer)."""
        return self.ddp.parameters(recurse)

    def finish(self):
        """File the last step's calls."""
        if self.calls:
            self.per_step.append(list(self.calls))
            self.calls.clear()


def _no_sync_grads(model, rank, world_size, per_rank, seed):
    """Two micro-batches, the first under no_sync: (grads inside no_sync, grads after the second)."""
    x, y = global_batch(world_size, per_rank, 1, seed)
    xs, ys = shard(x[0], rank, world_size).chunk(2), shard(y[0], rank, world_size).chunk(2)
    with model.no_sync():
        (F.mse_loss(model(xs[0]), ys[0]) / 2).backward()
    local = _grads(model)
    (F.mse_loss(model(xs[1]), ys[1]) / 2).backward()
    return local, _grads(model)


def one_process_grads(world_size, per_rank=4, seed=0):
    """The reference for no_sync: grads of rank 0's model on the global batch of one step."""
    model = make_model(seed)
    x, y = global_batch(world_size, per_rank, 1, seed)
    F.mse_loss(model(x[0]), y[0]).backward()
    return _grads(model)


def ddp_check(rank, world_size, steps=3, per_rank=4, lr=0.1, seed=0, bucket_cap_mb=0.0001):
    """Rank function: train the mirror and torch's DDP on this rank's shards; return what to compare.

    Returns {'initial' (params before wrapping: they differ by rank), 'wrapped' (after: rank 0's),
    'mirror' and 'torch' ({'losses', 'grads', 'params'} per step; torch's also 'buckets_per_step' seen by
    a comm hook), 'layout' (bucket_layout), 'history' (the mirror's per-backward records),
    'no_sync' {'mirror'/'torch': (grads inside no_sync, grads after)}, 'hostile' {case: error text}}.
    """
    module = make_model(seed + rank)
    initial = _params(module)
    model = DistributedDataParallel(module, bucket_cap_mb=bucket_cap_mb)
    result = {"rank": rank, "initial": initial, "wrapped": _params(model), "layout": bucket_layout(model),
              "mirror": _train(model, rank, world_size, steps, per_rank, lr, seed)}
    result["history"] = model.history
    result["torch"] = _torch_ddp(rank, world_size, steps, per_rank, lr, seed, bucket_cap_mb)
    mirror_ns = DistributedDataParallel(make_model(seed + rank), bucket_cap_mb=bucket_cap_mb)
    torch_ns = nn.parallel.DistributedDataParallel(make_model(seed + rank), bucket_cap_mb=bucket_cap_mb)
    result["no_sync"] = {"mirror": _no_sync_grads(mirror_ns, rank, world_size, per_rank, seed),
                         "torch": _no_sync_grads(torch_ns, rank, world_size, per_rank, seed),
                         "history": mirror_ns.history}
    result["hostile"] = _hostile(rank, world_size)
    return result


def _hostile(rank, world_size):
    """Bad use inside a process group: the error each case raises (the same on every rank)."""
    cases = {
        "cap": lambda: DistributedDataParallel(make_model(), bucket_cap_mb=0),
        "not a module": lambda: DistributedDataParallel(make_model),  # the function, not a model
        "unused parameter": lambda: _unused_parameter_backward(),
    }
    return error_texts(cases, DataParallelError)


def _unused_parameter_backward():
    """A backward that leaves fc1 without a gradient: the mirror's end-of-backward check fires."""
    model = DistributedDataParallel(make_model(), bucket_cap_mb=0.0001)
    x = torch.ones(2, 16)
    model.module.fc3(torch.tanh(model.module.fc2(x))).sum().backward()


# ---------------------------------------------------------------------------------------------
# The launch's results as one table.



def _largest(per_step, reference):
    """max |a - b| over steps and parameter names of two lists of {name: tensor}."""
    return max(float((a[name] - b[name]).abs().max()) for a, b in zip(per_step, reference) for name in b)


def check_table(results, steps=3, per_rank=4, lr=0.1, seed=0):
    """A Table from ddp_check's results (one per rank): the mirror and torch's DDP, each against one
    process training the global batch (train_one_process): gradients and parameters at every step on
    every rank, and the losses (the mean over ranks of each step's loss). `steps`, `per_rank`, `lr` and
    `seed` must be the ones ddp_check ran with."""
    if not isinstance(results, (list, tuple)) or not results or not all("mirror" in r for r in results):
        raise DataParallelError("check_table takes the list launch(ddp_check, N) returned")
    world = len(results)
    one = train_one_process(world, steps, per_rank, lr, seed)
    rows = []
    for name, label in (("mirror", "ortlab DistributedDataParallel"), ("torch", "torch DistributedDataParallel")):
        runs = [r[name] for r in results]
        mean = [sum(step) / world for step in zip(*(run["losses"] for run in runs))]
        rows.append((label, within(max(abs(a - b) for a, b in zip(mean, one["losses"]))),
                     within(max(_largest(run["grads"], one["grads"]) for run in runs)),
                     within(max(_largest(run["params"], one["params"]) for run in runs))))
    return Table(("data parallel", "losses vs one process", "grads vs one process", "params vs one process"),
                 rows)

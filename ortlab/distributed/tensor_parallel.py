"""Megatron-LM tensor parallelism: column- and row-parallel linear layers, their f/g operators, an MLP and
a self-attention block whose heads are split across ranks.

Mirrors megatron/core/tensor_parallel/layers.py (ColumnParallelLinear, RowParallelLinear) and
megatron/core/tensor_parallel/mappings.py (copy_to_tensor_model_parallel_region = f,
reduce_from_tensor_model_parallel_region = g, gather_from_..., scatter_to_...), Shoeybi et al. 2019,
"Megatron-LM", section 3 and figure 3:

- a column-parallel linear keeps rows [r*n/W, (r+1)*n/W) of the weight (output features) on rank r; its
  input goes through f (identity forward, all-reduce of the input gradient backward);
- a row-parallel linear keeps the matching columns (input features); its partial products go through g
  (all-reduce forward, identity backward) and the bias is added once, after the sum;
- column then row (an MLP, or attention with its heads split) needs one all-reduce forward and one
  backward, and the activation in between is applied to local features with no communication.

Each layer is built from a full nn.Linear (or nn.MultiheadAttention) by copying its rank's slice, so a
one-process model with the same weights is the reference. `tp_check` is the rank function that trains both
(and DTensor's parallelize_module) and returns what the tests and the notebook compare.
"""
import contextlib
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ortlab.distributed.group import rank_and_world_size
from ortlab.errors import OrtlabError
from ortlab.viz.tables import Table, within


class TensorParallelError(OrtlabError):
    """A tensor-parallel layer was given something it cannot split: say what and how to fix it."""


# ---------------------------------------------------------------------------------------------
# Counting the collectives (what Megatron's paper counts: all-reduces per forward and backward).

_COUNTERS = []


class CollectiveCount:
    """The collectives the f/g/gather/scatter operators ran inside `count_collectives()`.

    `events` is a list of (phase, op, elements) with phase 'forward' or 'backward' and op 'all_reduce'
    or 'all_gather'; `count(op, phase)` counts them.
    """

    def __init__(self):
        self.events = []

    def count(self, op="all_reduce", phase=None):
        """How many `op` collectives ran (in `phase` 'forward' / 'backward', or both when None)."""
        return sum(1 for p, o, _ in self.events if o == op and (phase is None or p == phase))

    def elements(self, op="all_reduce", phase=None):
        """How many tensor elements the `op` collectives carried (per rank)."""
        return sum(n for p, o, n in self.events if o == op and (phase is None or p == phase))

    def __repr__(self):
        return (f"CollectiveCount(all_reduce forward={self.count('all_reduce', 'forward')} "
                f"backward={self.count('all_reduce', 'backward')}, all_gather={self.count('all_gather')})")


@contextlib.contextmanager
def count_collectives():
    """Record every collective the tensor-parallel operators run in this block: yields a CollectiveCount."""
    counter = CollectiveCount()
    _COUNTERS.append(counter)
    try:
        yield counter
    finally:
        _COUNTERS.remove(counter)


def _record(phase, op, tensor):
    for counter in _COUNTERS:
        counter.events.append((phase, op, tensor.numel()))


def _all_reduce(tensor, group, phase):
    _record(phase, "all_reduce", tensor)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    return tensor


def _gather_last_dim(tensor, group, phase):
    _record(phase, "all_gather", tensor)
    parts = [torch.empty_like(tensor) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, tensor.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _split_last_dim(tensor, group):
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    return tensor.chunk(world, dim=-1)[rank].contiguous()


# ---------------------------------------------------------------------------------------------
# The conjugate operators of mappings.py.


class CopyToParallel(torch.autograd.Function):
    """Megatron's f: identity in the forward pass, all-reduce (SUM) of the gradient in the backward pass."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return _all_reduce(grad.contiguous().clone(), ctx.group, "backward"), None


class ReduceFromParallel(torch.autograd.Function):
    """Megatron's g: all-reduce (SUM) in the forward pass, identity in the backward pass."""

    @staticmethod
    def forward(ctx, x, group):
        return _all_reduce(x.contiguous().clone(), group, "forward")

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class GatherFromParallel(torch.autograd.Function):
    """All-gather along the last dimension forward; keep this rank's slice of the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather_last_dim(x, group, "forward")

    @staticmethod
    def backward(ctx, grad):
        return _split_last_dim(grad, ctx.group), None


class ScatterToParallel(torch.autograd.Function):
    """Keep this rank's slice of the last dimension forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _split_last_dim(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather_last_dim(grad, ctx.group, "backward"), None


def copy_to_parallel(x, group=None):
    """f: the identity forward whose backward all-reduces the input gradient over the group."""
    return CopyToParallel.apply(x, group)


def reduce_from_parallel(x, group=None):
    """g: all-reduce (SUM) forward, identity backward."""
    return ReduceFromParallel.apply(x, group)


# ---------------------------------------------------------------------------------------------
# Layers.


def _rank_and_world(rank, world_size, group):
    return rank_and_world_size(rank, world_size, TensorParallelError, group)


def _check_linear(linear, what):
    if not isinstance(linear, nn.Linear):
        raise TensorParallelError(f"{what} must be a torch.nn.Linear holding the full weights to split, "
                                  f"got {type(linear).__name__}")


def _check_divisible(size, world_size, what):
    if size % world_size:
        raise TensorParallelError(f"{what} ({size}) is not divisible by world_size ({world_size}): each rank "
                                  f"must hold an equal slice; choose a size that is a multiple of "
                                  f"{world_size} or another number of ranks")
    return size // world_size


class ColumnParallelLinear(nn.Module):
    """Y_r = f(X) A_r^T + b_r: rank r keeps output features [r*n/W, (r+1)*n/W) of a full nn.Linear.

    Mirrors megatron/core/tensor_parallel/layers.py ColumnParallelLinear. With gather_output=True the
    output slices are all-gathered into the full output; otherwise each rank keeps its slice (the input of
    a RowParallelLinear).
    """

    def __init__(self, linear, rank=None, world_size=None, gather_output=False, group=None):
        super().__init__()
        _check_linear(linear, "linear")
        self.rank, self.world_size = _rank_and_world(rank, world_size, group)
        self.group, self.gather_output = group, bool(gather_output)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        local = _check_divisible(linear.out_features, self.world_size, "out_features")
        rows = slice(self.rank * local, (self.rank + 1) * local)
        self.weight = nn.Parameter(linear.weight.detach()[rows].clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach()[rows].clone())

    def forward(self, x):
        """f, then this rank's slice of the linear map (then all-gather when gather_output)."""
        y = F.linear(copy_to_parallel(x, self.group), self.weight, self.bias)
        return GatherFromParallel.apply(y, self.group) if self.gather_output else y

    def __repr__(self):
        return (f"ColumnParallelLinear(in={self.in_features}, out={self.out_features}, rank={self.rank}/"
                f"{self.world_size}, local weight {tuple(self.weight.shape)}, "
                f"gather_output={self.gather_output})")


class RowParallelLinear(nn.Module):
    """Y = g(X_r A_r^T) + b: rank r keeps input features [r*n/W, (r+1)*n/W) of a full nn.Linear.

    Mirrors megatron/core/tensor_parallel/layers.py RowParallelLinear. With input_is_parallel=True (after a
    ColumnParallelLinear) the input is already this rank's slice; otherwise it is split here. The bias is
    added once, after the all-reduce.
    """

    def __init__(self, linear, rank=None, world_size=None, input_is_parallel=True, group=None):
        super().__init__()
        _check_linear(linear, "linear")
        self.rank, self.world_size = _rank_and_world(rank, world_size, group)
        self.group, self.input_is_parallel = group, bool(input_is_parallel)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        local = _check_divisible(linear.in_features, self.world_size, "in_features")
        cols = slice(self.rank * local, (self.rank + 1) * local)
        self.weight = nn.Parameter(linear.weight.detach()[:, cols].clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        """This rank's partial product, summed over ranks by g, plus the (replicated) bias."""
        if not self.input_is_parallel:
            x = ScatterToParallel.apply(x, self.group)
        y = reduce_from_parallel(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias

    def __repr__(self):
        return (f"RowParallelLinear(in={self.in_features}, out={self.out_features}, rank={self.rank}/"
                f"{self.world_size}, local weight {tuple(self.weight.shape)}, "
                f"input_is_parallel={self.input_is_parallel})")


class MLP(nn.Module):
    """The one-process reference: fc1, GELU, fc2 (the names DTensor's parallelize_module plan refers to)."""

    def __init__(self, d_model, d_hidden, bias=True):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_hidden, bias=bias)
        self.fc2 = nn.Linear(d_hidden, d_model, bias=bias)

    def forward(self, x):
        """fc2(gelu(fc1(x)))."""
        return self.fc2(F.gelu(self.fc1(x)))


class ParallelMLP(nn.Module):
    """Megatron's MLP: fc1 column-parallel, GELU on local features, fc2 row-parallel.

    One all-reduce forward (g after fc2) and one backward (f before fc1, when the input needs a gradient).
    Built from an MLP (or any module with nn.Linear attributes fc1 and fc2).
    """

    def __init__(self, mlp, rank=None, world_size=None, group=None):
        super().__init__()
        for name in ("fc1", "fc2"):
            _check_linear(getattr(mlp, name, None), f"mlp.{name}")
        self.fc1 = ColumnParallelLinear(mlp.fc1, rank, world_size, group=group)
        self.fc2 = RowParallelLinear(mlp.fc2, rank, world_size, input_is_parallel=True, group=group)

    def forward(self, x):
        """fc2(gelu(fc1(x))) with the hidden features split across ranks."""
        return self.fc2(F.gelu(self.fc1(x)))

    def __repr__(self):
        return f"ParallelMLP(\n  fc1={self.fc1!r},\n  fc2={self.fc2!r})"


def causal_mask(length):
    """A (length, length) boolean mask, True above the diagonal: positions a query may not attend to."""
    return torch.ones(length, length, dtype=torch.bool).triu(1)


class ParallelSelfAttention(nn.Module):
    """Self-attention with its heads split across ranks: QKV column-parallel, output projection row-parallel.

    Built from a torch.nn.MultiheadAttention (batch_first=True, dropout 0, same q/k/v size). Rank r
    computes heads [r*H/W, (r+1)*H/W) with no communication; the output projection's g sums the ranks'
    partial outputs. Mirrors Megatron's ParallelAttention (megatron/legacy/model/transformer.py), whose QKV
    weight is laid out per partition (this rank's q, k, v rows together), as done here.
    """

    def __init__(self, attention, rank=None, world_size=None, causal=False, group=None):
        super().__init__()
        self._check_attention(attention)
        self.rank, self.world_size = _rank_and_world(rank, world_size, group)
        self.embed_dim, self.num_heads = attention.embed_dim, attention.num_heads
        self.head_dim = self.embed_dim // self.num_heads
        self.local_heads = _check_divisible(self.num_heads, self.world_size, "num_heads")
        self.causal = bool(causal)
        self.qkv = ColumnParallelLinear(self._partitioned_qkv(attention), self.rank, self.world_size,
                                        group=group)
        self.out = RowParallelLinear(attention.out_proj, self.rank, self.world_size, group=group)

    @staticmethod
    def _check_attention(attention):
        if not isinstance(attention, nn.MultiheadAttention):
            raise TensorParallelError(f"attention must be a torch.nn.MultiheadAttention, got "
                                      f"{type(attention).__name__}")
        if not attention.batch_first or not attention._qkv_same_embed_dim or attention.dropout:
            raise TensorParallelError("attention must be built with batch_first=True, no kdim/vdim and "
                                      "dropout=0 (the layout this mirror splits)")
        if attention.in_proj_bias is None or attention.bias_k is not None:
            raise TensorParallelError("attention must have bias=True and add_bias_kv=False")

    def _partitioned_qkv(self, attention):
        """A full nn.Linear whose rows are ordered [q_0 k_0 v_0 | q_1 k_1 v_1 | ...] by rank."""
        d, local = self.embed_dim, self.local_heads * self.head_dim
        order = [torch.arange(part * d + r * local, part * d + (r + 1) * local)
                 for r in range(self.world_size) for part in range(3)]
        order = torch.cat(order)
        linear = nn.Linear(d, 3 * d)
        with torch.no_grad():
            linear.weight.copy_(attention.in_proj_weight[order])
            linear.bias.copy_(attention.in_proj_bias[order])
        return linear

    def forward(self, x):
        """Attention over this rank's heads, then the row-parallel output projection (one all-reduce)."""
        batch, length, _ = x.shape
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        shape = (batch, length, self.local_heads, self.head_dim)
        q, k, v = (t.reshape(shape).transpose(1, 2) for t in (q, k, v))
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        if self.causal:
            scores = scores.masked_fill(causal_mask(length), float("-inf"))
        context = torch.softmax(scores, dim=-1) @ v
        context = context.transpose(1, 2).reshape(batch, length, self.local_heads * self.head_dim)
        return self.out(context)

    def __repr__(self):
        return (f"ParallelSelfAttention(embed_dim={self.embed_dim}, heads={self.num_heads} "
                f"({self.local_heads} on rank {self.rank}/{self.world_size}), causal={self.causal})")


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
    import copy

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

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
    from torch.distributed.tensor.debug import CommDebugMode

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

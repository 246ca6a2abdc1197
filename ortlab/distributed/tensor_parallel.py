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


class _Conjugate(torch.autograd.Function):
    """One operator of mappings.py: a map of the input in the forward pass and its conjugate map of the
    gradient in the backward pass, both over one process group; a subclass states the two maps."""

    @classmethod
    def forward(cls, ctx, x, group):
        ctx.group = group
        return cls.forward_map(x, group)

    @classmethod
    def backward(cls, ctx, grad):
        return cls.backward_map(grad, ctx.group), None


def _identity(tensor, group):
    return tensor.view_as(tensor)


def _sum(phase):
    """All-reduce (SUM) of a copy of the tensor, recorded under `phase`."""
    return lambda tensor, group: _all_reduce(tensor.contiguous().clone(), group, phase)


class CopyToParallel(_Conjugate):
    """Megatron's f: identity in the forward pass, all-reduce (SUM) of the gradient in the backward pass."""

    forward_map, backward_map = staticmethod(_identity), staticmethod(_sum("backward"))


class ReduceFromParallel(_Conjugate):
    """Megatron's g: all-reduce (SUM) in the forward pass, identity in the backward pass."""

    forward_map, backward_map = staticmethod(_sum("forward")), staticmethod(lambda grad, group: grad)


class GatherFromParallel(_Conjugate):
    """All-gather along the last dimension forward; keep this rank's slice of the gradient backward."""

    forward_map = staticmethod(lambda x, group: _gather_last_dim(x, group, "forward"))
    backward_map = staticmethod(_split_last_dim)


class ScatterToParallel(_Conjugate):
    """Keep this rank's slice of the last dimension forward; all-gather the gradient backward."""

    forward_map = staticmethod(_split_last_dim)
    backward_map = staticmethod(lambda grad, group: _gather_last_dim(grad, group, "backward"))


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


class _ParallelLinear(nn.Module):
    """What both Megatron layers share: made from a full nn.Linear, they keep this rank's equal slice of
    one side of it (`split`: 'out_features' for the column layer, 'in_features' for the row layer)."""

    split = ""
    flag = ""  # the layer's one option, shown by repr

    def __init__(self, linear, rank, world_size, group):
        super().__init__()
        _check_linear(linear, "linear")
        self.rank, self.world_size = _rank_and_world(rank, world_size, group)
        self.group = group
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def local_slice(self):
        """Rank r's features of the split side: [r*n/W, (r+1)*n/W)."""
        local = _check_divisible(getattr(self, self.split), self.world_size, self.split)
        return slice(self.rank * local, (self.rank + 1) * local)

    def __repr__(self):
        return (f"{type(self).__name__}(in={self.in_features}, out={self.out_features}, rank={self.rank}/"
                f"{self.world_size}, local weight {tuple(self.weight.shape)}, "
                f"{self.flag}={getattr(self, self.flag)})")


class ColumnParallelLinear(_ParallelLinear):
    """Y_r = f(X) A_r^T + b_r: rank r keeps output features [r*n/W, (r+1)*n/W) of a full nn.Linear.

    Mirrors megatron/core/tensor_parallel/layers.py ColumnParallelLinear. With gather_output=True the
    output slices are all-gathered into the full output; otherwise each rank keeps its slice (the input of
    a RowParallelLinear).
    """

    split, flag = "out_features", "gather_output"

    def __init__(self, linear, rank=None, world_size=None, gather_output=False, group=None):
        super().__init__(linear, rank, world_size, group)
        self.gather_output = bool(gather_output)
        rows = self.local_slice()
        self.weight = nn.Parameter(linear.weight.detach()[rows].clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach()[rows].clone())

    def forward(self, x):
        """f, then this rank's slice of the linear map (then all-gather when gather_output)."""
        y = F.linear(copy_to_parallel(x, self.group), self.weight, self.bias)
        return GatherFromParallel.apply(y, self.group) if self.gather_output else y


class RowParallelLinear(_ParallelLinear):
    """Y = g(X_r A_r^T) + b: rank r keeps input features [r*n/W, (r+1)*n/W) of a full nn.Linear.

    Mirrors megatron/core/tensor_parallel/layers.py RowParallelLinear. With input_is_parallel=True (after a
    ColumnParallelLinear) the input is already this rank's slice; otherwise it is split here. The bias is
    added once, after the all-reduce.
    """

    split, flag = "in_features", "input_is_parallel"

    def __init__(self, linear, rank=None, world_size=None, input_is_parallel=True, group=None):
        super().__init__(linear, rank, world_size, group)
        self.input_is_parallel = bool(input_is_parallel)
        cols = self.local_slice()
        self.weight = nn.Parameter(linear.weight.detach()[:, cols].clone())
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x):
        """This rank's partial product, summed over ranks by g, plus the (replicated) bias."""
        if not self.input_is_parallel:
            x = ScatterToParallel.apply(x, self.group)
        y = reduce_from_parallel(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


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

"""A mixture-of-experts layer (GShard / Switch Transformer style) whose experts live on different ranks.

Mirrors the expert-parallel MoE of GShard (Lepikhin et al. 2020, algorithm 1: top-2 gating, expert
capacity, first choices placed before second choices), the Switch Transformer (Fedus et al. 2021: top-1,
capacity_factor, the load-balancing loss) and the token dispatcher of Megatron-Core
(megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher) and DeepSpeed
(deepspeed/moe/sharded_moe.py, _AllToAll):

- a softmax router picks k experts per token (k=1 or 2) and a gate weight for each choice;
- each expert takes at most `capacity = ceil(k * tokens * capacity_factor / experts)` tokens of this
  rank's batch; later assignments (second choices after all first choices, then token order) are dropped
  and counted;
- rank r holds experts [r*E/W, (r+1)*E/W). The kept tokens, sorted by expert, are sent to the expert's rank
  with `dist.all_to_all_single`: the per-expert counts are exchanged first (an all_to_all of E numbers), so
  every rank knows its uneven input and output split sizes; the results come back through the reverse
  all_to_all and are combined, weighted by the gates;
- the exchange is an autograd Function whose backward is the reverse all_to_all, so gradients reach the
  tokens' ranks (and the experts receive the gradients of every rank's tokens).

`MoE` is the one-process reference holding every expert; `DistributedMoE` is built from it. `moe_check`
is the rank function that trains both on the same tokens and returns what the tests and notebook compare.
"""
import copy
import math
import numbers

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ortlab.distributed.agreement import check_same_on_every_rank
from ortlab.distributed.group import rank_and_world_size
from ortlab.errors import OrtlabError


class MoEError(OrtlabError):
    """A mixture-of-experts layer got a setting or an input it cannot use: say what and what to do."""


# ---------------------------------------------------------------------------------------------
# Routing.


def expert_capacity(num_tokens, num_experts, k, capacity_factor):
    """How many tokens one expert takes from a group of `num_tokens`: ceil(k * tokens * factor / experts)."""
    for value, what in ((num_tokens, "num_tokens"), (num_experts, "num_experts"), (k, "k")):
        if isinstance(value, bool) or not isinstance(value, int) or value < (0 if what == "num_tokens" else 1):
            raise MoEError(f"{what} must be a {'non-negative' if what == 'num_tokens' else 'positive'} int, "
                           f"got {value!r}")
    if (isinstance(capacity_factor, bool) or not isinstance(capacity_factor, numbers.Real)
            or not 0 < capacity_factor < math.inf):
        raise MoEError(f"capacity_factor must be a positive number, finite (1.0-2.0 is usual; "
                       f"{num_experts / k:g} lets one expert take every token), got {capacity_factor!r}")
    try:
        capacity = k * num_tokens * capacity_factor / num_experts
    except OverflowError:  # an int too large for a float
        capacity = math.inf
    if not math.isfinite(capacity):
        hint = (f"a capacity_factor of {num_experts / k:g} already lets one expert take every token"
                if capacity_factor > num_experts / k else "split the tokens into groups")
        raise MoEError(f"the capacity k * num_tokens * capacity_factor / num_experts overflows a float "
                       f"(capacity_factor={capacity_factor!r}); {hint}")
    return max(1, math.ceil(capacity))


class Routing:
    """Where each token of one group goes: expert (N, k), gate (N, k), position (N, k), kept (N, k).

    `position` is the token's slot in its expert's buffer (first choices first, then in token order);
    an assignment is kept when its position is below `capacity`. `aux_loss` is the Switch Transformer's
    load-balancing loss E * sum_e f_e P_e (f_e: share of first choices on e, P_e: mean router probability).
    """

    def __init__(self, expert, gate, position, capacity, num_experts, aux_loss):
        self.expert, self.gate, self.position = expert, gate, position
        self.capacity, self.num_experts, self.aux_loss = capacity, num_experts, aux_loss
        self.kept = position < capacity

    def tokens_per_expert(self):
        """The kept assignments per expert: a list of E ints (each at most capacity)."""
        return torch.bincount(self.expert[self.kept], minlength=self.num_experts).tolist()

    def wanted_per_expert(self):
        """The assignments per expert before the capacity cut."""
        return torch.bincount(self.expert.reshape(-1), minlength=self.num_experts).tolist()

    @property
    def dropped(self):
        """How many (token, choice) assignments the capacity cut dropped."""
        return int((~self.kept).sum())

    @property
    def dropped_tokens(self):
        """How many tokens lost every choice (their MoE output is zero)."""
        return int((~self.kept).all(dim=-1).sum())

    def assignments(self):
        """The kept assignments sorted by expert, then position: (token, choice, expert) index tensors."""
        token, choice = self.kept.nonzero(as_tuple=True)
        expert, position = self.expert[token, choice], self.position[token, choice]
        order = torch.argsort(expert * (self.capacity + 1) + position)
        return token[order], choice[order], expert[order]

    def __repr__(self):
        return (f"Routing(tokens={self.expert.shape[0]}, k={self.expert.shape[1]}, capacity={self.capacity}, "
                f"per expert={self.tokens_per_expert()}, dropped={self.dropped})")


def _check_route(logits, k, capacity):
    """route's arguments: logits a finite floating (tokens, experts) tensor, k 1 or 2 and at most the
    experts, capacity a positive int."""
    if not isinstance(logits, torch.Tensor) or logits.dim() != 2 or not logits.is_floating_point():
        got = (f"shape {tuple(logits.shape)} {logits.dtype}" if isinstance(logits, torch.Tensor)
               else type(logits).__name__)
        raise MoEError(f"logits must be a floating-point tensor (tokens, experts), the router's output; got {got}")
    if isinstance(k, bool) or not isinstance(k, numbers.Integral) or k not in (1, 2):
        raise MoEError(f"k must be 1 (Switch) or 2 (GShard), got {k!r}")
    if k > logits.shape[1]:
        raise MoEError(f"k={k} choices need at least {k} experts, the logits have {logits.shape[1]}")
    if isinstance(capacity, bool) or not isinstance(capacity, numbers.Integral) or capacity < 1:
        raise MoEError(f"capacity must be a positive int (tokens per expert, see expert_capacity), "
                       f"got {capacity!r}")
    if not torch.isfinite(logits).all():
        raise MoEError("the router's logits hold NaN or inf: top-k of a NaN picks an arbitrary expert; "
                       "check the router's weights and its input")


def route(logits, k, capacity):
    """Top-k softmax routing of one group's tokens, with GShard's capacity rule: a Routing.

    k=1 uses the top probability as the gate (Switch); k=2 renormalises the two gates to sum to 1 (GShard).
    """
    _check_route(logits, k, capacity)
    num_tokens, num_experts = logits.shape
    probs = torch.softmax(logits, dim=-1)
    top_p, expert = probs.topk(k, dim=-1)
    gate = top_p if k == 1 else top_p / top_p.sum(dim=-1, keepdim=True)
    one_hot = F.one_hot(expert, num_experts)                          # (N, k, E)
    choice_major = one_hot.transpose(0, 1).reshape(k * num_tokens, num_experts)
    slots = torch.cumsum(choice_major, dim=0) - 1                      # slot of each assignment, per expert
    position = (slots * choice_major).sum(dim=-1).reshape(k, num_tokens).transpose(0, 1)
    first_share = one_hot[:, 0].float().mean(dim=0)
    aux_loss = num_experts * (first_share * probs.mean(dim=0)).sum()
    return Routing(expert, gate, position, capacity, num_experts, aux_loss)


# ---------------------------------------------------------------------------------------------
# Modules.


class Expert(nn.Module):
    """One expert: a feed-forward block fc1, GELU, fc2."""

    def __init__(self, d_model, d_hidden):
        super().__init__()
        self.fc1 = nn.Linear(d_model, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_model)

    def forward(self, x):
        """fc2(gelu(fc1(x)))."""
        return self.fc2(F.gelu(self.fc1(x)))


def _check_settings(d_model, d_hidden, num_experts, k, capacity_factor):
    for value, what in ((d_model, "d_model"), (d_hidden, "d_hidden"), (num_experts, "num_experts"), (k, "k")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise MoEError(f"{what} must be a positive int, got {value!r}")
    if k not in (1, 2):
        raise MoEError(f"k must be 1 (Switch) or 2 (GShard), got {k}")
    if k > num_experts:
        raise MoEError(f"k={k} choices need at least {k} experts, got num_experts={num_experts}")
    if (isinstance(capacity_factor, bool) or not isinstance(capacity_factor, (int, float))
            or not math.isfinite(capacity_factor) or capacity_factor <= 0):
        raise MoEError(f"capacity_factor must be a positive finite number (1.0-2.0 is usual), "
                       f"got {capacity_factor!r}")


def _tokens(x, d_model):
    """x (..., d_model) as (tokens, d_model), checked."""
    if not isinstance(x, torch.Tensor):
        raise MoEError(f"the MoE input must be a torch.Tensor (..., d_model), got {type(x).__name__}")
    if not x.is_floating_point():
        raise MoEError(f"the MoE input must be a floating-point tensor, got {x.dtype}")
    if x.dim() < 2 or x.shape[-1] != d_model or x.numel() == 0:
        raise MoEError(f"the MoE input must have shape (..., {d_model}) with at least one token, "
                       f"got {tuple(x.shape)}")
    if not torch.isfinite(x).all():
        raise MoEError("the MoE input holds NaN or inf: the router's top-k of a NaN is meaningless; "
                       "check the layer before the MoE")
    return x.reshape(-1, d_model)


class MoE(nn.Module):
    """The one-process reference: a router and every expert here; one call routes one group of tokens.

    forward(x) maps (..., d_model) to the same shape; `last_routing` keeps the Routing of the last call.
    """

    def __init__(self, d_model, d_hidden, num_experts, k=1, capacity_factor=1.25):
        super().__init__()
        _check_settings(d_model, d_hidden, num_experts, k, capacity_factor)
        self.d_model, self.num_experts, self.k = d_model, num_experts, k
        self.capacity_factor = float(capacity_factor)
        self.router = nn.Linear(d_model, num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(d_model, d_hidden) for _ in range(num_experts))
        self.last_routing = None

    def forward(self, x):
        """Route, run each expert on its kept tokens, sum the gated results per token."""
        tokens = _tokens(x, self.d_model)
        capacity = expert_capacity(tokens.shape[0], self.num_experts, self.k, self.capacity_factor)
        routing = route(self.router(tokens), self.k, capacity)
        self.last_routing = routing
        token, choice, expert = routing.assignments()
        pieces = [self.experts[e](tokens[token[expert == e]]) for e in range(self.num_experts)]
        weighted = torch.cat(pieces) * routing.gate[token, choice].unsqueeze(-1)
        return torch.zeros_like(tokens).index_add(0, token, weighted).reshape(x.shape)

    def __repr__(self):
        return (f"MoE(d_model={self.d_model}, experts={self.num_experts}, k={self.k}, "
                f"capacity_factor={self.capacity_factor})")


class AllToAll(torch.autograd.Function):
    """dist.all_to_all_single with split sizes forward; the reverse all_to_all (splits swapped) backward."""

    @staticmethod
    def forward(ctx, x, output_splits, input_splits, group):
        ctx.splits, ctx.group = (output_splits, input_splits), group
        out = x.new_empty((sum(output_splits),) + tuple(x.shape[1:]))
        dist.all_to_all_single(out, x.contiguous(), output_splits, input_splits, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        output_splits, input_splits = ctx.splits
        out = grad.new_empty((sum(input_splits),) + tuple(grad.shape[1:]))
        dist.all_to_all_single(out, grad.contiguous(), input_splits, output_splits, group=ctx.group)
        return out, None, None, None


def all_to_all(x, output_splits, input_splits, group=None):
    """Send rows input_splits[j] of x to rank j and receive output_splits[j] rows from it (autograd-aware)."""
    return AllToAll.apply(x, list(output_splits), list(input_splits), group)


class DistributedMoE(nn.Module):
    """The MoE with its experts split across ranks: rank r keeps experts [r*E/W, (r+1)*E/W) of `moe`.

    The router is replicated (all-reduce its gradient as data parallelism does, see `sync_router_grads`).
    forward(x) routes this rank's tokens, exchanges them with two all_to_all_single calls (dispatch and
    combine) and returns the same shape. `last_routing` / `last_exchange` describe the last call.
    """

    def __init__(self, moe, rank=None, world_size=None, group=None):
        super().__init__()
        if not isinstance(moe, MoE):
            raise MoEError(f"DistributedMoE is built from an ortlab MoE (the full layer to split), "
                           f"got {type(moe).__name__}")
        rank, world_size = rank_and_world_size(rank, world_size, MoEError, group)
        if moe.num_experts % world_size:
            raise MoEError(f"num_experts ({moe.num_experts}) is not divisible by world_size ({world_size}): "
                           f"each rank holds the same number of experts; use a multiple of {world_size}")
        self.rank, self.world_size, self.group = rank, world_size, group
        self.d_model, self.num_experts, self.k = moe.d_model, moe.num_experts, moe.k
        self.capacity_factor = moe.capacity_factor
        self.local_experts = moe.num_experts // world_size
        self.first_expert = rank * self.local_experts
        self.router = copy.deepcopy(moe.router)
        self.experts = nn.ModuleList(copy.deepcopy(moe.experts[self.first_expert + i])
                                     for i in range(self.local_experts))
        self.last_routing, self.last_exchange = None, None
        self._checked = False

    def _check_group(self):
        """Before the first exchange: this rank is the rank and world the layer was built for, and every
        rank's layer has the same settings (one all_gather_object; otherwise all_to_all_single would get
        split sizes of other lengths, or tokens would reach the wrong experts)."""
        if not (dist.is_available() and dist.is_initialized()):
            raise MoEError("DistributedMoE exchanges tokens between ranks with all_to_all_single: call it "
                           "inside a function run by ortlab.distributed.launch(fn, world_size=2)")
        actual = (dist.get_rank(self.group), dist.get_world_size(self.group))
        if actual != (self.rank, self.world_size):
            raise MoEError(f"this layer was built for rank {self.rank} of {self.world_size}, but runs on rank "
                           f"{actual[0]} of {actual[1]} of its process group: build it with rank=None, "
                           f"world_size=None to read them from the group")
        if not self._checked:
            settings = [(name, f"value {value!r}") for name, value in (
                ("d_model", self.d_model), ("num_experts", self.num_experts), ("k", self.k),
                ("capacity_factor", self.capacity_factor))]
            check_same_on_every_rank({"setting": settings}, MoEError, "Build every rank's DistributedMoE from "
                                     "the same MoE settings", self.group)
            self._checked = True

    def _exchange_counts(self, expert):
        """Per-expert counts out (E,) and in (world, local experts), via an all_to_all of E numbers."""
        send_counts = torch.bincount(expert, minlength=self.num_experts)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts, group=self.group)
        return send_counts, recv_counts.reshape(self.world_size, self.local_experts)

    def _run_experts(self, received, recv_counts):
        """Apply the local experts to the received rows (ordered by source rank, then expert)."""
        local = torch.arange(self.local_experts).repeat(self.world_size)
        which = torch.repeat_interleave(local, recv_counts.reshape(-1))
        order = torch.argsort(which, stable=True)
        pieces = [self.experts[e](received[order[which[order] == e]]) for e in range(self.local_experts)]
        return torch.cat(pieces)[torch.argsort(order)]

    def forward(self, x):
        """Route locally, dispatch by all_to_all, run the local experts, combine by the reverse all_to_all."""
        tokens = _tokens(x, self.d_model)
        self._check_group()
        capacity = expert_capacity(tokens.shape[0], self.num_experts, self.k, self.capacity_factor)
        routing = route(self.router(tokens), self.k, capacity)
        token, choice, expert = routing.assignments()
        send_counts, recv_counts = self._exchange_counts(expert)
        input_splits = send_counts.reshape(self.world_size, self.local_experts).sum(dim=1).tolist()
        output_splits = recv_counts.sum(dim=1).tolist()
        received = all_to_all(tokens[token], output_splits, input_splits, self.group)
        processed = self._run_experts(received, recv_counts)
        returned = all_to_all(processed, input_splits, output_splits, self.group)
        weighted = returned * routing.gate[token, choice].unsqueeze(-1)
        self.last_routing = routing
        self.last_exchange = {"input_splits": input_splits, "output_splits": output_splits,
                              "received_per_expert": recv_counts.sum(dim=0).tolist()}
        return torch.zeros_like(tokens).index_add(0, token, weighted).reshape(x.shape)

    def sync_router_grads(self):
        """All-reduce (SUM) the replicated router's gradient, as data parallelism does for shared weights."""
        for p in self.router.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad, group=self.group)

    def __repr__(self):
        last = self.first_expert + self.local_experts - 1
        return (f"DistributedMoE(d_model={self.d_model}, experts {self.first_expert}..{last} of "
                f"{self.num_experts} on rank {self.rank}/{self.world_size}, k={self.k}, "
                f"capacity_factor={self.capacity_factor})")


# ---------------------------------------------------------------------------------------------
# Routing table and plot.


def routing_table(per_rank):
    """A text table of tokens per expert per rank: `per_rank` is a list of dicts with 'tokens_per_expert'
    and 'dropped' (what moe_check returns as 'routing' per rank)."""
    experts = len(per_rank[0]["tokens_per_expert"])
    header = ["rank"] + [f"expert {e}" for e in range(experts)] + ["dropped"]
    rows = [[str(r)] + [str(n) for n in stats["tokens_per_expert"]] + [str(stats["dropped"])]
            for r, stats in enumerate(per_rank)]
    totals = [sum(s["tokens_per_expert"][e] for s in per_rank) for e in range(experts)]
    rows.append(["all"] + [str(n) for n in totals] + [str(sum(s["dropped"] for s in per_rank))])
    widths = [max(len(row[i]) for row in [header] + rows) for i in range(len(header))]
    lines = [" | ".join(c.rjust(w) for c, w in zip(row, widths)) for row in [header] + rows]
    lines.insert(1, "-+-".join("-" * w for w in widths))
    return "\n".join(lines)


def plot_routing(per_rank, ax=None):
    """Stacked bars: tokens each expert received from each rank, and the dropped assignments. Returns ax."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    ax = ax or plt.subplots(figsize=(5, 3))[1]
    experts = len(per_rank[0]["tokens_per_expert"])
    bottom = [0] * experts
    for r, stats in enumerate(per_rank):
        ax.bar(range(experts), stats["tokens_per_expert"], bottom=bottom, label=f"from rank {r}")
        bottom = [b + n for b, n in zip(bottom, stats["tokens_per_expert"])]
    ax.set_xticks(range(experts))
    ax.set_xlabel("expert")
    ax.set_ylabel("tokens")
    ax.set_title(f"tokens per expert (dropped: {sum(s['dropped'] for s in per_rank)})")
    ax.legend()
    return ax

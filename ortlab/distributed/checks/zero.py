"""ZeRO stages 1-3 checked across ranks: a tied toy model, the rank function that trains every technique
(ortlab's stages, torch's ZeroRedundancyOptimizer, DDP) and the one-process reference, and the table of
results. The stages themselves are ortlab/distributed/zero.py.
"""
import contextlib
import copy
import functools
import time
import torch
import torch.nn.functional as F
from torch import nn

from ortlab.distributed.accounting import CommCounter, count_torch_collectives, counting_allreduce_hook
from ortlab.distributed.accounting import measure_memory
from ortlab.viz.tables import Table, within
from ortlab.distributed.zero import zero, ZeroError


# ---------------------------------------------------------------------------------------------
# A test model and the rank function that trains every technique.


class TiedToyModel(nn.Module):
    """A tiny language model with what sharding must handle: an embedding tied to the output layer, a
    positional buffer, a frozen parameter, and sizes that do not divide by 2 (91 trainable elements)."""

    def __init__(self, vocab=7, dim=5, hidden=4, length=4):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.register_buffer("position", torch.linspace(-0.5, 0.5, length * dim).view(length, dim))
        self.scale = nn.Parameter(torch.full((dim,), 1.5), requires_grad=False)
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.head = nn.Linear(dim, vocab)
        self.head.weight = self.emb.weight

    def forward(self, tokens, targets):
        """Mean cross-entropy of predicting `targets` from `tokens` (batch, length)."""
        x = (self.emb(tokens) + self.position) * self.scale
        x = x + self.fc2(torch.tanh(self.fc1(x)))
        return F.cross_entropy(self.head(x).flatten(0, 1), targets.flatten())


def toy_batch(world_size, rows_per_rank=2, length=4, vocab=7, seed=0):
    """The global batch (tokens, targets) of world_size * rows_per_rank rows; rank r trains rows
    [r * rows_per_rank, (r + 1) * rows_per_rank)."""
    g = torch.Generator().manual_seed(seed + 1)
    rows = world_size * rows_per_rank
    return (torch.randint(0, vocab, (rows, length), generator=g),
            torch.randint(0, vocab, (rows, length), generator=g))


def toy_model(seed=0):
    """TiedToyModel with weights from `seed`."""
    torch.manual_seed(seed)
    return TiedToyModel()


TECHNIQUES = ("ddp", "zero1", "zero2", "zero3", "torch_zero1", "fsdp_shard_grad_op", "fsdp_full_shard")
_PREFIXES = ("module.", "_fsdp_wrapped_module.")


def clean_name(name):
    for prefix in _PREFIXES:
        name = name.replace(prefix, "")
    return name


def trainable_params(module):
    return [p for p in module.parameters() if p.requires_grad]


def _build(technique, model, lr, counter):
    """(module to call, optimizer, a function returning the full parameters) for one technique."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # heavy: torch
    from torch.distributed.fsdp import ShardingStrategy  # heavy: torch
    from torch.distributed.fsdp.wrap import lambda_auto_wrap_policy  # heavy: torch
    from torch.distributed.optim import ZeroRedundancyOptimizer  # heavy: torch
    from torch.nn.parallel import DistributedDataParallel as DDP  # heavy: torch

    if technique.startswith("zero"):
        module, optimizer = zero(model, torch.optim.Adam, int(technique[-1]), lr=lr)
        return module, optimizer, optimizer.full_parameters
    if technique in ("ddp", "torch_zero1"):
        # broadcast_buffers=False: the buffer is constant, and DDP's per-forward buffer broadcast runs in C++
        module = DDP(model, gradient_as_bucket_view=True, broadcast_buffers=False)
        module.register_comm_hook(counter, counting_allreduce_hook)
        if technique == "ddp":
            optimizer = torch.optim.Adam(trainable_params(module), lr=lr)
        else:
            optimizer = ZeroRedundancyOptimizer(trainable_params(module), optimizer_class=torch.optim.Adam,
                                                lr=lr)
        return module, optimizer, lambda: {clean_name(n): p.detach().clone()
                                           for n, p in module.named_parameters()}
    strategy = (ShardingStrategy.SHARD_GRAD_OP if technique == "fsdp_shard_grad_op"
                else ShardingStrategy.FULL_SHARD)
    # fc1 and fc2 are FSDP units of their own (the head shares the embedding's weight: it stays in the root).
    # FSDP1 never frees the root unit after forward (backward needs it at once), so only non-root units show
    # FULL_SHARD's second all-gather.
    wrap = functools.partial(lambda_auto_wrap_policy, lambda_fn=lambda m: m is model.fc1 or m is model.fc2)
    module = FSDP(model, device_id=torch.device("cpu"), sharding_strategy=strategy, use_orig_params=True,
                  auto_wrap_policy=wrap)
    optimizer = torch.optim.Adam(trainable_params(module), lr=lr)

    def full():
        with FSDP.summon_full_params(module):
            return {clean_name(n): p.detach().clone() for n, p in module.named_parameters()}
    return module, optimizer, full


def _train(rank, world_size, technique, steps, lr, seed):
    counter = CommCounter(world_size)
    tokens, targets = toy_batch(world_size, seed=seed)
    rows = slice(rank * 2, rank * 2 + 2)
    module, optimizer, full = _build(technique, toy_model(seed), lr, counter)
    counter.mark_setup()
    losses, memory = [], None
    with count_torch_collectives(counter) if technique in ("torch_zero1", "fsdp_shard_grad_op",
                                                           "fsdp_full_shard") else contextlib.nullcontext():
        for _ in range(steps):
            loss = module(tokens[rows], targets[rows])
            loss.backward()
            optimizer.step()
            memory = measure_memory(module, optimizer).as_dict()
            optimizer.zero_grad()
            losses.append(loss.item())
            counter.next_step()
    counts = optimizer.comm if technique.startswith("zero") else counter
    stage = {"ddp": 0, "torch_zero1": 1, "fsdp_shard_grad_op": 2, "fsdp_full_shard": 3}.get(technique)
    return {"technique": technique, "stage": int(technique[-1]) if stage is None else stage, "losses": losses,
            "params": full(), "memory": memory, "comm": counts.steps, "calls": counts.calls}


def _extras(rank, world_size, lr, seed):
    """Stage 3 with two accumulated micro-batches, then a no_grad forward on the whole batch; a bad optimizer
    keyword; the module's gradients after one stage-1 step (flat, padded). Returns plain data."""
    tokens, targets = toy_batch(world_size, seed=seed)
    model, optimizer = zero(toy_model(seed), torch.optim.Adam, 3, lr=lr)
    for row in (rank * 2, rank * 2 + 1):
        (model(tokens[row:row + 1], targets[row:row + 1]) / 2).backward()
    optimizer.step()
    with torch.no_grad():
        eval_loss = model(tokens, targets).item()
    out = {"params": optimizer.full_parameters(), "eval_loss": eval_loss, "repr": repr(optimizer),
           "after_eval": optimizer.full.untyped_storage().nbytes()}
    try:
        zero(toy_model(seed), torch.optim.Adam, 1, momentum=0.9)
        out["bad_kwarg"] = None
    except ZeroError as exc:
        out["bad_kwarg"] = str(exc)
    model, optimizer = zero(toy_model(seed), torch.optim.Adam, 1, lr=lr)
    model(tokens[rank * 2:rank * 2 + 2], targets[rank * 2:rank * 2 + 2]).backward()
    optimizer.step()
    out["stage1_grad"] = optimizer.layout.flatten([p.grad for p in optimizer._params])
    out["stage1_shares_storage"] = (optimizer.shard_param.grad.untyped_storage().data_ptr()
                                    == optimizer._params[0].grad.untyped_storage().data_ptr())
    return out


def zero_check(rank, world_size, techniques=TECHNIQUES, steps=3, lr=0.05, seed=0, extras=True):
    """Rank function: train TiedToyModel `steps` Adam steps with each technique on this rank's rows of
    toy_batch, every technique from the same weights.

    Returns {technique: {'stage', 'losses' (this rank's), 'params' (final, full, by name), 'memory'
    (MemoryReport.as_dict() after the last step, before zero_grad), 'comm' (a {kind: bytes} per step),
    'calls'}} plus 'numel' (trainable elements, Psi) and, with extras=True, 'extras' (stage 3 with gradient
    accumulation and a no_grad forward, a bad optimizer keyword's message, the flat `.grad` after one stage-1
    step). Techniques: ortlab's zero1/2/3 (zero1 moves the paper's 2 Psi), torch's DDP,
    ZeroRedundancyOptimizer + DDP (torch_zero1: 3 Psi, DDP all-reduces before the optimizer broadcasts),
    FSDP1 SHARD_GRAD_OP and FULL_SHARD on the CPU.
    """
    out = {}
    for technique in techniques:
        started = time.perf_counter()
        out[technique] = _train(rank, world_size, technique, steps, lr, seed)
        print(f"{technique}: {time.perf_counter() - started:.2f} s")
    out["numel"] = sum(p.numel() for p in toy_model(seed).parameters() if p.requires_grad)
    if extras:
        out["extras"] = _extras(rank, world_size, lr, seed)
    return out


def reference_run(world_size, steps=3, lr=0.05, seed=0, clip=None):
    """One process, torch.optim.Adam on the whole batch: (losses, {name: final parameter}); with `clip`, the
    gradients clipped to that global norm before each step (torch.nn.utils.clip_grad_norm_)."""
    tokens, targets = toy_batch(world_size, seed=seed)
    model = copy.deepcopy(toy_model(seed))
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(trainable, lr=lr)
    losses = []
    for _ in range(steps):
        loss = model(tokens, targets)
        loss.backward()
        if clip is not None:
            torch.nn.utils.clip_grad_norm_(trainable, clip)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}



def check_table(results, steps=3, lr=0.05, seed=0, clip=None):
    """A Table from zero_check's (or zero_deepspeed.deepspeed_check's) results, one per rank: for each
    technique, the largest difference of its final parameters and of its losses (the mean over ranks of each
    step's loss) from one process training the whole batch with torch.optim.Adam (reference_run), and what
    each rank holds where it was measured.

    `steps`, `lr` and `seed` must be the ones the check ran with; `clip` clips the one process's gradients
    to that norm (DeepSpeed's default run clips to 1.0)."""
    if not isinstance(results, (list, tuple)) or not results or not all(isinstance(r, dict) for r in results):
        raise ZeroError("check_table takes the list launch(zero_check, N) returned")
    world = len(results)
    losses, params = reference_run(world, steps, lr, seed, clip)
    rows = []
    techniques = [t for t, run in results[0].items() if isinstance(run, dict) and "losses" in run]
    if not techniques:
        raise ZeroError("check_table found no technique's run in these results: give it the list "
                        "launch(zero_check, N) or launch(deepspeed_check, N) returned")
    for technique in techniques:
        runs = [r[technique] for r in results]
        mean = [sum(step) / world for step in zip(*(run["losses"] for run in runs))]
        loss_gap = max(abs(a - b) for a, b in zip(mean, losses))
        param_gap = max(float((run["params"][name] - value).abs().max())
                        for run in runs for name, value in params.items())
        held = runs[0].get("memory") or dict.fromkeys(("params", "grads", "state"), "-")
        rows.append((technique, runs[0]["stage"], within(loss_gap), within(param_gap),
                     held["params"], held["grads"], held["state"]))
    header = ("technique", "ZeRO stage", "losses vs one process", "params vs one process",
              "rank 0 params B", "grads B", "optimizer state B")
    if not any(run.get("memory") for run in results[0].values() if isinstance(run, dict)):
        header, rows = header[:4], [row[:4] for row in rows]  # nothing measured (DeepSpeed's runs)
    return Table(header, rows)

"""What data parallelism costs, measured and calculated: bytes held per rank and bytes sent per step.

Measured: `CommCounter` records every collective a training step runs (ortlab's ZeRO records its own; torch's
DDP through a counting comm hook, `counting_allreduce_hook`; ZeroRedundancyOptimizer and FSDP1 through
`count_torch_collectives`, which wraps torch.distributed's collective functions for a block).
`measure_memory(model, optimizer)` adds up the storages of the tensors actually held: parameters, gradients
and optimizer state, each storage counted once (views of one flat buffer, tied weights).

Calculated: the ZeRO paper's formulas (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models", section 5 figure 1 and section 7). Memory per rank for Psi parameters on N_d ranks
with p, g, k bytes per parameter for parameters, gradients and optimizer state:

    DDP     (p + g + k) Psi            ZeRO-1  (p + g) Psi + k Psi / N_d
    ZeRO-2  p Psi + (g + k) Psi / N_d  ZeRO-3  (p + g + k) Psi / N_d

The paper's mixed-precision Adam has p = g = 2 (fp16) and k = K = 12 (fp32 master parameters, momentum and
variance). The runs here train fp32 with torch.optim.Adam, which has no master copy: p = g = 4 and k = 8 (two
fp32 tensors, exp_avg and exp_avg_sq). That is the formula `measure_memory` is checked against, with Psi
rounded up to a multiple of N_d as the flat buffers are padded (Adam's one-element `step` counters are
listed apart, as `step_bytes`).

Communication per rank and step (section 7.2): an all-reduce moves 2 Psi (a reduce-scatter then an
all-gather, each Psi), so DDP 2 Psi; ZeRO-1 and ZeRO-2 reduce-scatter the gradients and all-gather the updated
parameters, 2 Psi (ZeRO-1 still holds a full-size gradient buffer: only its memory differs from ZeRO-2);
ZeRO-3 all-gathers the parameters for forward and again for backward, 3 Psi. torch's ZeRO-1,
ZeroRedundancyOptimizer under DDP, moves 3 Psi: DDP all-reduces the full gradient (2 Psi) before the optimizer
broadcasts the updated parameters (Psi); `comm_volume(..., stage1_all_reduce=True)`. "Volume" below
counts collectives that way (all-reduce 2x its size, reduce-scatter, all-gather and broadcast 1x); the bytes a
rank sends with ring algorithms are that times (N_d - 1) / N_d.
"""
import contextlib
import functools

import torch
import torch.distributed as dist

from ortlab.errors import OrtlabError
from ortlab.viz.tables import Table

KINDS = ("all_reduce", "reduce_scatter", "all_gather", "broadcast")
VOLUME_FACTOR = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "broadcast": 1}
TECHNIQUES = ("DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3")
# bytes per parameter (params, grads, optimizer state): the paper's mixed-precision Adam, and fp32 Adam.
PRECISIONS = {"mixed": (2, 2, 12), "fp32": (4, 4, 8)}


class AccountingError(OrtlabError):
    """An accounting function was given something it cannot count: say what and how to fix it."""


# ---------------------------------------------------------------------------------------------
# Communication.


class CommCounter:
    """Bytes moved by each kind of collective, step by step, as one rank sees them.

    `record(kind, numel, element_size)` adds one collective whose full tensor has `numel` elements (the
    all-reduced tensor, the reduce-scatter's input, the all-gather's output, the broadcast tensor);
    `next_step()` closes the current step. `steps[i]` is {kind: bytes} for step i; `setup` holds what ran
    before the first `next_step()` if `mark_setup()` was called (initial broadcasts).
    """

    def __init__(self, world_size=1):
        self.world_size = world_size
        self.steps = []
        self.setup = {}
        self.calls = []
        self._current = {}

    def record(self, kind, numel, element_size=4):
        """Add one collective of `kind` over a full tensor of `numel` elements of `element_size` bytes."""
        if kind not in KINDS:
            raise AccountingError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}")
        nbytes = int(numel) * int(element_size)
        self._current[kind] = self._current.get(kind, 0) + nbytes
        self.calls.append((len(self.steps), kind, int(numel)))

    def mark_setup(self):
        """What was recorded so far is set-up (the constructor's broadcasts), not a training step."""
        self.setup, self._current = self._current, {}
        self.calls = []

    def next_step(self):
        """Close the current step: what was recorded since the last call becomes `steps[-1]`."""
        self.steps.append(self._current)
        self._current = {}

    def bytes(self, step=-1):
        """{kind: bytes} of one step (the last closed one by default)."""
        if not self.steps:
            raise AccountingError("no step was counted yet: call next_step() after each training step")
        return dict(self.steps[step])

    def volume(self, step=-1):
        """The step's communication volume in the ZeRO paper's sense (all-reduce counted twice), bytes."""
        return sum(VOLUME_FACTOR[kind] * n for kind, n in self.bytes(step).items())

    def sent(self, step=-1):
        """Bytes one rank sends in the step with ring algorithms: volume x (world_size - 1) / world_size."""
        return self.volume(step) * (self.world_size - 1) // self.world_size

    def __repr__(self):
        last = self.steps[-1] if self.steps else self._current
        parts = ", ".join(f"{k}={v}" for k, v in last.items()) or "nothing"
        return f"CommCounter(world_size={self.world_size}, steps={len(self.steps)}, last step bytes: {parts})"


def counting_allreduce_hook(counter, bucket):
    """DDP comm hook: all-reduce the bucket (sum, then divide by the world size) and record its bytes.

    Use `ddp.register_comm_hook(counter, counting_allreduce_hook)`; mirrors
    torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py allreduce_hook.
    """
    tensor = bucket.buffer()
    counter.record("all_reduce", tensor.numel(), tensor.element_size())
    tensor.div_(dist.get_world_size())
    # distributed_c10d's own function: not the wrapper count_torch_collectives may have put on `dist`
    work = dist.distributed_c10d.all_reduce(tensor, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def _counting(original, counter, kind, index, keyword):
    @functools.wraps(original)
    def wrapper(*args, **kwargs):
        tensor = args[index] if len(args) > index else kwargs[keyword]
        tensors = tensor if isinstance(tensor, (list, tuple)) else [tensor]  # list forms: the output list
        counter.record(kind, sum(t.numel() for t in tensors), tensors[0].element_size())
        return original(*args, **kwargs)
    return wrapper


# function: (kind, position and keyword of the full-size tensor)
_PATCHED = {"all_reduce": ("all_reduce", 0, "tensor"), "broadcast": ("broadcast", 0, "tensor"),
            "all_gather_into_tensor": ("all_gather", 0, "output_tensor"),
            "all_gather": ("all_gather", 0, "tensor_list"),
            "reduce_scatter_tensor": ("reduce_scatter", 1, "input")}


@contextlib.contextmanager
def count_torch_collectives(counter):
    """Record the tensor collectives torch.distributed's Python functions run in this block.

    Wraps torch.distributed.all_reduce, broadcast, all_gather_into_tensor and all_gather (the output
    counted: FSDP1 uses the list form on the CPU) and reduce_scatter_tensor (its input counted), which
    ZeroRedundancyOptimizer and FSDP1 call through the module. DDP's gradient all-reduce runs in C++
    (the Reducer) and is not seen here: use `counting_allreduce_hook`.
    """
    saved = {name: getattr(dist, name) for name in _PATCHED}
    try:
        for name, (kind, index, keyword) in _PATCHED.items():
            setattr(dist, name, _counting(saved[name], counter, kind, index, keyword))
        yield counter
    finally:
        for name, original in saved.items():
            setattr(dist, name, original)


# ---------------------------------------------------------------------------------------------
# Memory.


class MemoryReport:
    """Bytes one rank holds: parameters, gradients, optimizer state (per-element tensors), and apart:
    Adam's `step` counters (`step_bytes`) and frozen parameters and buffers (`other_bytes`)."""

    def __init__(self, params, grads, state, step_bytes=0, other_bytes=0):
        self.params = params
        self.grads = grads
        self.state = state
        self.step_bytes = step_bytes
        self.other_bytes = other_bytes

    @property
    def total(self):
        """Parameters + gradients + optimizer state, bytes (what the ZeRO formulas count)."""
        return self.params + self.grads + self.state

    def as_dict(self):
        """Plain data: {'params', 'grads', 'state', 'step_bytes', 'other_bytes', 'total'}."""
        return {"params": self.params, "grads": self.grads, "state": self.state,
                "step_bytes": self.step_bytes, "other_bytes": self.other_bytes, "total": self.total}

    def __repr__(self):
        return (f"MemoryReport(params={self.params}, grads={self.grads}, state={self.state}, "
                f"total={self.total} bytes)")


def _storage_key(tensor):
    storage = tensor.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def storage_bytes(tensors):
    """Bytes of the distinct storages behind `tensors` (views of one buffer counted once; freed ones 0)."""
    seen = {}
    for tensor in tensors:
        if tensor is None or tensor.device.type == "meta":
            continue
        ptr, nbytes = _storage_key(tensor)
        if nbytes:
            seen[ptr] = max(seen.get(ptr, 0), nbytes)
    return sum(seen.values())


def _inner_optimizers(optimizer):
    """The torch optimizers holding state: the optimizer itself, or the local one a sharded wrapper holds."""
    inner = getattr(optimizer, "optim", None)
    return [inner] if isinstance(inner, torch.optim.Optimizer) else [optimizer]


def measure_memory(model, optimizer):
    """A MemoryReport of the tensors `model` and `optimizer` hold now (call it between steps).

    Parameters: the storages of the model's trainable parameters and of the optimizer's parameters (a
    ZeRO optimizer's flat shard); gradients: their `.grad` storages; state: the optimizer state tensors
    that are not `step`. Frozen parameters and buffers go to `other_bytes`.
    """
    if not isinstance(model, torch.nn.Module):
        raise AccountingError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    optimizers = _inner_optimizers(optimizer)
    if not all(isinstance(o, torch.optim.Optimizer) for o in optimizers):
        raise AccountingError(f"optimizer must be a torch optimizer or a ZeRO optimizer holding one in "
                              f".optim, got {type(optimizer).__name__}")
    trainable = [p for p in model.parameters() if p.requires_grad]
    owned = [p for o in optimizers for g in o.param_groups for p in g["params"] if p.requires_grad]
    params = trainable + owned
    state = [t for o in optimizers for s in o.state.values() for k, t in s.items()
             if isinstance(t, torch.Tensor) and k != "step"]
    steps = [t for o in optimizers for s in o.state.values() for k, t in s.items()
             if isinstance(t, torch.Tensor) and k == "step"]
    other = [p for p in model.parameters() if not p.requires_grad] + list(model.buffers())
    return MemoryReport(storage_bytes(params), storage_bytes([p.grad for p in params]), storage_bytes(state),
                        storage_bytes(steps), storage_bytes(other))


# ---------------------------------------------------------------------------------------------
# The paper's formulas and the calculator (arithmetic).


def _stage(stage):
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise AccountingError(f"stage must be 0 (DDP), 1, 2 or 3, got {stage!r}")
    return stage


def _count(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 1:
        raise AccountingError(f"{what} must be a positive number, got {value!r}")
    return value


def _precision(precision):
    if isinstance(precision, str):
        if precision not in PRECISIONS:
            raise AccountingError(f"precision must be one of {', '.join(PRECISIONS)} or a tuple "
                                  f"(param_bytes, grad_bytes, state_bytes), got {precision!r}")
        return PRECISIONS[precision]
    if not (isinstance(precision, tuple) and len(precision) == 3):
        raise AccountingError(f"precision must be a name or a tuple of 3 byte counts, got {precision!r}")
    return precision


def memory_formula(numel, world_size, stage, precision="fp32"):
    """The ZeRO paper's bytes per rank {'params', 'grads', 'state', 'total'} for `numel` parameters.

    stage 0 is DDP; precision 'mixed' is the paper's (2, 2, K=12) bytes per parameter, 'fp32' plain fp32
    Adam (4, 4, 8), or a tuple. Partitioned parts are numel / world_size (round numel up to a multiple of
    world_size first to compare with padded flat buffers).
    """
    numel, world_size, stage = _count(numel, "numel"), _count(world_size, "world_size"), _stage(stage)
    p, g, k = _precision(precision)
    share = numel / world_size
    params = p * (share if stage == 3 else numel)
    grads = g * (share if stage >= 2 else numel)
    state = k * (share if stage >= 1 else numel)
    return {"params": params, "grads": grads, "state": state, "total": params + grads + state}


def comm_volume(numel, stage, element_size=4, stage1_all_reduce=False):
    """The papers' communication volume per rank and step, bytes: DDP 2 Psi, ZeRO-1/2 2 Psi, ZeRO-3 3 Psi.

    ZeRO-1 is the paper's (section 7.2.1), as ortlab's stage 1 runs it: a reduce-scatter of the gradients
    (Psi) then an all-gather of the updated parameters (Psi). stage1_all_reduce=True is torch's variant,
    ZeroRedundancyOptimizer + DDP: DDP all-reduces the gradients first (2 Psi, every rank receives all of them
    averaged, though it updates only its shard), then the optimizer broadcasts the updated parameters (Psi):
    3 Psi. It changes stage 1 only.
    """
    _count(numel, "numel")
    stage = _stage(stage)
    if not isinstance(stage1_all_reduce, bool):
        raise AccountingError(f"stage1_all_reduce must be True (torch's ZeRO-1 under DDP, 3 Psi) or False "
                              f"(the paper's ZeRO-1, 2 Psi), got {stage1_all_reduce!r}")
    factor = {0: 2, 1: 3 if stage1_all_reduce else 2, 2: 2, 3: 3}[stage]
    return factor * numel * element_size


def calculator(params, world_size, stage, precision="mixed", bandwidth_gb_s=None):
    """Arithmetic, not a measurement: the ZeRO paper's memory per rank and volume per step for a model and
    cluster no machine here has (e.g. calculator(7e9, 64, 3)). Returns a dict of GB figures, plus the seconds
    the step's communication takes at `bandwidth_gb_s` (GB/s per rank, ring algorithms) when given.
    """
    _count(params, "params (the model's parameter count)")
    p, g, k = _precision(precision)
    memory = memory_formula(params, world_size, stage, (p, g, k))
    volume = comm_volume(params, stage, element_size=g)
    out = {"kind": "arithmetic (ZeRO paper formulas)", "technique": TECHNIQUES[stage], "params": params,
           "world_size": world_size, "precision": precision}
    out.update({f"{key}_gb": value / 1e9 for key, value in memory.items()})
    out["comm_volume_gb"] = volume / 1e9
    if bandwidth_gb_s is not None:
        _count(bandwidth_gb_s, "bandwidth_gb_s")
        out["comm_seconds"] = volume * (world_size - 1) / world_size / 1e9 / bandwidth_gb_s
    return out


def calculator_table(params, world_size, precision="mixed", bandwidth_gb_s=None):
    """A Table of `calculator` for DDP and ZeRO-1/2/3: GB per rank and GB moved per step (arithmetic)."""
    rows = []
    for stage in range(4):
        c = calculator(params, world_size, stage, precision, bandwidth_gb_s)
        row = {"arithmetic": c["technique"], "params GB": f"{c['params_gb']:.2f}",
               "grads GB": f"{c['grads_gb']:.2f}", "optimizer GB": f"{c['state_gb']:.2f}",
               "total GB / rank": f"{c['total_gb']:.2f}", "comm GB / step": f"{c['comm_volume_gb']:.1f}"}
        if bandwidth_gb_s is not None:
            row["comm s / step"] = f"{c['comm_seconds']:.2f}"
        rows.append(row)
    return Table.from_dicts(rows)


def plot_memory(params, world_sizes=(1, 2, 4, 8, 16, 32, 64), precision="mixed", ax=None):
    """Plot the formulas' GB per rank against the number of ranks, one line per technique (arithmetic).
    Returns the matplotlib axes."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    ax = ax or plt.subplots(figsize=(5, 3.2))[1]
    for stage, name in enumerate(TECHNIQUES):
        totals = [memory_formula(params, n, stage, precision)["total"] / 1e9 for n in world_sizes]
        ax.plot(world_sizes, totals, marker="o", label=name)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("ranks (N_d)")
    ax.set_ylabel("GB per rank")
    ax.set_title(f"{params / 1e9:g}B parameters, {precision} Adam (arithmetic)")
    ax.legend()
    return ax


def _rank0_techniques(results, step=-1):
    """{technique: rank 0's result with 'comm' narrowed to one step} from zero_check's launch results."""
    return {label: {**result, "comm": result["comm"][step]} for label, result in results[0].items()
            if isinstance(result, dict) and "stage" in result and "memory" in result}


def measured_table(results, numel=None, world_size=None, element_size=4):
    """A Table of measured bytes per rank and per step next to the formulas (fp32 Adam, padded numel).

    `results` maps a technique label to one rank's result dict with 'stage' (0 for DDP), 'memory'
    (MemoryReport.as_dict()) and 'comm' ({kind: bytes} of one step); or it is the list
    launch(zero_check, N) returned (rank 0's results, the last step; numel and world_size read from it).
    The 'note' column splits the volume by collective, in Psi, and flags a ZeRO run that all-reduces its
    gradients (torch's ZeRO-1 under DDP).
    """
    if isinstance(results, (list, tuple)):
        if not results or not isinstance(results[0], dict) or "numel" not in results[0]:
            raise AccountingError("measured_table takes the list launch(zero_check, N) returned, "
                                  "or {technique: one rank's result}")
        numel = results[0]["numel"] if numel is None else numel
        world_size = len(results) if world_size is None else world_size
        results = _rank0_techniques(results)
    if not isinstance(results, dict) or numel is None or world_size is None:
        raise AccountingError("give measured_table {technique: result} with numel and world_size, "
                              "or the list launch(zero_check, N) returned")
    rows = []
    for label, result in results.items():
        padded = -(-numel // world_size) * world_size
        formula = memory_formula(padded, world_size, result["stage"], "fp32")
        memory = result["memory"]
        volume = sum(VOLUME_FACTOR[k] * n for k, n in result["comm"].items())
        rows.append({"technique": label, "params B": f"{memory['params']} ({formula['params']:.0f})",
                     "grads B": f"{memory['grads']} ({formula['grads']:.0f})",
                     "state B": f"{memory['state']} ({formula['state']:.0f})",
                     "comm / step B": volume, "in Psi": f"{volume / (numel * element_size):.2f}",
                     "note": comm_note(result["comm"], result["stage"], numel, element_size)})
    return Table.from_dicts(rows)


def comm_note(comm, stage, numel, element_size=4):
    """One step's volume split by collective in Psi of `numel` elements ('reduce-scatter 1.00 + all-gather
    1.00'), flagged when a ZeRO stage all-reduces its gradients, as DDP does under torch's
    ZeroRedundancyOptimizer."""
    psi = numel * element_size
    parts = [f"{kind.replace('_', '-')} {VOLUME_FACTOR[kind] * n / psi:.2f}" for kind, n in comm.items()]
    note = " + ".join(parts) or "nothing"
    if stage >= 1 and "all_reduce" in comm:
        note += " (DDP all-reduces first)"
    return note

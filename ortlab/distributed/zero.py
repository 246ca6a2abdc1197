"""ZeRO stages 1, 2 and 3: data parallelism with optimizer state, gradients and parameters split across ranks.

Mirrors Rajbhandari et al. 2020 ("ZeRO: Memory Optimizations Toward Training Trillion Parameter Models"),
DeepSpeed's deepspeed/runtime/zero/stage_1_and_2.py and stage3.py, torch's
torch/distributed/optim/zero_redundancy_optimizer.py and FSDP1's flat parameters
(torch/distributed/fsdp/_flat_param.py). `zero(model, optimizer_class, stage, **optimizer_kwargs)` returns
`(model, optimizer)`, used as usual inside a launched function: forward, `loss.backward()`,
`optimizer.step()`, `optimizer.zero_grad()`. Gradients are averaged over ranks as DDP does, so N ranks on
N equal slices of a batch train like one process on the whole batch.

All trainable parameters are flattened into one flat fp32 buffer (tied weights once), padded with zeros to a
multiple of the world size; rank r owns elements [r S, (r+1) S) with S = padded / world_size, and an optimizer
built over that shard alone holds its state (Adam: exp_avg, exp_avg_sq of S elements each).

- stage 1 (P_os): every rank keeps the full parameters and a full-size flat gradient buffer; at `step()` the
  gradients are reduce-scattered (each rank receives the averaged gradient of its own shard only), each rank
  updates its shard, and the shards are all-gathered into every rank's flat buffer: Psi + Psi = 2 Psi, the
  paper's volume (section 7.2.1). After `step()` the module's `.grad` are views of that buffer: this rank's
  shard holds the gradient averaged over ranks (what its optimizer used), the rest this rank's own local,
  unaveraged gradient (the other shards' averages were never sent here: that is the Psi saved). torch's
  ZeroRedundancyOptimizer under DDP moves 3 Psi instead, because DDP all-reduces the full gradient (2 Psi)
  before the optimizer broadcasts the updated parameters (Psi): see `zero_check`'s 'torch_zero1';
- stage 2 (P_os+g): at `step()` the gradients are reduce-scattered, so each rank keeps only its shard's
  (averaged) gradient; the module's `.grad` are then None; parameters all-gathered after the update;
- stage 3 (P_os+g+p): each rank keeps only its parameter shard. Module hooks all-gather the flat buffer
  before forward and free it after; a hook on the outputs gathers it again before backward, and at the end
  of backward the gradients are reduce-scattered and the full buffer is freed (FSDP1's trick: the buffer's
  storage is resized to 0 and back, so autograd's saved views stay valid). Read parameters with
  `optimizer.gathered()` or `optimizer.full_parameters()`.

Differences from DeepSpeed, on purpose for reading: one flat buffer (no buckets), gradient communication at
`step()` for stages 1 and 2 and at the end of backward for stage 3 (not overlapped with backward), fp32
(no fp16 copies). Frozen parameters (requires_grad=False) and buffers stay whole on every rank, broadcast
from rank 0 once, as DDP's constructor does; before that, every rank's parameter shapes, stage and optimizer
are compared (one all_gather_object, not counted in `comm`), so a rank with another model is named. A
parameter that gets no gradient in a step counts as a zero gradient (as in DeepSpeed and FSDP; torch's Adam
on one process would skip it).
"""
import contextlib
import inspect

import torch
import torch.distributed as dist
from torch import nn
from torch.utils._pytree import tree_map_only

from ortlab.distributed.accounting import CommCounter
from ortlab.distributed.accounting import measure_memory
from ortlab.distributed.agreement import check_same_on_every_rank, describe_tensors
from ortlab.errors import OrtlabError

STAGES = (1, 2, 3)


class ZeroError(OrtlabError):
    """zero() was given something it cannot shard, or ran outside a process group (the message says what to
    do)."""


# ---------------------------------------------------------------------------------------------
# The flat buffer.


class FlatLayout:
    """Where each trainable parameter lives in the flat buffer, and which slice each rank owns.

    `names`, `shapes`, `offsets`, `numels` per parameter (in `named_parameters()` order, tied ones once);
    `numel` the parameters' total (Psi), `padded` rounded up to a multiple of `world_size`, `shard` = padded
    / world_size. Mirrors FSDP1's FlatParamHandle (_flat_param.py: flatten, pad, shard).
    """

    def __init__(self, named_params, world_size):
        self.names = [name for name, _ in named_params]
        self.shapes = [tuple(p.shape) for _, p in named_params]
        self.numels = [p.numel() for _, p in named_params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(self.numels))]
        self.world_size = world_size
        self.numel = sum(self.numels)
        self.padded = -(-self.numel // world_size) * world_size
        self.shard = self.padded // world_size

    def shard_range(self, rank):
        """The [start, stop) slice of the flat buffer that `rank` owns."""
        return rank * self.shard, (rank + 1) * self.shard

    def flatten(self, tensors):
        """One padded flat tensor holding `tensors` (None counts as zeros), in layout order."""
        flat = torch.zeros(self.padded, dtype=tensors[0].dtype if tensors else torch.float32)
        for tensor, offset, numel in zip(tensors, self.offsets, self.numels):
            if tensor is not None:
                flat[offset:offset + numel].copy_(tensor.reshape(-1))
        return flat

    def views(self, flat):
        """Views of `flat` shaped like each parameter."""
        return [flat[o:o + n].view(s) for o, n, s in zip(self.offsets, self.numels, self.shapes)]

    def owners(self, name):
        """The ranks whose shard holds part of parameter `name`."""
        i = self.names.index(name)
        first, last = self.offsets[i], self.offsets[i] + self.numels[i] - 1
        return list(range(first // self.shard, last // self.shard + 1))

    def __repr__(self):
        return (f"FlatLayout({len(self.names)} parameters, numel={self.numel}, padded={self.padded}, "
                f"world_size={self.world_size}, shard={self.shard})")


# ---------------------------------------------------------------------------------------------
# Checks.


def _check_stage(stage):
    if isinstance(stage, bool) or stage not in STAGES:
        raise ZeroError(f"stage must be 1 (optimizer state partitioned), 2 (+ gradients) or 3 "
                        f"(+ parameters), got {stage!r}; for no partitioning use torch's "
                        f"DistributedDataParallel")
    return stage


def _check_optimizer_class(optimizer_class):
    if not (inspect.isclass(optimizer_class) and issubclass(optimizer_class, torch.optim.Optimizer)):
        got = (f"an instance of {type(optimizer_class).__name__}" if isinstance(optimizer_class, torch.optim.Optimizer)
               else repr(optimizer_class)[:80])
        raise ZeroError(f"optimizer_class must be a torch.optim.Optimizer subclass such as torch.optim.Adam "
                        f"(the class, not an instance), got {got}; pass its arguments as "
                        f"keywords: zero(model, torch.optim.Adam, stage, lr=1e-3)")
    return optimizer_class


def _check_group():
    if not (dist.is_available() and dist.is_initialized()):
        raise ZeroError("zero() needs a torch.distributed process group: call it inside a function run by "
                        "ortlab.distributed.launch(fn, world_size=2) (or after dist.init_process_group)")


def _trainable(model):
    if not isinstance(model, nn.Module):
        raise ZeroError(f"model must be a torch.nn.Module, got {type(model).__name__}")
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    if not named:
        raise ZeroError("the model has no trainable parameters (requires_grad=True): nothing to shard")
    dtypes = {p.dtype for _, p in named}
    devices = {p.device.type for _, p in named}
    if len(dtypes) > 1 or not next(iter(dtypes)).is_floating_point or devices != {"cpu"}:
        raise ZeroError(f"every trainable parameter must be a floating tensor of one dtype on the CPU to "
                        f"share one flat buffer, got dtypes {sorted(map(str, dtypes))} on {sorted(devices)}; "
                        f"convert the model first (model.float())")
    return named


def _check_same_model(model, named, optimizer_class, stage, optimizer_kwargs):
    """Every rank must shard the same trainable parameters, frozen parameters and buffers (names, shapes,
    dtypes) with the same stage and optimizer: one all_gather_object of their description before the first
    broadcast, the same ZeroError on every rank otherwise (a flat buffer of another size would make gloo
    abort)."""
    trainable = {id(p) for _, p in named}
    frozen = [(n, p) for n, p in model.named_parameters() if id(p) not in trainable]
    optimizer = f"{optimizer_class.__name__}({', '.join(f'{k}={v!r}' for k, v in sorted(optimizer_kwargs.items()))})"
    check_same_on_every_rank(
        {"trainable parameter": describe_tensors(named), "frozen parameter": describe_tensors(frozen),
         "buffer": describe_tensors(model.named_buffers()),
         "setting": [("stage", f"value {stage!r}"), ("optimizer", optimizer)]}, ZeroError,
        "ZeRO flattens the trainable parameters into one buffer cut into equal shards and broadcasts rank 0's "
        "values: build the same model and call zero() with the same stage and optimizer on every rank")


def zero(model, optimizer_class, stage, **optimizer_kwargs):
    """Shard `model`'s training across the process group's ranks with ZeRO `stage` (1, 2 or 3).

    Returns `(model, optimizer)`: the same module (its parameters now views of a flat buffer; with stage
    3 hooked to gather them) and a ZeroOptimizer whose inner `optimizer_class(**optimizer_kwargs)` updates
    this rank's shard. Rank 0's parameters and buffers are broadcast to every rank first.
    """
    stage = _check_stage(stage)
    optimizer_class = _check_optimizer_class(optimizer_class)
    named = _trainable(model)
    _check_group()
    return model, ZeroOptimizer(model, named, optimizer_class, stage, optimizer_kwargs)


# ---------------------------------------------------------------------------------------------
# The optimizer.


class _GatherBeforeBackward(torch.autograd.Function):
    """Identity on a module output; its backward gathers the stage-3 parameters before the module's own
    backward runs (DeepSpeed's PreBackwardFunction in parameter_offload.py)."""

    @staticmethod
    def forward(ctx, tensor, owner):
        ctx.owner = owner
        return tensor.view_as(tensor)

    @staticmethod
    def backward(ctx, grad):
        ctx.owner._before_backward()
        return grad, None


class ZeroOptimizer:
    """Steps the shard of the flat parameters this rank owns; does stage 1/2/3's communication.

    `stage`, `rank`, `world_size`, `layout` (FlatLayout), `optim` (the inner optimizer over `shard_param`),
    `comm` (a CommCounter: bytes per collective per step; `comm.setup` holds the initial broadcasts, not
    the few hundred bytes of the check that every rank holds the same model, which comes first).
    """

    def __init__(self, model, named, optimizer_class, stage, optimizer_kwargs):
        _check_same_model(model, named, optimizer_class, stage, optimizer_kwargs)
        self.model = model
        self.stage = stage
        self.rank = dist.get_rank()
        self.world_size = dist.get_world_size()
        self.comm = CommCounter(self.world_size)
        self.layout = FlatLayout(named, self.world_size)
        self._params = [p for _, p in named]
        flat = self._broadcast_initial(model)
        start, stop = self.layout.shard_range(self.rank)
        if stage < 3:
            self.flat = flat
            self._point_params_at(flat)
            self.shard_param = nn.Parameter(flat[start:stop])  # a view: the update writes into `flat`
        else:
            self.shard_param = nn.Parameter(flat[start:stop].clone())
            self.full = flat
            self._point_params_at(flat)
            self._free_full()
            self._backward_pending = False
            self._hooks = [model.register_forward_pre_hook(self._before_forward),
                           model.register_forward_hook(self._after_forward)]
        try:
            self.optim = optimizer_class([self.shard_param], **optimizer_kwargs)
        except TypeError as exc:
            raise ZeroError(f"{optimizer_class.__name__} did not accept the optimizer arguments "
                            f"{sorted(optimizer_kwargs)}: {exc}") from exc

    # -- set-up

    def _collective(self, kind, tensor):
        self.comm.record(kind, tensor.numel(), tensor.element_size())

    def _broadcast_initial(self, model):
        flat = self.layout.flatten([p.detach() for p in self._params])
        self._collective("broadcast", flat)
        dist.broadcast(flat, src=0)
        trainable = {id(p) for p in self._params}
        for tensor in [p for p in model.parameters() if id(p) not in trainable] + list(model.buffers()):
            self._collective("broadcast", tensor)
            with torch.no_grad():
                dist.broadcast(tensor, src=0)
        self.comm.mark_setup()
        return flat

    def _point_params_at(self, flat):
        for param, view in zip(self._params, self.layout.views(flat)):
            param.data = view

    # -- stage 3: gather and free the full parameters

    def _free_full(self):
        self.full.untyped_storage().resize_(0)

    def _gather_full(self):
        if self.full.untyped_storage().nbytes() == 0:
            self.full.untyped_storage().resize_(self.layout.padded * self.full.element_size())
            self._collective("all_gather", self.full)
            dist.all_gather_into_tensor(self.full, self.shard_param.detach())

    def _before_forward(self, module, args):
        self._gather_full()

    def _after_forward(self, module, args, output):
        self._free_full()
        if not torch.is_grad_enabled():
            return output
        return tree_map_only(torch.Tensor, lambda t: _GatherBeforeBackward.apply(t, self)
                             if t.requires_grad else t, output)

    def _before_backward(self):
        if not self._backward_pending:
            self._backward_pending = True
            self._gather_full()
            torch.autograd.Variable._execution_engine.queue_callback(self._after_backward)

    def _after_backward(self):
        self._backward_pending = False
        grad = self._reduce_scatter(self.layout.flatten([p.grad for p in self._params]))
        for param in self._params:
            param.grad = None
        if self.shard_param.grad is None:
            self.shard_param.grad = grad
        else:
            self.shard_param.grad.add_(grad)
        self._free_full()

    # -- communication of gradients and parameters

    def _reduce_scatter(self, flat_grad):
        shard = torch.empty(self.layout.shard, dtype=flat_grad.dtype)
        self._collective("reduce_scatter", flat_grad)
        dist.reduce_scatter_tensor(shard, flat_grad)
        return shard.div_(self.world_size)

    def _reduce_scatter_keeping_full(self):
        """Stage 1: reduce-scatter the gradients into this rank's slice of a full-size flat gradient buffer,
        which the module's `.grad` view (own shard averaged, the rest local) and `shard_param.grad` views."""
        flat_grad = self.layout.flatten([p.grad for p in self._params])
        start, stop = self.layout.shard_range(self.rank)
        flat_grad[start:stop].copy_(self._reduce_scatter(flat_grad))
        for param, view in zip(self._params, self.layout.views(flat_grad)):
            param.grad = view
        self.shard_param.grad = flat_grad[start:stop]

    def _all_gather_params(self):
        self._collective("all_gather", self.flat)
        dist.all_gather_into_tensor(self.flat, self.shard_param.detach().clone())

    # -- the optimizer's interface

    def step(self, closure=None):
        """Average this rank's shard of the gradients over ranks (a reduce-scatter: stages 1 and 2 here,
        stage 3 at the end of backward), update the shard, all-gather the updated parameters (stages 1, 2)."""
        if closure is not None:
            raise ZeroError("ZeroOptimizer.step takes no closure: call loss.backward() before step()")
        if self.stage == 1:
            self._reduce_scatter_keeping_full()
        elif self.stage == 2:
            flat_grad = self.layout.flatten([p.grad for p in self._params])
            self.shard_param.grad = self._reduce_scatter(flat_grad)
            for param in self._params:
                param.grad = None
        self.optim.step()
        if self.stage < 3:
            self._all_gather_params()
        self.comm.next_step()

    def zero_grad(self, set_to_none=True):
        """Drop (or zero) the gradients: the module's and the shard's."""
        for param in self._params + [self.shard_param]:
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()

    @property
    def param_groups(self):
        """The inner optimizer's parameter groups (one, holding `shard_param`): change `lr` here."""
        return self.optim.param_groups

    @property
    def state(self):
        """The inner optimizer's state: this rank's shard only."""
        return self.optim.state

    @contextlib.contextmanager
    def gathered(self):
        """Make the full parameters readable in this block (stage 3 gathers and frees after; collective:
        every rank must enter it). Mirrors FSDP's summon_full_params."""
        if self.stage < 3:
            yield self.model
            return
        self._gather_full()
        try:
            yield self.model
        finally:
            self._free_full()

    def full_parameters(self):
        """{name: copy} of every parameter of the model, whole (collective for stage 3)."""
        with self.gathered():
            return {name: p.detach().clone() for name, p in self.model.named_parameters()}

    def memory(self):
        """A MemoryReport of what this rank holds now (see ortlab.distributed.accounting.measure_memory)."""
        return measure_memory(self.model, self)

    def __repr__(self):
        return (f"ZeroOptimizer(stage={self.stage}, rank={self.rank}/{self.world_size}, {self.layout}, "
                f"optim={type(self.optim).__name__})")

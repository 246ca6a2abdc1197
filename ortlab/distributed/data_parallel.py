"""Data parallel training with gradient buckets: a readable mirror of torch's DistributedDataParallel.

Mirrors torch/nn/parallel/distributed.py (DistributedDataParallel: _sync_module_states, no_sync,
_ddp_init_helper) and torch/csrc/distributed/c10d/reducer.cpp (compute_bucket_assignment_by_size,
Reducer::autograd_hook / mark_variable_ready / mark_bucket_ready / finalize_backward):

- at wrap time every rank's parameter and buffer shapes are compared (one all_gather_object: a different
  model is named on every rank instead of a gloo abort), then rank 0's parameters and buffers are
  broadcast, so every rank starts from the same model;
- the parameters are cut into buckets in reverse order (the order their gradients are usually ready in
  backward), a bucket closed as soon as it holds at least `bucket_cap_mb` MiB (one set of buckets per dtype);
- a hook on each parameter (`register_post_accumulate_grad_hook`) marks it ready once its gradient is
  accumulated; when every gradient of a bucket is ready the bucket is flattened and all-reduced
  asynchronously (SUM, then divided by the world size at the end: gloo has no ReduceOp.AVG), buckets always
  launched in index order so every rank issues the same collectives in the same order;
- at the end of backward (an autograd engine callback, as finalize_backward) the reductions are waited
  for, divided by the world size and copied back into each `.grad`;
- `no_sync()`: a forward inside it skips the reduction of the following backward, so gradients accumulate
  locally (DDP decides at forward time too);
- `history` records, for every backward, the order gradients became ready and when each bucket was
  launched, for display (`bucket_table`, `bucket_timeline`).

Differences from torch's DDP, on purpose: the buckets are fixed at wrap time (DDP uses one bucket in the
first iteration when find_unused_parameters=False, then rebuilds them in the order gradients became ready:
the same layout as this mirror's for a feed-forward model); no find_unused_parameters, comm hooks or
gradient_as_bucket_view.

`ddp_check` is the rank function that trains the mirror and torch's DDP side by side on the same shards.
"""
import contextlib
import numbers

import torch
import torch.distributed as dist
from torch import nn

from ortlab.distributed.agreement import check_same_on_every_rank, describe_tensors
from ortlab.errors import OrtlabError

MIB = 1024 * 1024


class DataParallelError(OrtlabError):
    """The data-parallel wrapper got a setting or a model it cannot use, or ran outside a process group."""


# ---------------------------------------------------------------------------------------------
# Buckets.


class Bucket:
    """One gradient bucket: the parameters (names) whose gradients are all-reduced together."""

    def __init__(self, index, names, params):
        self.index, self.names, self.params = index, list(names), list(params)
        self.numel = sum(p.numel() for p in self.params)
        self.nbytes = sum(p.numel() * p.element_size() for p in self.params)

    def __repr__(self):
        return f"Bucket({self.index}, {self.names}, numel={self.numel}, bytes={self.nbytes})"


def assign_buckets(tensors, bucket_cap_mb):
    """Bucket `tensors` (in the order given) by size: lists of indices, one list per bucket.

    A bucket is closed as soon as it holds at least the cap; tensors of different dtypes never share a
    bucket; buckets are ordered by their first tensor. Mirrors reducer.cpp compute_bucket_assignment_by_size
    (with one size limit).
    """
    cap = _check_cap(bucket_cap_mb) * MIB
    if isinstance(tensors, torch.Tensor) or not isinstance(tensors, (list, tuple)):
        raise DataParallelError(f"tensors must be a list of tensors (parameters in bucketing order), "
                                f"got {type(tensors).__name__}")
    for index, tensor in enumerate(tensors):
        if not isinstance(tensor, torch.Tensor):
            raise DataParallelError(f"tensors[{index}] must be a torch.Tensor, got {type(tensor).__name__}")
    open_buckets, closed = {}, []
    for index, tensor in enumerate(tensors):
        key = tensor.dtype
        indices, size = open_buckets.get(key, ([], 0))
        indices, size = indices + [index], size + tensor.numel() * tensor.element_size()
        if size >= cap:
            closed.append(indices)
            open_buckets.pop(key, None)
        else:
            open_buckets[key] = (indices, size)
    closed.extend(indices for indices, _ in open_buckets.values())
    return sorted(closed, key=min)


def _process_group():
    if not (dist.is_available() and dist.is_initialized()):
        raise DataParallelError(
            "no process group: DistributedDataParallel all-reduces gradients between ranks. Wrap the model "
            "inside a function run by ortlab.distributed.launch(fn, world_size=2), or call "
            "dist.init_process_group first")
    return dist.get_rank(), dist.get_world_size()


def _check_cap(bucket_cap_mb):
    number = isinstance(bucket_cap_mb, numbers.Real) and not isinstance(bucket_cap_mb, bool)
    if not number or not bucket_cap_mb > 0:
        raise DataParallelError(f"bucket_cap_mb must be a positive number of MiB (torch's default is 25; "
                                f"float('inf') puts every gradient in one bucket), got {bucket_cap_mb!r}")
    return float(bucket_cap_mb)


def _trainable(module):
    if not isinstance(module, nn.Module):
        raise DataParallelError(f"module must be a torch.nn.Module, got {type(module).__name__}")
    named = [(name, p) for name, p in module.named_parameters() if p.requires_grad]
    if not named:
        raise DataParallelError("the module has no parameter that requires grad: there is nothing to "
                                "synchronise; train it without a data-parallel wrapper")
    for name, p in named:
        if not p.is_floating_point():
            raise DataParallelError(f"parameter {name} has dtype {p.dtype}; gradients need a floating dtype")
    return named


# ---------------------------------------------------------------------------------------------
# The wrapper.


class DistributedDataParallel(nn.Module):
    """Data parallel module wrapper: the same model on every rank, gradients averaged in buckets.

    Use as torch's: `model = DistributedDataParallel(module, bucket_cap_mb=25)` inside a launched
    function, then forward, `loss.backward()` (gradients come back averaged over ranks), `optimizer.step()`.
    `buckets` is the bucket layout, `history` one record per backward (see bucket_timeline).
    """

    def __init__(self, module, bucket_cap_mb=25.0, broadcast_buffers=True):
        super().__init__()
        named = _trainable(module)
        self.bucket_cap_mb = _check_cap(bucket_cap_mb)
        self.rank, self.world_size = _process_group()
        self.module = module
        self.broadcast_buffers = broadcast_buffers
        self._check_same_model()
        self._sync_module_states()
        reverse = named[::-1]
        layout = assign_buckets([p for _, p in reverse], self.bucket_cap_mb)
        self.buckets = [Bucket(i, [reverse[j][0] for j in indices], [reverse[j][1] for j in indices])
                        for i, indices in enumerate(layout)]
        self._bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self._name_of = {id(p): name for name, p in named}
        self.require_backward_grad_sync = True
        self._sync_next_backward = True
        self.history = []
        self._state = None
        self._hooks = [p.register_post_accumulate_grad_hook(self._grad_ready) for _, p in named]

    # -- wrap time and forward ----------------------------------------------------------------

    def _check_same_model(self):
        """Every rank must wrap the same parameters and buffers (names, shapes, dtypes, which are trained)
        with the same settings: one all_gather_object of their description, before any broadcast
        (distributed.py _verify_param_shape_across_processes). Raises the same error on every rank."""
        params = [(name, f"{facts}, requires_grad={p.requires_grad}") for (name, facts), p in
                  zip(describe_tensors(self.module.named_parameters()), self.module.parameters())]
        settings = [(name, f"value {value!r}") for name, value in
                    (("bucket_cap_mb", self.bucket_cap_mb), ("broadcast_buffers", self.broadcast_buffers))]
        check_same_on_every_rank(
            {"parameter": params, "buffer": describe_tensors(self.module.named_buffers()), "setting": settings},
            DataParallelError,
            "DistributedDataParallel broadcasts rank 0's parameters to every rank and all-reduces gradient "
            "buckets of the same layout: build the same model with the same settings on every rank (only "
            "the initial values may differ)")

    def _sync_module_states(self):
        """Broadcast rank 0's parameters and buffers (distributed.py _sync_module_states)."""
        with torch.no_grad():
            for tensor in list(self.module.parameters()) + list(self.module.buffers()):
                dist.broadcast(tensor.data, src=0)

    def forward(self, *args, **kwargs):
        """Run the module; decide (as DDP does here) whether the next backward reduces gradients."""
        if self.broadcast_buffers:
            with torch.no_grad():
                for buffer in self.module.buffers():
                    dist.broadcast(buffer.data, src=0)
        self._sync_next_backward = self.require_backward_grad_sync
        return self.module(*args, **kwargs)

    @contextlib.contextmanager
    def no_sync(self):
        """Within this context forward+backward accumulate gradients locally, with no all-reduce.

        The first backward after a forward outside the context reduces the accumulated gradients."""
        old = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = old

    # -- backward: the reducer ----------------------------------------------------------------

    def _begin_backward(self):
        self._state = {"ready": {b.index: 0 for b in self.buckets}, "next": 0, "launched": [],
                       "record": {"backward": len(self.history), "synced": True, "events": []}}
        torch.autograd.Variable._execution_engine.queue_callback(self._finalize_backward)

    def _grad_ready(self, param):
        """Post-accumulate-grad hook: mark `param` ready; launch every bucket that is complete, in order
        (reducer.cpp mark_variable_ready, mark_bucket_ready)."""
        if not self._sync_next_backward:
            return
        if self._state is None:
            self._begin_backward()
        bucket = self._bucket_of[id(param)]
        self._state["record"]["events"].append(["grad", self._name_of[id(param)], bucket.index])
        self._state["ready"][bucket.index] += 1
        state = self._state
        while state["next"] < len(self.buckets) and state["ready"][state["next"]] == len(
                self.buckets[state["next"]].params):
            self._launch(self.buckets[state["next"]])
            state["next"] += 1

    def _launch(self, bucket):
        flat = torch.cat([p.grad.detach().reshape(-1) for p in bucket.params])
        work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
        self._state["launched"].append((bucket, flat, work))
        self._state["record"]["events"].append(["all_reduce", bucket.index, list(bucket.names)])

    def _finalize_backward(self):
        """End of backward: wait for every bucket, divide by the world size, copy into .grad."""
        state, self._state = self._state, None
        if state["next"] < len(self.buckets):
            missing = [self._name_of[id(p)] for b in self.buckets[state["next"]:] for p in b.params
                       if p.grad is None]
            raise DataParallelError(
                f"backward ended with buckets {list(range(state['next'], len(self.buckets)))} not reduced: "
                f"parameters {missing or 'in them'} got no gradient in this backward. Every trainable "
                f"parameter must be used in the forward (torch's DDP needs find_unused_parameters=True "
                f"for that case, which this mirror does not implement)")
        for bucket, flat, work in state["launched"]:
            work.wait()
            flat.div_(self.world_size)
            offset = 0
            for p in bucket.params:
                p.grad.copy_(flat[offset:offset + p.numel()].view_as(p.grad))
                offset += p.numel()
        state["record"]["events"].append(["done"])
        self.history.append(state["record"])

    def __repr__(self):
        return (f"DistributedDataParallel(rank={self.rank}, world_size={self.world_size}, "
                f"buckets={len(self.buckets)}, bucket_cap_mb={self.bucket_cap_mb}, "
                f"module={type(self.module).__name__})")


# ---------------------------------------------------------------------------------------------
# Display.


def bucket_layout(model):
    """The buckets of a wrapped model as plain data: [{'index', 'params', 'numel', 'bytes'}]."""
    if not isinstance(model, DistributedDataParallel):
        raise DataParallelError(f"bucket_layout needs a DistributedDataParallel, got {type(model).__name__}")
    return [{"index": b.index, "params": list(b.names), "numel": b.numel, "bytes": b.nbytes}
            for b in model.buckets]


def bucket_table(layout):
    """A text table of buckets (from bucket_layout): index, elements, bytes, parameters in order."""
    lines = ["bucket | elements |  bytes | parameters (reverse order)"]
    for b in layout:
        lines.append(f"{b['index']:>6} | {b['numel']:>8} | {b['bytes']:>6} | {', '.join(b['params'])}")
    return "\n".join(lines)


def bucket_timeline(record):
    """One backward as text: each gradient as it became ready, and each bucket when it was launched."""
    if not isinstance(record, dict) or "events" not in record:
        raise DataParallelError("bucket_timeline needs one record of a wrapped model's history "
                                "(model.history[i]), a dict with 'events'")
    lines = [f"backward {record['backward']}:"]
    for event in record["events"]:
        if event[0] == "grad":
            lines.append(f"  grad ready   {event[1]} (bucket {event[2]})")
        elif event[0] == "all_reduce":
            lines.append(f"  all_reduce   bucket {event[1]}: {', '.join(event[2])}")
        else:
            lines.append("  wait, divide by world size, copy into .grad")
    return "\n".join(lines)

"""Pipeline parallelism on real ranks: GPipe and 1F1B schedules, their timelines and their bubbles.

A model is cut into stages, one per rank; a batch is cut into microbatches. A *schedule* is, for each
rank, the ordered list of actions F(i) (forward of microbatch i) and B(i) (its backward). Ranks pass
activations forward with send/recv and gradients backward. Mirrors torch/distributed/pipelining/
schedules.py (torch 2.6): ScheduleGPipe (all forwards, then all backwards: fill-drain) and Schedule1F1B
(`num_stages - stage` warm-up forwards, then one backward / one forward in turn, then the remaining
backwards). Gradients are the **sum** over microbatches, as torch's schedules leave them: each
microbatch's loss (`loss_fn(output, target)`, a mean over its rows) is backpropagated on its own and
`.grad` accumulates, so with m equal microbatches grad = m x the gradient of the full batch's mean loss.

The bubble: with p stages, m microbatches and no communication cost, each rank idles for p-1 slots
out of m+p-1, a fraction (p-1)/(m+p-1) (GPipe paper, Huang et al. 2019), for both schedules; 1F1B
only lowers the activations held at once (p - stage microbatches instead of m).

torch 2.6's Schedule1F1B deadlocks on gloo: its `_batch_p2p` returns `batch_isend_irecv(ops).pop()`,
one Work of several, and waits on that one only (pytorch/pytorch#132644, fixed after 2.6).
`batch_p2p_waits_all()` patches it for the duration of a block. Run jobs that may hang with
`launch(..., timeout=...)`; the launcher puts a barrier before destroying the process group.
"""
import contextlib
import copy
import os
import sys
import threading
import time
import traceback
from collections import namedtuple

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ortlab.errors import OrtlabError
from ortlab.viz.tables import Table, within

SCHEDULES = ("gpipe", "1f1b")
IMPLEMENTATIONS = ("ortlab", "torch")
COLOURS = {"F": "#4C72B0", "B": "#DD8452"}


class PipelineError(OrtlabError):
    """A pipeline schedule or run was given something it cannot use, or a schedule cannot finish."""


class PipelineHang(PipelineError):
    """A pipeline schedule did not finish in the time it was given (a deadlock): says where it waits."""


class Action(namedtuple("Action", "kind microbatch")):
    """One action of a rank's schedule: kind 'F' (forward) or 'B' (backward) of one microbatch."""

    __slots__ = ()

    def __repr__(self):
        return f"{self.kind}{self.microbatch}"


class Event(namedtuple("Event", "rank kind microbatch start end")):
    """One action as it ran (or was simulated): its rank, kind, microbatch and start / end times (s)."""

    __slots__ = ()

    def __repr__(self):
        return f"Event(rank {self.rank}, {self.kind}{self.microbatch}, {self.start:.4f}-{self.end:.4f})"


# ---------------------------------------------------------------------------------------------
# Schedules: plain lists of actions.


def _check_sizes(n_stages, n_microbatches):
    for value, what in ((n_stages, "n_stages"), (n_microbatches, "n_microbatches")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise PipelineError(f"{what} must be a positive int, got {value!r}")


def gpipe_schedule(n_stages, n_microbatches):
    """Each rank's actions under GPipe: F0..F(m-1), then B0..B(m-1) (fill, then drain).

    Mirrors ScheduleGPipe._step_microbatches (torch/distributed/pipelining/schedules.py)."""
    _check_sizes(n_stages, n_microbatches)
    forwards = [Action("F", i) for i in range(n_microbatches)]
    backwards = [Action("B", i) for i in range(n_microbatches)]
    return [forwards + backwards for _ in range(n_stages)]


def one_f_one_b_schedule(n_stages, n_microbatches):
    """Each rank's actions under 1F1B: min(m, p - stage) warm-up forwards, then B, F, B, F... until
    every forward has run, then the remaining backwards.

    Mirrors Schedule1F1B._step_microbatches (torch/distributed/pipelining/schedules.py)."""
    _check_sizes(n_stages, n_microbatches)
    schedule = []
    for stage in range(n_stages):
        warmup = min(n_microbatches, n_stages - stage)
        actions = [Action("F", i) for i in range(warmup)]
        forward, backward = warmup, 0
        while True:
            actions.append(Action("B", backward))
            backward += 1
            if forward == n_microbatches:
                break
            actions.append(Action("F", forward))
            forward += 1
        actions += [Action("B", i) for i in range(backward, n_microbatches)]
        schedule.append(actions)
    return schedule


def schedule(name, n_stages, n_microbatches):
    """The schedule called `name` ('gpipe' or '1f1b') for p stages and m microbatches."""
    makers = {"gpipe": gpipe_schedule, "1f1b": one_f_one_b_schedule}
    if name not in makers:
        raise PipelineError(f"schedule must be one of {SCHEDULES}, got {name!r}")
    return makers[name](n_stages, n_microbatches)


def schedule_table(name, n_stages, n_microbatches):
    """The schedule as a Table: one row per rank, its actions in order (e.g. 'F0 F1 B0 F2 ...')."""
    rows = [{"rank": rank, "actions": " ".join(map(repr, actions))}
            for rank, actions in enumerate(schedule(name, n_stages, n_microbatches))]
    return Table.from_dicts(rows)


def bubble_fraction(n_stages, n_microbatches):
    """The theoretical bubble (idle share of every rank's time): (p - 1) / (m + p - 1)."""
    _check_sizes(n_stages, n_microbatches)
    return (n_stages - 1) / (n_microbatches + n_stages - 1)


def _dependencies(action, stage, n_stages):
    """What must have finished before `action` on `stage` may start (zero communication time)."""
    i = action.microbatch
    if action.kind == "F":
        return [("F", stage - 1, i)] if stage > 0 else []
    after = [("F", stage, i)]
    if stage < n_stages - 1:
        after.append(("B", stage + 1, i))
    return after


def simulate(actions_per_rank, forward_time=1.0, backward_time=1.0):
    """Run a schedule on paper: every F takes forward_time, every B backward_time, messages are free.

    Each rank starts its next action as soon as its previous one and the actions it depends on have
    ended (F(i) on stage s needs F(i) on s-1; B(i) needs F(i) here and B(i) on s+1). Returns each
    rank's list of Events; raises PipelineError if the schedule can never finish (a deadlock)."""
    n_stages = len(actions_per_rank)
    ended, clock = {}, [0.0] * n_stages
    position = [0] * n_stages
    timelines = [[] for _ in range(n_stages)]
    durations = {"F": forward_time, "B": backward_time}
    while any(position[s] < len(actions_per_rank[s]) for s in range(n_stages)):
        progressed = False
        for stage in range(n_stages):
            if position[stage] == len(actions_per_rank[stage]):
                continue
            action = actions_per_rank[stage][position[stage]]
            needs = _dependencies(action, stage, n_stages)
            if not all(need in ended for need in needs):
                continue
            start = max([clock[stage]] + [ended[need] for need in needs])
            end = start + durations[action.kind]
            ended[(action.kind, stage, action.microbatch)] = end
            clock[stage] = end
            timelines[stage].append(Event(stage, action.kind, action.microbatch, start, end))
            position[stage] += 1
            progressed = True
        if not progressed:
            waiting = {s: actions_per_rank[s][position[s]] for s in range(n_stages)
                       if position[s] < len(actions_per_rank[s])}
            raise PipelineError(f"the schedule cannot finish: every rank waits ({waiting}); check that "
                                f"each B(i) comes after F(i) and the stages agree on the order")
    return timelines


def measured_bubble(timelines):
    """The idle share of the ranks' time: 1 - (busy time of all ranks) / (ranks x makespan), where the
    makespan runs from the first action's start to the last action's end, over all ranks."""
    events = [e for timeline in timelines for e in timeline]
    if not events:
        raise PipelineError("measured_bubble needs timelines with events (a list per rank of Events)")
    makespan = max(e.end for e in events) - min(e.start for e in events)
    busy = sum(e.end - e.start for e in events)
    return 1.0 - busy / (len(timelines) * makespan)


# ---------------------------------------------------------------------------------------------
# The model, its stages and the data (the same on every rank: built from a seed).


def make_model(seed=0, width=8, n_layers=4):
    """A stack of n_layers (Linear(width, width), Tanh) blocks, built from `seed`."""
    torch.manual_seed(seed)
    layers = []
    for _ in range(n_layers):
        layers += [torch.nn.Linear(width, width), torch.nn.Tanh()]
    return torch.nn.Sequential(*layers)


def make_batch(seed=0, batch=8, width=8):
    """(inputs, targets) of shape (batch, width), built from `seed` + 1000."""
    generator = torch.Generator().manual_seed(seed + 1000)
    return torch.randn(batch, width, generator=generator), torch.randn(batch, width, generator=generator)


def stage_module(model, stage, n_stages):
    """Stage `stage` of `n_stages`: a Sequential of an equal share of the model's blocks (shared modules)."""
    blocks = list(model)
    if not 0 <= stage < n_stages or len(blocks) % (2 * n_stages):
        raise PipelineError(f"cannot cut {len(blocks) // 2} blocks into {n_stages} equal stages and take "
                            f"stage {stage}: use n_layers divisible by the number of ranks")
    size = len(blocks) // n_stages
    return torch.nn.Sequential(*blocks[stage * size:(stage + 1) * size])


def stage_parameter_names(model, stage, n_stages):
    """The model's parameter names (e.g. '2.weight') that belong to stage `stage`."""
    owned = {id(p) for p in stage_module(model, stage, n_stages).parameters()}
    return [name for name, p in model.named_parameters() if id(p) in owned]


def microbatches(tensor, n_microbatches):
    """`tensor` cut into n_microbatches equal chunks along dim 0 (as torch's TensorChunkSpec(0) does)."""
    _check_sizes(1, n_microbatches)
    if not isinstance(tensor, torch.Tensor) or tensor.dim() == 0 or tensor.shape[0] == 0:
        got = f"shape {tuple(tensor.shape)}" if isinstance(tensor, torch.Tensor) else type(tensor).__name__
        raise PipelineError(f"microbatches cuts a batch tensor along dim 0 (rows); it needs a tensor with at "
                            f"least one row, got {got}")
    if tensor.shape[0] % n_microbatches:
        raise PipelineError(f"a batch of {tensor.shape[0]} rows does not split into {n_microbatches} equal "
                            f"microbatches: pick a batch size divisible by n_microbatches")
    return list(tensor.chunk(n_microbatches))


def reference_gradients(seed=0, width=8, n_layers=4, batch=8, n_microbatches=4):
    """One process, no pipeline: {parameter name: gradient} summed over the microbatches' mean losses,
    and the microbatches' losses."""
    model = make_model(seed, width, n_layers)
    x, y = make_batch(seed, batch, width)
    losses = []
    for xm, ym in zip(microbatches(x, n_microbatches), microbatches(y, n_microbatches)):
        loss = F.mse_loss(model(xm), ym)
        loss.backward()
        losses.append(loss.item())
    return {name: p.grad.clone() for name, p in model.named_parameters()}, losses


# ---------------------------------------------------------------------------------------------
# ortlab's executor: one rank runs its list of actions with send/recv.


def _input_shape(model, stage, n_stages, microbatch):
    with torch.no_grad():
        for earlier in range(stage):
            microbatch = stage_module(model, earlier, n_stages)(microbatch)
    return microbatch.shape


def run_stage(actions, module, rank, world_size, inputs, targets, input_shape, t0, delays=(0.0, 0.0)):
    """Run this rank's `actions` on its stage `module`; returns (losses, events, peak in-flight count).

    F(i): receive the activation from rank-1 (or take inputs[i] on rank 0), run the stage, keep input
    and output for the backward, send the output to rank+1 (isend), or compute the loss on the last rank.
    B(i): backward of the loss (last rank) or of the output with the gradient received from rank+1,
    then send the input's gradient to rank-1. Events time the compute only (after the receive);
    `delays` = (seconds, seconds) slept inside every F and B stand for a bigger model's compute."""
    last = rank == world_size - 1
    saved, losses, sends, events, peak = {}, {}, [], [], 0
    for action in actions:
        i = action.microbatch
        if action.kind == "F":
            if rank == 0:
                x = inputs[i]
            else:
                x = torch.empty(input_shape)
                dist.recv(x, rank - 1)
                x.requires_grad_(True)
            start = time.monotonic() - t0
            out = module(x)
            time.sleep(delays[0])
            saved[i] = (x, out)
            peak = max(peak, len(saved))
            if last:
                losses[i] = F.mse_loss(out, targets[i])
            end = time.monotonic() - t0
            if not last:
                message = out.detach()
                sends.append((dist.isend(message, rank + 1), message))
        else:
            x, out = saved.pop(i)
            if last:
                start = time.monotonic() - t0
                losses[i].backward()
            else:
                grad = torch.empty_like(out)
                dist.recv(grad, rank + 1)
                start = time.monotonic() - t0
                out.backward(grad)
            time.sleep(delays[1])
            end = time.monotonic() - t0
            if rank > 0:
                sends.append((dist.isend(x.grad, rank - 1), x.grad))
        events.append(Event(rank, action.kind, i, start, end))
    for work, _ in sends:
        work.wait()
    return [losses[i].item() for i in sorted(losses)], events, peak


def _synced_start():
    """A time origin shared by all ranks (rank 0's monotonic clock after a barrier; Linux's
    CLOCK_MONOTONIC is the same clock in every process of the machine)."""
    dist.barrier()
    t0 = torch.tensor([time.monotonic()], dtype=torch.float64)
    dist.broadcast(t0, 0)
    return t0.item()


def ortlab_pipeline(rank, world_size, name, seed=0, width=8, n_layers=4, batch=8, n_microbatches=4,
                    delays=(0.0, 0.0)):
    """Train one step of the pipeline with ortlab's executor and schedule `name`, on this rank.

    Returns {'grads': {name: grad} of this rank's stage, 'losses' (last rank), 'events', 'peak'}.
    Bad sizes raise PipelineError before any message is exchanged."""
    if not (isinstance(delays, (tuple, list)) and len(delays) == 2
            and all(isinstance(d, (int, float)) and not isinstance(d, bool) and d >= 0 for d in delays)):
        raise PipelineError(f"delays must be (forward seconds, backward seconds), two numbers >= 0, "
                            f"got {delays!r}")
    model = make_model(seed, width, n_layers)
    module = stage_module(model, rank, world_size)
    x, y = make_batch(seed, batch, width)
    xs, ys = microbatches(x, n_microbatches), microbatches(y, n_microbatches)
    actions = schedule(name, world_size, n_microbatches)[rank]
    shape = _input_shape(model, rank, world_size, xs[0])
    t0 = _synced_start()
    losses, events, peak = run_stage(actions, module, rank, world_size, xs, ys, shape, t0, delays)
    names = stage_parameter_names(model, rank, world_size)
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if n in names}
    dist.barrier()
    return {"grads": grads, "losses": losses, "events": events, "peak": peak}


# ---------------------------------------------------------------------------------------------
# torch.distributed.pipelining, and the 1F1B fix for torch 2.6 on gloo.


class _AllWorks:
    """The Works of one batch_isend_irecv call; wait() waits on every one of them."""

    def __init__(self, works):
        self.works = list(works)

    def wait(self, timeout=None):
        """Wait on every Work (torch 2.6's _batch_p2p waited on the last one only)."""
        for work in self.works:
            work.wait()
        return True

    def __repr__(self):
        return f"_AllWorks({len(self.works)} works)"


def _batch_p2p_all(p2p_ops, desc=None):
    """schedules._batch_p2p, returning all the Works (pytorch/pytorch#132644; the upstream fix does this)."""
    if len(p2p_ops) == 0:
        return None
    return _AllWorks(dist.batch_isend_irecv(p2p_ops))


@contextlib.contextmanager
def batch_p2p_waits_all():
    """Inside the block, torch.distributed.pipelining's schedules wait on every send/recv of a batch.

    torch 2.6's schedules._batch_p2p returns `dist.batch_isend_irecv(ops).pop()`; on gloo each op is
    its own Work, so waiting on one leaves the others pending and Schedule1F1B deadlocks
    (pytorch/pytorch#132644). The patch replaces that module function and restores it on exit."""
    from torch.distributed.pipelining import schedules  # heavy: torch

    original = schedules._batch_p2p
    schedules._batch_p2p = _batch_p2p_all
    try:
        yield
    finally:
        schedules._batch_p2p = original


def _torch_runner(rank, world_size, name, seed, width, n_layers, batch, n_microbatches, group):
    """A PipelineStage for this rank's stage and the schedule class `name` over it: (runner, stage
    module, this rank's parameter names, inputs, targets)."""
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe  # heavy: torch

    classes = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}
    if name not in classes:
        raise PipelineError(f"schedule must be one of {SCHEDULES}, got {name!r}")
    model = make_model(seed, width, n_layers)
    module = copy.deepcopy(stage_module(model, rank, world_size))
    x, y = make_batch(seed, batch, width)
    stage = PipelineStage(module, rank, world_size, torch.device("cpu"), group=group)
    runner = classes[name](stage, n_microbatches=n_microbatches, loss_fn=F.mse_loss)
    return runner, module, stage_parameter_names(model, rank, world_size), x, y


def _torch_step(runner, rank, world_size, x, y, patch):
    """One schedule step: inputs on the first rank, targets on the last; the last rank's losses."""
    losses = []
    with batch_p2p_waits_all() if patch else contextlib.nullcontext():
        if rank == 0:
            runner.step(x)
        elif rank == world_size - 1:
            runner.step(target=y, losses=losses)
        else:
            runner.step()
    return [float(loss) for loss in losses]


def torch_pipeline(rank, world_size, name, seed=0, width=8, n_layers=4, batch=8, n_microbatches=4,
                   patch=True, group=None):
    """Train one step with torch.distributed.pipelining: a PipelineStage per rank and ScheduleGPipe or
    Schedule1F1B (with batch_p2p_waits_all() when `patch`), on process group `group` (default: the
    world). Returns {'grads', 'losses'} of this rank."""
    runner, module, names, x, y = _torch_runner(rank, world_size, name, seed, width, n_layers, batch,
                                                n_microbatches, group)
    losses = _torch_step(runner, rank, world_size, x, y, patch)
    grads = dict(zip(names, (p.grad.clone() for p in module.parameters())))
    dist.barrier(group=group)
    return {"grads": grads, "losses": losses}


def pipeline_job(rank, world_size, seed=0, width=8, n_layers=4, batch=8, n_microbatches=4,
                 delays=(0.02, 0.02)):
    """Everything a lesson needs from one launch: both schedules with ortlab's executor and with torch's
    (1F1B patched), then both schedules again with `delays` slept in every action for readable timelines.

    Returns {'ortlab': {schedule: result}, 'torch': {schedule: result}, 'timed': {schedule: result}}."""
    sizes = dict(seed=seed, width=width, n_layers=n_layers, batch=batch, n_microbatches=n_microbatches)
    found = {"ortlab": {}, "torch": {}, "timed": {}}
    for name in SCHEDULES:
        found["ortlab"][name] = ortlab_pipeline(rank, world_size, name, **sizes)
        found["torch"][name] = torch_pipeline(rank, world_size, name, **sizes)
        found["timed"][name] = ortlab_pipeline(rank, world_size, name, delays=delays, **sizes)
    return found


def torch_1f1b_unpatched(rank, world_size, wait=5.0, seed=0, n_microbatches=4):
    """Run torch 2.6's Schedule1F1B as shipped (no patch) on gloo, and see whether it finishes.

    The stage is built first; then the schedule's step runs in a thread, on its own process group, and
    is given `wait` seconds from the moment every rank is ready (so a slow start-up does not count).
    If it is still running then, raises PipelineHang with the place it waits (the deadlock of
    pytorch/pytorch#132644): the launcher then stops the ranks without destroying the process group, which
    would abort the process under a thread stuck in gloo. Returns {'losses': ...} if it finishes."""
    group = dist.new_group(backend="gloo")
    runner, _, _, x, y = _torch_runner(rank, world_size, "1f1b", seed, 8, 4, 8, n_microbatches, group)
    outcome = {}

    def body():
        outcome["losses"] = _torch_step(runner, rank, world_size, x, y, patch=False)

    dist.barrier()
    thread = threading.Thread(target=body, name="schedule-1f1b", daemon=True)
    thread.start()
    thread.join(wait)
    if not thread.is_alive():
        return outcome
    frame = sys._current_frames()[thread.ident]
    stack = [f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in traceback.extract_stack(frame)
             if "pipelining" in f.filename]
    raise PipelineHang(f"torch's Schedule1F1B did not finish within {wait:g} s on rank {rank}: a deadlock; "
                       f"it waits at {' <- '.join(reversed(stack))}. torch 2.6's _batch_p2p waits on one "
                       f"Work of several (pytorch/pytorch#132644): run it inside batch_p2p_waits_all()")


def merged_grads(results, implementation, name):
    """{parameter name: grad} over all ranks' stages from pipeline_job's per-rank results."""
    grads = {}
    for result in results:
        grads.update(result[implementation][name]["grads"])
    return grads


def timelines_of(results, name, kind="timed"):
    """Each rank's Events for schedule `name` from pipeline_job's per-rank results."""
    return [result[kind][name]["events"] for result in results]


def bubble_table(results, n_microbatches):
    """One row per schedule from pipeline_job's per-rank results: the measured bubble of the timed run,
    the theoretical (p-1)/(m+p-1), and the most microbatches each rank held activations for at once."""
    if not results or not all(isinstance(r, dict) and "timed" in r for r in results):
        raise PipelineError("bubble_table needs the list of per-rank results of launch(pipeline_job, ...)")
    rows = []
    for name in SCHEDULES:
        row = {"schedule": name, "measured bubble": f"{measured_bubble(timelines_of(results, name)):.2f}",
               "(p-1)/(m+p-1)": f"{bubble_fraction(len(results), n_microbatches):.2f}"}
        row.update({f"rank {r} peak activations": result["timed"][name]["peak"]
                    for r, result in enumerate(results)})
        rows.append(row)
    return Table.from_dicts(rows)


# ---------------------------------------------------------------------------------------------
# Pictures.


def plot_timelines(timelines, title="", n_microbatches=None, unit="s"):
    """A Gantt chart: one row per rank, one bar per action (F blue, B orange, microbatch written in it).

    The title gets the measured bubble and, given n_microbatches, the theoretical (p-1)/(m+p-1).
    Returns a matplotlib Figure."""
    from matplotlib.figure import Figure  # heavy: matplotlib
    from matplotlib.patches import Patch  # heavy: matplotlib

    if not timelines or not all(isinstance(t, (list, tuple)) for t in timelines):
        raise PipelineError("plot_timelines needs one list of Events per rank (see timelines_of/simulate)")
    events = [e for timeline in timelines for e in timeline]
    origin = min(e.start for e in events)
    figure = Figure(figsize=(8, 0.6 * len(timelines) + 1.2), dpi=80)
    axes = figure.add_subplot()
    for e in events:
        axes.barh(e.rank, e.end - e.start, left=e.start - origin, color=COLOURS[e.kind], edgecolor="white")
        axes.text((e.start + e.end) / 2 - origin, e.rank, str(e.microbatch), ha="center", va="center",
                  color="white", fontsize=8)
    axes.set(yticks=range(len(timelines)), yticklabels=[f"rank {r}" for r in range(len(timelines))],
             xlabel=f"time ({unit})")
    axes.invert_yaxis()
    label = f"bubble of this timeline {measured_bubble(timelines):.2f}"
    if n_microbatches:
        label += f", theory (p-1)/(m+p-1) = {bubble_fraction(len(timelines), n_microbatches):.2f}"
    axes.set_title(f"{title}  ({label})" if title else label, fontsize=9, loc="left")
    handles = [Patch(color=COLOURS["F"], label="forward"), Patch(color=COLOURS["B"], label="backward")]
    axes.legend(handles=handles,
                loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
    figure.tight_layout()
    return figure



def check_table(results, seed=0, width=8, n_layers=4, batch=8, n_microbatches=4):
    """A Table from pipeline_job's per-rank results: for each schedule and implementation (ortlab's
    executor, torch's pipelining), the largest difference of the stages' gradients and of the last
    stage's microbatch losses from one process (reference_gradients), and, for ortlab's, the most
    microbatches whose activations each rank held at once. The sizes must be pipeline_job's."""
    if not results or not all(isinstance(r, dict) and "ortlab" in r for r in results):
        raise PipelineError("check_table needs the list of per-rank results of launch(pipeline_job, ...)")
    grads, losses = reference_gradients(seed, width, n_layers, batch, n_microbatches)
    rows = []
    for name in SCHEDULES:
        for implementation in ("ortlab", "torch"):
            merged = merged_grads(results, implementation, name)
            if sorted(merged) != sorted(grads):
                raise PipelineError(f"{implementation} {name}: the stages hold {sorted(merged)}, "
                                    f"not every parameter {sorted(grads)}")
            grad_gap = max(float((merged[k] - grads[k]).abs().max()) for k in grads)
            last = results[-1][implementation][name]["losses"]
            loss_gap = max(abs(a - b) for a, b in zip(last, losses)) if len(last) == len(losses) else float("inf")
            peaks = (" / ".join(str(r[implementation][name]["peak"]) for r in results)
                     if implementation == "ortlab" else "")
            rows.append({"schedule": name, "implementation": implementation, "grads vs one process":
                         within(grad_gap), "losses vs one process": within(loss_gap),
                         "peak activations per rank": peaks})
    return Table.from_dicts(rows)

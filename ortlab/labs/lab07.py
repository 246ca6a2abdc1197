"""Checks for lab07_distributed_job: a ring all-reduce, data-parallel gradients and ZeRO-1, on 2 real ranks.

The learner writes three pieces of a distributed training step in notebook cells; the checks run them on
local ranks started by ortlab.distributed.launch (gloo, loopback only), which record what each call did,
and ortlab.labs.judges.lab07 compares every rank with the sum torch's own collective gives and with one
process training on the whole batch (torch.optim's SGD and Adam), naming the rank, the parameter or chunk
that differs, and by how much. The ranks compare nothing themselves.

The spawn problem: each rank is a new process started with the spawn method, which finds a function by
its module and name, and a notebook cell is no module. So the checks copy the source of your functions
(inspect.getsource), with the imports and constants they use, into a module in a temporary folder of their
own (never beside your notebook) and the ranks import that file. `job_source(fn)` shows what they import.

Mirrors: the ring of nccl/src/device/all_reduce.h (runRing: reduce-scatter then all-gather), DDP's
gradient averaging (torch/nn/parallel/distributed.py: SUM then divide by the world size) and ZeRO stage 1
(DeepSpeed's runtime/zero/stage_1_and_2.py: each rank keeps and updates the optimizer state of its shard
of a flat parameter buffer, then the shards are all-gathered).
"""
import inspect
import json
import os
import re
import shutil
import tempfile
import traceback

from ortlab.labs.build import stub_pattern
from ortlab.labs.checks import judge
from ortlab.labs.rank_jobs import RankJobError, write_new, job_source, load_job, module_source
from ortlab.labs.remote import learner, probe

EXERCISES = ("ring_all_reduce", "average_gradients", "zero1_step")
WORLD_SIZE = 2
TIMEOUT = 60          # seconds for one checking job (a hung rank is reported after it)
STEPS = 3             # training steps the checks compare
BATCH = 8             # the global batch; each rank trains on BATCH / world_size rows
SGD_LR = 0.1
ADAM_LR = 0.01
RING_SIZES = (10, 7, 4096)
RTOL, ATOL = 1e-5, 1e-6
MARK = "@@lab07"      # prefix of the progress lines a checking rank prints
HANG_HINT = ("did every rank call the same collectives in the same order? A blocking dist.send waits until "
             "the peer posts the matching recv (on gloo, at every size), so two ranks that both send first "
             "wait for ever: use dist.isend, or let even ranks send first")
SUBSTITUTES = ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
               "reduce_scatter_tensor",
               "broadcast", "reduce", "all_to_all", "all_to_all_single", "gather", "scatter",
               "all_reduce_coalesced")


class Lab07Error(RankJobError):
    """A lab helper got bad input, or (as its base RankJobError) a function cannot be sent to the ranks; the
    message says what to do."""


class LearnerRaised(Exception):
    """Raised on a checking rank when the learner's function raised there (the message says where)."""


# --- what the ranks share: a model, its data, ZeRO's shards, Adam on a shard ------------------------

def make_model(seed=0):
    """The lab's small network (fc1: 5 -> 7, tanh, fc2: 7 -> 3; 66 parameters), the same on every rank."""
    import torch  # heavy: torch
    from torch import nn  # heavy: torch

    class TinyNet(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1, self.fc2 = nn.Linear(5, 7), nn.Linear(7, 3)

        def forward(self, x):
            return self.fc2(torch.tanh(self.fc1(x)))

    torch.manual_seed(seed)
    return TinyNet()


def global_batch(step, seed=0):
    """(x, y): step `step`'s global batch of BATCH rows (the one process trains on all of it)."""
    import torch  # heavy: torch

    g = torch.Generator().manual_seed(seed * 1000 + step)
    return torch.randn(BATCH, 5, generator=g), torch.randn(BATCH, 3, generator=g)


def micro_batch(step, rank, world_size, seed=0):
    """(x, y): rank `rank`'s rows of step `step`'s global batch (BATCH / world_size contiguous rows)."""
    if BATCH % world_size:
        raise Lab07Error(f"the global batch of {BATCH} rows does not divide over {world_size} ranks; "
                         "use 1, 2, 4 or 8 ranks")
    x, y = global_batch(step, seed)
    rows = BATCH // world_size
    return x[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]


def loss_fn(model, x, y):
    """The mean squared error of the model on (x, y): a mean over rows, so the average of the ranks'
    gradients is the gradient of the whole batch."""
    return ((model(x) - y) ** 2).mean()


def shard_size(numel, world_size):
    """Elements per rank of a flat buffer of `numel` elements padded to a multiple of world_size."""
    return -(-numel // world_size)


def shard_range(numel, rank, world_size):
    """(start, end): the elements of the padded flat buffer that rank `rank` owns under ZeRO."""
    size = shard_size(numel, world_size)
    return rank * size, (rank + 1) * size


def flatten(tensors, world_size):
    """One flat float32 buffer holding `tensors` in order, padded with zeros to a multiple of world_size."""
    import torch  # heavy: torch

    flat = torch.cat([t.detach().reshape(-1) for t in tensors])
    padding = shard_size(flat.numel(), world_size) * world_size - flat.numel()
    return torch.cat([flat, flat.new_zeros(padding)])


_ADAM_CALLS = []  # on a checking rank: (shard values before, grad, numel) of each adam_update call


def adam_update(shard, grad, state, lr=ADAM_LR):
    """Adam (torch.optim.Adam's defaults) on one shard, in place; its moments live in `state`, a dict.

    `shard` and `grad` are 1-D tensors of the same size (a view of the flat buffer works); `state` starts
    empty and holds 'step', 'exp_avg' and 'exp_avg_sq' afterwards: the optimizer state of this shard only.
    Calls torch/optim/adam.py's functional adam, so it is torch's Adam applied to these elements.
    """
    import torch  # heavy: torch
    from torch.optim.adam import adam  # heavy: torch

    for tensor, what in ((shard, "shard"), (grad, "grad")):
        if not isinstance(tensor, torch.Tensor) or tensor.dim() != 1:
            raise Lab07Error(f"adam_update: {what} must be a 1-D tensor, got "
                             f"{getattr(tensor, 'shape', type(tensor).__name__)}")
    if shard.shape != grad.shape:
        raise Lab07Error(f"adam_update: shard has {shard.numel()} elements and grad {grad.numel()}: give the "
                         "gradient of the same elements")
    if not isinstance(state, dict):
        raise Lab07Error(f"adam_update: state must be a dict (empty at first), got {type(state).__name__}")
    if not state:
        state.update(step=torch.tensor(0.0), exp_avg=torch.zeros_like(shard),
                     exp_avg_sq=torch.zeros_like(shard))
    if state["exp_avg"].shape != shard.shape:
        raise Lab07Error(f"adam_update: state holds moments of {state['exp_avg'].numel()} elements, "
                         f"the shard "
                         f"has {shard.numel()}: give each shard its own state")
    _ADAM_CALLS.append((shard.detach().clone(), grad.detach().clone()))
    with torch.no_grad():
        adam([shard], [grad.detach()], [state["exp_avg"]], [state["exp_avg_sq"]], [], [state["step"]],
             foreach=False, amsgrad=False, beta1=0.9, beta2=0.999, lr=lr, weight_decay=0.0, eps=1e-8,
             maximize=False)
    return shard


# --- the checks, on each rank ----------------------------------------------------------------------

def _mark(kind, exercise, reason=None):
    print(f"{MARK} {kind} {exercise} {json.dumps(reason)}", flush=True)


def _learner_line(exc, path):
    """' (line N: `code`)' for the deepest frame of the job file in exc's traceback, or ''."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if os.path.abspath(f.filename) == path]
    if not frames:
        return ""
    return f" in {frames[-1].name}, at `{(frames[-1].line or '').strip()}`"


def _call(fn, exercise, path, *args):
    """fn(*args); what it raises becomes LearnerRaised naming the exercise and the line."""
    try:
        return fn(*args)
    except NotImplementedError as exc:
        raise LearnerRaised(f"not done: {exc}") from None
    except Exception as exc:
        first = (str(exc).strip().splitlines() or [""])[0][:200]
        raise LearnerRaised(f"your {exercise} raised {type(exc).__name__}: {first}"
                            f"{_learner_line(exc, path)}") from None


class _Traffic:
    """While active: counts the point-to-point messages this rank sends and the collectives it calls.

    Wraps the functions in torch.distributed and in distributed_c10d (where P2POp checks its op), so
    dist.send, dist.isend and batch_isend_irecv are all counted."""

    def __init__(self):
        import torch.distributed as dist  # heavy: torch
        from torch.distributed import distributed_c10d  # heavy: torch

        self.modules, self.saved, self.sent, self.collectives = (dist, distributed_c10d), [], [], []

    def __enter__(self):
        for name in ("isend",):  # dist.send calls isend, then waits
            self._wrap(name, lambda real: lambda tensor, *a, **k: (self.sent.append(tensor.numel()),
                                                                  real(tensor, *a, **k))[1])
        for name in SUBSTITUTES:
            self._wrap(name, lambda real, name=name: lambda *a, **k: (self.collectives.append(name),
                                                                     real(*a, **k))[1])
        return self

    def _wrap(self, name, make):
        real = getattr(self.modules[1], name, None)
        if real is None:
            return
        wrapper = make(real)
        for module in self.modules:
            if getattr(module, name, None) is real:
                self.saved.append((module, name, real))
                setattr(module, name, wrapper)

    def __exit__(self, *exc):
        for module, name, real in reversed(self.saved):
            setattr(module, name, real)


def _save(folder, key, rank, items):
    """Write what this rank recorded so far for `key` (set:exercise) where the caller finds it even when
    a later step hangs or raises (the ranks never compare anything: ortlab.labs.judges.lab07 does)."""
    import torch  # heavy: torch

    path = os.path.join(folder, f"{key.replace(':', '-')}-rank{rank}.pt")
    torch.save(items, path + ".tmp")
    os.replace(path + ".tmp", path)


def _record_ring(fn, rank, world, path, save):
    """Exercise 'ring_all_reduce' on this rank: per size, the tensor after the call, what the call
    returned, and the messages and collectives it sent."""
    import torch  # heavy: torch

    items = []
    for n in RING_SIZES:
        original = torch.randn(n, generator=torch.Generator().manual_seed(100 * n + rank))
        tensor = original.clone()
        with _Traffic() as traffic:
            returned = _call(fn, "ring_all_reduce", path, tensor)
        items.append({"n": n, "got": tensor.detach().clone(), "sent": list(traffic.sent),
                      "collectives": list(traffic.collectives),
                      "returned_new": isinstance(returned, torch.Tensor) and returned is not tensor})
        save(items)


def _record_average(fn, rank, world, path, save):
    """Exercise 'average_gradients' on this rank: per SGD step, the gradients before and after the call
    and the parameters after the step."""
    import torch  # heavy: torch

    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    items = []
    for step in range(STEPS):
        optimizer.zero_grad()
        loss_fn(model, *micro_batch(step, rank, world)).backward()
        local = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        _call(fn, "average_gradients", path, model)
        after = {n: None if p.grad is None else p.grad.detach().clone() for n, p in model.named_parameters()}
        item = {"local": local, "after": after, "params": None}
        items.append(item)
        if any(g is None for g in after.values()):
            save(items)
            return
        optimizer.step()
        item["params"] = {n: p.detach().clone() for n, p in model.named_parameters()}
        save(items)


def _record_zero(fn, rank, world, path, save):
    """Exercise 'zero1_step' on this rank: per step, the flat buffer before and after the call, each
    adam_update call (its shard's values before and its gradient) and the sizes of the state."""
    import torch  # heavy: torch

    model = make_model()
    layout, offset = {"numel": sum(p.numel() for p in model.parameters())}, 0
    for name, p in model.named_parameters():
        layout[name], offset = offset, offset + p.numel()
    flat = flatten(model.parameters(), world)
    state, items = {}, []
    for step in range(STEPS):
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(flat[layout[name]:layout[name] + p.numel()].view_as(p))
        model.zero_grad()
        loss_fn(model, *micro_batch(step, rank, world)).backward()
        flat_grad = flatten([p.grad for p in model.parameters()], world)
        before = flat.clone()
        _ADAM_CALLS.clear()
        _call(fn, "zero1_step", path, flat, flat_grad, state)
        held = {k: v.numel() for k, v in state.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
        items.append({"before": before, "after": flat.detach().clone(), "calls": list(_ADAM_CALLS),
                      "state": held, "layout": dict(layout)})
        save(items)


_RECORDERS = {"ring_all_reduce": _record_ring, "average_gradients": _record_average,
              "zero1_step": _record_zero}


def grade_rank(rank, world_size, path, plan):
    """A checking rank (run by ortlab.distributed.launch): import the job file and run, in order, each
    set of `plan` (a list of {exercise: function name in the file}), saving what each call did beside
    the job file and printing progress lines."""
    path = os.path.abspath(path)
    folder = os.path.dirname(path)
    module = load_job(path)
    for index, names in enumerate(plan):
        for exercise in EXERCISES:
            if exercise in names:
                key = f"{index}:{exercise}"
                _mark("start", key)
                _RECORDERS[exercise](getattr(module, names[exercise]), rank, world_size, path,
                                     lambda items, key=key: _save(folder, key, rank, items))
                _mark("done", key)
    return None


# --- the checks, on the caller's side --------------------------------------------------------------

def _progress(output):
    """(finished set:exercise keys, (set, exercise) started and not finished, or None)."""
    done, current = set(), None
    for line in output.splitlines():
        if not line.startswith(MARK + " "):
            continue
        _, kind, key = line.split(" ", 3)[:3]
        index, exercise = key.split(":")
        if kind == "start":
            current = (int(index), exercise)
        else:
            done.add((int(index), exercise))
            current = None
    return done, current


def _job_line(message, path):
    """' It was waiting in fn, at `code`.' for the deepest frame of the job file in a stack dump, or ''."""
    found = re.findall(r'File "' + re.escape(path) + r'", line (\d+) in (\S+)', message)
    if not found:
        return ""
    number, name = found[0]  # faulthandler lists the most recent call first
    with open(path, encoding="utf-8") as f:
        lines = f.read().splitlines()
    return f" It was waiting in {name}, at `{lines[int(number) - 1].strip()}`."


def _stop_message(error, exercise, path, timeout):
    """(status, message) for the exercise a job stopped in: a rank raised, hung or died."""
    rank = error.rank if error.rank is not None else 0
    first = str(error).splitlines()[0]
    if error.kind == "timeout":
        return "fail", (f"rank {rank} did not finish {exercise} within {timeout:g} s: {HANG_HINT}."
                        f"{_job_line(str(error), path)}")
    if "LearnerRaised: not done: " in first:
        return "not done", first.split("not done: ", 1)[1]
    if "LearnerRaised: " in first:
        message = f"rank {rank}: {first.split('LearnerRaised: ', 1)[1]}"
        if "ReduceOp.AVG" in first:
            message += " (gloo has no AVG: all-reduce with SUM, then divide by the world size)"
        return "fail", message
    return "fail", f"the checking job failed: {first}"


def _stopped(error, todo, path, timeout):
    """Where and why a job stopped: {"at": [set, exercise], "status", "message"}; "at" is None when the
    ranks stopped before the first exercise."""
    outputs = error.outputs or [""]
    rank = error.rank if error.rank is not None else 0
    progress = [_progress(o) for o in outputs]
    stopped = progress[rank][1] if rank < len(progress) else None
    if stopped is None and not any(finished for finished, _ in progress):
        first = str(error).splitlines()[0]
        why = (f"the ranks did not reach the first check within {timeout:g} s (a busy machine? give a longer "
               "timeout)" if error.kind == "timeout"
               else f"the checking job failed before the first check: {first}")
        return {"at": None, "status": "fail", "message": why, "rank": rank}
    if stopped is None:  # failed between two exercises
        finished = set.intersection(*[f for f, _ in progress])
        stopped = next(((i, e) for i, names in enumerate(todo) for e in names if (i, e) not in finished),
                       None)
        if stopped is None:
            return {"at": None, "status": "fail", "message": f"the checking job failed: {str(error).splitlines()[0]}",
                    "rank": rank}
    status, message = _stop_message(error, stopped[1], path, timeout)
    return {"at": list(stopped), "status": status, "message": message, "rank": rank}


def _load_records(folder, todo, world_size):
    """{[set, exercise]: [what each rank recorded]} of what the ranks saved (an exercise only when every
    rank saved something for it)."""
    import torch  # heavy: torch

    found = []
    for index, names in enumerate(todo):
        for exercise in names:
            ranks = []
            for rank in range(world_size):
                path = os.path.join(folder, f"{index}-{exercise}-rank{rank}.pt")
                ranks.append(torch.load(path, weights_only=False) if os.path.exists(path) else [])
            found.append([[index, exercise], ranks])
    return found


def _not_done(exercise, fn):
    try:
        return bool(stub_pattern(exercise).search(inspect.getsource(fn)))
    except (OSError, TypeError):
        return False


def _screen(functions):
    """({exercise: (status, message)} decided without running, {exercise: fn} to run) for one set."""
    unknown = sorted(set(functions) - set(EXERCISES))
    if unknown or not functions:
        raise Lab07Error(f"the checks take the exercises {', '.join(EXERCISES)} as keywords, got "
                         f"{unknown or 'none'}")
    decided, todo = {}, {}
    for exercise in EXERCISES:
        if exercise not in functions:
            continue
        fn = functions[exercise]
        if not callable(fn):
            decided[exercise] = ("fail", f"{exercise} must be a function, got {type(fn).__name__}")
        elif _not_done(exercise, fn):
            decided[exercise] = ("not done", "the exercise's stub is still in place")
        else:
            try:
                module_source([(exercise, fn)])
                todo[exercise] = fn
            except RankJobError as exc:  # Lab07Error included
                decided[exercise] = ("fail", str(exc))
    return decided, todo


@probe
def run_sets(sets, world_size=WORLD_SIZE, timeout=TIMEOUT):
    """Run several sets of answers ({exercise: function}) in ONE job of `world_size` ranks, one set after
    the other, and return what happened as data: {"decided": [{exercise: (status, message)}] (decided
    without running: a stub, not a function), "records": [[set, exercise], [per rank: recorded items]],
    "stop": where and why the job stopped, or None}. Nothing here says whether an answer is right."""
    from ortlab.distributed import LaunchError, launch  # heavy: ortlab.distributed imports torch

    if not isinstance(sets, (list, tuple)) or not all(isinstance(f, dict) for f in sets):
        raise Lab07Error("run_many takes a list of {exercise: function} dicts")
    screened = [_screen(functions) for functions in sets]
    todo = [names for _, names in screened]
    reply = {"decided": [decided for decided, _ in screened], "records": [], "stop": None}
    if any(todo):
        folder = tempfile.mkdtemp(prefix="ortlab-lab07-")
        try:
            everything = [(e, fn) for names in todo for e, fn in names.items()]
            path = write_new(os.path.join(folder, "lab07_job.py"), module_source(everything))
            plan = [{e: fn.__name__ for e, fn in names.items()} for names in todo]
            try:
                launch(grade_rank, world_size, args=(path, plan), timeout=timeout)
            except LaunchError as exc:
                reply["stop"] = _stopped(exc, todo, path, timeout)
            reply["records"] = _load_records(folder, todo, world_size)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return reply


def check_ring_all_reduce(ring_all_reduce, timeout=TIMEOUT):
    """Exercise 'ring_all_reduce': on 2 ranks, equal to dist.all_reduce (SUM) on tensors of 10, 7 and 4096
    elements, built from send/recv only, 2(N-1) messages of one chunk per rank."""
    judge("ring_all_reduce", "lab07.one", "ring_all_reduce", learner(ring_all_reduce), timeout)


def check_average_gradients(average_gradients, timeout=TIMEOUT):
    """Exercise 'average_gradients': 3 SGD steps on 2 ranks equal one process on the whole batch."""
    judge("average_gradients", "lab07.one", "average_gradients", learner(average_gradients), timeout)


def check_zero1_step(zero1_step, timeout=TIMEOUT):
    """Exercise 'zero1_step': 3 ZeRO-1 Adam steps on 2 ranks equal torch's Adam on one process, with each
    rank's optimizer state and update limited to its shard."""
    judge("zero1_step", "lab07.one", "zero1_step", learner(zero1_step), timeout)


# --- the job itself: a training run, by launch here and by torchrun elsewhere -----------------------

JOB_MAIN = '''

def train(rank, world_size, steps={steps}):
    """Data-parallel SGD on the lab's model: each rank its micro-batch, gradients averaged by your code."""
    model = lab07.make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lab07.SGD_LR)
    losses = []
    for step in range(steps):
        optimizer.zero_grad()
        loss = lab07.loss_fn(model, *lab07.micro_batch(step, rank, world_size))
        loss.backward()
        average_gradients(model)
        optimizer.step()
        losses.append(loss.item())
    return {{"losses": losses, "params": [p.detach().clone() for p in model.parameters()]}}


if __name__ == "__main__":  # started by torchrun: it sets RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT
    import torch.distributed as dist
    dist.init_process_group("gloo")  # env://: the TCPStore rendezvous that torchrun set up
    result = train(dist.get_rank(), dist.get_world_size())
    print(f"rank {{dist.get_rank()}}: losses {{[round(x, 4) for x in result['losses']]}}")
    dist.barrier()
    dist.destroy_process_group()
'''


def job_script(average_gradients, steps=5):
    """A training script for torchrun: your average_gradients (and what it uses) plus the lab's loop."""
    text = job_source(average_gradients=average_gradients).rstrip("\n")
    lines = text.splitlines()
    after_header = next(i for i, line in enumerate(lines) if not line.startswith("#"))
    for needed in ("import torch", "import ortlab.labs.lab07 as lab07"):
        if needed not in lines:
            lines.insert(after_header, needed)
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
        raise Lab07Error(f"steps must be a positive int, got {steps!r}")
    return "\n".join(lines) + "\n" + JOB_MAIN.format(steps=steps)


def save_job_script(text, path):
    """Write a job script to `path` (a new file: never overwrites one); return the path."""
    return write_new(path, text)


def torchrun_commands(script, nodes=2, procs_per_node=1, master_addr="node0.example.org", master_port=29500):
    """The torchrun command for each node of a multi-node job running `script` (one line per node)."""
    for value, what in ((nodes, "nodes"), (procs_per_node, "procs_per_node")):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise Lab07Error(f"{what} must be a positive int, got {value!r}")
    name = os.path.basename(script)
    return [f"torchrun --nnodes {nodes} --nproc-per-node {procs_per_node} --node-rank {node} "
            f"--master-addr {master_addr} --master-port {master_port} {name}" for node in range(nodes)]


def run_job_script(rank, world_size, path, steps=5):
    """A rank of the job script started by ortlab's launch: import the script (its __main__ block does not
    run: launch made the process group) and call its train()."""
    return load_job(os.path.abspath(path), "lab07_job_script").train(rank, world_size, steps)


def job_summary(results):
    """Lines describing a finished data-parallel job: each rank's losses, and whether the ranks agree
    with each other and with one process training on the whole batch."""
    import torch  # heavy: torch

    lines = [f"rank {r}: losses {[round(x, 4) for x in v['losses']]}" for r, v in enumerate(results)]
    spread = max(float((a - b).abs().max()) for v in results[1:]
                 for a, b in zip(v["params"], results[0]["params"])) if len(results) > 1 else 0.0
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    for step in range(len(results[0]["losses"])):
        optimizer.zero_grad()
        loss_fn(model, *global_batch(step)).backward()
        optimizer.step()
    off = max(float((a - b).abs().max()) for a, b in zip(results[0]["params"], model.parameters()))
    lines.append(f"ranks hold the same parameters: {spread <= ATOL}")
    lines.append(f"parameters equal one process on the whole batch (to 1e-6): {off <= ATOL}")
    return lines

"""Checks for lab07_distributed_job: a ring all-reduce, data-parallel gradients and ZeRO-1, on 2 real ranks.

The learner writes three pieces of a distributed training step in notebook cells; the checks run them on
local ranks started by ortlab.distributed.launch (gloo, loopback only) and compare every rank with
torch's own collective (dist.all_reduce) and with one process training on the whole batch (torch.optim's
SGD and Adam), naming the rank, the parameter or chunk that differs, and by how much.

The spawn problem: each rank is a new process started with the spawn method, which finds a function by
its module and name, and a notebook cell is no module. So the checks copy the source of your functions
(inspect.getsource), with the imports and constants they use, into a module in a temporary folder of their
own (never beside your notebook) and the ranks import that file. `job_source(fn)` shows what they import.

Mirrors: the ring of nccl/src/device/all_reduce.h (runRing: reduce-scatter then all-gather), DDP's
gradient averaging (torch/nn/parallel/distributed.py: SUM then divide by the world size) and ZeRO stage 1
(DeepSpeed's runtime/zero/stage_1_and_2.py: each rank keeps and updates the optimizer state of its shard
of a flat parameter buffer, then the shards are all-gathered).
"""
import builtins
import dis
import importlib.util
import inspect
import json
import os
import shutil
import sys
import tempfile
import textwrap
import traceback
import types

from ortlab.errors import OrtlabError
from ortlab.labs.build import BEGIN, END, stub_pattern
from ortlab.labs.checks import CheckResult, _show

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


class Lab07Error(OrtlabError):
    """A function cannot be sent to the ranks, or a lab helper got bad input; the message says what to do."""


class LearnerRaised(Exception):
    """Raised on a checking rank when the learner's function raised there (the message says where)."""


# --- shipping the learner's functions to the ranks -------------------------------------------------

def _is_cell_function(value):
    """True for a function or class defined in the notebook (module __main__ or an IPython cell)."""
    fn = getattr(value, "__func__", value)
    code = getattr(fn, "__code__", None)
    where = code.co_filename if code is not None else ""
    return getattr(value, "__module__", None) == "__main__" or "ipykernel_" in where \
        or where.startswith("<ipython-input")


def _global_names(code):
    """The global names a code object (and the functions nested in it) reads, in order."""
    names = []
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and instruction.argval not in names:
            names.append(instruction.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += [n for n in _global_names(const) if n not in names]
    return names


def _is_plain_constant(value):
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return True
    return isinstance(value, (tuple, frozenset)) and all(_is_plain_constant(v) for v in value)


def _import_line(name, value):
    """The import statement that binds `name` to `value` in a fresh process, or None."""
    if isinstance(value, types.ModuleType):
        module = value.__name__
        if module == "__main__":
            return None
        return f"import {module}" if module == name else f"import {module} as {name}"
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not module or not qualname or "." in qualname or module == "__main__":
        return None
    if getattr(sys.modules.get(module), qualname, None) is not value:
        return None
    return f"from {module} import {qualname}" + ("" if qualname == name else f" as {name}")


def _source(fn, owner):
    """The dedented source of a notebook function or class, or Lab07Error saying why it cannot be read."""
    if getattr(fn, "__name__", "") == "<lambda>":
        raise Lab07Error(f"{owner} is a lambda: write it with `def` so its source can be sent to the ranks")
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise Lab07Error(f"cannot read the source of {getattr(fn, '__name__', fn)!r} ({exc}): define it with "
                         "`def` in a notebook cell, and run that cell again") from None
    # the lab's solution markers are comments for the lab's build, not for the ranks
    return "".join(line for line in text.splitlines(True) if not (BEGIN.match(line) or END.match(line)))


def _collect(fn, owner, imports, sources, seen):
    """Add fn's source and what it needs from the notebook to `imports` and `sources` (dicts, in order)."""
    if id(fn) in seen:
        return
    seen.add(id(fn))
    code = getattr(fn, "__code__", None)
    names = _global_names(code) if code is not None else []
    if isinstance(fn, type):
        names = [n for member in vars(fn).values() if hasattr(member, "__code__")
                 for n in _global_names(member.__code__)]
    glob = getattr(fn, "__globals__", None) or vars(sys.modules.get(fn.__module__, builtins))
    for name in names:
        if name not in glob:
            continue  # a builtin, or a name that does not exist: the rank's NameError says so
        value = glob[name]
        line = _import_line(name, value)
        if line:
            imports.setdefault(name, line)
        elif (inspect.isfunction(value) or inspect.isclass(value)) and _is_cell_function(value):
            _collect(value, f"{name} (used by {owner})", imports, sources, seen)
            if value.__name__ != name:
                sources.setdefault(f"{name} alias", f"{name} = {value.__name__}\n")
        elif _is_plain_constant(value):
            imports.setdefault(name, f"{name} = {value!r}")
        else:
            raise Lab07Error(
                f"{owner} uses `{name}` ({type(value).__name__}), defined in the notebook: each rank is a "
                f"new "
                f"process that gets only your functions' source, their imports and their plain constants. "
                f"Create `{name}` inside the function (or from its arguments)")
    if fn.__name__ in sources:
        raise Lab07Error(f"two different functions are called {fn.__name__!r} ({owner} is one): give each "
                         "its own name")
    sources[fn.__name__] = _source(fn, owner)


def module_source(functions, aliases=()):
    """The source of a module holding `functions` (each a function, with what it uses from the notebook),
    then `name = function` lines for each (name, function) in `aliases`."""
    imports, sources, seen = {}, {}, set()
    for owner, fn in functions:
        if not callable(fn):
            raise Lab07Error(f"{owner} must be a function, got {type(fn).__name__}: pass the function itself "
                             f"(without calling it)")
        _collect(fn, owner, imports, sources, seen)
    header = ["# Written by ortlab.labs.lab07 from your notebook: each rank is a new process, which can",
              "# import a module but not a notebook cell, so your functions are copied here (your notebook",
              "# is untouched)."]
    parts = ["\n".join(header + list(imports.values())) + "\n"]
    parts += [text.rstrip("\n") + "\n" for text in sources.values()]
    lines = [f"{name} = {fn.__name__}" for name, fn in aliases if fn.__name__ != name]
    if lines:
        parts.append("\n".join(lines) + "\n")
    return "\n\n".join(parts)


def job_source(**functions):
    """The module the ranks import: `name=function` pairs, with the imports and constants they use.

    Functions a function calls that are defined in the notebook come along too (their source).
    Raises Lab07Error for a lambda, a function without readable source, or a notebook object that is not
    a module, a function, a class or a plain constant.
    """
    if not functions:
        raise Lab07Error("give the functions to send, e.g. job_source(ring_all_reduce=ring_all_reduce)")
    return module_source(list(functions.items()), list(functions.items()))


def write_job(folder, **functions):
    """Write job_source(**functions) to a new file in `folder`; return its path (never overwrites a file)."""
    return _write_new(os.path.join(folder, "lab07_job.py"), job_source(**functions))


def _write_new(path, text):
    if os.path.exists(path):
        raise Lab07Error(f"{path} exists; the lab never overwrites a file: choose a new name or folder")
    with open(path, "x", encoding="utf-8") as f:
        f.write(text)
    return path


def load_job(path, name="lab07_job"):
    """Import the module at `path` (what each rank does with the job file); its __main__ block is not run."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# --- what the ranks share: a model, its data, ZeRO's shards, Adam on a shard ------------------------

def make_model(seed=0):
    """The lab's small network (fc1: 5 -> 7, tanh, fc2: 7 -> 3; 66 parameters), the same on every rank."""
    import torch
    from torch import nn

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
    import torch

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
    import torch

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
    import torch
    from torch.optim.adam import adam

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
        import torch.distributed as dist
        from torch.distributed import distributed_c10d

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


def _agree(reason):
    """True on every rank when any rank found something wrong (all ranks then leave the exercise together,
    so that no rank waits in a collective its peer will never call)."""
    import torch
    import torch.distributed as dist

    flag = torch.tensor([1.0 if reason else 0.0])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return flag.item() > 0


def _chunk_of(index, numel, world_size):
    bounds = [0]
    for part in range(world_size):
        bounds.append(bounds[-1] + numel // world_size + (1 if part < numel % world_size else 0))
    chunk = next(c for c in range(world_size) if bounds[c] <= index < bounds[c + 1])
    return chunk, bounds


def _ring_reason(rank, world, n, original, got, want, traffic):
    import torch

    if traffic.collectives:
        return (f"rank {rank}: ring_all_reduce called dist.{traffic.collectives[0]}: build the ring from "
                "dist.send / dist.recv (or isend / irecv) only")
    where = f"rank {rank}, tensor of {n} elements"
    if torch.allclose(got, original) and not torch.allclose(want, original):
        return (f"{where}: the tensor is unchanged: sum into it in place, as dist.all_reduce does "
                "(tensor.copy_)")
    if not torch.allclose(got, want, rtol=RTOL, atol=ATOL):
        diff = (got - want).abs()
        i = int(diff.argmax())
        chunk, bounds = _chunk_of(i, n, world)
        span = f"chunk {chunk} (elements {bounds[chunk]}..{bounds[chunk + 1] - 1})"
        hint = ""
        if torch.allclose(got, want / world, rtol=RTOL, atol=ATOL):
            hint = ": it is the average; all-reduce SUM does not divide"
        elif torch.allclose(got[bounds[chunk]:bounds[chunk + 1]], original[bounds[chunk]:bounds[chunk + 1]]):
            hint = ": it holds only this rank's own values (never reduced, or never gathered)"
        else:
            for other in range(world):
                a, b = bounds[other], bounds[other + 1]
                if other != chunk and b - a == bounds[chunk + 1] - bounds[chunk] and torch.allclose(
                        got[bounds[chunk]:bounds[chunk + 1]], want[a:b], rtol=RTOL, atol=ATOL):
                    hint = f": it holds the sum of chunk {other}: the chunks are in the wrong order"
                    break
        return (f"{where}: {span} differs from torch's dist.all_reduce, largest difference "
                f"{float(diff[i]):.3g} "
                f"at element {i} (got {float(got[i]):.4g}, expected {float(want[i]):.4g}){hint}")
    bound = 2 * (world - 1) * -(-n // world)
    if len(traffic.sent) != 2 * (world - 1) or sum(traffic.sent) > bound:
        return (f"{where}: the sum is right, but rank {rank} sent {len(traffic.sent)} message(s), "
                f"{sum(traffic.sent)} elements in all; a ring sends 2(N-1) = {2 * (world - 1)} messages "
                f"of one chunk (about n/N = {n / world:g} elements) each: N-1 reduce-scatter steps, then N-1 "
                "all-gather "
                "steps")
    return None


def _check_ring(fn, rank, world, path):
    """Exercise 'ring_all_reduce' on this rank: None or what is wrong."""
    import torch
    import torch.distributed as dist

    for n in RING_SIZES:
        inputs = [torch.randn(n, generator=torch.Generator().manual_seed(100 * n + r)) for r in range(world)]
        tensor = inputs[rank].clone()
        with _Traffic() as traffic:
            returned = _call(fn, "ring_all_reduce", path, tensor)
        want = inputs[rank].clone()
        dist.all_reduce(want)  # torch's own collective
        assert torch.allclose(want, torch.stack(inputs).sum(0), atol=1e-5), "gloo's all_reduce != one process"
        if isinstance(returned, torch.Tensor) and returned is not tensor \
                and torch.equal(tensor, inputs[rank]):
            reason = (f"rank {rank}: ring_all_reduce returned a new tensor and left its argument unchanged: "
                      "sum into `tensor` in place (tensor.copy_(result)), as dist.all_reduce does")
        else:
            reason = _ring_reason(rank, world, n, inputs[rank], tensor, want, traffic)
        if _agree(reason):
            return reason
    return None


def _param_reason(rank, step, got, want, what, layout=None, world=None):
    """The first parameter (or gradient) whose values differ from the one process, described."""
    import torch

    for name, g in got.items():
        w = want[name].detach()
        g = g.detach()
        if torch.allclose(g, w, rtol=RTOL, atol=ATOL):
            continue
        diff = (g - w).abs()
        where = ""
        if layout is not None:
            start = layout[name]
            owner = (start + int(diff.argmax())) // shard_size(layout["numel"], world)
            where = (f" (flat elements {start}..{start + g.numel() - 1}; the largest difference is in rank "
                     f"{owner}'s shard)")
        return (f"rank {rank}, step {step}: the {what} of '{name}'{where} differs from one process "
                f"training on "
                f"the whole batch, largest difference {float(diff.max()):.3g}")
    return None


def _gradient_reason(rank, world, step, model, local, want):
    import torch

    got = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            return f"rank {rank}, step {step}: the gradient of '{name}' is None after average_gradients"
        got[name] = p.grad
    for name in got:
        if torch.allclose(got[name], want[name], rtol=RTOL, atol=ATOL):
            continue
        if torch.allclose(got[name], world * want[name], rtol=RTOL, atol=ATOL):
            return (f"rank {rank}, step {step}: the gradient of '{name}' is {world}x the one-process one: "
                    f"divide the SUM by the world size ({world}); gloo has no ReduceOp.AVG")
        if torch.allclose(got[name], local[name]):
            return (f"rank {rank}, step {step}: the gradient of '{name}' is still this rank's own "
                    "micro-batch's: all-reduce it over the ranks")
    return _param_reason(rank, step, got, want, "gradient")


def _check_average(fn, rank, world, path):
    """Exercise 'average_gradients': SGD steps with your averaging = one process on the whole batch."""
    import torch

    model, reference = make_model(), make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=SGD_LR)
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=SGD_LR)
    for step in range(STEPS):
        optimizer.zero_grad()
        ref_optimizer.zero_grad()
        loss_fn(model, *micro_batch(step, rank, world)).backward()
        local = {n: p.grad.clone() for n, p in model.named_parameters()}
        loss_fn(reference, *global_batch(step)).backward()
        _call(fn, "average_gradients", path, model)
        want = {n: p.grad for n, p in reference.named_parameters()}
        reason = _gradient_reason(rank, world, step, model, local, want)
        if _agree(reason):
            return reason
        optimizer.step()
        ref_optimizer.step()
        reason = _param_reason(rank, step, dict(model.named_parameters()), dict(reference.named_parameters()),
                               "parameters after the step")
        if _agree(reason):
            return reason
    return None


def _zero_calls_reason(rank, world, step, numel, before, average):
    """What is wrong with the adam_update calls of one ZeRO-1 step on this rank, or None."""
    import torch

    start, end = shard_range(numel, rank, world)
    size = end - start
    if not _ADAM_CALLS:
        return (f"rank {rank}, step {step}: zero1_step never called lab07.adam_update: update your "
                "shard with it")
    total = sum(call[0].numel() for call in _ADAM_CALLS)
    if total > size:
        return (f"rank {rank}, step {step}: adam_update got {total} elements; under ZeRO-1 each rank "
                f"updates only "
                f"its shard ({size} elements, flat [{start}, {end})) and the all-gather brings the others")
    values, grad = _ADAM_CALLS[0]
    if values.numel() == size and not torch.equal(values, before[start:end]):
        for other in range(world):
            a, b = shard_range(numel, other, world)
            if torch.equal(values, before[a:b]):
                return (f"rank {rank}, step {step}: rank {rank} updated rank {other}'s shard "
                        f"(flat [{a}, {b})); rank r owns flat [r*{size}, (r+1)*{size}), the chunk "
                        "all_gather_into_tensor puts at r")
    if values.numel() == size and torch.allclose(grad, world * average[start:end], rtol=RTOL, atol=ATOL) \
            and not torch.allclose(grad, average[start:end], rtol=RTOL, atol=ATOL):
        return (f"rank {rank}, step {step}: the gradient given to adam_update is {world}x the average: "
                f"divide the "
                f"SUM by the world size ({world}); Adam hides it in the parameters, not in its state")
    return None


def _state_reason(rank, step, state, size):
    import torch

    held = {k: v.numel() for k, v in state.items() if isinstance(v, torch.Tensor) and v.dim() > 0}
    if any(n > size for n in held.values()):
        key = max(held, key=held.get)
        return (f"rank {rank}, step {step}: the optimizer state holds {held[key]} elements ('{key}'); "
                f"ZeRO-1 keeps only this rank's shard's ({size})")
    return None


def _check_zero(fn, rank, world, path):
    """Exercise 'zero1_step': ZeRO-1 steps with your code = torch's Adam on one process, whole batch."""
    import torch

    model, reference = make_model(), make_model()
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=ADAM_LR)
    layout, offset = {"numel": sum(p.numel() for p in model.parameters())}, 0
    for name, p in model.named_parameters():
        layout[name], offset = offset, offset + p.numel()
    flat = flatten(model.parameters(), world)
    state = {}
    for step in range(STEPS):
        with torch.no_grad():
            for name, p in model.named_parameters():
                p.copy_(flat[layout[name]:layout[name] + p.numel()].view_as(p))
        model.zero_grad()
        ref_optimizer.zero_grad()
        loss_fn(model, *micro_batch(step, rank, world)).backward()
        loss_fn(reference, *global_batch(step)).backward()
        flat_grad = flatten([p.grad for p in model.parameters()], world)
        average = flatten([p.grad for p in reference.parameters()], world)
        before = flat.clone()
        _ADAM_CALLS.clear()
        _call(fn, "zero1_step", path, flat, flat_grad, state)
        reason = _zero_calls_reason(rank, world, step, layout["numel"], before, average) \
            or _state_reason(rank, step, state, shard_size(layout["numel"], world))
        if not reason:
            ref_optimizer.step()
            got = {n: flat[layout[n]:layout[n] + p.numel()].view_as(p)
                   for n, p in reference.named_parameters()}
            reason = _param_reason(rank, step, got, dict(reference.named_parameters()),
                                   "parameters after the step", layout, world)
        if _agree(reason):
            return reason
    return None


_GRADERS = {"ring_all_reduce": _check_ring, "average_gradients": _check_average, "zero1_step": _check_zero}


def grade_rank(rank, world_size, path, plan):
    """A checking rank (run by ortlab.distributed.launch): import the job file and check, in order, each
    set of `plan` (a list of {exercise: function name in the file}); print progress lines; return a list of
    {exercise: None or what is wrong}, one per set."""
    path = os.path.abspath(path)
    module = load_job(path)
    results = []
    for index, names in enumerate(plan):
        results.append({})
        for exercise in EXERCISES:
            if exercise in names:
                _mark("start", f"{index}:{exercise}")
                reason = _GRADERS[exercise](getattr(module, names[exercise]), rank, world_size, path)
                results[-1][exercise] = reason
                _mark("done", f"{index}:{exercise}", reason)
    return results


# --- the checks, on the caller's side --------------------------------------------------------------

def _progress(output):
    """(finished {(set, exercise): reason}, (set, exercise) started and not finished, or None)."""
    done, current = {}, None
    for line in output.splitlines():
        if not line.startswith(MARK + " "):
            continue
        _, kind, key, reason = line.split(" ", 3)
        index, exercise = key.split(":")
        if kind == "start":
            current = (int(index), exercise)
        else:
            done[(int(index), exercise)], current = json.loads(reason), None
    return done, current


def _job_line(message, path):
    """' It was waiting in fn, at `code`.' for the deepest frame of the job file in a stack dump, or ''."""
    import re

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


def _failure_results(error, todo, path, timeout):
    """[{exercise: CheckResult}] for a job that stopped: what finished on every rank, the exercise it
    stopped in, and 'not checked' for the rest."""
    outputs = error.outputs or [""]
    rank = error.rank if error.rank is not None else 0
    progress = [_progress(o) for o in outputs]
    stopped = progress[rank][1] if rank < len(progress) else None
    results = []
    for index, names in enumerate(todo):
        results.append({})
        for exercise in names:
            key = (index, exercise)
            if all(key in finished for finished, _ in progress):
                bad = [reason for finished, _ in progress if (reason := finished[key])]
                results[index][exercise] = CheckResult(exercise, "fail", bad[0]) if bad \
                    else CheckResult(exercise, "pass")
    if stopped is None and not any(finished for finished, _ in progress):
        first = str(error).splitlines()[0]
        why = (f"the ranks did not reach the first check within {timeout:g} s (a busy machine? give a longer "
               "timeout)" if error.kind == "timeout"
               else f"the checking job failed before the first check: {first}")
        return [{e: CheckResult(e, "fail", why) for e in names} for names in todo]
    if stopped is None:  # failed between two exercises
        stopped = next((i, e) for i, names in enumerate(todo) for e in names if e not in results[i])
    index, exercise = stopped
    if exercise in todo[index]:
        results[index][exercise] = CheckResult(exercise, *_stop_message(error, exercise, path, timeout))
    for i, names in enumerate(todo):
        for e in names:
            results[i].setdefault(e, CheckResult(e, "not done", f"not checked: the job stopped at {exercise} "
                                                               f"on rank {rank}"))
    return results


def _not_done(exercise, fn):
    try:
        return bool(stub_pattern(exercise).search(inspect.getsource(fn)))
    except (OSError, TypeError):
        return False


def _screen(functions):
    """({exercise: CheckResult} decided without running, {exercise: fn} to run) for one set."""
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
            decided[exercise] = CheckResult(exercise, "fail", f"{exercise} must be a function, got "
                                                              f"{type(fn).__name__}")
        elif _not_done(exercise, fn):
            decided[exercise] = CheckResult(exercise, "not done", "the exercise's stub is still in place")
        else:
            try:
                module_source([(exercise, fn)])
                todo[exercise] = fn
            except Lab07Error as exc:
                decided[exercise] = CheckResult(exercise, "fail", str(exc))
    return decided, todo


def run_many(sets, world_size=WORLD_SIZE, timeout=TIMEOUT):
    """Check several sets of answers ({exercise: function}) in ONE job of `world_size` ranks, one set after
    the other; return one {exercise: CheckResult} per set (EXERCISES order). A set whose function raises
    or hangs stops the job: the sets after it are reported 'not checked'."""
    from ortlab.distributed import LaunchError, launch

    if not isinstance(sets, (list, tuple)) or not all(isinstance(f, dict) for f in sets):
        raise Lab07Error("run_many takes a list of {exercise: function} dicts")
    screened = [_screen(functions) for functions in sets]
    todo = [names for _, names in screened]
    results = [dict(decided) for decided, _ in screened]
    if any(todo):
        folder = tempfile.mkdtemp(prefix="ortlab-lab07-")
        try:
            everything = [(e, fn) for names in todo for e, fn in names.items()]
            path = _write_new(os.path.join(folder, "lab07_job.py"), module_source(everything))
            plan = [{e: fn.__name__ for e, fn in names.items()} for names in todo]
            try:
                values = launch(grade_rank, world_size, args=(path, plan), timeout=timeout)
                for index, names in enumerate(todo):
                    for exercise in names:
                        bad = [v[index][exercise] for v in values if v[index][exercise]]
                        results[index][exercise] = CheckResult(exercise, "fail", bad[0]) if bad \
                            else CheckResult(exercise, "pass")
            except LaunchError as exc:
                for index, found in enumerate(_failure_results(exc, todo, path, timeout)):
                    results[index].update(found)
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return [{e: r[e] for e in EXERCISES if e in r} for r in results]


def run_checks(world_size=WORLD_SIZE, timeout=TIMEOUT, **functions):
    """Check the given exercises (ring_all_reduce=fn, average_gradients=fn, zero1_step=fn) in one job of
    `world_size` ranks; return {exercise: CheckResult} in EXERCISES order, without displaying them."""
    return run_many([functions], world_size, timeout)[0]


def _check_one(exercise, fn, timeout):
    _show(run_checks(timeout=timeout, **{exercise: fn})[exercise])


def check_ring_all_reduce(ring_all_reduce, timeout=TIMEOUT):
    """Exercise 'ring_all_reduce': on 2 ranks, equal to dist.all_reduce (SUM) on tensors of 10, 7 and 4096
    elements, built from send/recv only, 2(N-1) messages of one chunk per rank."""
    _check_one("ring_all_reduce", ring_all_reduce, timeout)


def check_average_gradients(average_gradients, timeout=TIMEOUT):
    """Exercise 'average_gradients': 3 SGD steps on 2 ranks equal one process on the whole batch."""
    _check_one("average_gradients", average_gradients, timeout)


def check_zero1_step(zero1_step, timeout=TIMEOUT):
    """Exercise 'zero1_step': 3 ZeRO-1 Adam steps on 2 ranks equal torch's Adam on one process, with each
    rank's optimizer state and update limited to its shard."""
    _check_one("zero1_step", zero1_step, timeout)


def check_job(timeout=TIMEOUT, **functions):
    """All the given exercises in one 2-rank job (one start-up instead of three); shows one line each."""
    for result in run_checks(timeout=timeout, **functions).values():
        _show(result)


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
    return _write_new(path, text)


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
    import torch

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

"""The checks of lab07_distributed_job (run where the learner's code cannot reach them).

The ranks (ortlab.labs.lab07.run_sets, in the learner's process) record what each call of the learner's
functions did: the tensor after a ring all-reduce and the messages it sent, the gradients and parameters
of each SGD step, the flat buffer and the adam_update calls of each ZeRO-1 step. The records come back
as data; here they are compared with the sum torch's collective gives (the inputs are made again here
from their seeds) and with one process training on the whole batch (torch.optim's SGD and Adam).
"""
from types import SimpleNamespace

import torch

from ortlab.labs.checks import CheckFailed, CheckResult
from ortlab.labs.lab07 import (ATOL, EXERCISES, RING_SIZES, RTOL, STEPS, TIMEOUT, WORLD_SIZE, Lab07Error,
                               flatten, global_batch, loss_fn, make_model, run_sets, shard_range, shard_size)
from ortlab.labs.lab07 import ADAM_LR, SGD_LR
from ortlab.labs.remote import LocalRemote, learner

STATUSES = ("fail", "not done")  # what a record of the learner's side may say by itself: never a pass


def _chunk_of(index, numel, world_size):
    bounds = [0]
    for part in range(world_size):
        bounds.append(bounds[-1] + numel // world_size + (1 if part < numel % world_size else 0))
    chunk = next(c for c in range(world_size) if bounds[c] <= index < bounds[c + 1])
    return chunk, bounds


def _ring_reason(rank, world, n, original, got, want, traffic):
    import torch  # heavy: torch

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


def _ring(ranks, world):
    """(what is wrong or None, whether every rank recorded every size)."""
    for k, n in enumerate(RING_SIZES):
        if any(len(items) <= k for items in ranks):
            return None, False
        inputs = [torch.randn(n, generator=torch.Generator().manual_seed(100 * n + r)) for r in range(world)]
        want = torch.stack(inputs).sum(0)
        for rank, items in enumerate(ranks):
            item = items[k]
            got = torch.as_tensor(item["got"])
            if item["returned_new"] and torch.equal(got, inputs[rank]):
                return (f"rank {rank}: ring_all_reduce returned a new tensor and left its argument unchanged: "
                        "sum into `tensor` in place (tensor.copy_(result)), as dist.all_reduce does"), True
            traffic = SimpleNamespace(sent=list(item["sent"]), collectives=list(item["collectives"]))
            reason = _ring_reason(rank, world, n, inputs[rank], got, want, traffic)
            if reason:
                return reason, True
    return None, True


def _param_reason(rank, step, got, want, what, layout=None, world=None):
    """The first parameter (or gradient) whose values differ from the one process, described."""
    import torch  # heavy: torch

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


def _gradient_reason(rank, world, step, after, local, want):
    for name, grad in after.items():
        if grad is None:
            return f"rank {rank}, step {step}: the gradient of '{name}' is None after average_gradients"
    for name in after:
        if torch.allclose(after[name], want[name], rtol=RTOL, atol=ATOL):
            continue
        if torch.allclose(after[name], world * want[name], rtol=RTOL, atol=ATOL):
            return (f"rank {rank}, step {step}: the gradient of '{name}' is {world}x the one-process one: "
                    f"divide the SUM by the world size ({world}); gloo has no ReduceOp.AVG")
        if torch.allclose(after[name], local[name]):
            return (f"rank {rank}, step {step}: the gradient of '{name}' is still this rank's own "
                    "micro-batch's: all-reduce it over the ranks")
    return _param_reason(rank, step, after, want, "gradient")


def _average(ranks, world):
    """(what is wrong or None, complete): SGD steps with the learner's averaging = one process."""
    reference = make_model()
    ref_optimizer = torch.optim.SGD(reference.parameters(), lr=SGD_LR)
    for step in range(STEPS):
        ref_optimizer.zero_grad()
        loss_fn(reference, *global_batch(step)).backward()
        if any(len(items) <= step for items in ranks):
            return None, False
        want = {n: p.grad for n, p in reference.named_parameters()}
        for rank, items in enumerate(ranks):
            reason = _gradient_reason(rank, world, step, items[step]["after"], items[step]["local"], want)
            if reason:
                return reason, True
        if any(items[step]["params"] is None for items in ranks):
            return None, False
        ref_optimizer.step()
        for rank, items in enumerate(ranks):
            reason = _param_reason(rank, step, items[step]["params"], dict(reference.named_parameters()),
                                   "parameters after the step")
            if reason:
                return reason, True
    return None, True


def _zero_calls_reason(rank, world, step, numel, before, average, calls):
    """What is wrong with the adam_update calls of one ZeRO-1 step on this rank, or None."""
    import torch  # heavy: torch

    start, end = shard_range(numel, rank, world)
    size = end - start
    if not calls:
        return (f"rank {rank}, step {step}: zero1_step never called lab07.adam_update: update your "
                "shard with it")
    total = sum(call[0].numel() for call in calls)
    if total > size:
        return (f"rank {rank}, step {step}: adam_update got {total} elements; under ZeRO-1 each rank "
                f"updates only "
                f"its shard ({size} elements, flat [{start}, {end})) and the all-gather brings the others")
    values, grad = calls[0]
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


def _state_reason(rank, step, held, size):
    if any(n > size for n in held.values()):
        key = max(held, key=held.get)
        return (f"rank {rank}, step {step}: the optimizer state holds {held[key]} elements ('{key}'); "
                f"ZeRO-1 keeps only this rank's shard's ({size})")
    return None


def _zero(ranks, world):
    """(what is wrong or None, complete): ZeRO-1 steps with the learner's code = torch's Adam, one process."""
    reference = make_model()
    ref_optimizer = torch.optim.Adam(reference.parameters(), lr=ADAM_LR)
    layout, offset = {"numel": sum(p.numel() for p in reference.parameters())}, 0
    for name, p in reference.named_parameters():
        layout[name], offset = offset, offset + p.numel()
    numel = layout["numel"]
    for step in range(STEPS):
        ref_optimizer.zero_grad()
        loss_fn(reference, *global_batch(step)).backward()
        if any(len(items) <= step for items in ranks):
            return None, False
        average = flatten([p.grad for p in reference.parameters()], world)
        for rank, items in enumerate(ranks):
            item = items[step]
            calls = [(torch.as_tensor(v), torch.as_tensor(g)) for v, g in item["calls"]]
            reason = _zero_calls_reason(rank, world, step, numel, torch.as_tensor(item["before"]), average, calls) \
                or _state_reason(rank, step, dict(item["state"]), shard_size(numel, world))
            if reason:
                return reason, True
        ref_optimizer.step()
        for rank, items in enumerate(ranks):
            flat = torch.as_tensor(items[step]["after"])
            got = {n: flat[layout[n]:layout[n] + p.numel()].view_as(p) for n, p in reference.named_parameters()}
            reason = _param_reason(rank, step, got, dict(reference.named_parameters()),
                                   "parameters after the step", layout, world)
            if reason:
                return reason, True
    return None, True


_JUDGES = {"ring_all_reduce": _ring, "average_gradients": _average, "zero1_step": _zero}


def _verdict(index, exercise, ranks, stop, world):
    """The CheckResult of one exercise of one set, from the ranks' records and where the job stopped."""
    ranks = ranks if ranks else [[] for _ in range(world)]
    reason, complete = _JUDGES[exercise](ranks, world)
    if reason:
        return CheckResult(exercise, "fail", reason)
    if stop is None:
        return CheckResult(exercise, "pass") if complete else \
            CheckResult(exercise, "fail", "the ranks did not record the whole check")
    status = stop["status"] if stop["status"] in STATUSES else "fail"
    if stop["at"] is None:
        return CheckResult(exercise, status, stop["message"])
    if list(stop["at"]) == [index, exercise]:
        return CheckResult(exercise, status, stop["message"])
    if complete:
        return CheckResult(exercise, "pass")
    return CheckResult(exercise, "not done", f"not checked: the job stopped at {stop['at'][1]} on rank {stop['rank']}")


def run_many(sets, world_size=WORLD_SIZE, timeout=TIMEOUT, remote=None):
    """Check several sets of answers ({exercise: function}) in ONE job of `world_size` ranks, one set after
    the other; return one {exercise: CheckResult} per set (EXERCISES order). A set whose function raises
    or hangs stops the job: the sets after it are reported 'not checked'."""
    if not isinstance(sets, (list, tuple)) or not all(isinstance(f, dict) for f in sets):
        raise Lab07Error("run_many takes a list of {exercise: function} dicts")
    for functions in sets:
        unknown = sorted(set(functions) - set(EXERCISES))
        if unknown or not functions:
            raise Lab07Error(f"the checks take the exercises {', '.join(EXERCISES)} as keywords, got "
                             f"{unknown or 'none'}")
    remote = remote if remote is not None else LocalRemote()
    reply = remote.call(run_sets, [{e: learner(fn) for e, fn in f.items()} for f in sets], world_size, timeout)
    records = {tuple(key): ranks for key, ranks in reply["records"]}
    results = []
    for index, functions in enumerate(sets):
        found = {}
        for exercise in EXERCISES:
            if exercise not in functions:
                continue
            decided = reply["decided"][index].get(exercise)
            if decided:
                status, message = decided
                found[exercise] = CheckResult(exercise, status if status in STATUSES else "fail", str(message))
            else:
                found[exercise] = _verdict(index, exercise, records.get((index, exercise)), reply["stop"],
                                           world_size)
        results.append(found)
    return results


def run_checks(world_size=WORLD_SIZE, timeout=TIMEOUT, remote=None, **functions):
    """Check the given exercises (ring_all_reduce=fn, average_gradients=fn, zero1_step=fn) in one job of
    `world_size` ranks; return {exercise: CheckResult} in EXERCISES order."""
    return run_many([functions], world_size, timeout, remote)[0]


def one(remote, exercise, fn, timeout=TIMEOUT):
    """The check of one exercise (in a job of its own): None, or what is wrong."""
    result = run_checks(timeout=timeout, remote=remote, **{exercise: fn})[exercise]
    if result.status == "not done":
        raise NotImplementedError(result.message)
    if result.status == "fail":
        raise CheckFailed(result.message)
    return None

"""The checks of L2_03's exercises (run where the learner's code cannot reach them); no process is launched.

'ddp_buckets' compares the learner's buckets with those of torch's own assignment,
torch.distributed._compute_bucket_assignment_by_size (torch/csrc/distributed/c10d/reducer.cpp
compute_bucket_assignment_by_size, the function DistributedDataParallel and its Reducer call: a bucket per dtype
fills in the order given and closes once it holds at least its limit, the first limit for a dtype's first bucket
and the cap after it; the buckets ordered by their first gradient), and names the usual mistake by the buckets it
gives. 'all_to_all' compares the learner's exchange with dist.all_to_all_single's, as torch documents it: rank r
cuts its rows by its input split sizes and sends chunk j to rank j; rank r's output is the chunks sent to it, rank
0's first (tests/labs/test_exercise_facts_l2_03.py checks this against gloo's all_to_all_single on real ranks).
"""
import numpy as np

from ortlab.labs.checks import CheckFailed
from ortlab.labs.l2_03 import A2A_CASES, BUCKET_CASES, ITEM, a2a_inputs, buckets_of, exchanged


# --- 'ddp_buckets' ---------------------------------------------------------------------------------------------

def torch_buckets(grads, first, cap):
    """The buckets (lists of names) torch's compute_bucket_assignment_by_size makes of `grads` ((name, elements,
    dtype) in ready order) with the limits [first, cap]."""
    import torch  # heavy: torch
    import torch.distributed as dist  # heavy: torch

    tensors = [torch.empty(numel, dtype=getattr(torch, dtype)) for _, numel, dtype in grads]
    indices, _ = dist._compute_bucket_assignment_by_size(tensors, [first, cap])
    return [[grads[i][0] for i in bucket] for bucket in indices]


def _assign(grads, first, cap, close_before=False, per_dtype=True, first_limit=True, in_bytes=True, sort=True):
    """The buckets a variant of the rule makes (the usual mistakes are variants)."""
    open_, closed, started = {}, [], set()
    for i, (name, numel, dtype) in enumerate(grads):
        key = dtype if per_dtype else "all"
        limit = first if first_limit and key not in started else cap
        size = numel * (ITEM[dtype] if in_bytes else 1)
        names, total = open_.get(key, ([], 0))
        if close_before and names and total + size > limit:
            closed.append((names[0], names))
            started.add(key)
            names, total = [], 0
            limit = cap
        names, total = names + [name], total + size
        if total >= limit:
            closed.append((names[0], names))
            started.add(key)
            open_.pop(key, None)
        else:
            open_[key] = (names, total)
    closed += [(names[0], names) for names, _ in open_.values()]
    order = [g[0] for g in grads]
    if sort:
        closed.sort(key=lambda pair: order.index(pair[0]))
    return [names for _, names in closed]


def _bytes(names, grads):
    size = {name: numel * ITEM[dtype] for name, numel, dtype in grads}
    return sum(size[n] for n in names)


def _why(got, truth, grads, first, cap):
    """What is wrong with buckets `got` where torch gives `truth`, naming the usual mistake when it is one."""
    if _assign(grads, first, cap, close_before=True) == got:
        bucket = next(b for b in truth if b not in got)
        return (f"torch closes a bucket once it holds at least its limit, with the gradient that reached the limit "
                f"inside, so a bucket may go over it: torch's bucket {bucket} holds {_bytes(bucket, grads)} bytes. "
                "You start a new bucket before the limit is passed")
    if _assign(grads, first, cap, first_limit=False) == got:
        return (f"every bucket here has the cap's limit ({cap} bytes); the first bucket of each dtype has its own, "
                f"smaller limit (first_cap = {first} bytes: DDP's 1 MiB when bucket_cap_mb is left at its default, so "
                "that the last layers' gradients are all-reduced early), and every later one the cap")
    if _assign(grads, first, cap, per_dtype=False) == got:
        return ("a bucket holds gradients of one dtype only (DDP flattens a bucket into one tensor to all-reduce it): "
                "each dtype fills its own buckets, with its own first limit, then the cap")
    if _assign(grads, first, cap, in_bytes=False) == got:
        return ("the limits are in bytes: a gradient adds elements x element size (4 bytes a float32, 2 a float16) "
                "to its bucket, not its number of elements")
    if _assign(list(reversed(grads)), first, cap) == got:
        return ("you bucketed the gradients last to first: they are given in the order backward makes them ready, "
                "and DDP fills its buckets in that order (after its first step, the order it saw)")
    if sorted(map(sorted, got)) == sorted(map(sorted, truth)):
        return (f"the right buckets in the wrong order: {got}; order them by their first gradient, as torch does "
                f"(a dtype's last, unfilled bucket is no last bucket overall): {truth}")
    return f"torch's buckets are {truth}; yours are {got}"


def ddp_buckets(remote, fn):
    for k, (what, grads, first, cap) in enumerate(BUCKET_CASES):
        got = remote.call(buckets_of, fn, k)
        truth = torch_buckets(grads, first, cap)
        names = [g[0] for g in grads]
        flat = [n for bucket in got for n in bucket]
        unknown = [n for n in flat if n not in names]
        if unknown:
            raise CheckFailed(f"case {k} ({what}): {unknown[0]!r} is no gradient of this case; they are {names}")
        if sorted(flat) != sorted(names):
            missing = [n for n in names if n not in flat]
            twice = sorted({n for n in flat if flat.count(n) > 1})
            raise CheckFailed(f"case {k} ({what}): every gradient goes into exactly one bucket; "
                              + (f"{missing} in none" if missing else f"{twice} in more than one"))
        if any(not bucket for bucket in got):
            raise CheckFailed(f"case {k} ({what}): an empty bucket: leave it out")
        if got != truth:
            raise CheckFailed(f"case {k} ({what}): {_why(got, truth, grads, first, cap)}")
    return None


# --- 'all_to_all' ----------------------------------------------------------------------------------------------

def all_to_all_single(inputs, splits):
    """What dist.all_to_all_single leaves on every rank: (outputs, output split sizes). Rank r's rows are cut by
    splits[r] (chunk j goes to rank j); rank r's output is the chunks sent to it, from rank 0 first."""
    world = len(inputs)
    starts = [np.concatenate([[0], np.cumsum(s)]).astype(int) for s in splits]
    outputs = [np.concatenate([inputs[j][starts[j][r]:starts[j][r + 1]] for j in range(world)]) for r in range(world)]
    return outputs, [[int(splits[j][r]) for j in range(world)] for r in range(world)]


def _rows(block):
    """'rank 1's rows 0 to 2' for rows that say where they came from (a2a_inputs: 100 * rank + row)."""
    if len(block) == 0:
        return "no rows"
    labels = [(int(v) // 100, int(v) % 100) for v in block[:, 0]]
    r, i = labels[0]
    if labels == [(r, i + k) for k in range(len(labels))]:
        return f"rank {r}'s row {i}" if len(labels) == 1 else f"rank {r}'s rows {i} to {i + len(labels) - 1}"
    return ", ".join(f"rank {r}'s row {i}" for r, i in labels)


def all_to_all(remote, fn):
    for k, case in enumerate(A2A_CASES):
        inputs, splits = a2a_inputs(case)
        world = len(inputs)
        outputs, output_splits = all_to_all_single(inputs, splits)
        got, got_splits = remote.call(exchanged, fn, k)
        label = f"with {world} ranks (splits {splits})"
        if all(g.shape == x.shape and np.array_equal(g, x) for g, x in zip(got, inputs)):
            raise CheckFailed(f"{label}: every rank kept its own rows: all_to_all sends rank r's chunk j (its next "
                              "splits[r][j] rows) to rank j, and keeps only its chunk r")
        for r in range(world):
            want, have = outputs[r], got[r]
            if len(have) != len(want):
                terms = " + ".join(str(splits[j][r]) for j in range(world))
                raise CheckFailed(f"{label}: rank {r} receives {len(want)} rows (splits[0][{r}] + splits[1][{r}] + "
                                  f"... = {terms}); yours has {len(have)}")
            if np.array_equal(have, want):
                continue
            if sorted(map(tuple, have.tolist())) == sorted(map(tuple, want.tolist())):
                raise CheckFailed(f"{label}: rank {r} has the right rows in the wrong order ({_rows(have)}): "
                                  "all_to_all_single writes the chunk from rank 0 first, then rank 1's, and so on, "
                                  "in source-rank order, whatever order the exchanges happen in")
            at = 0
            for j in range(world):
                n = splits[j][r]
                if not np.array_equal(have[at:at + n], want[at:at + n]):
                    start = sum(splits[j][:r])
                    where = f"row {at}" if n == 1 else f"rows {at} to {at + n - 1}"
                    raise CheckFailed(f"{label}: {where} of rank {r}'s output must be what rank {j} sends it, "
                                      f"{_rows(want[at:at + n])}: rank {j}'s chunk for rank {r} is splits[{j}][{r}] = "
                                      f"{n} row(s) from its row sum(splits[{j}][:{r}]) = {start}; yours "
                                      f"{'is' if n == 1 else 'are'} {_rows(have[at:at + n])}")
                at += n
        if got_splits != output_splits:
            r = next(r for r in range(world) if got_splits[r] != output_splits[r])
            raise CheckFailed(f"{label}: output_splits[{r}] is {output_splits[r]}, how many rows rank {r} got from "
                              f"rank 0, 1, ... (splits[j][{r}] for each j); yours is {got_splits[r]}. The input "
                              "splits count rows per destination, the output splits per source")
    return None

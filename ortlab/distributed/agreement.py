"""Do all ranks hold the same model? One small all-gather of a description, the first difference named.

A wrapper that broadcasts rank 0's parameters (DDP, ZeRO) sends tensors of rank 0's shapes: a rank whose
model differs receives a message of the wrong size and gloo aborts the process, naming nothing. So before
the first broadcast every rank describes what it holds (names, shapes, dtypes, settings: plain text) and
one `all_gather_object` shares the descriptions; every rank compares them with rank 0's and raises the
same error, naming the rank, the entry and both shapes. Mirrors torch's DDP check before its first
broadcast (torch/distributed/utils.py _verify_param_shape_across_processes, which calls
verify_params_across_processes in torch/csrc/distributed/c10d/comm.cpp).

The exchange is a few hundred bytes once per construction; the wrappers' byte counters do not count it.
"""
import torch.distributed as dist


def describe_tensors(named):
    """[(name, 'shape (16, 4) float32')] for (name, tensor) pairs: what must match across ranks."""
    return [(name, f"shape {tuple(t.shape)} {str(t.dtype).replace('torch.', '')}") for name, t in named]


def _first_difference(what, mine, first, rank):
    """A sentence naming the first entry of `what` where rank `rank`'s list differs from rank 0's, or None."""
    for index, (a, b) in enumerate(zip(first, mine)):
        if a != b:
            return (f"{what} {index} is {b[0]!r} with {b[1]} on rank {rank}, but {a[0]!r} with {a[1]} "
                    f"on rank 0")
    if len(first) != len(mine):
        extra, where = (mine, rank) if len(mine) > len(first) else (first, 0)
        name, facts = extra[min(len(first), len(mine))]
        return (f"rank {rank} has {len(mine)} {what}s and rank 0 has {len(first)}; the first one without "
                f"a counterpart is {name!r} with {facts} on rank {where}")
    return None


def check_same_on_every_rank(description, error, fix, group=None):
    """All-gather `description` ({what: [(name, facts text)]}) and raise `error` on every rank, naming the
    first rank and entry that differ from rank 0's, with `fix` (what to do) appended."""
    everyone = [None] * dist.get_world_size(group)
    dist.all_gather_object(everyone, description, group=group)
    problems = []
    for rank, mine in enumerate(everyone[1:], start=1):
        for what in description:
            found = _first_difference(what, mine[what], everyone[0][what], rank)
            if found:
                problems.append(found)
                break
    if problems:
        more = f" ({len(problems) - 1} more rank(s) differ too)" if len(problems) > 1 else ""
        raise error(f"the ranks do not hold the same model: {problems[0]}{more}. {fix}")

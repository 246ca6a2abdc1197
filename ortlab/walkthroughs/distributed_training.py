"""Small rank functions to run with ortlab.distributed.launch (the tests' and notebooks' workers).

They live in a module, not in a notebook cell, because each rank is a spawned process that imports
its function by module and name.
"""
import ipaddress
import os
import sys
import time

import numpy as np
import torch
import torch.distributed as dist
from torch.utils.data import BatchSampler, DistributedSampler

from ortlab.distributed import collectives, data_parallel, moe, pipeline
from ortlab.distributed.checks import collectives as collective_checks
from ortlab.distributed.checks import data_parallel as ddp_checks
from ortlab.distributed.checks import moe as moe_checks
from ortlab.distributed.checks import tensor_parallel as tp_checks
from ortlab.distributed.checks.zero import zero_check
from ortlab.distributed.zero import zero
from ortlab.errors import OrtlabError
from ortlab.viz import Table

LISTEN = "0A"  # TCP_LISTEN in the kernel's /proc/net/tcp "st" column (include/net/tcp_states.h)


def all_reduce_sum(rank, world_size):
    """All-reduce (SUM) one number per rank, rank + 1: every rank gets 1 + 2 + ... + world_size."""
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value)
    return value.item()


def _socket_inodes(pids):
    """The inodes of the sockets the processes `pids` have open (from /proc/<pid>/fd)."""
    inodes = set()
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                target = os.readlink(os.path.join(fd_dir, fd))
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:["):-1])
    return inodes


def _address(hex_address):
    """An address from /proc/net/tcp{,6}: hex, each 32-bit word in host (little-endian) order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return ipaddress.ip_address(words)


def listening_sockets(pids):
    """(address, port) of every TCP socket in LISTEN state that the processes `pids` own.

    Reads /proc/net/tcp and /proc/net/tcp6 (the whole network namespace) and keeps the sockets whose
    inode one of `pids` holds, so other programs on the machine do not count.
    """
    inodes = _socket_inodes(pids)
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            next(f)
            for line in f:
                fields = line.split()
                local, state, inode = fields[1], fields[3], fields[9]
                if state == LISTEN and inode in inodes:
                    host, port = local.split(":")
                    found.append((str(_address(host)), int(port, 16)))
    return sorted(found)


def is_loopback(address):
    """True for 127.0.0.0/8, ::1 and IPv4-mapped loopback (::ffff:127.0.0.1)."""
    ip = ipaddress.ip_address(address)
    mapped = getattr(ip, "ipv4_mapped", None)
    return ip.is_loopback or bool(mapped and mapped.is_loopback)


def launch_facts(rank, world_size):
    """What one rank sees of its launch: group, all-reduce, threads, environment, listening sockets.

    Prints one line on stdout and one on stderr, so the caller can check both are captured per rank.
    """
    total = torch.arange(4, dtype=torch.float64) * (rank + 1)
    dist.all_reduce(total)
    pids = [None] * world_size
    dist.all_gather_object(pids, os.getpid())
    dist.barrier()  # every rank has joined the group and opened its sockets
    listeners = listening_sockets(pids)
    dist.barrier()  # no rank leaves (closing its sockets) before all have looked
    print(f"rank {rank} of {world_size}: all_reduce {total.tolist()}")
    print(f"rank {rank} says hello on stderr", file=sys.stderr)
    return {"rank": rank, "world_size": world_size, "group_rank": dist.get_rank(),
            "group_size": dist.get_world_size(), "backend": dist.get_backend(), "sum": total.tolist(),
            "threads": torch.get_num_threads(),
            "interop_threads": torch.get_num_interop_threads(), "pid": os.getpid(), "pids": pids,
            "env": {key: os.environ.get(key) for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK",
                                                         "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")},
            "listeners": listeners}


def _fail(rank):
    raise ValueError(f"rank {rank} fails on purpose")


def fail_on_rank(rank, world_size, bad_rank=1):
    """Rank `bad_rank` raises ValueError; the others wait for it at a barrier (it never comes)."""
    if rank == bad_rank:
        _fail(rank)
    dist.barrier()
    return rank


def stuck_forever():
    """Never returns: what a hung rank looks like (sleeps in short steps)."""
    while True:
        time.sleep(0.05)


def hang_on_rank(rank, world_size, bad_rank=1):
    """Rank `bad_rank` hangs in stuck_forever(); the others return and wait for it."""
    if rank == bad_rank:
        stuck_forever()
    return rank


def _mismatch_cases(rank, world_size):
    """{case: call}: each rank gives the collective or wrapper something different from rank 0's."""
    def two_models(hidden):
        torch.manual_seed(0)
        return ddp_checks.MLP(hidden=hidden)

    def extra_parameter():
        model = two_models(16)
        if rank:
            model.extra = torch.nn.Linear(2, 2)
        return model

    moe_layer = moe.MoE(4, 8, 2 * world_size, k=1)
    return {
        "all_reduce sizes": lambda: collectives.ring_all_reduce(torch.ones(10 if rank == 0 else 7)),
        "all_reduce dtypes": lambda: collectives.ring_all_reduce(
            torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64)),
        "all_reduce one bad rank": lambda: collectives.ring_all_reduce(torch.ones(3, dtype=torch.bool if rank
                                                                                  else torch.float32)),
        "reduce_scatter shapes": lambda: collectives.ring_reduce_scatter(torch.ones(2 * world_size * (rank + 1))),
        "all_to_all dtypes": lambda: collectives.all_to_all(
            [torch.ones(1, dtype=torch.float32 if rank == 0 else torch.int64)] * world_size),
        "ddp models": lambda: data_parallel.DistributedDataParallel(two_models(16 if rank == 0 else 8)),
        "ddp extra parameter": lambda: data_parallel.DistributedDataParallel(extra_parameter()),
        "ddp bucket caps": lambda: data_parallel.DistributedDataParallel(two_models(16),
                                                                       bucket_cap_mb=25 if rank == 0 else 1),
        "zero models": lambda: zero(two_models(16 if rank == 0 else 8), torch.optim.Adam, 1, lr=0.1),
        "zero stages": lambda: zero(two_models(16), torch.optim.Adam, 1 + rank, lr=0.1),
        "moe world size": lambda: moe.DistributedMoE(moe_layer, rank, 2 * world_size)(torch.ones(3, 4)),
        "moe settings": lambda: moe.DistributedMoE(moe.MoE(4, 8, 2 * world_size, k=1 + (rank > 0)))(
            torch.ones(3, 4)),
    }


def mismatch_check(rank, world_size):
    """Rank function: every rank gives the mirrors inputs that differ from rank 0's; returns {case: error
    text}, the same on every rank since each mirror compares the ranks before sending anything, and a ring
    all-reduce that works afterwards, with its trace.

    (torch 2.6's own DDP is not among the cases: on gloo only the ranks whose model differs from rank 0's
    raise, and rank 0 goes on to broadcast and waits for them.)"""
    found = collective_checks.error_texts(_mismatch_cases(rank, world_size), OrtlabError)
    trace = collectives.CollectiveTrace()
    total = collectives.ring_all_reduce(torch.full((10,), float(rank + 1)), trace=trace)
    return {"errors": found, "after": total, "trace": trace.as_dict()}


# --- ORT's LoadBalancingDistributedBatchSampler: tokens per rank and step, with and without it -----------

def sample_lengths(n=32, low=4, high=128, seed=0):
    """n sequence lengths in [low, high], as a dataset of variable-length samples has (numpy's legacy
    RandomState, whose stream does not change between numpy versions)."""
    return [int(x) for x in np.random.RandomState(seed).randint(low, high + 1, size=n)]


def step_tokens(lengths, world_size=2, batch_size=4, budget=None, seed=0):
    """{sampler: [[tokens of rank r at step s for r in ranks] for s in steps]} for one epoch.

    'torch DistributedSampler': torch's sampler (shuffled, `seed`) cut into batches of `batch_size`
    samples (torch's BatchSampler), what a DataLoader does. 'ORT LoadBalancingDistributedBatchSampler':
    ORT's real class (onnxruntime.training.utils.data, sampler.py) over ORT's LoadBalancingDistributedSampler
    with the length as complexity, cutting each rank's samples into batches of at most `budget` tokens
    (default: batch_size times the mean length, so both see about as many steps). A step's tokens on a
    rank are the summed lengths of its batch. ORT's batch sampler pads every rank to the number of batches
    of the rank with most by repeating batches; a rank that still has fewer batches idles (0).
    """
    from ortlab.ortmodule import distributed as ort  # heavy: onnxruntime.training; the ranks never need it

    budget = budget or round(batch_size * sum(lengths) / len(lengths))
    per_rank = {"torch DistributedSampler": [], "ORT LoadBalancingDistributedBatchSampler": []}
    for rank in range(world_size):
        torch_sampler = DistributedSampler(lengths, num_replicas=world_size, rank=rank, shuffle=True, seed=seed)
        per_rank["torch DistributedSampler"].append(list(BatchSampler(torch_sampler, batch_size, drop_last=False)))
        sampler = ort.load_balancing_sampler(lengths, int, world_size=world_size, rank=rank, shuffle=True,
                                             seed=seed)
        batches = ort.load_balancing_batch_sampler(sampler, ort.token_budget_batches(lengths, budget))
        per_rank["ORT LoadBalancingDistributedBatchSampler"].append(list(batches))
    found = {}
    for name, ranks in per_rank.items():
        steps = max(len(batches) for batches in ranks)
        found[name] = [[sum(lengths[i] for i in batches[s]) if s < len(batches) else 0 for batches in ranks]
                       for s in range(steps)]
    return found


def balance_table(tokens):
    """One row per sampler: steps, each rank's tokens over the epoch, the tokens of the slowest rank summed
    over steps (what a synchronous step waits for) and the share of rank-steps spent waiting."""
    rows = []
    for name, steps in tokens.items():
        world = len(steps[0])
        slowest = sum(max(step) for step in steps)
        idle = sum(max(step) - t for step in steps for t in step) / (slowest * world)
        rows.append((name, len(steps), *(f"{sum(step[r] for step in steps):,}" for r in range(world)),
                     f"{slowest:,}", f"{idle:.0%}"))
    return Table(("sampler", "steps", *(f"rank {r} tokens" for r in range(len(steps[0]))),
                  "slowest rank, summed over steps", "ranks waiting"), rows)


# --- one launch for several sections' checks ----------------------------------------------------------------

SECTION_CHECKS = ("collectives", "ddp", "tensor_parallel", "zero", "moe", "pipeline")


def sections_job(rank, world_size, sections=SECTION_CHECKS):
    """{section: that section's check on this rank}, the checks of L2_03's sections 1 to 6 run one after the
    other in one process group, so that the ranks' start-up (a spawned Python importing torch, about 3 s on
    2 cores) is paid once instead of once per section. Each check seeds itself and leaves the group as it
    found it, so each result is the one its own launch returns."""
    checks = {"collectives": collective_checks.collectives_check, "ddp": ddp_checks.ddp_check,
              "tensor_parallel": tp_checks.tp_check, "zero": zero_check, "moe": moe_checks.moe_check,
              "pipeline": pipeline.pipeline_job}
    unknown = [s for s in sections if s not in checks]
    if unknown:
        raise OrtlabError(f"no check for sections {unknown}; known: {list(checks)}")
    found = {}
    for section in sections:
        found[section] = checks[section](rank, world_size)
        dist.barrier()
    return found


def section(results, name):
    """The per-rank results of one section out of a sections_job launch, in rank order."""
    return [rank_results[name] for rank_results in results]

"""Small rank functions to run with ortlab.distributed.launch (the tests' and notebooks' workers).

They live in a module, not in a notebook cell, because each rank is a spawned process that imports
its function by module and name.
"""
import ipaddress
import os
import sys
import time

import torch
import torch.distributed as dist

from ortlab.distributed import collectives, data_parallel, moe
from ortlab.distributed.checks import collectives as collective_checks
from ortlab.distributed.checks import data_parallel as ddp_checks
from ortlab.distributed.zero import zero
from ortlab.errors import OrtlabError

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

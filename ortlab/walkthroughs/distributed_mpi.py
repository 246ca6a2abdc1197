"""L2_03, MPI: the all-reduce of torch.distributed, run again with mpirun (Open MPI) and mpi4py.

`mpirun -n N python -m ortlab.walkthroughs.distributed_mpi` starts N ranks; mpirun gives each its rank
(OMPI_COMM_WORLD_RANK, as torchrun sets RANK) and MPI_COMM_WORLD is the process group. Each rank
all-reduces (SUM) the vector arange(4) * (rank + 1) with MPI_Allreduce and prints one JSON line;
`torch_all_reduce` is the same collective for ortlab.distributed.launch.

Loopback only. `--mca btl_tcp_if_include lo` and `--mca oob_tcp_if_include lo` (Open MPI's MCA
parameters; `ompi_info --param oob tcp --level 9` lists them) choose the interfaces the ranks' TCP
transport and mpirun's out-of-band channel use, but Open MPI 4.1 still binds those listeners to the
wildcard address (0.0.0.0 and ::), measured on this machine. So the job runs in a network namespace of
its own (`unshare --net`, or `--user --map-root-user --net` for a user who is not root) whose only
interface is `lo`: whatever a listener binds to, only this namespace's loopback reaches it. Rank 0
reads the listening sockets of every rank and of mpirun from /proc, and the interfaces it sees.
"""
import json
import os
import shutil
import socket
import subprocess
import sys

import numpy as np

from ortlab.errors import OrtlabError

MPI_PACKAGE = "mpi4py==4.1.2"
LOOPBACK_FLAGS = ("--mca", "btl_tcp_if_include", "lo", "--mca", "oob_tcp_if_include", "lo")
RANK_VARIABLES = ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK")


class MpiError(OrtlabError):
    """mpirun or mpi4py is missing, or an MPI job failed."""


def rank_vector(rank):
    """What rank `rank` contributes: [0, 1, 2, 3] * (rank + 1), as float64."""
    return [float(i * (rank + 1)) for i in range(4)]


def expected_sum(world_size):
    """The all-reduce's answer, by arithmetic: sum over ranks of arange(4) * (rank + 1)."""
    return [float(i * world_size * (world_size + 1) // 2) for i in range(4)]


def _is_root():
    return hasattr(os, "geteuid") and os.geteuid() == 0


def namespace_prefix():
    """The command that runs the job in a network namespace whose only interface is lo, brought up first:
    `unshare --net` as root, `unshare --user --map-root-user --net` otherwise (the user namespace grants
    the right to make a network namespace). Raises MpiError where unshare or ip is missing or refused."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if unshare is None or ip is None:
        raise MpiError("unshare (util-linux) and ip (iproute2) are needed to give the MPI job a network of its "
                       "own, loopback only; install them, or run without isolation on a machine whose "
                       "network you control (mpi_all_reduce(isolated=False))")
    user = () if _is_root() else ("--user", "--map-root-user")
    prefix = [unshare, *user, "--net", "sh", "-c", f'{ip} link set lo up && exec "$@"', "sh"]
    tried = subprocess.run(prefix + ["true"], capture_output=True, text=True)
    if tried.returncode != 0:
        raise MpiError(f"this machine refuses a private network namespace ({tried.stderr.strip()}): "
                       f"run with isolated=False only where every interface is yours")
    return prefix


def mpirun_command(world_size, python=sys.executable, isolated=True):
    """The mpirun command line: N ranks of this module, oversubscribed cores allowed, TCP on lo, inside a
    loopback-only network namespace when `isolated` (and --allow-run-as-root where the job runs as root,
    which Open MPI otherwise refuses: this process is root, or the namespace maps the user to root)."""
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise MpiError("mpirun is not installed: on Debian or Ubuntu, `apt-get install openmpi-bin` "
                       "(Open MPI; .ci/run installs it)")
    prefix = namespace_prefix() if isolated else []
    root = ("--allow-run-as-root",) if _is_root() or isolated else ()
    return [*prefix, mpirun, "-n", str(world_size), "--oversubscribe", *root, *LOOPBACK_FLAGS,
            python, "-m", __name__]


def command_text(world_size):
    """The mpirun part of the command, programs by name: the same wherever the programs are installed."""
    command = mpirun_command(world_size, python="python", isolated=False)
    command[0] = "mpirun"
    if "--allow-run-as-root" not in command:  # the isolated job always runs as root inside its namespace
        command.insert(4, "--allow-run-as-root")
    return " ".join(command)


def _check_world_size(world_size):
    if isinstance(world_size, bool) or not isinstance(world_size, int) or not 1 <= world_size <= 8:
        raise MpiError(f"world_size must be an int from 1 to 8 (each rank is a Python process on this "
                       f"machine), got {world_size!r}")


def mpi_all_reduce(world_size=2, timeout=120, isolated=True):
    """Run the MPI all-reduce on `world_size` local ranks; each rank's report, in rank order.

    A report: rank, size, the vector after MPI_Allreduce, the MPI library's name, the OMPI_COMM_WORLD_*
    variables mpirun set, the network interfaces the rank sees, and (rank 0) the listening TCP sockets
    of the ranks and of mpirun. isolated=True runs the job in a loopback-only network namespace."""
    _check_world_size(world_size)
    try:
        import mpi4py  # noqa: F401  (only checked here; the ranks import it) (optional: mpi4py)
    except ImportError:
        raise MpiError(f"mpi4py is not installed: pip install {MPI_PACKAGE}") from None
    command = mpirun_command(world_size, isolated=isolated)
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
    except subprocess.TimeoutExpired:
        raise MpiError(f"the MPI job ran past {timeout} s and was stopped: {' '.join(command)}") from None
    lines = [line for line in done.stdout.splitlines() if line.startswith("[{")]
    reports = json.loads(lines[-1]) if lines else []
    if done.returncode != 0 or len(reports) != world_size:
        tail = "\n".join((done.stderr or done.stdout).strip().splitlines()[-10:])
        raise MpiError(f"mpirun exited with code {done.returncode} and {len(reports)} of {world_size} "
                       f"ranks reported; the end of its output:\n{tail}")
    return sorted(reports, key=lambda r: r["rank"])


def torch_all_reduce(rank, world_size):
    """The same collective in torch.distributed (a rank function for ortlab.distributed.launch)."""
    import torch  # heavy: torch
    import torch.distributed as dist  # heavy: torch

    value = torch.tensor(rank_vector(rank), dtype=torch.float64)
    dist.all_reduce(value)
    return {"rank": rank, "size": world_size, "sum": value.tolist(), "backend": dist.get_backend()}


def _rank_main():
    """One MPI rank: all-reduce, look at the sockets (rank 0); rank 0 prints every rank's report as one JSON line."""
    from mpi4py import MPI  # optional: mpi4py

    from ortlab.walkthroughs.distributed_training import listening_sockets  # heavy: imports torch

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    mine = np.array(rank_vector(rank))
    total = np.empty_like(mine)
    comm.Allreduce(mine, total, op=MPI.SUM)
    pids = comm.allgather(os.getpid())
    comm.Barrier()  # every rank is up, with its sockets open
    listeners = listening_sockets(pids + [os.getppid()]) if rank == 0 else []
    comm.Barrier()  # nobody leaves before rank 0 has looked
    report = {"rank": rank, "size": size, "sum": total.tolist(),
              "library": MPI.Get_library_version().split(",")[0].strip(),
              "env": {key: os.environ.get(key) for key in RANK_VARIABLES}, "listeners": listeners,
              "interfaces": sorted(name for _, name in socket.if_nameindex())}
    reports = comm.gather(report, root=0)  # one line from rank 0: mpirun may interleave the ranks' lines
    if rank == 0:
        print(json.dumps(reports), flush=True)


if __name__ == "__main__":
    _rank_main()

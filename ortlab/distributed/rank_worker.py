"""One rank's process, as launch() spawns it: capture its output, join the process group, run fn, report.

Mirrors what torch/multiprocessing/spawn.py's _wrap does in each spawned process and the environment
torchrun (torch/distributed/run.py) gives a worker: RANK / WORLD_SIZE / LOCAL_RANK, one thread, loopback
sockets. The rank talks to the caller through files in the launch's directory (RankFiles): its phase, its
result or its error, and its Python stack when the caller asks for it (SIGUSR1 -> faulthandler).
"""
import faulthandler
import multiprocessing
import os
import pickle
import re
import signal
import socket
import sys
import time
import traceback
from datetime import timedelta

from ortlab.distributed.launch_report import LaunchError

WATCHDOG_GRACE_S = 30.0
_THIS_FILE = os.path.abspath(__file__)
_PHASES = ("starting", "fn", "returned")


class RankFiles:
    """The files one rank writes in the launch's directory."""

    def __init__(self, workdir, rank):
        base = os.path.join(workdir, f"rank{rank}")
        self.stdout = base + ".stdout"
        self.stderr = base + ".stderr"
        self.stack = base + ".stack"
        self.phase = base + ".phase"
        self.result = base + ".result"
        self.error = base + ".error"


def write_atomic(path, data):
    """Write a file whole or not at all (a temporary file, then os.replace): the caller never reads half of it."""
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.replace(path + ".tmp", path)


def _redirect_output(files):
    for fd, path in ((1, files.stdout), (2, files.stderr)):
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = open(1, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)
    sys.stderr = open(2, "w", buffering=1, encoding="utf-8", errors="backslashreplace", closefd=False)


def loopback_interface():
    """Name of the loopback network interface ('lo' on Linux), or None where there is none."""
    names = {name for _, name in socket.if_nameindex()}
    return next((name for name in ("lo", "lo0") if name in names), None)


def rank_environment(rank, world_size, threads):
    """The variables a rank runs with: torchrun's RANK/WORLD_SIZE/LOCAL_*, thread counts, loopback."""
    env = {"RANK": rank, "WORLD_SIZE": world_size, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": world_size,
           "OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads}
    interface = loopback_interface()
    if interface:
        env.update(GLOO_SOCKET_IFNAME=interface, NCCL_SOCKET_IFNAME=interface)
    return {key: str(value) for key, value in env.items()}


def _trimmed_traceback(exc):
    """The exception's traceback without the launcher's own frames."""
    summary = traceback.TracebackException.from_exception(exc)
    summary.stack = traceback.StackSummary.from_list(
        [frame for frame in summary.stack if os.path.abspath(frame.filename) != _THIS_FILE])
    return "".join(summary.format())


def _init_group(backend, rank, world_size, workdir, timeout):
    import torch  # heavy: torch
    import torch.distributed as dist  # heavy: torch

    if backend == "nccl":
        torch.cuda.set_device(rank)
    # A collective must not time out before the launcher does, or the rank waiting for a hung peer
    # would be reported instead of the hung one.
    dist.init_process_group(backend, init_method="file://" + os.path.join(workdir, "rendezvous"),
                            rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout + 60))


def _teardown():
    import torch.distributed as dist  # heavy: torch

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def _run_rank(rank, world_size, workdir, backend, threads, timeout, files, phase):
    import torch  # heavy: torch

    torch.set_num_threads(threads)
    try:
        torch.set_num_interop_threads(threads)
    except RuntimeError:  # already set: the caller's script imported torch and ran inter-op work
        pass
    with open(os.path.join(workdir, "job.pkl"), "rb") as f:
        fn, args = pickle.load(f)
    _init_group(backend, rank, world_size, workdir, timeout)
    phase(1)
    value = fn(rank, world_size, *args)
    phase(2)
    try:
        blob = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise LaunchError(f"the value fn returned ({type(value).__name__}) cannot be pickled back to the "
                          f"caller: {exc}; return plain data, arrays or tensors") from exc
    write_atomic(files.result, blob)
    _teardown()


def run_worker(rank, world_size, workdir, backend, threads, timeout):
    """The body of one rank's process: capture output, join the group, run fn, report."""
    files = RankFiles(workdir, rank)
    _redirect_output(files)
    os.environ.update(rank_environment(rank, world_size, threads))
    stack_file = open(files.stack, "w")
    faulthandler.register(signal.SIGUSR1, file=stack_file, all_threads=True)
    # Backstop if the caller is gone: the rank dumps its stack and exits on its own.
    faulthandler.dump_traceback_later(timeout + WATCHDOG_GRACE_S, exit=True, file=stack_file)
    current = [0]

    def phase(index):
        current[0] = index
        write_atomic(files.phase, _PHASES[index].encode())

    phase(0)
    try:
        _run_rank(rank, world_size, workdir, backend, threads, timeout, files, phase)
    except BaseException as exc:  # noqa: B902 - every failure, KeyboardInterrupt included, is reported
        record = {"rank": rank, "time": time.monotonic(), "phase": _PHASES[current[0]],
                  "type": type(exc).__name__, "message": str(exc), "traceback": _trimmed_traceback(exc)}
        write_atomic(files.error, pickle.dumps(record))
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    faulthandler.cancel_dump_traceback_later()
    sys.stdout.flush()
    sys.stderr.flush()




def trimmed_stack(text):
    """A faulthandler dump without the frames of multiprocessing's bootstrap and the launcher."""
    skip = (_THIS_FILE, os.path.dirname(os.path.abspath(multiprocessing.__file__)) + os.sep, "<string>")
    lines = [re.sub(r"0x[0-9a-f]+ ", "", line) for line in text.splitlines()
             if not any(f'File "{path}' in line for path in skip)]
    return "\n".join("    " + line for line in lines)

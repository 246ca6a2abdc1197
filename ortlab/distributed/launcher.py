"""Run a function on N local processes that form a torch.distributed process group: ortlab's launcher.

Mirrors what torchrun (torch/distributed/run.py and its elastic agent) and torch.multiprocessing.spawn
(torch/multiprocessing/spawn.py: start_processes, ProcessContext.join) do on one machine: one process
per rank started with the spawn start method, RANK / WORLD_SIZE / LOCAL_RANK set as torchrun sets them,
one thread per rank as torchrun sets OMP_NUM_THREADS=1, the ranks watched and all of them stopped as soon
as one fails. What differs, on purpose, for notebooks, tests and labs:

- the rendezvous is a FileStore in a temporary directory, so there is no TCP store at all: torchrun and
  the env:// and tcp:// init methods bind their TCPStore to every interface ([::]) whatever MASTER_ADDR
  says. Gloo's own pair sockets follow GLOO_SOCKET_IFNAME=lo (NCCL's bootstrap NCCL_SOCKET_IFNAME=lo),
  so every socket a launch listens on is bound to 127.0.0.1;
- each rank's stdout and stderr go to files and come back with the results, so a notebook prints them
  rank by rank instead of interleaved (or lost: a spawned process does not write into a notebook cell);
- a time limit: a rank still inside `fn` at the deadline has its Python stack dumped (faulthandler,
  on SIGUSR1) before all ranks are killed, and the error names it and shows that stack;
- a rank that raises gives one LaunchError naming the rank and its exception, with the traceback
  trimmed to the frames of `fn`; the ranks that fail afterwards (a peer's connection closed) are
  listed as consequences, not as causes, grouped by error (and a timeout groups ranks by stack);
- at most MAX_RANKS_PER_CORE ranks per core (and as many as the free memory holds): each rank is a whole
  process importing torch, so a bigger launch is refused at once instead of timing out while starting.

`fn(rank, world_size, *args)` must be importable by the spawned processes: a function at the top level
of a module (a notebook cell is not one: put the function in a .py file and import it).

This module is the caller's side (check, start, watch, stop); rank_worker.py is what each spawned rank
runs, launch_report.py what a launch gives back and how its errors sum up many ranks.
"""
import multiprocessing
import numbers
import os
import pickle
import shutil
import signal
import sys
import tempfile
import time
import warnings
from multiprocessing.connection import wait as wait_for_any

from ortlab import env
from ortlab.distributed.launch_report import (RANK_START_CPU_S, LaunchError, LaunchResult, LaunchWarning,
                                             group_by, ranks_text, timeout_summary)
from ortlab.distributed.rank_worker import RankFiles, run_worker, trimmed_stack, write_atomic

BACKENDS = ("gloo", "nccl")
# Each rank is a whole Python process that imports torch and joins the group: about 1.3 s of CPU and 215 MB
# of private memory (measured on a 2-core machine), and every collective waits for all ranks to be scheduled.
# Beyond a few ranks per core a launch only waits longer; every pattern here shows with 2 to 8 ranks.
MAX_RANKS_PER_CORE = 4
RANK_MEMORY_MB = 256
MAX_TIMEOUT_S = 7 * 24 * 3600.0  # a week; the wait below takes at most about 24 days (2**31 ms)
STOP_WAIT_S = 2.0
STACK_WAIT_S = 2.0


# ---------------------------------------------------------------------------------------------
# Checks on the caller's side, before any process starts.


def cores():
    """The number of cores this process may run on (its CPU affinity, as a container limits it)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def _positive_int(value, what):
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise LaunchError(f"{what} must be a positive int, got {value!r} ({type(value).__name__})")
    return int(value)


def _check_threads(threads_per_rank):
    """At most one thread per core in each rank: more only wait for each other (torchrun sets 1)."""
    if threads_per_rank > cores():
        raise LaunchError(f"threads_per_rank={threads_per_rank} is more than the {cores()} cores this process may "
                          f"run on: a rank's extra threads would only wait for a core; use 1 (torchrun's default) "
                          f"up to {cores()}")
    return threads_per_rank


def _check_timeout(timeout):
    """A finite number of seconds in (0, MAX_TIMEOUT_S]: the launcher waits that long, and the ranks' own
    watchdogs and process group timeouts are derived from it (an infinite wait cannot be scheduled)."""
    number = isinstance(timeout, numbers.Real) and not isinstance(timeout, bool)
    if not number or not 0 < timeout <= MAX_TIMEOUT_S:
        raise LaunchError(f"timeout must be a positive number of seconds, finite and at most {MAX_TIMEOUT_S:g} "
                          f"(a week), got {timeout!r}; for a long job give a large finite value, "
                          f"e.g. timeout=24 * 3600")
    return float(timeout)


def available_memory_mb():
    """MiB of memory the system can still give to new processes (MemAvailable), or None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def max_world_size():
    """The most ranks launch() starts on this machine, and why: (limit, reason). MAX_RANKS_PER_CORE per
    core, fewer where the free memory cannot hold RANK_MEMORY_MB per rank."""
    available, memory = cores(), available_memory_mb()
    limit, reason = MAX_RANKS_PER_CORE * available, f"{MAX_RANKS_PER_CORE} per core on {available} cores"
    if memory is not None and memory // RANK_MEMORY_MB < limit:
        limit, reason = max(1, memory // RANK_MEMORY_MB), f"{RANK_MEMORY_MB} MB each in {memory} MB of free memory"
    return limit, reason


def _check_world_size(world_size):
    """Refuse more ranks than max_world_size() before any process starts (they would only time out)."""
    limit, reason = max_world_size()
    if world_size > limit:
        start = world_size * RANK_START_CPU_S / cores()
        raise LaunchError(
            f"world_size={world_size} is more than this machine can run: at most {limit} ranks here ({reason}). "
            f"Each rank is a whole Python process that imports torch and joins the group (about "
            f"{RANK_START_CPU_S:g} s of CPU and 215 MB each), so {world_size} ranks would need about {start:.0f} s "
            f"only to start and {world_size * RANK_MEMORY_MB / 1024:.1f} GB. Use world_size <= {limit} (every "
            f"algorithm here shows its pattern with 2 to 8 ranks), or a machine with more cores and memory")
    return world_size


def _check_args(args):
    if not isinstance(args, (tuple, list)):
        raise LaunchError(f"args must be a tuple of extra arguments for fn(rank, world_size, *args), "
                          f"got {type(args).__name__}; write args=({args!r},) for one argument")
    return tuple(args)


def main_is_reimportable():
    """True when spawned processes can re-import `__main__` (a script file or `python -m`).

    Mirrors multiprocessing/spawn.py's get_preparation_data: the children import the parent's main
    module from its spec name or its file. A notebook kernel, `python -c` and the REPL have neither,
    so a function defined there cannot be found by the children.
    """
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None and getattr(spec, "name", None):
        return True
    path = getattr(main, "__file__", None)
    return bool(path) and os.path.isfile(path)


def _check_not_bootstrapping():
    """Refuse a launch from a rank that is still importing the caller's script (no __main__ guard).

    The same condition as multiprocessing/spawn.py's _check_not_importing_main, caught before the
    rank imports torch, with the fix in the message."""
    if getattr(multiprocessing.current_process(), "_inheriting", False):
        raise LaunchError("launch() was called while a spawned rank imported the caller's script again: "
                          "call launch under `if __name__ == \"__main__\":` in a script")


def _check_main_path():
    """Refuse a launch when spawned ranks would try to re-import a __main__ that is no file (a program read
    from stdin, `python -`): multiprocessing's spawn runs the main module's path again in every rank."""
    main = sys.modules.get("__main__")
    path, spec = getattr(main, "__file__", None), getattr(main, "__spec__", None)
    if path and not os.path.isfile(path) and not (spec is not None and getattr(spec, "name", None)):
        raise LaunchError(f"the main program is {path!r}, not a file: each rank, started with the spawn method, "
                          "would run it again and fail. Launch from a script file, a notebook or python -c")


def _check_importable(fn):
    if not callable(fn):
        raise LaunchError(f"fn must be a function fn(rank, world_size, *args), got {type(fn).__name__}")
    name = getattr(fn, "__qualname__", repr(fn))
    if getattr(fn, "__module__", None) == "__main__" and not main_is_reimportable():
        raise LaunchError(
            f"{name} is defined in __main__ (a notebook cell, python -c or the REPL): each rank is a new "
            f"process started with the spawn method, which finds fn by its module and name, and a new "
            f"process cannot import a notebook's cells. Put {name} in a module (a .py file next to the "
            f"notebook or in a package, e.g. ortlab/walkthroughs/distributed_training.py) and import it from there")
    try:
        pickle.dumps(fn)
    except Exception as exc:
        raise LaunchError(
            f"{name} cannot be sent to the ranks ({exc}): the ranks import fn by module and name, so it "
            f"must be defined at the top level of a module (not a lambda or a nested function)") from exc


def _pickle_job(fn, args):
    _check_importable(fn)
    try:
        return pickle.dumps((fn, args), protocol=pickle.HIGHEST_PROTOCOL)
    except Exception as exc:
        raise LaunchError(
            f"args cannot be pickled ({type(exc).__name__}: {exc}): each rank receives a copy of args "
            f"through pickle; pass plain data, arrays or tensors, and build other objects (open files, "
            f"locks, sessions, lambdas) inside fn") from exc


def choose_backend(backend, world_size):
    """The process group's backend: NCCL, one rank per GPU, when ortlab.env's device is CUDA and there
    are at least `world_size` GPUs; gloo on CPU otherwise. An explicit backend is checked."""
    if backend is None:
        # env.device() imports onnxruntime: ask it only where CUDA is possible or a device is asked for.
        if _gpu_count() == 0 and not os.environ.get(env.DEVICE_VARIABLE):
            return "gloo"
        if env.device() == "cuda" and _gpu_count() >= world_size:
            return "nccl"
        return "gloo"
    if backend not in BACKENDS:
        raise LaunchError(f"backend must be one of {', '.join(BACKENDS)} (or None to choose), "
                          f"got {backend!r}")
    if backend == "nccl" and _gpu_count() < world_size:
        raise LaunchError(f"backend='nccl' runs one rank per GPU: {world_size} ranks need {world_size} GPUs, "
                          f"torch sees {_gpu_count()}; use backend='gloo' (CPU) or fewer ranks")
    return backend


def _gpu_count():
    import torch  # heavy: torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def _warn_if_oversubscribed(world_size, threads_per_rank):
    available = cores()
    if world_size * threads_per_rank > available:
        warnings.warn(
            f"{world_size} ranks x {threads_per_rank} thread(s) on {available} cores: the ranks share the "
            f"cores, so the job runs and computes the same results, only slower (each rank waits for the "
            f"slowest at every collective)", LaunchWarning, stacklevel=3)


# ---------------------------------------------------------------------------------------------
# The caller's side: start, watch, stop, report.


def _read_text(path):
    try:
        with open(path, encoding="utf-8", errors="backslashreplace") as f:
            return f.read()
    except FileNotFoundError:
        return ""


def _read_pickle(path):
    try:
        with open(path, "rb") as f:
            return pickle.load(f)
    except FileNotFoundError:
        return None


def _watch(processes, deadline):
    """Wait until every rank exits, one fails or the deadline passes: (ranks that failed, ranks left)."""
    pending = set(range(len(processes)))
    while pending:
        left = deadline - time.monotonic()
        if left <= 0:
            return [], sorted(pending)
        ready = set(wait_for_any([processes[r].sentinel for r in pending], timeout=left))
        failed = []
        for rank in sorted(pending):
            if processes[rank].sentinel in ready:
                processes[rank].join()
                pending.discard(rank)
                if processes[rank].exitcode != 0:
                    failed.append(rank)
        if failed:
            return failed, sorted(pending)
    return [], []


def _stop(processes):
    """Terminate (then kill) every rank still running, and reap them all."""
    for process in processes:
        if process.is_alive():
            process.terminate()
    deadline = time.monotonic() + STOP_WAIT_S
    for process in processes:
        process.join(max(0.0, deadline - time.monotonic()))
        if process.is_alive():
            process.kill()
            process.join()


def _dump_stacks(processes, ranks, files):
    """Ask each rank in `ranks` for its Python stack (SIGUSR1 -> faulthandler) and wait for it.

    Only ranks that wrote their phase file have the handler: SIGUSR1 would kill one still starting up."""
    ranks = [r for r in ranks if os.path.exists(files[r].phase) and processes[r].is_alive()]
    for rank in ranks:
        os.kill(processes[rank].pid, signal.SIGUSR1)
    deadline = time.monotonic() + STACK_WAIT_S
    while ranks and time.monotonic() < deadline:
        if all(os.path.getsize(files[r].stack) > 0 for r in ranks if os.path.exists(files[r].stack)):
            time.sleep(0.1)  # let the dump finish: it is written frame by frame
            return
        time.sleep(0.05)


def _timeout_error(processes, pending, files, timeout, report):
    phases = {r: _read_text(files[r].phase) or "not started" for r in pending}
    _dump_stacks(processes, [r for r in pending if phases[r] != "returned"] or pending, files)
    _stop(processes)
    stacks = {r: trimmed_stack(_read_text(files[r].stack)) for r in pending}
    stacks = {r: text for r, text in stacks.items() if text.strip()}
    lines, hung = timeout_summary(len(processes), timeout, phases, stacks, cores())
    return LaunchError("\n".join(lines), rank=hung[0], kind="timeout", stacks=stacks, **report())


def _exit_description(exitcode):
    if exitcode is not None and exitcode < 0:
        return f"was killed by signal {signal.Signals(-exitcode).name}"
    return f"exited with code {exitcode}"


def _failure_error(processes, failed, files, report):
    _stop(processes)
    records = [r for r in (_read_pickle(f.error) for f in files) if r is not None]
    records.sort(key=lambda record: record["time"])
    world = len(processes)
    if not records:
        rank = failed[0]
        tail = "\n".join(_read_text(files[rank].stderr).splitlines()[-15:])
        message = (f"rank {rank} of {world} {_exit_description(processes[rank].exitcode)} without raising "
                   f"a Python exception (a crash, os._exit, or a failure before the rank could start)")
        if not os.path.exists(files[rank].phase):
            message += (". It never reached the launcher's code: its error is on the caller's stderr. When "
                        "launch is called from a script, call it under `if __name__ == \"__main__\":`, since "
                        "each spawned rank imports the script again")
        if tail:
            message += f"; the end of its stderr:\n{tail}"
        return LaunchError(message + "\nThe other ranks were stopped.", rank=rank, kind="died", **report())
    first = records[0]
    starting = first["phase"] == "starting"
    where = " while starting (importing fn, joining the process group)" if starting else ""
    remote = first["traceback"].rstrip().replace(
        "Traceback (most recent call last):",
        f"Traceback on rank {first['rank']} (most recent call last, the launcher's frames removed):", 1)
    lines = [f"rank {first['rank']} of {world} raised {first['type']}{where}: {first['message']}", remote]
    if starting and "__main__" in first["message"]:
        lines.append("The rank could not find something defined in __main__ (a notebook cell?) that fn or "
                     "args refer to: define it in a module and import it from there.")
    after = group_by(records[1:], lambda rec: (rec["type"], (rec["message"].splitlines() or [""])[0]))
    for (kind, first_line), group in after:
        lines.append(f"{ranks_text([rec['rank'] for rec in group])} then raised {kind}: {first_line}")
    lines.append("The other ranks were stopped.")
    return LaunchError("\n".join(lines), rank=first["rank"], kind="raised", **report())


def launch(fn, world_size=2, args=(), timeout=60, backend=None, threads_per_rank=1):
    """Run `fn(rank, world_size, *args)` on `world_size` local processes in one process group.

    Returns a LaunchResult: the list of each rank's return value in rank order, with `.outputs`
    (each rank's stdout) and `.stderr`. Raises LaunchError for bad input, when a rank raises (naming
    it and its exception), dies, or is still running after `timeout` seconds (with its stack).
    The process group (gloo on CPU, NCCL one rank per GPU) is created before fn runs and destroyed
    after it returns (barrier first); every rendezvous and gloo socket is bound to 127.0.0.1.
    """
    started = time.monotonic()
    _check_not_bootstrapping()
    _check_main_path()
    world_size = _positive_int(world_size, "world_size")
    threads_per_rank = _check_threads(_positive_int(threads_per_rank, "threads_per_rank"))
    timeout = _check_timeout(timeout)
    job = _pickle_job(fn, _check_args(args))
    backend = choose_backend(backend, world_size)
    _check_world_size(world_size)
    _warn_if_oversubscribed(world_size, threads_per_rank)
    workdir = tempfile.mkdtemp(prefix="ortlab-launch-")
    processes = []
    try:
        write_atomic(os.path.join(workdir, "job.pkl"), job)
        files = [RankFiles(workdir, rank) for rank in range(world_size)]
        context = multiprocessing.get_context("spawn")
        for rank in range(world_size):
            process = context.Process(target=run_worker, name=f"ortlab-rank-{rank}",
                                      args=(rank, world_size, workdir, backend, threads_per_rank, timeout))
            process.start()
            processes.append(process)
        pids = [process.pid for process in processes]

        def report():
            return {"outputs": [_read_text(f.stdout) for f in files],
                    "stderr": [_read_text(f.stderr) for f in files], "pids": pids}

        failed, pending = _watch(processes, started + timeout)
        if failed:
            raise _failure_error(processes, failed, files, report)
        if pending:
            raise _timeout_error(processes, pending, files, timeout, report)
        values = [_read_pickle(f.result) for f in files]
        return LaunchResult(values, seconds=time.monotonic() - started, backend=backend, **report())
    finally:
        _stop(processes)
        for process in processes:
            process.close()
        shutil.rmtree(workdir, ignore_errors=True)

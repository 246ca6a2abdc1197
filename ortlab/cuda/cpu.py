"""launch(kernel, grid, block, *args): a CUDA C++ kernel run on the CPU, one thread at a time, checked.

`cpu_kernel(source, name)` (cpu_build.py) compiles the kernel's source with g++ after `cpu_cuda.h`, a
header that maps CUDA's built-ins (threadIdx, blockIdx, blockDim, gridDim, __shared__,
__syncthreads, warp shuffles, atomics) onto coroutines of one CPU thread. Two rewrites make it checkable: each
pointer parameter becomes `ortlab_cpu::ptr<T>`, which knows its array's size, and
`extern __shared__ T name[]` becomes such a pointer to the launch's dynamic shared memory;
fixed-size arrays are checked by GCC's -fsanitize=bounds. One shared library per (source, name),
built once per process.

The schedule is deterministic: blocks one after another, and inside a block every thread runs, in
thread order (or reversed: schedule="reverse", which also runs the blocks last to first), until its
next __syncthreads() or its end. So a result never depends on the run, and a race between two
barriers, or between two blocks, shows as a difference between the two schedules
(`schedule_differences`). An index outside an array (also through a pointer derived from a
parameter: `o + 64`, `&o[0]`, a __device__ function's `float*`), or a thread that returns while
others wait at a barrier, stops the launch with an OrtlabError naming the thread and block (and the
source line, cpu_checks.h). Warp operations (__shfl_*_sync, __syncwarp, __ballot_sync) are barriers
of the thread's warp, full-warp masks only (cpu_cuda.h, warp_op). `__launch_bounds__(n)` is
enforced as a GPU enforces it; a write through const_cast lands, as on a GPU. A launch runs in a
worker process, killed after `timeout` seconds, so a kernel that never returns ends in an OrtlabError.

Warps. Running a thread to its next barrier is a schedule a GPU may follow for threads of
different warps, but not one it follows for the lanes of one warp: code that relies on a warp's
lanes moving together (the volatile last-warp reduction of NVIDIA's reduction sample before CUDA 9)
would get a sum here that no GPU gives. Two modes, chosen per launch with `warps=`:
  "independent" (the default): threads as GPUs since Volta (sm_70) may schedule them, each on its
     own; a lane that reads shared memory another lane of its warp wrote, or writes what it read,
     with no __syncwarp() or __syncthreads() between, through a volatile access, stops the launch
     with the hazard compute-sanitizer's racecheck reports (the lanes, the lines, the missing
     __syncwarp()). Such races through plain accesses are left to schedule_differences, as races
     between warps are.
  "lockstep": the lanes of a warp advance one memory access at a time together, as on GPUs before
     Volta, so warp-synchronous code gives the sum it was written for.
"independent" is the default because it is what every GPU the labs target (sm_70 and later) is
allowed to do, what the CUDA programming guide has required since CUDA 9, and what racecheck
checks: a learner who copies warp-synchronous code from an old tutorial learns that it needs
__syncwarp() (or shuffles), instead of seeing it pass here and fail on a future GPU or compiler.
"lockstep" shows what that code computed on the GPUs it was written for.
Lost updates. A read-modify-write of one element by threads that nothing orders (`counter[0] += 1`
in two blocks, or in every lane of a warp) gives the same count in any order one thread after
another, but loses updates when the threads run at once; schedule_differences names its array
too: its forward run notes each thread that writes back what it read from such a write
(cpu_checks.h, note_lost_update).
This is a teaching tool for correctness, not a timing model: memory fences and the GPU's real
interleavings are not modelled; races through plain accesses inside a warp are left to
schedule_differences (launch reports those through volatile accesses).
"""
import ctypes
import faulthandler
import os
import pickle
import select
import signal
import socket
import threading

import numpy as np

from ortlab.cuda import cpu_messages
from ortlab.cuda.cpu_build import (  # noqa: F401  (the module's API, as before the split)
    BUILD, CHECKS, DTYPES, HEADER, STACK_KIB, CpuKernel, Param, cpu_kernel, cpu_kernels, launch_bounds, parse_params)
from ortlab.errors import OrtlabError

_LOCK = threading.Lock()


def _dims(value, what, limit):
    dims = ((value,) if isinstance(value, (int, np.integer))
            else tuple(value) if isinstance(value, (tuple, list)) else None)
    if (dims is None or not 1 <= len(dims) <= 3
            or any(isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 1 for d in dims)):
        raise OrtlabError(f"{what} must be a positive int or a tuple of 1 to 3 positive ints, got {value!r}")
    dims = tuple(int(d) for d in dims) + (1,) * (3 - len(dims))
    if any(d > m for d, m in zip(dims, limit)):
        raise OrtlabError(f"{what} {dims} exceeds CUDA's limits {limit}")
    return dims


def _argument(param, value):
    if param.pointer:
        if not isinstance(value, np.ndarray):
            raise OrtlabError(f"parameter {param.name} ({param.type}*) takes a numpy array, "
                              f"got {type(value).__name__}")
        if value.dtype != param.dtype:
            raise OrtlabError(f"parameter {param.name} ({param.type}*) takes {np.dtype(param.dtype).name}, "
                              f"got {value.dtype.name}: pass array.astype(np.{np.dtype(param.dtype).name})")
        if not value.flags.c_contiguous:
            raise OrtlabError(f"parameter {param.name}: the array must be C-contiguous "
                              "(np.ascontiguousarray(a))")
        if not param.const and not value.flags.writeable:
            raise OrtlabError(f"parameter {param.name} ({param.type}*) is written by the kernel "
                              "but the array is read-only")
        return value, value.size
    if isinstance(value, np.ndarray) or not isinstance(value, (int, float, bool, np.generic)):
        raise OrtlabError(f"parameter {param.name} ({param.type}) takes a number, got {type(value).__name__}")
    try:
        with np.errstate(over="ignore", invalid="ignore"):
            scalar = np.array(value).astype(param.dtype)
    except (OverflowError, ValueError, TypeError):
        scalar = None
    rounded_float = np.issubdtype(param.dtype, np.floating) and np.isfinite(scalar) == np.isfinite(value)
    if scalar is None or (scalar.item() != value and not rounded_float):
        raise OrtlabError(f"parameter {param.name} ({param.type}) cannot hold {value!r}")
    return np.ascontiguousarray(scalar.reshape(1)), 1


WARPS = ("independent", "lockstep")


def launch(kernel, grid, block, *args, shared_bytes=0, schedule="forward", warps="independent", timeout=10.0):
    """Run `kernel` (a CpuKernel) on grid x block threads with `args` (numpy arrays for pointer
    parameters, written in place; numbers for the others) and `shared_bytes` of dynamic shared
    memory, threads in `schedule` order ("forward" or "reverse", which runs the blocks last to first
    too) between barriers. `warps="independent"` runs each thread of a warp on its own, as GPUs since
    Volta may, and stops on a race between two lanes of a warp through volatile shared memory;
    `warps="lockstep"` runs a warp's lanes one memory access at a time together, as GPUs before Volta
    did (see the module's docstring).

    The launch runs in a worker process (forked once, reused) on copies of the arrays, and the worker
    is killed after `timeout` seconds: compiled code that never returns (`while (true) {}`) cannot
    be interrupted inside this process, since a thread cannot be killed, so only a process can be.
    A kernel that crashes the worker (e.g. a thread's locals overflowing its stack) ends in an
    OrtlabError too; the next launch forks a new worker. Arrays are written back only when the
    launch succeeded (a const parameter's array only if the kernel wrote it, through const_cast).
    `timeout=None` runs in this process, without the worker's protection against a kernel that
    never returns or crashes."""
    _launch(kernel, grid, block, args, shared_bytes, schedule, warps, timeout)


def _launch(kernel, grid, block, args, shared_bytes, schedule, warps, timeout, lost_updates=False):
    """launch's work; the indices of the arguments where a thread wrote back what it had read from an
    unordered write (a lost update, looked for only with `lost_updates`)."""
    if not isinstance(kernel, CpuKernel):
        raise OrtlabError(f"launch takes a CpuKernel from cpu_kernel(source, name), not {type(kernel).__name__}")
    if schedule not in ("forward", "reverse"):
        raise OrtlabError(f"schedule must be 'forward' or 'reverse', got {schedule!r}")
    if warps not in WARPS:
        raise OrtlabError(f"warps must be 'independent' (GPUs since Volta) or 'lockstep' (before Volta), "
                          f"got {warps!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < 1e6):
        raise OrtlabError(f"timeout must be a number of seconds above 0 (below 1e6), or None, got {timeout!r}")
    grid = _dims(grid, "grid", (2**31 - 1, 65535, 65535))
    block = _dims(block, "block", (1024, 1024, 64))
    threads = block[0] * block[1] * block[2]
    if threads > 1024:
        raise OrtlabError(f"block {block} has {threads} threads; CUDA allows at most 1024")
    if kernel.max_threads and threads > kernel.max_threads:
        raise OrtlabError(f"kernel {kernel.name} is declared __launch_bounds__({kernel.max_threads}): a launch of "
                          f"{threads} threads per block (block {block}) is refused by a GPU ('too many resources "
                          f"requested for launch'); launch at most {kernel.max_threads} threads per block, or "
                          "raise the bound")
    if len(args) != len(kernel.params):
        raise OrtlabError(f"{kernel!r} takes {len(kernel.params)} arguments, got {len(args)}")
    if not isinstance(shared_bytes, int) or isinstance(shared_bytes, bool) or not 0 <= shared_bytes <= 227 * 1024:
        raise OrtlabError(f"shared_bytes (dynamic shared memory) must be a number of bytes from 0 to 232448 "
                          f"(227 KiB, the most any architecture gives one block), got {shared_bytes!r}")
    held = [_argument(p, a) for p, a in zip(kernel.params, args)]
    shape = (*grid, *block, int(schedule == "reverse") | 2 * bool(lost_updates), WARPS.index(warps), shared_bytes)
    with _LOCK:
        if timeout is None:
            failed, message, written = _call(kernel, held, shape)
        else:
            failed, message, written = _in_worker(kernel, held, shape, float(timeout))
    if failed:
        raise OrtlabError(f"kernel {kernel.name} stopped: {cpu_messages.explain(message, kernel.library._name)}")
    return [k for k, flags in enumerate(written) if flags & 2]


def _call(kernel, held, shape, writable=None):
    """(failed, message, written flags) of one launch-entry call on the arrays of `held` (pairs of
    array and element count), written in place on success; `writable`: whether the caller's arrays
    may be written (these arrays' own flags by default)."""
    arrays = [a for a, _ in held]
    n = max(1, len(arrays))
    pointers = (ctypes.c_void_p * n)(*(a.ctypes.data for a in arrays))
    counts = (ctypes.c_longlong * n)(*(size for _, size in held))
    writable = (ctypes.c_int * n)(*(int(a.flags.writeable) for a in arrays) if writable is None else writable)
    written = (ctypes.c_int * n)()
    error = ctypes.create_string_buffer(2048)
    dims = (*map(ctypes.c_uint, shape[:6]), ctypes.c_int(shape[6]), ctypes.c_int(shape[7]),
            ctypes.c_ulonglong(shape[8]))
    failed = getattr(kernel.library, kernel.entry)(pointers, counts, writable, written, *dims, error,
                                                   ctypes.c_int(len(error)))
    return failed, error.value.decode(errors="replace"), list(written)[:len(arrays)]


_LIBC = ctypes.CDLL(None)


class _Worker:
    """A child process, forked once, that runs launches sent to it over a socket: each request is
    (library path, entry, arrays, sizes, writable flags, shape), each answer (failed, message, arrays,
    written flags). One fork
    per worker instead of one per launch (a fork of a process that holds torch and ORT costs tens
    of milliseconds); a worker that overruns a timeout is killed and the next launch forks anew."""

    def __init__(self):
        mine, theirs = socket.socketpair()
        self.pid = os.fork()
        if self.pid == 0:  # the worker: serve until the parent closes its end, never return
            try:
                mine.close()
                _LIBC.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: never outlive the thread that forked it
                faulthandler.disable()  # a crash is reported by the parent, not as a Python dump
                _serve(theirs)
            finally:
                os._exit(0)
        theirs.close()
        self.socket, self.owner = mine, os.getpid()
        self.reader = mine.makefile("rb")

    def alive(self):
        """Whether the worker is still running (it dies with the thread that forked it)."""
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return done == 0

    def run(self, kernel, held, shape, timeout):
        """(failed, message, arrays after the launch, written flags), or an OrtlabError on a timeout or a
        crash."""
        request = (kernel.library._name, kernel.entry, [a for a, _ in held], [n for _, n in held],
                   [int(a.flags.writeable) for a, _ in held], list(shape))
        try:
            self.socket.sendall(_frame(pickle.dumps(request, protocol=pickle.HIGHEST_PROTOCOL)))
            ready, _, _ = select.select([self.socket], [], [], timeout)
            if not ready:
                self.stop()
                raise OrtlabError(f"kernel {kernel.name} did not finish within {timeout:g} s and was stopped "
                                  "(a loop that never ends, a barrier inside one, or a launch too large for "
                                  "the CPU runner: pass a larger timeout=); the arrays are unchanged")
            return pickle.loads(_read_frame(self.reader))
        except OrtlabError:
            raise
        except (EOFError, OSError, pickle.UnpicklingError):
            raise OrtlabError(f"kernel {kernel.name} {self.stop()}") from None
        except BaseException:  # e.g. KeyboardInterrupt while the kernel runs: never leave it running
            self.stop()
            raise

    def stop(self):
        """Kill and reap the worker; what ended it, for a message."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        _, code = os.waitpid(self.pid, 0)
        self.reader.close()
        self.socket.close()
        if os.WIFSIGNALED(code) and os.WTERMSIG(code) != signal.SIGKILL:
            name = signal.Signals(os.WTERMSIG(code)).name
            return (f"crashed the CPU runner's worker process ({name}): e.g. a thread's local arrays "
                    f"overflowing its {STACK_KIB} KiB stack, or an index through an unchecked T* in a device "
                    "function; the arrays are unchanged")
        return "ended the CPU runner's worker process without an answer; the arrays are unchanged"


def _frame(payload):
    return len(payload).to_bytes(8, "little") + payload


def _read_frame(reader):
    head = reader.read(8)
    if len(head) < 8:
        raise EOFError
    payload = reader.read(int.from_bytes(head, "little"))
    if len(payload) < int.from_bytes(head, "little"):
        raise EOFError
    return payload


def _serve(connection):
    """The worker's loop: run each request's launch on its own copies of the arrays and answer."""
    reader, libraries = connection.makefile("rb"), {}
    while True:
        try:
            path, entry, arrays, sizes, writable, shape = pickle.loads(_read_frame(reader))
        except EOFError:
            return
        if path not in libraries:
            libraries[path] = ctypes.CDLL(path)
        kernel = CpuKernel(entry, (), libraries[path], entry)
        arrays = [np.require(a, requirements=["C", "W"]) for a in arrays]
        failed, message, written = _call(kernel, list(zip(arrays, sizes)), shape, writable)
        _LIBC.fflush(None)  # a kernel's printf reaches the output before the answer does
        answer = (failed, message, [] if failed else arrays, written)
        connection.sendall(_frame(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)))


_WORKER = None


def _in_worker(kernel, held, shape, timeout):
    """_call run by the worker process on copies of the arrays, stopped after `timeout` seconds.
    Written arrays are copied back on success."""
    global _WORKER
    if _WORKER is not None and _WORKER.owner == os.getpid() and not _WORKER.alive():
        _WORKER.reader.close()
        _WORKER.socket.close()
        _WORKER = None
    if _WORKER is None or _WORKER.owner != os.getpid():  # none yet, or this is a fork of its owner
        _WORKER = _Worker()
    worker = _WORKER
    try:
        failed, message, arrays, written = worker.run(kernel, held, shape, timeout)
    except BaseException:  # the worker was stopped: the next launch forks a new one
        _WORKER = None
        raise
    if not failed:
        for (array, _), param, result, wrote in zip(held, kernel.params, arrays, written):
            if param.pointer and (not param.const or wrote & 1):
                array.reshape(-1)[...] = result.reshape(-1)
    return failed, message, written


def stop_worker():
    """Stop this process's worker, if it has one (the next timed launch starts a new one). A worker lives as
    long as the process that started it; a test suite that counts its child processes stops it first."""
    global _WORKER
    if _WORKER is not None and _WORKER.owner == os.getpid():
        _WORKER.stop()
    _WORKER = None


def schedule_differences(kernel, grid, block, *args, shared_bytes=0, warps="independent", timeout=10.0):
    """Names of the array arguments a race changes (the arguments themselves are not changed):
    those whose results differ between the forward and the reverse schedule (each run on copies), a
    race between two barriers or between two blocks (the reverse schedule runs the blocks last to
    first), and those where a thread wrote back what it had read from another thread's write with
    nothing ordering the two (another block's; another warp's since the last __syncthreads(); another
    lane's since the warp last met): a read-modify-write such as `counter[0] += 1` whose updates
    threads running at once can lose, though one thread after another counts right in any order."""
    runs, lost = [], set()
    for schedule in ("forward", "reverse"):
        copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        lost.update(_launch(kernel, grid, block, copies, shared_bytes, schedule, warps, timeout,
                            lost_updates=schedule == "forward"))
        runs.append(copies)
    return [p.name for k, (p, a, b) in enumerate(zip(kernel.params, *runs))
            if p.pointer and (k in lost or not np.array_equal(a, b, equal_nan=True))]

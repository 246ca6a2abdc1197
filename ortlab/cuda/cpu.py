"""launch(kernel, grid, block, *args): a CUDA C++ kernel run on the CPU, one thread at a time, checked.

`cpu_kernel(source, name)` compiles the kernel's unchanged source with g++ after `cpu_cuda.h`, a
header that maps CUDA's built-ins (threadIdx, blockIdx, blockDim, gridDim, __shared__,
__syncthreads, warp shuffles, atomics) onto coroutines of one CPU thread. Two rewrites make it checkable: each
pointer parameter becomes `ortlab_cpu::ptr<T>`, which knows its array's size, and
`extern __shared__ T name[]` becomes such a pointer to the launch's dynamic shared memory;
fixed-size arrays are checked by GCC's -fsanitize=bounds. One shared library per (source, name),
built once per process.

The schedule is deterministic: blocks one after another, and inside a block every thread runs, in
thread order (or reversed: schedule="reverse"), until its next __syncthreads() or its end. So a
result never depends on the run, and a race between two barriers shows as a difference between the
two schedules (`schedule_differences`). An index outside an array, or a thread that returns while
others wait at a barrier, stops the launch with an OrtlabError naming the thread and block.
Warp operations (__shfl_*_sync, __syncwarp, __ballot_sync) are barriers of the thread's warp,
full-warp masks only (cpu_cuda.h, warp_op). A launch runs in a worker process, killed after
`timeout` seconds, so a kernel that never returns ends in an OrtlabError.
This is a teaching tool for correctness, not a timing model: lock-step warps, memory fences and
the GPU's real interleavings are not modelled.
"""
import ctypes
import faulthandler
import hashlib
import os
import re
import pickle
import select
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ortlab.errors import OrtlabError

HEADER = Path(__file__).with_name("cpu_cuda.h")
STACK_KIB = 128  # kStackBytes in cpu_cuda.h
# CUDA C++ parameter types -> numpy dtypes (a pointer parameter takes an array of that dtype)
DTYPES = {
    "float": np.float32, "double": np.float64, "bool": np.bool_,
    "char": np.int8, "signed char": np.int8, "int8_t": np.int8, "unsigned char": np.uint8, "uint8_t": np.uint8,
    "short": np.int16, "int16_t": np.int16, "unsigned short": np.uint16, "uint16_t": np.uint16,
    "int": np.int32, "int32_t": np.int32, "unsigned": np.uint32, "unsigned int": np.uint32, "uint32_t": np.uint32,
    "long": np.int64, "long long": np.int64, "int64_t": np.int64,
    "unsigned long": np.uint64, "unsigned long long": np.uint64, "uint64_t": np.uint64, "size_t": np.uint64,
}
# -U_FORTIFY_SOURCE: the runner's _longjmp between thread stacks is by design, not a stack smash
BUILD = (["g++", "-std=c++17", "-O1", "-g", "-fPIC", "-fvisibility=hidden", "-fsanitize=bounds", "-U_FORTIFY_SOURCE",
          "-c", "kernel.cpp", "-o", "kernel.o"],
         # linked without -fsanitize: the bounds handlers are cpu_cuda.h's, not libubsan's
         ["g++", "-shared", "kernel.o", "-o", "kernel.so"])
_LOCK = threading.Lock()
_BUILT = {}
_DYNAMIC_SHARED = re.compile(r"extern\s+__shared__\s+(?:__align__\s*\(\s*\d+\s*\)\s+)?"
                             r"(?P<type>[A-Za-z_][\w ]*?)\s+(?P<name>\w+)\s*\[\s*\]\s*;")


@dataclass(frozen=True)
class Param:
    """One kernel parameter: `pointer` params take a numpy array of `dtype`, the others a scalar."""

    name: str
    type: str        # the element type as written, e.g. "const float"
    pointer: bool
    const: bool
    dtype: type


@dataclass(frozen=True, eq=False)
class CpuKernel:
    name: str
    params: tuple
    library: ctypes.CDLL
    entry: str = "ortlab_launch"  # the library's extern "C" function that launches this kernel

    def __repr__(self):
        params = ", ".join(f"{p.type}{'*' if p.pointer else ''} {p.name}" for p in self.params)
        return f"<CpuKernel {self.name}({params})>"


def _signature(source, name):
    """(start, end) of the parameter list's text of __global__ kernel `name` in `source`."""
    matches = list(re.finditer(r"__global__[^;{}]*?\b" + re.escape(name) + r"\s*\(", source))
    # the definition, not a declaration before it: its parameter list is followed by the body
    m = next((m for m in matches if re.match(r"\s*\{", source[_closing(source, m.end(), name) + 1:])), None)
    if not m:
        plain = re.sub(r"__launch_bounds__\s*\([^)]*\)", " ", source)
        found = re.findall(r"__global__[^;{}(]*?\b(\w+)\s*\(", plain)
        raise OrtlabError(f"no __global__ kernel named {name!r} in the source; its kernels are {found}")
    return m.end(), _closing(source, m.end(), name)


def _closing(source, start, name):
    """Index of the parenthesis that closes the one opened just before `start`."""
    depth = 1
    for k in range(start, len(source)):
        depth += {"(": 1, ")": -1}.get(source[k], 0)
        if depth == 0:
            return k
    raise OrtlabError(f"kernel {name!r}'s parameter list has no closing parenthesis")


def _param(text):
    words = text.replace("*", " * ").replace("__restrict__", " ").replace("__restrict", " ").split()
    if len(words) < 2 or not re.fullmatch(r"[A-Za-z_]\w*", words[-1]):
        raise OrtlabError(f"cannot read kernel parameter {text.strip()!r}: write it as TYPE NAME or TYPE* NAME")
    name, words = words[-1], words[:-1]
    stars = words.count("*")
    const = "const" in words[: words.index("*")] if stars else "const" in words
    base = " ".join(w for w in words if w not in ("*", "const"))
    if stars > 1 or base not in DTYPES or (stars and words[-1] != "*" and words[-1] != "const"):
        raise OrtlabError(f"kernel parameter {text.strip()!r}: the CPU runner takes scalars and one-level "
                          f"pointers of {sorted(DTYPES)}")
    return Param(name, ("const " if const else "") + base, bool(stars), const, DTYPES[base])


def parse_params(source, name):
    """The Params of kernel `name`, read from its signature in `source`."""
    start, end = _signature(source, name)
    text = source[start:end].strip()
    if text in ("", "void"):
        return ()
    return tuple(_param(p) for p in text.split(","))


def _rewrite(source, name, params):
    """The source with pointer parameters made checked pointers (line numbers unchanged)."""
    start, end = _signature(source, name)
    listed = ", ".join(f"ortlab_cpu::ptr<{p.type}> {p.name}" if p.pointer else f"{p.type} {p.name}"
                       for p in params)
    source = source[:start] + listed + "\n" * source[start:end].count("\n") + source[end:]
    return _DYNAMIC_SHARED.sub(lambda m: f"ortlab_cpu::ptr<{m['type']}> {m['name']} = "
                               f"ortlab_cpu::dynamic_shared<{m['type']}>(\"{m['name']}\");", source)


def _wrapper(name, params, entry="ortlab_launch"):
    args = []
    for k, p in enumerate(params):
        if p.pointer:
            args.append(f'ortlab_cpu::ptr<{p.type}>{{({p.type}*)ortlab_args[{k}], ortlab_sizes[{k}], "{p.name}"}}')
        else:
            args.append(f"*({p.type}*)ortlab_args[{k}]")
    # every name here starts with ortlab_, so that no kernel name or macro of the source collides
    return f"""
extern "C" __attribute__((visibility("default"))) int {entry}(
    void** ortlab_args, const long long* ortlab_sizes, unsigned ortlab_gx, unsigned ortlab_gy, unsigned ortlab_gz,
    unsigned ortlab_bx, unsigned ortlab_by, unsigned ortlab_bz, int ortlab_reverse, unsigned long long ortlab_shared,
    char* ortlab_error, int ortlab_error_size) {{
  return ortlab_cpu::run(dim3(ortlab_gx, ortlab_gy, ortlab_gz), dim3(ortlab_bx, ortlab_by, ortlab_bz), ortlab_reverse,
                         ortlab_shared, [=] {{ {name}({", ".join(args)}); }}, ortlab_error, ortlab_error_size);
}}
"""


def cpu_kernel(source, name, timeout=120.0):
    """The CpuKernel of __global__ kernel `name` in CUDA C++ `source`, compiled by g++ (cached)."""
    if not isinstance(source, str) or not isinstance(name, str):
        raise OrtlabError("cpu_kernel takes the CUDA C++ source and the kernel's name, both str")
    params = parse_params(source, name)
    header = HEADER.read_text()
    key = hashlib.sha256("\0".join((source, name, header, repr(BUILD))).encode()).hexdigest()[:20]
    if key not in _BUILT:
        text = (f'#include "{HEADER}"\n#line 1 "kernel.cu"\n' + _rewrite(source, name, params)
                + '\n#line 1 "ortlab_launch"\n' + _wrapper(name, params))
        _BUILT[key] = CpuKernel(name, params, ctypes.CDLL(_build(text, key, timeout)))
    return _BUILT[key]


def cpu_kernels(source, names, timeout=120.0):
    """{name: CpuKernel} for several __global__ kernels of one `source`, built by one g++ run into
    one library (each kernel's pointer parameters checked, each with its own launch entry)."""
    if not isinstance(source, str) or isinstance(names, str) or not all(isinstance(n, str) for n in names):
        raise OrtlabError("cpu_kernels takes the CUDA C++ source (str) and a list of kernel names")
    names = tuple(dict.fromkeys(names))
    if not names:
        raise OrtlabError("cpu_kernels needs at least one kernel name")
    header = HEADER.read_text()
    key = hashlib.sha256("\0".join((source, *names, header, repr(BUILD))).encode()).hexdigest()[:20]
    if key not in _BUILT:
        text, params = source, {}
        for name in names:  # each rewrite keeps line numbers, so later signatures are found again
            params[name] = parse_params(text, name)
            text = _rewrite(text, name, params[name])
        wrappers = "".join(_wrapper(n, params[n], f"ortlab_launch_{k}") for k, n in enumerate(names))
        text = f'#include "{HEADER}"\n#line 1 "kernel.cu"\n' + text + '\n#line 1 "ortlab_launch"\n' + wrappers
        library = ctypes.CDLL(_build(text, key, timeout))
        _BUILT[key] = {n: CpuKernel(n, params[n], library, f"ortlab_launch_{k}") for k, n in enumerate(names)}
    return dict(_BUILT[key])


def _build(text, key, timeout):
    """Path of the shared library for `text`, built once per key (by g++) and shared by processes."""
    folder = Path(tempfile.gettempdir()) / f"ortlab-cuda-cpu-{os.getuid()}"
    library = folder / f"{key}.so"
    if library.exists():
        return str(library)
    folder.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=key, dir=folder))  # a process of its own builds here
    (work / "kernel.cpp").write_text(text)
    for argv in BUILD:
        try:
            done = subprocess.run(argv, cwd=work, capture_output=True, text=True, errors="replace", timeout=timeout,
                                  env={**os.environ, "LC_ALL": "C"})  # plain quotes in g++'s messages
        except FileNotFoundError:
            raise OrtlabError("g++ was not found: the CPU runner compiles kernels with it "
                              "(apt-get install g++)") from None
        except subprocess.TimeoutExpired:
            raise OrtlabError(f"g++ took longer than {timeout} s") from None
        if done.returncode != 0:
            errors = [line for line in done.stderr.splitlines() if "error" in line][:5]
            raise OrtlabError("g++ could not compile the kernel for the CPU runner: "
                              + ("; ".join(errors) or done.stderr.strip()[-2000:]))
    os.replace(work / "kernel.so", library)
    shutil.rmtree(work, ignore_errors=True)
    return str(library)


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


def launch(kernel, grid, block, *args, shared_bytes=0, schedule="forward", timeout=10.0):
    """Run `kernel` (a CpuKernel) on grid x block threads with `args` (numpy arrays for pointer
    parameters, written in place; numbers for the others) and `shared_bytes` of dynamic shared
    memory, threads in `schedule` order ("forward" or "reverse") between barriers.

    The launch runs in a worker process (forked once, reused) on copies of the arrays, and the worker
    is killed after `timeout` seconds: compiled code that never returns (`while (true) {}`) cannot
    be interrupted inside this process, since a thread cannot be killed, so only a process can be.
    A kernel that crashes the worker (e.g. a thread's locals overflowing its stack) ends in an
    OrtlabError too; the next launch forks a new worker. Arrays are written back only when the
    launch succeeded. `timeout=None` runs in this process, without the copies and without any
    protection."""
    if not isinstance(kernel, CpuKernel):
        raise OrtlabError(f"launch takes a CpuKernel from cpu_kernel(source, name), not {type(kernel).__name__}")
    if schedule not in ("forward", "reverse"):
        raise OrtlabError(f"schedule must be 'forward' or 'reverse', got {schedule!r}")
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < 1e6):
        raise OrtlabError(f"timeout must be a number of seconds above 0 (below 1e6), or None, got {timeout!r}")
    grid = _dims(grid, "grid", (2**31 - 1, 65535, 65535))
    block = _dims(block, "block", (1024, 1024, 64))
    if block[0] * block[1] * block[2] > 1024:
        raise OrtlabError(f"block {block} has {block[0] * block[1] * block[2]} threads; CUDA allows at most 1024")
    if len(args) != len(kernel.params):
        raise OrtlabError(f"{kernel!r} takes {len(kernel.params)} arguments, got {len(args)}")
    if not isinstance(shared_bytes, int) or isinstance(shared_bytes, bool) or not 0 <= shared_bytes <= 227 * 1024:
        raise OrtlabError(f"shared_bytes (dynamic shared memory) must be a number of bytes from 0 to 232448 "
                          f"(227 KiB, the most any architecture gives one block), got {shared_bytes!r}")
    held = [_argument(p, a) for p, a in zip(kernel.params, args)]
    shape = (*map(ctypes.c_uint, grid + block), ctypes.c_int(schedule == "reverse"), ctypes.c_ulonglong(shared_bytes))
    with _LOCK:
        if timeout is None:
            failed, message = _call(kernel, [h for h, _ in held], [n for _, n in held], shape)
        else:
            failed, message = _in_worker(kernel, held, shape, float(timeout))
    if failed:
        raise OrtlabError(f"kernel {kernel.name} stopped: {message}")


def _call(kernel, arrays, sizes, shape):
    """(failed, message) of one ortlab_launch call on `arrays` (numpy arrays, written in place)."""
    pointers = (ctypes.c_void_p * max(1, len(arrays)))(*(a.ctypes.data for a in arrays))
    counts = (ctypes.c_longlong * max(1, len(arrays)))(*sizes)
    error = ctypes.create_string_buffer(512)
    failed = getattr(kernel.library, kernel.entry)(pointers, counts, *shape, error, ctypes.c_int(len(error)))
    return failed, error.value.decode(errors="replace")


_LIBC = ctypes.CDLL(None)


class _Worker:
    """A child process, forked once, that runs launches sent to it over a socket: each request is
    (library path, entry, arrays, sizes, shape), each answer (failed, message, arrays). One fork
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
        """(failed, message, arrays after the launch), or an OrtlabError on a timeout or a crash."""
        request = (kernel.library._name, kernel.entry, [a for a, _ in held], [n for _, n in held],
                   [c.value for c in shape])
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
            path, entry, arrays, sizes, shape = pickle.loads(_read_frame(reader))
        except EOFError:
            return
        if path not in libraries:
            libraries[path] = ctypes.CDLL(path)
        kernel = CpuKernel(entry, (), libraries[path], entry)
        arrays = [np.require(a, requirements=["C", "W"]) for a in arrays]
        shape = (*map(ctypes.c_uint, shape[:6]), ctypes.c_int(shape[6]), ctypes.c_ulonglong(shape[7]))
        failed, message = _call(kernel, arrays, sizes, shape)
        _LIBC.fflush(None)  # a kernel's printf reaches the output before the answer does
        answer = (failed, message, [] if failed else arrays)
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
        failed, message, arrays = worker.run(kernel, held, shape, timeout)
    except BaseException:  # the worker was stopped: the next launch forks a new one
        _WORKER = None
        raise
    if not failed:
        for (array, _), param, result in zip(held, kernel.params, arrays):
            if param.pointer and not param.const:
                array.reshape(-1)[...] = result.reshape(-1)
    return failed, message


def stop_worker():
    """Stop this process's worker, if it has one (the next timed launch starts a new one). A worker lives as
    long as the process that started it; a test suite that counts its child processes stops it first."""
    global _WORKER
    if _WORKER is not None and _WORKER.owner == os.getpid():
        _WORKER.stop()
    _WORKER = None


def schedule_differences(kernel, grid, block, *args, shared_bytes=0, timeout=10.0):
    """Names of the array arguments whose results differ between the forward and the reverse schedule
    (each run on copies): a race between two barriers. The arguments themselves are not changed."""
    runs = []
    for schedule in ("forward", "reverse"):
        copies = [a.copy() if isinstance(a, np.ndarray) else a for a in args]
        launch(kernel, grid, block, *copies, shared_bytes=shared_bytes, schedule=schedule, timeout=timeout)
        runs.append(copies)
    return [p.name for p, a, b in zip(kernel.params, *runs)
            if p.pointer and not np.array_equal(a, b, equal_nan=True)]

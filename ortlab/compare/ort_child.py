"""ORT 1.19.2 run in a child process, one call at a time: a kernel that traps (an integer division by
zero is SIGFPE, which no Python code can catch), crashes or hangs kills or stalls that child only. The
parent waits at most a timeout, stops the child for certain, and raises OrtDied naming the signal and
what ORT was doing. An error ORT raises on purpose (a SessionError...) comes back as itself.

The child is forked: it starts in milliseconds, with the model and feeds already in its memory, and runs
nothing of the caller's script again (as a spawned child would)."""
import contextvars
import ctypes
import faulthandler
import math
import multiprocessing
import os
import re
import signal
import tempfile
import traceback
from collections import Counter
from pathlib import Path

import onnx

from ortlab.compare.report import CompareError
from ortlab.errors import OrtlabError
from ortlab.gradients.ort import ort_gradient_graph as build
from ortlab.memory.ort_arena_log import ort_block as block

ORT_TIMEOUT_S = 600      # one ORT call (load, optimize, build gradients, run): then the child is stopped
TIMEOUT_S = contextvars.ContextVar("ortlab_compare_timeout_s", default=ORT_TIMEOUT_S)  # compare(timeout=...)
WHO = "ORT 1.19.2"
SIGNALS = {"SIGFPE": "an arithmetic trap: an integer division or remainder by zero, or the smallest integer "
                     "divided by -1",
           "SIGSEGV": "a memory fault inside ORT", "SIGBUS": "a memory fault inside ORT",
           "SIGABRT": "ORT aborted", "SIGILL": "an illegal instruction",
           "SIGKILL": "killed from outside, often by the system for lack of memory"}


class OrtDied(CompareError):
    """ORT's child process died (a signal, an exit) or did not finish in time: nothing to compare with."""


class EngineStopped(CompareError):
    """ortlab's engine, run in a child like ORT, died or did not finish in time: a row says so."""


def check_timeout(seconds):
    """A time limit per call: a finite number of seconds above 0 (None: ORT_TIMEOUT_S)."""
    if seconds is None:
        return ORT_TIMEOUT_S
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds <= 0:
        raise CompareError(f"the timeout (--timeout SECONDS) must be a number of seconds above 0, got {seconds!r}")
    return seconds


def _started(pid):
    """Called with each child's pid as it starts (a hook for tests that check the child is gone)."""


def in_child(what, fn, *args, timeout=None, who=WHO):
    """fn(*args) in a forked child; its result (pickled back), or the OrtlabError it raised, raised here.

    `what` says what the call does ("running the model on ...") for the message when the child dies or
    outlives `timeout` (compare's, TIMEOUT_S, by default): OrtDied when `who` is ORT, else EngineStopped."""
    timeout = TIMEOUT_S.get() if timeout is None else timeout
    _preload()
    ctx = multiprocessing.get_context("fork")
    receive, send = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_serve, args=(send, fn, args, os.getpid()), daemon=True)
    child.start()
    _started(child.pid)
    send.close()  # the child holds the only sending end: its death is an end of file here
    try:
        kind, payload = _receive(receive, child, f"{who} ", what, timeout)
    finally:
        receive.close()
        _stop(child)
    if kind == "error":
        raise RuntimeError(f"{who}'s side of compare failed while {what}:\n{payload}")
    if kind == "refused":
        raise _remade(*payload)
    return payload


def _preload():
    """Import what the calls below need in this process, once: each forked child then starts with ORT
    (and torch, which ORT's training build loads) already imported, instead of seconds of imports."""
    import ortlab.gradients.ort  # noqa: F401
    import ortlab.session  # noqa: F401
    import ortlab.memory.ort_arena_log  # noqa: F401


def _serve(send, fn, args, parent):
    """The child: run fn, send ("ok", result), ("refused", the OrtlabError) or ("error", a traceback).
    Python's faulthandler (pytest's, or PYTHONFAULTHANDLER) is off here: the parent reports the death."""
    faulthandler.disable()
    _die_with_parent(parent)
    _quiet_stderr()
    try:
        message = ("ok", fn(*args))
    except OrtlabError as exc:
        message = ("refused", (type(exc), str(exc)))
    except Exception:  # noqa: BLE001 - a bug, sent whole so that the parent shows it
        message = ("error", traceback.format_exc())
    try:
        send.send(message)
    except Exception:  # noqa: BLE001 - a result or error that does not pickle
        send.send(("error", traceback.format_exc()))
    send.close()


def _die_with_parent(parent):
    """The child is killed when the parent dies (Linux's PR_SET_PDEATHSIG), even by a signal that leaves
    multiprocessing no time to stop its daemons: no ORT run outlives the compare that started it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: the parent's timeout and exit still stop the child
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _quiet_stderr():
    """The child's file descriptor 2 goes nowhere: ORT's own log lines ("[E:onnxruntime:...]") would repeat,
    on the caller's stderr, the error that comes back as a message (ortlab.capture still reads fd 2 where
    a call captures ORT's log)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    os.close(devnull)


def _remade(cls, message):
    """The child's OrtlabError, made again here (a CompareError when its class takes other arguments)."""
    try:
        return cls(message)
    except Exception:  # noqa: BLE001 - an __init__ with another signature
        return CompareError(message)


def _receive(receive, child, who, what, timeout):
    died = OrtDied if who.startswith(WHO) else EngineStopped
    if not receive.poll(timeout):
        child.kill()
        raise died(f"{who}did not finish {what} within {timeout:g} s, so it was stopped: give the dynamic "
                   "dimensions smaller sizes (--dim NAME=N), compare a smaller model, or allow more time "
                   "(--timeout SECONDS)")
    try:
        return receive.recv()
    except (EOFError, OSError):
        child.join(30)
        raise died(f"{who}{_death(child.exitcode)} while {what}: nothing to compare with") from None


def _death(code):
    """How the child ended, in words: 'died with SIGFPE (...)' or 'exited with status 3'."""
    if code is None:
        return "stopped answering"
    if code >= 0:
        return f"exited with status {code}"
    try:
        name = signal.Signals(-code).name
    except ValueError:
        return f"died with signal {-code}"
    return f"died with {name} ({SIGNALS[name]})" if name in SIGNALS else f"died with {name}"


def _stop(child):
    """The child ends for certain: it exits by itself after sending, or is killed."""
    child.join(10)
    if child.is_alive():
        child.kill()
        child.join()
    child.close()


# --- the calls compare() makes, each in its own child ----------------------------------------------

def ort_loads(model):
    """ORT 1.19.2 loads the model (optimizations off), or raises SessionError with ORT's reason."""
    from ortlab import session  # lazy: only the forked child loads onnxruntime (2 s)

    session.create(model, session.session_options("disable"), ["CPUExecutionProvider"])


def ort_optimized(model, level):
    """ORT's optimized graph at `level` ('basic', 'extended', 'all') on the CPU EP, and the transformers
    that logged "modified: 1" while making it (graph_transformer.cc, verbose)."""
    from ortlab import session  # lazy: only the forked child loads onnxruntime (2 s)

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "optimized.onnx"
        lines = session.initialization_log(model, 0, ["CPUExecutionProvider"], level=level,
                                           optimized_model_filepath=str(path))
        optimized = onnx.load(str(path))
    fired = Counter(m.group(1) for line in lines if (m := re.search(r"GraphTransformer (\S+) modified: 1", line)))
    return optimized, fired


def ort_gradient_graph(model, xs, loss):
    """The forward + backward model ORT's C++ GradientGraphBuilder builds."""
    return build(model, xs, loss)


def run_model(model, feeds):
    """{output name: array} from one ORT run, optimizations off."""
    from ortlab.session import run_model as run  # lazy: only the forked child loads onnxruntime (2 s)

    return run(model, feeds)


def ort_block(model, feeds):
    """The memory-pattern block ORT asks its CPU arena for on the first run (None when not logged)."""
    try:
        return block(model, feeds)
    except OrtlabError:
        raise
    except Exception as exc:  # noqa: BLE001 - ORT's own run error (InvalidArgument, Fail...), raised raw there
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise CompareError(f"onnxruntime could not run the model: {text}") from None

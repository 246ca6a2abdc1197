"""A learner's CUDA C++ kernel built and launched on the CPU runner in a process of its own.

Native code can do anything in the process that loads it: a static object's constructor in the kernel's
text runs when the build is loaded, and through Python's C API it could replace any function there. So
the process that loads a learner's build holds nothing a verdict depends on: it is a fresh interpreter
(started, not forked from the grader, so it holds no judge, no reference and no result), it imports only
ortlab.cuda's CPU runner, it receives the kernel's text and the launches' inputs, and it sends back each
launch's output array, or the runner's message, as plain data. The grader (ortlab.labs.judges) decides
whether those arrays are right. Whatever the learner's code does in that process can change only the
arrays it sends back; what it writes to files, the grader never imports (ortlab.labs.isolation).

    launches(source, name, [Launch(...)], timeout)   in the grader: [array or message] per launch

Run as a script, this file is that process: it reads one request on stdin and writes one framed reply
to the file descriptor given as its argument.
"""
import base64
import json
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
DTYPES = ("float32", "float64", "int32", "int64", "uint32", "uint64", "int8", "uint8", "int16", "uint16", "bool")
CAP = 256 << 20  # the largest reply read back (bytes)


class RunnerFailed(Exception):
    """The runner process gave no usable answer (it was stopped, or what it sent is not data)."""


class BuildFailed(Exception):
    """g++ could not build the kernel for the CPU runner (the runner's message)."""


@dataclass(frozen=True)
class Launch:
    """One launch: grid and block, the kernel's arguments (arrays and numbers), and which argument is
    the output sent back."""

    grid: object
    block: object
    args: tuple
    out: int
    schedule: str = "forward"


def _array(array):
    array = np.ascontiguousarray(array)
    return {"dtype": array.dtype.name, "shape": [int(d) for d in array.shape],
            "data": base64.b64encode(array.tobytes()).decode()}


def _from_array(data):
    if not isinstance(data, dict) or data.get("dtype") not in DTYPES:
        raise RunnerFailed("an array that is not data")
    shape = tuple(int(d) for d in data["shape"])
    raw = base64.b64decode(data["data"], validate=True)
    return np.frombuffer(raw, dtype=np.dtype(data["dtype"])).reshape(shape).copy()


def _argument(value):
    if isinstance(value, np.ndarray):
        return {"array": _array(value)}
    if isinstance(value, (bool, np.bool_)):
        return {"number": bool(value)}
    if isinstance(value, (int, np.integer)):
        return {"number": int(value)}
    return {"number": float(value)}


# --- the grader's side --------------------------------------------------------------------------------

def launches(source, name, runs, timeout, launch_timeout=20.0):
    """[output array, or the CPU runner's message (str)] for each Launch in `runs` of kernel `name` in
    `source`, built and launched in a fresh process that is stopped (with anything it started) after
    `timeout` seconds at most. BuildFailed when g++ cannot build it; RunnerFailed when the process gives
    no usable answer."""
    request = json.dumps({"source": source, "name": name, "timeout": launch_timeout,
                          "launches": [{"grid": r.grid, "block": r.block, "schedule": r.schedule, "out": r.out,
                                        "args": [_argument(a) for a in r.args]} for r in runs]}).encode()
    read_end, write_end = os.pipe()
    try:
        process = subprocess.Popen([sys.executable, "-I", "-B", __file__, str(write_end)], stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, pass_fds=(write_end,),
                                   cwd=str(REPO), start_new_session=True)
    except BaseException:
        os.close(read_end)
        raise
    finally:
        os.close(write_end)
    try:
        reply = _exchange(process, request, read_end, time.monotonic() + timeout)
    finally:
        os.close(read_end)
        _stop(process)
    if reply is None:
        raise RunnerFailed(f"the kernels did not finish on the CPU runner within {timeout:g} s")
    try:
        answer = json.loads(reply)
        if "build" in answer:
            raise BuildFailed(str(answer["build"])[:2000])
        results = answer["results"]
        if not isinstance(results, list) or len(results) != len(runs):
            raise RunnerFailed("the CPU runner's process gave a malformed answer")
        return [str(r["failed"])[:2000] if "failed" in r else _from_array(r["ok"]) for r in results]
    except (BuildFailed, RunnerFailed):
        raise
    except Exception:
        raise RunnerFailed("the CPU runner's process gave a malformed answer") from None


def _exchange(process, request, read_end, deadline):
    """The runner's framed reply (bytes), or None when the deadline passed first."""
    try:
        process.stdin.write(request)
        process.stdin.close()
    except OSError:  # it ended before reading: its reply (if any) says why
        pass
    data = b""
    while True:
        need = 8 if len(data) < 8 else 8 + int.from_bytes(data[:8], "little")
        if len(data) >= 8 and need - 8 > CAP:
            raise RunnerFailed("the CPU runner's process sent more than an answer")
        if len(data) >= need and len(data) >= 8:
            return data[8:need]
        ready, _, _ = select.select([read_end], [], [], max(0.0, deadline - time.monotonic()))
        if not ready:
            return None
        chunk = os.read(read_end, 1 << 20)
        if not chunk:
            raise RunnerFailed("the CPU runner's process ended without a usable answer (did the kernel end it?)")
        data += chunk


def _stop(process):
    """Kill the runner and everything in its session (its launch worker), and reap it."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    process.wait()


# --- the runner's side ----------------------------------------------------------------------------------

def _serve(request):
    from ortlab.cuda import cpu  # local: -I ignores PYTHONPATH; main() puts this repo on sys.path first
    from ortlab.errors import OrtlabError  # local: likewise, once main() has set sys.path

    try:
        kernel = cpu.cpu_kernel(request["source"], request["name"])
    except OrtlabError as exc:
        return {"build": str(exc)}
    results = []
    for run in request["launches"]:
        args = [_from_array(a["array"]) if "array" in a else a["number"] for a in run["args"]]
        try:
            cpu.launch(kernel, run["grid"], run["block"], *args, schedule=run["schedule"],
                       timeout=float(request["timeout"]))
        except OrtlabError as exc:
            results.append({"failed": str(exc)})
        else:
            results.append({"ok": _array(args[run["out"]])})
    cpu.stop_worker()
    return {"results": results}


def main(fd):
    sys.path.insert(0, str(REPO))
    reply = json.dumps(_serve(json.loads(sys.stdin.buffer.read()))).encode()
    with os.fdopen(fd, "wb") as out:
        out.write(len(reply).to_bytes(8, "little") + reply)


if __name__ == "__main__":
    main(int(sys.argv[1]))
    os._exit(0)

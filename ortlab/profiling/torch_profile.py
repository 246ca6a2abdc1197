"""torch.profiler's trace as a Profile, so that PyTorch and ORT are read the same way.

torch.profiler (torch/profiler/profiler.py) records nested 'cpu_op' events (aten::linear
contains aten::addmm ...); each keeps only its self time here, so that the times add up like
ORT's per-node kernel times. record_function('step ...') spans become the runs.
"""
import json
import tempfile
from pathlib import Path

from ortlab.profiling.trace import Event, Profile, ProfileError
from ortlab.capture import captured_lines


def self_times(ops):
    """{id(event): self time}: an event's duration minus that of the events directly inside it
    on the same thread (torch's 'self CPU time'), so that nested ops add up without counting twice."""
    own = {id(e): float(e["dur"]) for e in ops}
    for tid in {e["tid"] for e in ops}:
        stack = []
        for e in sorted((e for e in ops if e["tid"] == tid), key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= e["ts"]:
                stack.pop()
            if stack:
                own[id(stack[-1])] -= float(e["dur"])
            stack.append(e)
    return own


def load_torch_profile(path_or_trace):
    """A Profile from a torch.profiler Chrome trace (a path or the loaded dict)."""
    if isinstance(path_or_trace, (str, Path)):
        path = Path(path_or_trace)
        if not path.is_file():
            raise ProfileError(f"{path}: no such trace; write one with prof.export_chrome_trace(path)")
        trace, source = json.loads(path.read_text()), path.name
    else:
        trace, source = path_or_trace, "torch profile"
    if not isinstance(trace, dict) or "traceEvents" not in trace:
        raise ProfileError(f"{source} is not a torch.profiler trace (no traceEvents); for ORT's use "
                           "load_ort_profile")
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    own = self_times(ops)
    kernels = [Event(e["name"], e["name"], float(e["ts"]), own[id(e)], "torch") for e in ops]
    runs = [(e["name"], float(e["ts"]), float(e["dur"])) for e in events
            if e.get("cat") == "user_annotation" and e["name"].startswith("step")]
    return Profile(source, sorted(kernels, key=lambda e: e.ts), sorted(runs, key=lambda r: r[1]))


def profile_torch(step, steps=3, warmup=1):
    """Run step(i) `warmup` times unprofiled, then `steps` times under torch.profiler, each in a
    record_function('step i') span; returns the Profile."""
    import torch  # heavy: torch

    for i in range(warmup):
        step(i)
    with captured_lines(fds=(2,), python=False):  # kineto's GPU probe
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for i in range(steps):
                with torch.profiler.record_function(f"step {i}"):
                    step(i)
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return load_torch_profile(path)

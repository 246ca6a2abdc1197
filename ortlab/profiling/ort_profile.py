"""ORT's profiler: a session's Chrome trace as a Profile.

SessionOptions.enable_profiling makes onnxruntime/core/common/profiler.cc record one event per
node run (category 'Node', named '<node>_kernel_time', with args op_name and provider) and
session events (category 'Session': model_run, SequentialExecutor::Execute).
"""
import json
import re
from pathlib import Path

from ortlab.profiling.trace import Event, Profile, ProfileError
from ortlab.viz import Table

KERNEL_SUFFIX = "_kernel_time"
RUN_NAMES = ("model_run", "SequentialExecutor::Execute")


def _events(path_or_events):
    if isinstance(path_or_events, (str, Path)):
        path = Path(path_or_events)
        if not path.is_file():
            raise ProfileError(f"{path}: no such profile; ORT writes it when the session ends profiling "
                               "(session.end_profiling() returns its path)")
        try:
            return json.loads(path.read_text()), re.sub(r"_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d", "", path.name)
        except json.JSONDecodeError as exc:
            raise ProfileError(f"{path} is not a Chrome trace (JSON): {exc}") from None
    return list(path_or_events), "ORT profile"


def _kernel(event):
    args = event.get("args", {})
    shapes = tuple(tuple(shape) for entry in args.get("output_type_shape", []) for shape in entry.values())
    return Event(event["name"][:-len(KERNEL_SUFFIX)], args.get("op_name", "?"), event["ts"], event["dur"],
                 args.get("provider", ""), shapes, int(args.get("output_size", 0)))


def load_ort_profile(path_or_events):
    """A Profile from ORT's trace file (or its already-loaded list of events)."""
    events, source = _events(path_or_events)
    if isinstance(events, dict):  # a torch trace has {"traceEvents": [...]}
        raise ProfileError(f"{source} looks like a torch.profiler trace; use load_torch_profile")
    kernels = [_kernel(e) for e in events if e.get("cat") == "Node" and e.get("name", "").endswith(KERNEL_SUFFIX)]
    session = [e for e in events if e.get("cat") == "Session"]
    kind = next((n for n in RUN_NAMES if any(e["name"] == n for e in session)), None)
    runs = [(f"run {k}", e["ts"], e["dur"]) for k, e in enumerate(e for e in session if e["name"] == kind)]
    return Profile(source, sorted(kernels, key=lambda e: e.ts), runs)


def profile_model(model, feeds, runs=3, **options):
    """Run `model` `runs` times with ORT's profiler on (ortlab.session.profile) and load it."""
    from ortlab.session import profile  # lazy: ortlab.session imports onnxruntime (2 s)

    return load_ort_profile(profile(model, feeds, runs=runs, **options))


def plan_table(profile, run=0, limit=None):
    """What each node of one run produced, in execution order: output shapes and bytes, and the running
    total of bytes produced so far (what ORT's allocation planner had to find room for; it reuses
    buffers, so the peak is lower than the total; L2_02 and ortlab.memory.plan)."""
    if not profile.runs:
        raise ProfileError(f"{profile.source}: no session runs recorded")
    _, start, dur = profile.runs[run]
    rows, total = [], 0
    for e in (e for e in profile.events if start <= e.ts <= start + dur):
        total += e.output_bytes
        rows.append((e.name, e.op_type, " ".join(str(list(s)) for s in e.output_shapes), e.output_bytes, total))
    return Table(("node", "op", "output shapes", "output bytes", "bytes so far"), rows[:limit])

"""The external profilers of ORTModule's Performance Investigation guide (nvprof and the Visual
Profiler, their successors Nsight Systems and Nsight Compute, Linux perf): what each shows, its command,
and which of them this machine can run.

- nsys (Nsight Systems): the timeline of CUDA kernels, copies and NVTX ranges (ORT marks each node
  with an NVTX range when built with --enable_nvtx_profile);
- ncu (Nsight Compute): every metric of one kernel (bandwidth, occupancy, stalls);
- nvprof: the older command-line profiler behind the Visual Profiler. Neither supports GPUs of
  compute capability 8.0 and newer (A100 is 8.0, H100 9.0); Nsight Systems and Nsight Compute
  take over there;
- perf: the host (Python, ORT's CPU kernels, the OS). In a VM or container the hardware counters
  (instructions, cycles) are often not exposed; perf then samples on the cpu-clock software event.

`tool_table()` is the same on every machine; `run_tools()` runs each tool that this machine has
(the GPU tools need a GPU) on a small workload and says, per tool, whether it ran or was only
printed, and why.
"""
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass

from ortlab.viz import Table

TARGET = "python train.py"


@dataclass(frozen=True)
class Tool:
    name: str
    shows: str
    needs: str
    command: str  # a template: {target}, {kernel}, {out}


TOOLS = (
    Tool("nsys", "timeline: CUDA kernels, copies, NVTX ranges", "a GPU",
         "nsys profile -t cuda,nvtx -o {out}/trace --force-overwrite true {target}"),
    Tool("ncu", "one kernel's metrics: bandwidth, occupancy, stalls", "a GPU",
         "ncu --set full -k regex:{kernel} -c 1 {target}"),
    Tool("nvprof", "GPU kernel summary (the Visual Profiler's data)", "a GPU of compute capability < 8.0",
         "nvprof --print-gpu-summary --profile-child-processes {target}"),
    Tool("perf", "the host: Python, ORT's CPU code, the OS", "Linux perf",
         "perf record -e {event} -g -o {out}/perf.data -- {target}"),
)

# The small workloads run_tools profiles when it is given no target: torch matmuls and LayerNorms on
# the GPU for the GPU tools (torch's CUDA LayerNorm kernels are named *layer_norm*), and numpy
# (a matmul and a softmax, BLAS and Python) on the host for perf, which starts in a second.
GPU_WORKLOAD = """import torch
x = torch.randn(256, 256, device="cuda")
for _ in range(20):
    torch.nn.functional.layer_norm(x @ x, (256,))
torch.cuda.synchronize()
"""
HOST_WORKLOAD = """import numpy as np
x = np.random.default_rng(0).standard_normal((256, 256)).astype(np.float32)
for _ in range(100):
    m = x @ x
    e = np.exp(m - m.max(axis=1, keepdims=True))
    y = e / e.sum(axis=1, keepdims=True)
"""
WORKLOAD_KERNEL = "layer_norm"


def _command(tool, target, kernel, out, event="cpu-clock"):
    return tool.command.format(target=target, kernel=kernel, out=shlex.quote(out), event=event)


def tool_table(target=TARGET, kernel="LayerNorm"):
    """What each tool shows, what it needs, and the command (`target` the training script):
    the same on every machine."""
    shown = {"nsys": "nsys profile -t cuda,nvtx -o trace {target}", "perf": "perf record -g {target} && perf report"}
    rows = [(t.name, t.shows, t.needs, shown.get(t.name, t.command).format(target=target, kernel=kernel))
            for t in TOOLS]
    return Table(("tool", "shows", "needs", "command"), rows)


@dataclass
class ToolRun:
    tool: str
    command: str
    ran: bool
    why: str
    output: str = ""


def detect_gpu():
    """(name, (major, minor)) of GPU 0, or None without a usable GPU."""
    try:
        import torch  # optional: torch

        if torch.cuda.is_available():
            return torch.cuda.get_device_name(0), tuple(torch.cuda.get_device_capability(0))
    except Exception:  # no torch, no driver: no GPU to profile
        pass
    return None


def _run(argv, timeout, cwd):
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=cwd)
    except subprocess.TimeoutExpired:
        return None, f"stopped after {timeout} s"
    return done.returncode, (done.stdout + done.stderr)


def _tail(text, lines=8):
    kept = [line.rstrip() for line in text.splitlines() if line.strip()]
    return "\n".join(kept[-lines:])


def _perf_event(timeout):
    """'cycles' when this machine exposes hardware counters to perf, else 'cpu-clock'."""
    code, out = _run(["perf", "stat", "-e", "instructions", "true"], timeout, None)
    if code == 0 and "<not supported>" not in out and "<not counted>" not in out:
        return "cycles", "sampled on the cycles hardware counter"
    return "cpu-clock", "no hardware counters here (VM or container), so sampled on the cpu-clock software event"


def _run_perf(tool, target, out, timeout):
    event, note = _perf_event(timeout)
    command = _command(tool, target, WORKLOAD_KERNEL, out, event)
    code, text = _run(shlex.split(command), timeout, out)
    if code != 0:
        failure = f"exit {code}" if code is not None else text
        return ToolRun(tool.name, command, True, f"ran; it failed ({failure})",
                       _tail(text))
    report = ["perf", "report", "-i", os.path.join(out, "perf.data"), "--stdio", "--no-children", "--sort", "dso",
              "-g", "none", "--percent-limit", "2"]
    code, text = _run(report, timeout, out)
    table = "\n".join(line for line in text.splitlines() if line.strip() and not line.startswith("#"))
    return ToolRun(tool.name, command + " && " + " ".join(report[:2]) + " --sort dso", True,
                   f"ran: {note}; output: self time by shared object", _tail(table, 12))


def _run_gpu_tool(tool, target, out, timeout):
    command = _command(tool, target, WORKLOAD_KERNEL, out)
    code, text = _run(shlex.split(command), timeout, out)
    status = "exit 0" if code == 0 else (f"exit {code}" if code is not None else text)
    return ToolRun(tool.name, command, True, f"ran ({status})", _tail(text))


def _workload(out, name, text):
    path = os.path.join(out, name)
    with open(path, "w") as f:
        f.write(text)
    return shlex.join([sys.executable, path])


def run_tools(target=None, gpu="detect", timeout=300, workdir=None):
    """Run each tool of TOOLS that this machine can run on `target` (an argv list; default: the GPU
    tools on GPU_WORKLOAD, perf on HOST_WORKLOAD, in this Python), and print the rest. Returns one
    ToolRun per tool: the command, whether it ran, and why (not installed, no GPU, nvprof on compute
    capability >= 8.0...), with the output's tail. `gpu`: (name, (major, minor)) or None; "detect" asks torch."""
    if workdir is None:  # a folder of our own, removed afterwards
        with tempfile.TemporaryDirectory(prefix="ortlab_tools_") as out:
            return run_tools(target, gpu, timeout, out)
    gpu = detect_gpu() if gpu == "detect" else gpu
    out = workdir
    os.makedirs(out, exist_ok=True)
    if target is not None:
        gpu_target = host_target = shlex.join(target)
    else:
        gpu_target = _workload(out, "gpu_workload.py", GPU_WORKLOAD)
        host_target = _workload(out, "host_workload.py", HOST_WORKLOAD)
    runs = []
    for tool in TOOLS:
        shown = host_target if tool.name == "perf" else gpu_target
        command = _command(tool, shown, WORKLOAD_KERNEL, out)
        installed = shutil.which(tool.name) is not None
        if tool.name == "perf":
            if not installed:
                runs.append(ToolRun(tool.name, command, False, "printed, not run: perf is not installed here"))
            else:
                runs.append(_run_perf(tool, shown, out, timeout))
            continue
        if gpu is None:
            runs.append(ToolRun(tool.name, command, False, "printed, not run: no GPU here (nothing for it to record)"))
        elif tool.name == "nvprof" and tuple(gpu[1]) >= (8, 0):
            runs.append(ToolRun(tool.name, command, False,
                                f"printed, not run: {gpu[0]} has compute capability {gpu[1][0]}.{gpu[1][1]}; nvprof "
                                "supports only < 8.0 (use nsys and ncu)"))
        elif not installed:
            runs.append(ToolRun(tool.name, command, False,
                                f"printed, not run: a GPU ({gpu[0]}) but {tool.name} is not installed here"))
        else:
            runs.append(_run_gpu_tool(tool, shown, out, timeout))
    return runs


def runs_table(runs):
    """run_tools' result as a Table: tool, ran or printed, why."""
    return Table(("tool", "ran", "why"), [(r.tool, "ran" if r.ran else "printed", r.why) for r in runs])


def print_runs(runs):
    """Per tool: ran or printed and why, the command, and the tail of what it printed."""
    for r in runs:
        print(f"{r.tool}: {r.why}\n  $ {r.command}")
        if r.output:
            print("\n".join("  " + line for line in r.output.splitlines()))

"""Views of IOBinding and DLPack for the L1_03 walkthrough: pointers, the frame's feeds and fetches,
ORT's IOBinding bugs run where they cannot take the notebook down, and what copying costs against
binding.

What it reads about in ORT 1.19.2:
- onnxruntime/core/session/IOBinding.cc (BindInput, BindOutput: the name maps and the values bound),
  onnxruntime/python/onnxruntime_pybind_iobinding.cc and onnxruntime_inference_collection.py
  (the Python IOBinding, which holds `C.SessionIOBinding(session._sess)` and nothing else);
- onnxruntime/core/framework/execution_frame.cc (IExecutionFrame::Init: pre-allocated fetches first,
  then initializers, then the feeds, sharing the caller's OrtValues) and utils.cc (ExecuteGraph with a
  FeedsFetchesManager; CopyOutputsAcrossDevices for a fetch wanted on another device);
- onnxruntime/python/onnxruntime_pybind_ortvalue.cc (OrtValue.to_dlpack, from_dlpack) and
  orttraining/orttraining/python/training/ortmodule/_utils.py (_ortvalue_from_torch_tensor,
  _ortvalues_to_torch_tensor).

    mlp_model()                 the walkthrough's model: X[N, 8] -> MatMul -> Relu (Y), Neg (Z)
    relu_model()                X[N] -> Relu -> Y, for timing over sizes
    ort_session(model)          ORT 1.19.2 on the CPU, graph optimizations off
    data_ptr(value)             the address of numpy / OrtValue / C.OrtValue / torch data
    as_numpy(value)             a numpy view of an output from ORT (an OrtValue) or ortlab (an array)
    pointer_table(claims)       one row per claim: the two buffers compared, same memory or not
    frame_table(sess, callers)  ortlab's last run: each feed and fetch, its role in the frame, caller's?
    probe_ort_bugs(times)       ORT's IOBinding bugs, each run `times` times in a forked process
    bug_table(outcomes)         one row per bug: how every run ended, what the first printed
    copy_vs_bind(sizes)         run() against run_with_iobinding over sizes (a CostRow per size)
    cost_summary(rows)          the facts that do not depend on the machine (pointers, never times)
    plot_costs(rows)            the picture: time per run against bytes, one curve per path
    device_copies(device)       host<->device copies per run, copying path against device-bound path
"""
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ortlab.errors import OrtlabError
from ortlab.viz import Table

W = np.arange(64, dtype=np.float32).reshape(8, 8) / 64  # the MatMul weight of mlp_model()


class BindingViewError(OrtlabError):
    """A binding view was asked for something it cannot show."""


# --- models and sessions -----------------------------------------------------------------------------
def mlp_model():
    """X[N, 8] -> MatMul(W) -> T; Y = Relu(T), Z = Neg(T): two outputs of a dynamic batch N."""
    nodes = [helper.make_node("MatMul", ["X", "W"], ["T"], name="mm"),
             helper.make_node("Relu", ["T"], ["Y"], name="relu"),
             helper.make_node("Neg", ["T"], ["Z"], name="neg")]
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "mlp", [helper.make_tensor_value_info("X", f, ["N", 8])],
                              [helper.make_tensor_value_info("Y", f, ["N", 8]),
                               helper.make_tensor_value_info("Z", f, ["N", 8])],
                              [numpy_helper.from_array(W, "W")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def relu_model():
    """X[N] -> Relu -> Y on float32: one kernel, so a run's cost is the kernel plus the I/O around it."""
    f = TensorProto.FLOAT
    graph = helper.make_graph([helper.make_node("Relu", ["X"], ["Y"], name="relu")], "relu",
                              [helper.make_tensor_value_info("X", f, ["N"])],
                              [helper.make_tensor_value_info("Y", f, ["N"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mlp_reference(x):
    """(Y, Z) of mlp_model() by numpy in float64: what both runtimes must agree with."""
    t = np.asarray(x, np.float64) @ W.astype(np.float64)
    return np.maximum(t, 0), -t


def ort_session(model=None, threads=1, log_severity=4):
    """An onnxruntime.InferenceSession on the CPU with graph optimizations off (the graph as written).
    log_severity=4 (FATAL only): a failing run raises its message anyway, while ORT's own ERROR line would
    go to the process's stderr with a timestamp."""
    from ortlab.env import quiet_import  # lazy: ortlab.env imports torch

    ort = quiet_import("onnxruntime")
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.intra_op_num_threads = threads
    options.log_severity_level = log_severity
    model = mlp_model() if model is None else model
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


# --- pointers ----------------------------------------------------------------------------------------
def data_ptr(value):
    """The address of the first element of a numpy array, an onnxruntime.OrtValue (or the C-level
    OrtValue ORTModule passes around) or a torch tensor (OrtValue::DataRaw() in ORT's words)."""
    if isinstance(value, np.ndarray):
        return value.__array_interface__["data"][0]
    if hasattr(value, "data_ptr"):
        return int(value.data_ptr())
    raise BindingViewError(f"data_ptr: {type(value).__name__} holds no tensor data; pass a numpy array, "
                           "an OrtValue or a torch tensor")


def as_numpy(value):
    """A numpy view (no copy) of a host output: ORT's get_outputs() gives OrtValues, ortlab's arrays."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "numpy") and hasattr(value, "device_name") and value.device_name().lower() == "cpu":
        return value.numpy()  # on the CPU, a view of the OrtValue's buffer (the same data pointer)
    raise BindingViewError(f"as_numpy: takes a numpy array or an OrtValue on the CPU, not "
                           f"{type(value).__name__}; copy a device value with copy_outputs_to_cpu()")


def pointer_table(claims):
    """A Table, one row per claim {text: (a, b)}: whether a and b start at the same address. Addresses
    differ from machine to machine, so only the comparison is shown."""
    if not isinstance(claims, dict):
        raise BindingViewError("pointer_table takes {claim: (value_a, value_b)}")
    rows = [(text, "same memory" if data_ptr(a) == data_ptr(b) else "different memory")
            for text, (a, b) in claims.items()]
    return Table(("claim", "buffers"), rows)


def frame_table(sess, callers):
    """What ortlab's last run put in its ExecutionFrame, one row per feed and fetch: its role (a feed,
    a fetch pre-placed by the binding, or a fetch the run allocated) and whether the frame's buffer was
    the caller's own (`callers`: {name: the array or tensor the caller bound}).

    Mirrors IExecutionFrame::Init (execution_frame.cc): pre-allocated fetches go in first, the feeds
    last, sharing the caller's values; a fetch slot left empty is allocated by the kernel writing it."""
    run = getattr(sess, "last_run", None)
    if run is None:
        raise BindingViewError("frame_table reads an ortlab.engine session's last_run: run it first "
                               "(run_with_iobinding or run)")
    rows = []
    for name, ptr in run.feed_data_ptrs.items():
        rows.append((name, "feed", _is_callers(ptr, callers.get(name))))
    for name, ptr in run.fetch_data_ptrs.items():
        role = "fetch pre-placed by the binding" if name in run.preplaced_fetches else \
            "fetch allocated by the run"
        rows.append((name, role, _is_callers(ptr, callers.get(name))))
    return Table(("value", "role in the frame", "the caller's buffer"), rows)


def _is_callers(ptr, value):
    return "-" if value is None else ("yes" if ptr == data_ptr(value) else "no")


# --- ORT's bugs, each run in a forked process -------------------------------------------------------
# Each script runs with `ort` (onnxruntime), `np` and MODEL (mlp_model() serialized) defined; it prints
# what it sees with flush=True, so what it printed before a crash still comes back.
ORT_BUGS = {
    "orphaned binding": '''\
binding = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"]).io_binding()
print("binding made; its InferenceSession has no other reference", flush=True)
binding.bind_cpu_input("X", np.ones((4, 8), np.float32))
print("bind_cpu_input returned", flush=True)
''',
    "bind after a refused bind": '''\
sess = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
binding = sess.io_binding()
x = np.ones((4, 8), np.float32)
try:
    binding.bind_ortvalue_input("nope", ort.OrtValue.ortvalue_from_numpy(x))
except RuntimeError as error:
    print("refused:", str(error).strip(), flush=True)
for attempt in (1, 2):
    try:
        binding.bind_cpu_input("X", x)
        print(f"bind X #{attempt}: accepted", flush=True)
    except RuntimeError as error:
        message = str(error).strip().split(" was false. ")[-1]
        print(f"bind X #{attempt}: RuntimeError ...", message, flush=True)
binding.bind_output("Y")
sess.run_with_iobinding(binding)
print("the run works, Y[0, :2] =", binding.copy_outputs_to_cpu()[0][0, :2].round(3).tolist(), flush=True)
binding.clear_binding_inputs()
binding.bind_cpu_input("X", x)
print("after clear_binding_inputs(): bind X accepted", flush=True)
''',
    "output kept across a clear": '''\
sess = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
binding = sess.io_binding()
binding.bind_cpu_input("X", np.ones((4, 8), np.float32))
binding.bind_output("Y")
sess.run_with_iobinding(binding)
kept = binding.get_outputs()[0]  # a view of the binding's output slot, not a reference of its own
binding.clear_binding_outputs()
print("outputs cleared; reading the OrtValue kept from get_outputs()", flush=True)
print("Y[0, :2] =", kept.numpy()[0, :2].round(3).tolist(), flush=True)
''',
    "bind_cpu_input refused": '''\
sess = ort.InferenceSession(MODEL, providers=["CPUExecutionProvider"])
binding = sess.io_binding()
x = np.ones((4, 8), np.float32)
try:
    binding.bind_cpu_input("nope", x)
except RuntimeError as error:
    print("refused:", str(error).strip(), flush=True)
binding.bind_cpu_input("X", x)
print("bind X: accepted", flush=True)
''',
}


@dataclass
class Outcome:
    """How one run of a bug script ended: 'exit 0', 'exit 1' or the signal that killed it, and the
    lines it printed."""

    bug: str
    ending: str
    lines: list


def probe_ort_bugs(names=None, times=3, timeout=120):
    """Run each of ORT_BUGS (or `names`) `times` times, each in its own process forked from one child
    Python that imported onnxruntime once; a list of Outcome. A crash ends a grandchild, never this
    process."""
    names = list(ORT_BUGS) if names is None else list(names)
    unknown = [n for n in names if n not in ORT_BUGS]
    if unknown or not isinstance(times, int) or times < 1:
        raise BindingViewError(f"probe_ort_bugs takes names from {list(ORT_BUGS)} and times >= 1, not "
                               f"{unknown or names!r}, {times!r}")
    code = f"from ortlab.walkthroughs.iobinding_dlpack import _child; _child({names!r}, {times})"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)
    found = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    if done.returncode != 0 or len(found) != len(names) * times:
        raise BindingViewError(f"the probe process failed (exit {done.returncode}): "
                               f"{done.stderr.strip()[-400:]}")
    return [Outcome(**item) for item in found]


def _child(names, times):
    """In the child: import onnxruntime once, then fork a process per run of each script."""
    from ortlab.env import quiet_import  # lazy: ortlab.env imports torch

    ort = quiet_import("onnxruntime")
    model = mlp_model().SerializeToString()
    for name in names:
        for _ in range(times):
            print(json.dumps(_fork_and_run(os, ORT_BUGS[name], {"ort": ort, "np": np, "MODEL": model}, name)),
                  flush=True)


def _fork_and_run(os, script, namespace, name):
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the grandchild: run the script with its prints going into the pipe
        os.close(read_end)
        sys.stdout = os.fdopen(write_end, "w", buffering=1)
        status = 0
        try:
            exec(script, dict(namespace))  # noqa: S102 (one of ORT_BUGS, defined above)
        except Exception as error:  # noqa: BLE001 (reported as the run's last line)
            print(f"{type(error).__name__}: {str(error).strip()[:200]}", flush=True)
            status = 1
        sys.stdout.flush()
        os._exit(status)
    os.close(write_end)
    with os.fdopen(read_end) as pipe:
        lines = pipe.read().splitlines()
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        ending = f"killed by {signal.Signals(os.WTERMSIG(status)).name}"
    else:
        ending = f"exit {os.WEXITSTATUS(status)}"
    return {"bug": name, "ending": ending, "lines": lines}


def bug_table(outcomes):
    """One row per bug: how its runs ended (e.g. 'killed by SIGSEGV 3/3') and the lines its first run
    printed."""
    rows, seen = [], {}
    for outcome in outcomes:
        seen.setdefault(outcome.bug, []).append(outcome)
    for bug, runs in seen.items():
        endings = sorted({o.ending for o in runs})
        ended = "; ".join(f"{e} {sum(o.ending == e for o in runs)}/{len(runs)}" for e in endings)
        rows.append((bug, ended, " | ".join(runs[0].lines)))
    return Table(("script", "runs", "printed (first run)"), rows)


# --- copying against binding ------------------------------------------------------------------------
@dataclass
class CostRow:
    """One size: seconds per run of each path (the best of `repeat`), and the pointer facts."""

    elements: int
    run_s: float  # session.run(None, {"X": x}): numpy in, a new numpy array out
    run_copy_s: float  # the same, then copied into the caller's buffer (np.copyto)
    bind_s: float  # run_with_iobinding: x bound, the output written into the caller's buffer
    run_new_arrays: bool  # two results of run() held at once live at different addresses
    bind_in_place: bool  # every bound run left its output at the caller's buffer's address
    equal: bool  # the three paths computed the same values

    @property
    def nbytes(self):
        return self.elements * 4


def copy_vs_bind(sizes=tuple(4 ** k for k in range(5, 13)), repeat=5, threads=1):
    """Time ORT's session.run against run_with_iobinding on relu_model() for each size (float32
    elements), the best of `repeat` runs each (10 times as many below 1 Mi elements, where a run takes
    microseconds and one busy moment decides the figure); a CostRow per size."""
    from ortlab.env import quiet_import  # lazy: ortlab.env imports torch

    ort = quiet_import("onnxruntime")
    sess = ort_session(relu_model(), threads=threads)
    rows = []
    for n in sizes:
        if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or n < 1:
            raise BindingViewError(f"copy_vs_bind: sizes are element counts >= 1, not {n!r}")
        x = np.random.default_rng(int(n)).standard_normal(int(n)).astype(np.float32)
        out = np.empty_like(x)
        binding = sess.io_binding()
        binding.bind_cpu_input("X", x)
        binding.bind_ortvalue_output("Y", ort.OrtValue.ortvalue_from_numpy(out))
        first, second = sess.run(None, {"X": x})[0], sess.run(None, {"X": x})[0]
        times = repeat if n >= 1 << 20 else repeat * 10
        run_s = _best(lambda: sess.run(None, {"X": x}), times)
        run_copy_s = _best(lambda: np.copyto(out, sess.run(None, {"X": x})[0]), times)
        out[:] = np.nan
        bind_s = _best(lambda: sess.run_with_iobinding(binding), times)
        in_place = binding.get_outputs()[0].data_ptr() == data_ptr(out)
        rows.append(CostRow(int(n), run_s, run_copy_s, bind_s, data_ptr(first) != data_ptr(second),
                            in_place, bool(np.array_equal(first, out) and np.array_equal(second, out))))
    return rows


def _best(call, repeat):
    call()  # once to warm up (the arena, the caches)
    best = float("inf")
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        best = min(best, time.perf_counter() - start)
    return best


def cost_summary(rows):
    """A Table of what copy_vs_bind found that holds on any machine: per size, whether run() returned a
    new array each time, whether every bound run wrote into the caller's buffer, whether all agreed."""
    yes = {True: "yes", False: "no"}
    return Table(("elements", "MiB", "run() returns a new array", "bound output at the caller's address",
                  "same values"),
                 [(r.elements, f"{r.nbytes / 2 ** 20:.3g}", yes[r.run_new_arrays], yes[r.bind_in_place],
                   yes[r.equal]) for r in rows])


def plot_costs(rows, title="ORT 1.19.2 on the CPU, Relu over N float32"):
    """Time per run against the bytes of the output, one curve per path, log-log; shows the figure."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    if not rows:
        raise BindingViewError("plot_costs needs the rows of copy_vs_bind(sizes)")
    figure, axes = plt.subplots(figsize=(6.4, 3.6))
    nbytes = [r.nbytes for r in rows]
    for label, key, style in (("run(): new array each run", "run_s", "o-"),
                              ("run() + copy into the caller's buffer", "run_copy_s", "s--"),
                              ("run_with_iobinding: written in place", "bind_s", "^-")):
        axes.plot(nbytes, [getattr(r, key) * 1e6 for r in rows], style, label=label)
    axes.set(xscale="log", yscale="log", xlabel="output bytes", ylabel="µs per run (best)", title=title)
    axes.grid(alpha=0.3, which="both")
    axes.legend(fontsize=8)
    figure.tight_layout()
    plt.show()


# --- on a device ------------------------------------------------------------------------------------
def device_copies(device="cpu", elements=1 << 16, runs=3):
    """Host<->device copies over `runs` runs of Relu(X) done two ways with torch on `device`: as
    session.run does with numpy feeds on a device EP (each feed copied to the device, each fetch back
    to the host: utils.cc CopyInputsAcrossDevices / CopyOutputsAcrossDevices), and as IOBinding does
    with X and Y bound to device buffers (no copy). Copies are the aten copy ops torch dispatches
    (_to_copy, copy_), counted by a TorchDispatchMode. Returns {"copying": n, "bound": n,
    "device": device, "outputs_on": where the bound Y stays}."""
    import torch  # heavy: torch

    if device not in ("cpu", "cuda"):
        raise BindingViewError(f"device_copies: device is 'cpu' or 'cuda', not {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise BindingViewError("device_copies('cuda'): torch sees no CUDA GPU here; use 'cpu'")
    host = np.random.default_rng(0).standard_normal(elements).astype(np.float32)
    x_dev = torch.from_numpy(host).to(device)
    y_dev = torch.empty_like(x_dev)

    def copying():
        return torch.relu(torch.from_numpy(host).to(device)).cpu().numpy()

    def bound():
        torch.clamp(x_dev, min=0, out=y_dev)

    counts = {}
    for name, step in (("copying", copying), ("bound", bound)):
        with _CopyCounter() as counter:
            for _ in range(runs):
                step()
        counts[name] = counter.copies
    if device == "cuda":
        torch.cuda.synchronize()
    if not np.array_equal(copying(), y_dev.cpu().numpy()):
        raise BindingViewError("device_copies: the two paths disagree")  # never expected
    return {**counts, "device": device, "outputs_on": y_dev.device.type}


def _CopyCounter():
    """A TorchDispatchMode counting the copy ops torch runs inside it (its .copies)."""
    from torch.utils._python_dispatch import TorchDispatchMode  # heavy: torch

    class CopyCounter(TorchDispatchMode):
        copies = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func.__name__.split(".")[0] in ("_to_copy", "copy_"):
                self.copies += 1
            return func(*args, **(kwargs or {}))

    return CopyCounter()

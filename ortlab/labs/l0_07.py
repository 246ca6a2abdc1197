"""Exercises of the walkthrough L0_07_performance_investigation: turning torch.profiler's nested op events into
self times, and predicting which MatMuls ORT's level-2 fusions turn into FusedMatMul.

The model and the events the exercises are about are built here, so the notebook can show them; the checks
live in ortlab.labs.judges.l0_07 ('self_times' against torch.profiler's own self CPU time,
key_averages().self_cpu_time_total; 'fused_matmuls' against the graph ORT saves after its transformers,
SessionOptions optimized_model_filepath: onnxruntime/core/optimizer/matmul_transpose_fusion.cc,
matmul_scale_fusion.cc, constant_folding.cc), and the reference answers in
solutions/walkthroughs/L0_07_performance_investigation.py, outside the package.
"""
import json
import tempfile
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ortlab.capture import captured_lines
from ortlab.labs.checks import judge
from ortlab.labs.remote import learner, probe

F = TensorProto.FLOAT


# --- exercise 'self_times' --------------------------------------------------------------------------------

def profiled(fn):
    """(torch.profiler.profile, the trace's 'cpu_op' events as dicts {name, ts, dur, tid}) of one call of fn()
    after one unprofiled warm-up call."""
    import torch  # heavy: torch

    fn()
    with captured_lines(fds=(2,), python=False):  # kineto's GPU probe
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        trace = json.loads(path.read_text())
    events = [{"name": e["name"], "ts": float(e["ts"]), "dur": float(e["dur"]), "tid": int(e["tid"])}
              for e in trace["traceEvents"] if e.get("ph") == "X" and e.get("cat") == "cpu_op"]
    return prof, events


def op_events(fn):
    """The 'cpu_op' events torch.profiler records for one call of fn(): dicts {name, ts, dur, tid}, in µs."""
    return profiled(fn)[1]


def nesting(events):
    """Each event's depth (how many events it runs inside), in the order of `events`."""
    depth = [0] * len(events)
    for tid in {e["tid"] for e in events}:
        stack = []
        for i in sorted((i for i, e in enumerate(events) if e["tid"] == tid),
                        key=lambda i: (events[i]["ts"], -events[i]["dur"])):
            while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= events[i]["ts"]:
                stack.pop()
            depth[i] = len(stack)
            stack.append(i)
    return depth


def show_tree(events):
    """The events' names as a tree, each indented under the event it runs inside (no times: they vary)."""
    depth = nesting(events)
    order = sorted(range(len(events)), key=lambda i: (events[i]["ts"], -events[i]["dur"]))
    print("\n".join("    " * depth[i] + events[i]["name"] for i in order))


@probe
def self_times_of(fn, events):
    """The learner's fn(events), as a list of floats (one per event), or a str saying what to return instead."""
    found = fn([dict(e) for e in events])
    if isinstance(found, (str, bytes, dict)) or not hasattr(found, "__iter__"):
        return (f"return a list with one self time (µs) per event, in the order of the events, not "
                f"{type(found).__name__}")
    out = []
    for value in found:
        if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
            return f"each self time must be a number of µs, not {value!r}"[:160]
        out.append(float(value))
    return out


def check_self_times(fn):
    """Exercise 'self_times': fn(events) -> [self time of each event, µs], checked on a profile the check
    records against torch.profiler's own self CPU time per op."""
    judge("self_times", "l0_07.self_times", learner(fn))


# --- exercise 'fused_matmuls' -----------------------------------------------------------------------------

def matmul_model():
    """Six MatMuls an attention block and its projections write: q @ k^T (a Transpose swapping the last two
    axes), probs @ v with v's head axis moved, x @ W^T of an initializer W, a^T @ b where a^T is also read by a
    Relu, c^T @ d, and x @ W2 scaled by 0.125."""
    n = helper.make_node
    rng = np.random.default_rng(0)
    nodes = [n("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2], name="t_keys"),
             n("MatMul", ["q", "kt"], ["scores"], name="mm_scores"),
             n("Transpose", ["v"], ["vh"], perm=[0, 2, 1, 3], name="t_heads"),
             n("MatMul", ["probs", "vh"], ["context"], name="mm_context"),
             n("Transpose", ["W"], ["Wt"], perm=[1, 0], name="t_weight"),
             n("MatMul", ["x", "Wt"], ["projected"], name="mm_projected"),
             n("Transpose", ["a"], ["at"], perm=[1, 0], name="t_shared"),
             n("MatMul", ["at", "b"], ["ab"], name="mm_shared"),
             n("Relu", ["at"], ["relu_at"], name="relu"),
             n("Transpose", ["c"], ["ct"], perm=[1, 0], name="t_first"),
             n("MatMul", ["ct", "d"], ["cd"], name="mm_first"),
             n("MatMul", ["x", "W2"], ["m2"], name="mm_scaled"),
             n("Mul", ["m2", "eighth"], ["scaled"], name="scale")]
    shapes = {"q": [2, 4, 8, 16], "k": [2, 4, 8, 16], "v": [2, 8, 4, 16], "probs": [2, 4, 8, 8], "x": [8, 16],
              "a": [16, 8], "b": [16, 8], "c": [16, 8], "d": [16, 8]}
    inputs = [helper.make_tensor_value_info(name, F, shape) for name, shape in shapes.items()]
    outputs = [helper.make_tensor_value_info(o, F, None)
               for o in ("scores", "context", "projected", "ab", "relu_at", "cd", "scaled")]
    inits = [numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W"),
             numpy_helper.from_array(rng.standard_normal((16, 16)).astype(np.float32), "W2"),
             numpy_helper.from_array(np.array(0.125, np.float32), "eighth")]
    graph = helper.make_graph(nodes, "matmuls", inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def describe(model):
    """The model as text: graph inputs with their shapes, initializers, each node with its attributes."""
    def dims(info):
        return [d.dim_param or d.dim_value for d in info.type.tensor_type.shape.dim]
    lines = [f"input        {i.name}: {dims(i)}" for i in model.graph.input]
    for t in model.graph.initializer:
        value = numpy_helper.to_array(t)
        lines.append(f"initializer  {t.name} = {value.tolist()}" if value.size == 1
                     else f"initializer  {t.name}: {value.dtype}{list(value.shape)}")
    for node in model.graph.node:
        attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        lines.append(f"node         {node.name}: {node.op_type}({', '.join(node.input)}) -> {', '.join(node.output)}"
                     + (f"  {attributes}" if attributes else ""))
    return "\n".join(lines)


@probe
def predicted_fusions(fn):
    """The learner's fn(), as {"fused": [MatMul names], "transposes_left": [Transpose names]}, or a str saying
    what to return instead."""
    found = fn()
    if not isinstance(found, dict):
        return ("return a dict {'fused': {MatMul names}, 'transposes_left': {Transpose names}}, not "
                f"{type(found).__name__}")
    for key in ("fused", "transposes_left"):
        if key not in found:
            return f"your dict has no {key!r} key: return {{'fused': {{...}}, 'transposes_left': {{...}}}}"
        if isinstance(found[key], (str, bytes, dict)) or not hasattr(found[key], "__iter__"):
            return f"under {key!r} give a set of node names, not {type(found[key]).__name__}"
    return {key: sorted(str(v) for v in found[key]) for key in ("fused", "transposes_left")}


def check_fused_matmuls(fn):
    """Exercise 'fused_matmuls': fn() -> {"fused": MatMuls ORT turns into FusedMatMul, "transposes_left":
    Transposes still in the graph} for matmul_model() at level extended on the CPU EP, checked against the
    graph ORT saves."""
    judge("fused_matmuls", "l0_07.fused_matmuls", learner(fn))

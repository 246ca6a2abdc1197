"""Views of a session's execution plan and of one run through it, for the L2_01 walkthrough.

What ORT keeps inside onnxruntime/core/framework/session_state.cc (the OrtValueNameIdxMap and the
SequentialExecutionPlan with its release actions, sequential_execution_plan.h) and what its
ExecutionFrame holds while sequential_executor.cc runs, shown from an ortlab.engine.InferenceSession:

    plan_table(sess)        one row per step: node, op, EP, value indices read, written, released
    value_table(sess)       one row per value index: name, kind, its writer, last reader, release
    lifetimes(sess)         plain data: each produced value's Lifetime (ortlab.memory's): writer, last reader
    released_after(sess)    plain data: the step after which the plan releases each value
    trace_run(sess, feeds)  run once and watch the frame after every step (a Trace: .table(),
                            .memory_table(), .synchronized)
    plot_lifetimes(traces)  the picture: one bar per value across the steps, bytes in use below

Nothing here runs a kernel or frees a value itself: trace_run runs the session's own executor and
watches it through the executor's profiler hook and the EPs' synchronize.
"""
from dataclasses import dataclass, field

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ortlab.engine.execution_frame import nbytes
from ortlab.memory.lifetimes import Lifetime
from ortlab.onnx_defs import make_model, op_name
from ortlab.viz import Table

FEED, INITIALIZER, OUTPUT, INTERMEDIATE, UNREAD = "feed", "initializer", "graph output", "intermediate", "unread"


def two_branch_model(width=256, batch=8, seed=0):
    """The walkthrough's model: x -> MatMul -> Relu, then two heads of `width` features (MatMul,
    Sigmoid, ReduceSum; MatMul, Tanh, LayerNormalization whose Mean output nobody reads, ReduceSum)
    added into y; the first head's sum `ya` is a second graph output. Nodes are listed with the
    heads interleaved, as an exporter may write them. Returns (model, feeds)."""
    rng = np.random.default_rng(seed)

    def weight(name, *shape):
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.3).astype(np.float32), name)

    inits = [weight("W1", 16, 32), weight("Wa", 32, width), weight("Wb", 32, width),
             numpy_helper.from_array(np.ones(width, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(width, np.float32), "beta"),
             numpy_helper.from_array(np.array([1], np.int64), "axes")]
    node = helper.make_node
    nodes = [node("MatMul", ["x", "W1"], ["h"], name="fc"),
             node("Relu", ["h"], ["r"], name="relu"),
             node("MatMul", ["r", "Wa"], ["a"], name="a_fc"),
             node("MatMul", ["r", "Wb"], ["b"], name="b_fc"),
             node("Sigmoid", ["a"], ["sa"], name="a_act"),
             node("Tanh", ["b"], ["tb"], name="b_act"),
             node("ReduceSum", ["sa", "axes"], ["ya"], name="a_sum"),
             node("LayerNormalization", ["tb", "gamma", "beta"], ["nb", "b_mean"], name="b_norm", axis=-1),
             node("ReduceSum", ["nb", "axes"], ["yb"], name="b_sum"),
             node("Add", ["ya", "yb"], ["y"], name="add")]
    f = TensorProto.FLOAT
    graph = helper.make_graph(nodes, "two_branches", [helper.make_tensor_value_info("x", f, [batch, 16])],
                              [helper.make_tensor_value_info("y", f, [batch, 1]),
                               helper.make_tensor_value_info("ya", f, [batch, 1])], inits)
    return make_model(graph), {"x": rng.standard_normal((batch, 16)).astype(np.float32)}


# --- the plan, as SessionState computed it ----------------------------------------------------------
def _state(sess):
    return getattr(sess, "state", sess)


def value_kinds(sess):
    """{value index: kind}: 'feed', 'initializer', 'graph output', 'intermediate' (read, then
    released) or 'unread' (written, read by no node: kept to the end of the run)."""
    state = _state(sess)
    graph = state.graph
    read = {s for step in state.steps for s in step.inputs + [slot for _, slot in step.implicit] if s >= 0}
    kinds = {}
    for slot, name in enumerate(state.value_names):
        if name in graph.initializers:
            kinds[slot] = INITIALIZER
        elif name in graph.inputs:
            kinds[slot] = FEED
        elif name in graph.outputs:
            kinds[slot] = OUTPUT
        else:
            kinds[slot] = INTERMEDIATE if slot in read else UNREAD
    return kinds


def _indices(slots):
    return " ".join(str(s) if s >= 0 else "-" for s in slots) or "-"


def plan_table(sess):
    """The execution plan: per step the node, its op, its EP, and the frame indices it reads,
    writes and releases after it runs (ORT: SequentialExecutionPlan's steps and release actions)."""
    rows = [(k, step.node.name or step.node.output_names[0], op_name(step.node.op_type, step.node.domain),
             step.provider.type.replace("ExecutionProvider", ""), _indices(step.inputs), _indices(step.outputs),
             _indices(step.releases)) for k, step in enumerate(_state(sess).steps)]
    return Table(("step", "node", "op", "EP", "reads", "writes", "releases"), rows)


def _writers_and_readers(state):
    writer, last_reader = {}, {}
    for k, step in enumerate(state.steps):
        for slot in step.outputs:
            if slot >= 0:
                writer[slot] = k
        for slot in step.inputs + [slot for _, slot in step.implicit]:
            if slot >= 0:
                last_reader[slot] = k
    return writer, last_reader


def value_table(sess):
    """The value index map (ORT: OrtValueNameIdxMap) and each value's fate: the step writing it, the
    last step reading it, and when the plan frees it."""
    state = _state(sess)
    kinds = value_kinds(state)
    writer, last_reader = _writers_and_readers(state)
    released = released_after(state)
    fate = {FEED: "never (the caller's)", INITIALIZER: "never (the session's)", OUTPUT: "never (fetched)",
            UNREAD: "end of run (no reader)"}
    rows = [(slot, name, kinds[slot], writer.get(slot, "-"), last_reader.get(slot, "-"),
             f"after step {released[slot]}" if slot in released else fate.get(kinds[slot], "?"))
            for slot, name in enumerate(state.value_names)]
    return Table(("index", "value", "kind", "written at", "last read at", "released"), rows)


def lifetimes(sess):
    """{value name: Lifetime(defined_at, last_use)} (ortlab.memory's Lifetime) for each value a step
    writes, in plan order: the step writing it and the last step reading it (None: nobody reads it)."""
    state = _state(sess)
    writer, last_reader = _writers_and_readers(state)
    return {state.value_names[slot]: Lifetime(first, last_reader.get(slot))
            for slot, first in sorted(writer.items(), key=lambda kv: (kv[1], kv[0]))}


def released_after(sess):
    """{value index: the step after which the plan releases it}: the last reader of any value living in its
    buffer (ORT's release actions); a value the plan never releases is not listed."""
    return {slot: k for k, step in enumerate(_state(sess).steps) for slot in step.releases}


def _frame_spans(state):
    """[(name, slot, first, last)]: each written value in the frame from its writer to its release (the
    last step when never released), in plan order."""
    released, end = released_after(state), len(state.steps) - 1
    return [(name, state.index_of[name], life.defined_at, released.get(state.index_of[name], end))
            for name, life in lifetimes(state).items()]


# --- one run, watched -------------------------------------------------------------------------------
@dataclass
class TraceStep:
    """The frame right after one step computed (before its releases)."""

    index: int
    step: object
    filled: tuple        # value indices holding a value
    bytes_in_use: int    # bytes the frame had allocated (feeds and initializers not counted, as ORT)
    values: list = field(repr=False, default_factory=list)  # the frame's values (references, not copies)
    freed: int = 0       # bytes the step's releases give back (a shared buffer only with its last value)

    @property
    def bytes_after_release(self):
        return self.bytes_in_use - self.freed


@dataclass
class Trace:
    """What trace_run saw: the fetched outputs, the frame after each step, the EPs synchronized
    after the last step, and the frame itself."""

    state: object
    outputs: list
    steps: list
    synchronized: list   # (steps run before the call, EP type)
    frame: object = field(repr=False, default=None)
    title: str = ""

    @property
    def peak_bytes(self):
        return max((s.bytes_in_use for s in self.steps), default=0)

    def strip(self, row):
        """The frame's allocated slots after a step, one character each: '+' written by the step,
        '-' released after it, '#' held, '.' empty (feeds and initializers, always held, left out)."""
        first = min((slot for _, slot, _, _ in _frame_spans(self.state)), default=0)
        chars = []
        for slot in range(first, len(self.state.value_names)):
            if slot in row.step.releases:
                chars.append("-")
            elif slot in row.step.outputs:
                chars.append("+")
            else:
                chars.append("#" if slot in row.filled else ".")
        return "".join(chars)

    def table(self):
        """Step by step: the node, the slots it wrote and released, the frame strip, the bytes held."""
        rows = [(r.index, r.step.node.name or r.step.node.output_names[0], _indices(r.step.outputs),
                 _indices(r.step.releases), self.strip(r), r.bytes_in_use, r.bytes_after_release)
                for r in self.steps]
        return Table(("step", "node", "writes", "releases", "frame", "bytes held", "after release"), rows)

    def memory_table(self):
        """Where each step's outputs live: the step's EP, and per output the library whose object
        the frame holds (numpy: host memory; torch: a device EP's tensors)."""
        names = self.state.value_names
        rows = [(r.step.node.name or r.step.node.output_names[0], r.step.node.op_type,
                 r.step.provider.type.replace("ExecutionProvider", ""),
                 ", ".join(f"{names[s]}: {_held_as(r.values[s])}" for s in r.step.outputs if s >= 0))
                for r in self.steps]
        return Table(("node", "op", "EP", "outputs held as"), rows)


def _held_as(value):
    """'numpy' or 'torch' (the library whose object holds a value), 'None' for an empty slot."""
    return "None" if value is None else type(value).__module__.split(".")[0]


class _Watcher:
    """Stands in the executor's profiler slot: records the frame after each node, then hands the
    event on to the real profiler when there is one."""

    def __init__(self, inner):
        self.inner, self.steps, self.frame = inner, [], None

    def node_event(self, step, frame, start, end):
        self.frame = frame
        values = list(frame.values)
        self.steps.append(TraceStep(len(self.steps), step, tuple(i for i, v in enumerate(values) if v is not None),
                                    frame.bytes_in_use, values, frame.bytes_freed_by(step.releases)))
        if self.inner:
            self.inner.node_event(step, frame, start, end)


def trace_run(sess, feeds, output_names=None, run_options=None, title=""):
    """Run `sess` once (its own run(), executor and kernels) and return a Trace of the frame after
    every step and of the EPs' synchronize calls at the end of the run."""
    executor, watcher, synced = sess.executor, _Watcher(sess.executor.profiler), []
    providers = list(sess.state.providers.values())

    def watched(provider):
        original = provider.synchronize

        def synchronize():
            synced.append((len(watcher.steps), provider.type))
            return original()
        return synchronize

    executor.profiler = watcher
    for provider in providers:
        provider.synchronize = watched(provider)  # an instance attribute over the class's method
    try:
        outputs = sess.run(output_names, feeds, run_options)
    finally:
        executor.profiler = watcher.inner
        for provider in providers:
            del provider.synchronize
    return Trace(sess.state, outputs, watcher.steps, synced, watcher.frame, title)


# --- the picture ------------------------------------------------------------------------------------
COLOURS = {INTERMEDIATE: "tab:blue", OUTPUT: "tab:green", UNREAD: "tab:orange"}


def plot_lifetimes(*traces, titles=()):
    """One panel per trace: a bar per value the run allocates, from the step writing it to the step
    after which it is released, as thick as the value is large (green: graph outputs, orange: read
    by nobody, both kept to the end), the steps across; below, the bytes the frame holds after each
    step computes, its peak marked."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    figure, axes = plt.subplots(2, len(traces), figsize=(4.8 * len(traces), 5.2), squeeze=False,
                                gridspec_kw={"height_ratios": (3, 1.3)})
    top_kib = max(t.peak_bytes for t in traces) / 1024 * 1.25
    for column, trace in enumerate(traces):
        top, bottom = axes[0][column], axes[1][column]
        spans, kinds = _frame_spans(trace.state), value_kinds(trace.state)
        sizes = [nbytes(trace.steps[first].values[slot]) for _, slot, first, _ in spans]
        for row, ((_, slot, first, last), size) in enumerate(zip(spans, sizes)):
            top.barh(row, last - first + 0.8, left=first - 0.4,
                     height=0.2 + 0.6 * size / max(max(sizes), 1), color=COLOURS.get(kinds[slot], "0.5"))
        top.set_yticks(range(len(spans)), [name for name, *_ in spans], fontsize=8)
        top.invert_yaxis()
        top.set_title(titles[column] if column < len(titles) else trace.title, fontsize=10)
        names = [r.step.node.name or r.step.node.output_names[0] for r in trace.steps]
        held = [r.bytes_in_use / 1024 for r in trace.steps]
        bottom.step(range(len(held)), held, where="mid", color="0.3")
        peak = int(np.argmax(held))
        bottom.plot(peak, held[peak], "o", color="tab:red")
        bottom.annotate(f"peak {trace.peak_bytes / 1024:.1f} KiB", (peak, held[peak]), fontsize=8,
                        xytext=(4, -12), textcoords="offset points")
        bottom.set_xticks(range(len(names)), names, rotation=60, fontsize=8)
        top.set_xticks(range(len(names)), [])
        bottom.set_ylim(0, top_kib)
        bottom.set_ylabel("KiB held" if column == 0 else "")
        for ax in (top, bottom):
            ax.set_xlim(-0.6, len(names) - 0.4)
            ax.grid(axis="x", alpha=0.3)
    handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in COLOURS.values()]
    figure.legend(handles, ["released by the plan (with its buffer)", "graph output (kept)", "read by nobody (kept)"],
                  ncol=3, fontsize=8, loc="lower center")
    figure.tight_layout(rect=(0, 0.05, 1, 1))
    plt.show()

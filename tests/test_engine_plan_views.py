"""ortlab.walkthroughs.execution_engine against independent references: ORT's outputs and execution order, and
value lifetimes and bytes worked out here from the ONNX graph and ORT's own arrays."""
import matplotlib
import numpy as np
import pytest

from ortlab import session
from ortlab.engine import InferenceSession, RunOptions, SessionOptions
from ortlab.walkthroughs import execution_engine as pv
from ortlab.profiling import load_ort_profile

matplotlib.use("Agg")
CPU = ["CPUExecutionProvider"]


@pytest.fixture(scope="module")
def model_and_feeds():
    return pv.two_branch_model()


def engine(model, order="default", **options):
    options.setdefault("enable_mem_pattern", False)  # each tensor its own buffer: the releases show in bytes
    return InferenceSession(model, SessionOptions(graph_optimization_level=0, execution_order=order,
                                                  log_severity_level=3, **options))


def expected_spans(model, order):
    """{value: (first step, last step)} from the ONNX graph and an execution order (node names):
    written by its producer, held until its last reader, to the end when it is a graph output
    or nobody reads it."""
    nodes = {n.name: n for n in model.graph.node}
    position = {name: k for k, name in enumerate(order)}
    outputs = {o.name for o in model.graph.output}
    spans = {}
    for name in order:
        for value in nodes[name].output:
            readers = [position[n.name] for n in model.graph.node if value in n.input]
            last = len(order) - 1 if value in outputs or not readers else max(readers)
            spans[value] = (position[name], last)
    return spans


def expected_bytes(model, feeds, spans, steps, order="default"):
    """Bytes held after each step computes. Without the memory pattern ORT still follows its allocation
    plan: a value it reuses a buffer for (in place, or from the freelist) lives in that buffer, which is held
    from its first value's producer to the last step of any value in it. Buffers from ORT's plan
    (ortlab.memory, byte-exact against ORT in test_memory), sizes from ORT's own arrays."""
    from ortlab.memory import plan

    sizes = {output: array.nbytes for _, _, output, array in session.node_outputs(model, feeds)}
    p = plan(model, {k: v.shape for k, v in feeds.items()}, order=order)
    buffer = {}
    for v in p.values:
        origin = v
        while origin.reuses is not None:
            origin = p.value(origin.reuses)
        buffer[v.name] = origin.name
    held = {}
    for value, (a, b) in spans.items():
        first, last = held.get(buffer[value], (a, b))
        held[buffer[value]] = (min(first, a), max(last, b))
    return [sum(sizes[name] for name, (a, b) in held.items() if a <= k <= b) for k in range(steps)]


@pytest.mark.parametrize("order", ["default", "priority"])
def test_lifetimes_and_trace_match_the_graph_and_orts_order(model_and_feeds, order):
    model, feeds = model_and_feeds
    ort_order = session.execution_order(model, feeds, order=order, providers=CPU)
    sess = engine(model, order)
    spans = expected_spans(model, ort_order)
    assert {lt.name: (lt.first, lt.last) for lt in pv.lifetimes(sess)} == spans
    trace = pv.trace_run(sess, feeds)
    assert [r.step.node.name for r in trace.steps] == ort_order
    for row in trace.steps:  # the frame after each step holds exactly the values live then
        held = {sess.state.value_names[s] for s in row.filled if pv.value_kinds(sess)[s] not in ("feed", "initializer")}
        assert held == {v for v, (a, b) in spans.items() if a <= row.index <= b}
    ort = session.run_model(model, feeds)
    for name, value in zip(["y", "ya"], trace.outputs):
        np.testing.assert_allclose(value, ort[name], rtol=1e-5, atol=1e-5)
    held = expected_bytes(model, feeds, spans, len(ort_order), order)
    assert [r.bytes_in_use for r in trace.steps] == held
    assert trace.peak_bytes == max(held) == sess.last_run.peak_bytes


def test_the_order_decides_which_values_live_together_and_reuse_what_that_costs(model_and_feeds):
    """Kahn's order holds both heads' activations at once, depth first one head's: more values alive together.
    ORT's planner then lets Sigmoid and Tanh write into their MatMul's buffer (MayInplace), which here erases
    the difference in bytes held: the engine's frame holds what ORT's plan says, step by step."""
    model, feeds = model_and_feeds
    sizes = {output: array.nbytes for _, _, output, array in session.node_outputs(model, feeds)}
    values, held = {}, {}
    for order in ("default", "priority"):
        spans = expected_spans(model, session.execution_order(model, feeds, order=order, providers=CPU))
        values[order] = max(sum(sizes[v] for v, (a, b) in spans.items() if a <= k <= b)
                            for k in range(len(model.graph.node)))
        held[order] = max(expected_bytes(model, feeds, spans, len(model.graph.node), order))
        assert pv.trace_run(engine(model, order), feeds).peak_bytes == held[order]
    assert values["default"] < values["priority"]
    assert held["priority"] <= held["default"] <= values["default"] and held["priority"] < values["priority"]


def test_value_table_kinds_and_release_plan(model_and_feeds):
    model, _ = model_and_feeds
    sess = engine(model)
    rows = {r[1]: r for r in pv.value_table(sess).rows}
    assert rows["x"][2] == "feed" and rows["W1"][2] == "initializer"
    assert rows["y"][2] == "graph output" and rows["ya"][2] == "graph output"
    assert rows["b_mean"][2] == "unread" and rows["b_mean"][5] == "end of run (no reader)"
    order = [s.node.name for s in sess.state.steps]
    last_reader = max(order.index(n.name) for n in model.graph.node if "r" in n.input)
    assert rows["r"][5] == f"after step {last_reader}"
    assert [r[0] for r in pv.value_table(sess).rows] == list(range(len(sess.state.value_names)))


def test_plan_table_has_one_row_per_node_with_its_inputs_indices(model_and_feeds):
    model, _ = model_and_feeds
    sess = engine(model)
    table = pv.plan_table(sess)
    names = sess.state.value_names
    by_node = {n.name: n for n in model.graph.node}
    assert len(table.rows) == len(model.graph.node)
    for _, node, op, ep, reads, writes, _ in table.rows:
        assert op == by_node[node].op_type and ep == "CPU"
        assert [names[int(i)] for i in reads.split()] == list(by_node[node].input)
        assert [names[int(i)] for i in writes.split()] == list(by_node[node].output)


def test_only_execute_path_to_fetches_traces_the_steps_orts_runs(model_and_feeds):
    model, feeds = model_and_feeds
    import onnxruntime as ort

    ro = ort.RunOptions()
    ro.only_execute_path_to_fetches = True
    ort_ran = session.execution_order(model, feeds, fetches=["ya"], run_options=ro, providers=CPU)
    trace = pv.trace_run(engine(model), feeds, ["ya"], RunOptions(only_execute_path_to_fetches=True))
    assert [r.step.node.name for r in trace.steps] == ort_ran
    np.testing.assert_allclose(trace.outputs[0], session.run_model(model, feeds)["ya"], rtol=1e-5, atol=1e-5)


def test_trace_restores_the_executor_and_keeps_the_profile(model_and_feeds, tmp_path):
    model, feeds = model_and_feeds
    sess = engine(model, enable_profiling=True, profile_file_prefix=str(tmp_path / "p"))
    profiler = sess.executor.profiler
    trace = pv.trace_run(sess, feeds)
    assert sess.executor.profiler is profiler
    assert all("synchronize" not in vars(p) for p in sess.state.providers.values())
    profile = load_ort_profile(sess.end_profiling())
    assert [e.name for e in profile.events] == [r.step.node.name for r in trace.steps]


def test_trace_sees_the_device_ep_and_its_synchronize_after_the_last_step(model_and_feeds):
    model, feeds = model_and_feeds
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0, log_severity_level=3),
                            providers=["TritonExecutionProvider"])
    trace = pv.trace_run(sess, feeds)
    assert sorted(ep for _, ep in trace.synchronized) == ["CPUExecutionProvider", "TritonExecutionProvider"]
    assert all(after == len(trace.steps) for after, _ in trace.synchronized)
    for name, value in zip(["y", "ya"], trace.outputs):
        np.testing.assert_allclose(value, session.run_model(model, feeds)[name], rtol=1e-5, atol=1e-5)
    on_device = {r.step.node.name for r in trace.steps
                 if all(hasattr(r.values[s], "detach") for s in r.step.outputs if s >= 0)}
    assert {"b_norm", "b_sum", "a_sum"} <= on_device and not {"fc", "relu", "add"} & on_device
    held = {row[0]: row[3] for row in trace.memory_table().rows}
    assert held["b_norm"] == "nb: torch, b_mean: torch" and held["add"] == "y: numpy"


def test_strip_marks_written_and_released_slots(model_and_feeds):
    model, feeds = model_and_feeds
    trace = pv.trace_run(engine(model), feeds)
    first = min(lt.slot for lt in pv.lifetimes(trace.state))
    for row in trace.steps:
        strip = trace.strip(row)
        assert len(strip) == len(trace.state.value_names) - first
        assert {i + first for i, c in enumerate(strip) if c == "+"} == {s for s in row.step.outputs if s >= 0}
        assert {i + first for i, c in enumerate(strip) if c == "-"} == set(row.step.releases)
    assert "Table" in type(trace.table()).__name__ and len(trace.table().rows) == len(trace.steps)


def test_plot_lifetimes_draws_one_panel_per_trace(model_and_feeds, monkeypatch):
    import matplotlib.pyplot as plt

    model, feeds = model_and_feeds
    shown = []
    monkeypatch.setattr(plt, "show", lambda: shown.append(plt.gcf()))
    traces = [pv.trace_run(engine(model, order), feeds, title=order) for order in ("default", "priority")]
    pv.plot_lifetimes(*traces)
    axes = shown[0].axes
    assert len(axes) == 4 and [a.get_title() for a in axes[:2]] == ["default", "priority"]
    assert len(axes[0].patches) == len(pv.lifetimes(traces[0].state))
    plt.close("all")

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


def expected_reads(model, order):
    """{value: (writer's step, last reader's step or None)} from the ONNX graph and an execution order."""
    nodes = {n.name: n for n in model.graph.node}
    position = {name: k for k, name in enumerate(order)}
    found = {}
    for name in order:
        for value in nodes[name].output:
            readers = [position[n.name] for n in model.graph.node if value in n.input]
            found[value] = (position[name], max(readers) if readers else None)
    return found


def plan_buffers(model, feeds, order="default"):
    """{value: the value whose buffer it lives in} from ORT's plan (ortlab.memory, byte-exact against ORT
    in test_memory)."""
    from ortlab.memory import plan

    p = plan(model, {k: v.shape for k, v in feeds.items()}, order=order)
    buffer = {}
    for v in p.values:
        origin = v
        while origin.reuses is not None:
            origin = p.value(origin.reuses)
        buffer[v.name] = origin.name
    return buffer


def expected_releases(model, order, buffers=None):
    """{value: the step after which it is released}: the last reader of any value living in its buffer
    (ORT's release actions; `buffers` from plan_buffers, or each value its own); a graph output, or a value
    in a buffer nobody reads, is never released."""
    reads = expected_reads(model, order)
    buffers = buffers or {v: v for v in reads}
    outputs = {o.name for o in model.graph.output}
    ends = {}
    for value, (_, last) in reads.items():
        if last is not None:
            ends[buffers[value]] = max(ends.get(buffers[value], last), last)
    return {v: ends[buffers[v]] for v in reads if v not in outputs and buffers[v] in ends}


def expected_spans(model, order, buffers=None):
    """{value: (first step, last step)} from the ONNX graph and an execution order (node names): written
    by its producer, held until its release, to the end when it is never released."""
    released = expected_releases(model, order, buffers)
    return {v: (first, released.get(v, len(order) - 1)) for v, (first, _) in expected_reads(model, order).items()}


def expected_bytes(model, feeds, spans, steps, order="default"):
    """Bytes held after each step computes. Without the memory pattern ORT still follows its allocation
    plan: a value it reuses a buffer for (in place, or from the freelist) lives in that buffer, which is held
    from its first value's producer to the last step of any value in it. Buffers from ORT's plan
    (ortlab.memory, byte-exact against ORT in test_memory), sizes from ORT's own arrays."""
    sizes = {output: array.nbytes for _, _, output, array in session.node_outputs(model, feeds)}
    buffer = plan_buffers(model, feeds, order)
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
    buffers = plan_buffers(model, feeds, order)
    spans = expected_spans(model, ort_order, buffers)
    assert {name: (life.defined_at, life.last_use) for name, life in pv.lifetimes(sess).items()} == \
        expected_reads(model, ort_order)
    assert {sess.state.value_names[slot]: k for slot, k in pv.released_after(sess).items()} == \
        expected_releases(model, ort_order, buffers)
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
    """Without the freelist, LayerNormalization's unread Mean has a buffer of its own that nobody reads:
    kept to the end. With it, ORT's plan gives that freed buffer to a later value of the same size, so the
    buffer (and Mean with it) goes after that value's last reader."""
    model, feeds = model_and_feeds
    rows = {r[1]: r for r in pv.value_table(engine(model, enable_mem_reuse=False)).rows}
    assert rows["b_mean"][2] == "unread" and rows["b_mean"][5] == "end of run (no reader)"
    sess = engine(model)
    rows = {r[1]: r for r in pv.value_table(sess).rows}
    assert rows["x"][2] == "feed" and rows["W1"][2] == "initializer"
    assert rows["y"][2] == "graph output" and rows["ya"][2] == "graph output"
    order = [s.node.name for s in sess.state.steps]
    buffers = plan_buffers(model, feeds)
    tenants = [v for v, b in buffers.items() if b == "b_mean" and v != "b_mean"]
    assert tenants and rows["b_mean"][2] == "unread"
    assert rows["b_mean"][5] == f"after step {expected_releases(model, order, buffers)['b_mean']}"
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
    first = min(trace.state.index_of[name] for name in pv.lifetimes(trace.state))
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

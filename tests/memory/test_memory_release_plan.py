"""The engine's release plan on held-out models, ones nobody tuned it for: outputs equal ORT 1.19.2's under every
SessionOptions combination, and the plan never frees or overwrites a value that is read later.

Every run is compared with onnxruntime.InferenceSession on the same model (CPU EP, no optimization).
`assert_plan_safe` proves, from the session state alone, that (1) no step reads a value an earlier step
released, (2) no feed, weight or graph output is ever released, and (3) no output is written into a buffer
(in place through MayInplace, or taken from the freelist) while a value living there is still read or
fetched; an Alias output (Reshape, Squeeze, Identity) is a view of the same bytes and writes nothing.
The models: hand-built hostile graphs (outputs also read, feeds and weights as outputs, unread and optional
outputs, in-place and alias chains, strings, sequences), If/Loop/Scan/SequenceMap bodies reading outer values
(also through the graph transformers, which must keep what a subgraph reads), gradient graphs, a device EP
with Memcpy nodes, runs with other shapes, only_execute_path_to_fetches, bound outputs, and onnx's backend
cases that hold a subgraph.
"""
import itertools

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlab.engine import InferenceSession, SessionOptions
from ortlab.memory import plan as memory_plan
from ortlab.memory.allocation_planner import K_REUSE

pytestmark = pytest.mark.heldout

F = TensorProto.FLOAT
COMBOS = [dict(enable_mem_pattern=p, enable_mem_reuse=r, execution_order=o, graph_optimization_level=lv)
          for p, r, o, lv in itertools.product([True, False], [True, False], ["default", "priority"], [0, 99])]


def combo_id(c):
    return (f"{'pat' if c['enable_mem_pattern'] else 'nopat'}-{'reuse' if c['enable_mem_reuse'] else 'noreuse'}-"
            f"{c['execution_order']}-L{c['graph_optimization_level']}")


# ----------------------------------------------------------------------------------------------
# The checker
# ----------------------------------------------------------------------------------------------
def _reads(step):
    return [s for s in step.inputs if s >= 0] + [slot for _, slot in step.implicit]


def plan_problems(sess):
    """Every way the session's steps and releases could lose or overwrite a value still needed."""
    state = sess.state
    names, plan = state.value_names, state.allocation_plan
    protected = ({state.index_of[n] for n in state.graph.outputs} | {state.index_of[n] for n in state.graph.inputs}
                 | set(state.initializers))
    last_read = {}
    for k, step in enumerate(state.steps):
        for slot in _reads(step):
            last_read[slot] = k
    defined = {s: k for k, step in enumerate(state.steps) for s in step.outputs if s >= 0}
    residents = {}
    for value in plan.values:
        residents.setdefault(plan.buffer_of(value.index), []).append(value.index)
    problems, released = [], {}
    for k, step in enumerate(state.steps):
        problems += [f"{names[s]} read at step {k}, released after step {released[s]}"
                     for s in _reads(step) if s in released]
        kdef = state.kernel_defs[step.node.index]
        aliased = {o for _, o in kdef.alias}
        for out_num, slot in enumerate(step.outputs):
            value = plan.values[slot] if slot >= 0 else None
            if value is None or value.kind != K_REUSE:
                continue
            if value.inplace and (out_num in aliased or kdef.variadic_alias):
                continue  # a view of the same bytes: nothing is overwritten
            for other in residents[value.reused_buffer]:
                if other == slot or (other not in protected and defined.get(other, -1) >= k):
                    continue  # itself, or a later tenant of the buffer
                if other in protected or last_read.get(other, -1) > k:
                    problems.append(f"{names[slot]} written at step {k} into the buffer of {names[other]}, "
                                    "which is still read or fetched")
        for slot in step.releases:
            if slot in protected:
                problems.append(f"{names[slot]} (a feed, weight or graph output) released after step {k}")
            released.setdefault(slot, k)
    return problems


def assert_plan_safe(sess):
    problems = plan_problems(sess)
    assert not problems, "\n".join(problems)


def assert_plan_is_memory_plans(sess, feeds, options):
    """Where ortlab.memory.plan accepts the model, the session's plan has its kinds and reuse."""
    graph = sess.planning_graph()
    shapes = {n: np.shape(v) for n, v in feeds.items()}
    try:
        expected = memory_plan(graph, shapes, order=options["execution_order"],
                               enable_mem_reuse=options["enable_mem_reuse"],
                               declarations=lambda node: sess.state.kernel_defs[node.index])
    except Exception:  # noqa: BLE001 (a graph the static planner refuses: nothing to compare)
        return
    ours = sess.state.allocation_plan
    names = {v.index: v.name for v in ours.values}
    got = {v.name: (v.kind, names.get(v.reused_buffer) if v.kind == K_REUSE else None) for v in ours.values}
    for v in expected.values:
        assert got.get(v.name, (v.kind, v.reuses)) == (v.kind, v.reuses), v.name


# ----------------------------------------------------------------------------------------------
# Running against ORT
# ----------------------------------------------------------------------------------------------
def ort_outputs(model, feeds):
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


def assert_same(expected, got):
    assert len(expected) == len(got)
    for e, g in zip(expected, got):
        e, g = np.asarray(e), np.asarray(g)
        assert e.dtype == g.dtype and e.shape == g.shape, (e.dtype, e.shape, g.dtype, g.shape)
        if e.dtype == object:
            assert e.tolist() == g.tolist()
        else:
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6)


def assert_peak_holds_outputs(sess, feeds, outputs):
    """Every output this run made (not a feed passed through) is alive at the end of the run, so the
    run's peak is at least their bytes together."""
    made = [o for o in outputs if isinstance(o, np.ndarray)
            and not any(np.shares_memory(o, f) for f in feeds.values())]
    distinct = [o for i, o in enumerate(made) if not any(np.shares_memory(o, p) for p in made[:i])]
    assert sess.last_run.peak_bytes >= sum(o.nbytes for o in distinct) > 0, (sess.last_run, distinct)


def check_every_combo(model, feeds, runs=2):
    expected = ort_outputs(model, feeds)
    for options in COMBOS:
        sess = InferenceSession(model.SerializeToString(), SessionOptions(log_severity_level=3, **options))
        assert_plan_safe(sess)
        assert_plan_is_memory_plans(sess, feeds, options)
        for _ in range(runs):
            fed = {k: v.copy() for k, v in feeds.items()}
            got = sess.run(None, fed)
            assert_same(expected, got)
            assert_peak_holds_outputs(sess, fed, got)


# ----------------------------------------------------------------------------------------------
# Models
# ----------------------------------------------------------------------------------------------
def _model(nodes, inputs, outputs, initializers=(), opset=17):
    value = helper.make_tensor_value_info
    graph = helper.make_graph(nodes, "g", [value(n, t, s) for n, t, s in inputs],
                              [value(n, t, s) for n, t, s in outputs], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8
    return model


def _x(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def output_also_read():
    """a is a graph output and read by two later nodes; an in-place chain runs past it."""
    n = helper.make_node
    return _model([n("Relu", ["x"], ["a"]), n("Sigmoid", ["a"], ["b"]), n("Tanh", ["b"], ["c"]),
                   n("Neg", ["c"], ["d"]), n("Add", ["a", "d"], ["y"])],
                  [("x", F, [4, 8])], [("a", F, [4, 8]), ("y", F, [4, 8])]), {"x": _x(4, 8)}


def input_and_weight_are_outputs():
    """A feed and an initializer that are graph outputs, each also aliased (Reshape, Identity, Squeeze) and
    read through MayInplace ops."""
    n = helper.make_node
    w = numpy_helper.from_array(_x(1, 4, 8, seed=1), "w")
    shape = numpy_helper.from_array(np.array([8, 4], np.int64), "shape")
    return _model([n("Reshape", ["x", "shape"], ["xr"]), n("Relu", ["xr"], ["r"]), n("Identity", ["x"], ["xi"]),
                   n("Sigmoid", ["xi"], ["s"]), n("Squeeze", ["w"], ["ws"]), n("Tanh", ["ws"], ["t"]),
                   n("Reshape", ["r", "shape"], ["rr"]), n("Add", ["s", "t"], ["y"])],
                  [("x", F, [4, 8])], [("x", F, [4, 8]), ("w", F, [1, 4, 8]), ("y", F, [4, 8]), ("rr", F, [8, 4])],
                  [w, shape]), {"x": _x(4, 8)}


def unread_and_optional_outputs():
    """TopK indices nobody reads, Dropout's mask left off, LayerNormalization's Mean read only later, then a
    chain that can take freed buffers."""
    n = helper.make_node
    k = numpy_helper.from_array(np.array([3], np.int64), "k")
    scale = numpy_helper.from_array(np.ones(8, np.float32), "scale")
    return _model([n("TopK", ["x", "k"], ["vals", "idx"]), n("Dropout", ["x"], ["d"]),
                   n("LayerNormalization", ["d", "scale"], ["ln", "mean", ""], axis=-1),
                   n("Relu", ["ln"], ["r"]), n("Sigmoid", ["r"], ["s"]), n("Mul", ["s", "mean"], ["y"]),
                   n("ReduceSum", ["vals"], ["z"], keepdims=0)],
                  [("x", F, [4, 8])], [("y", F, [4, 8]), ("z", F, [])], [k, scale]), {"x": _x(4, 8)}


def _branch(name, node, out, shape):
    return helper.make_graph([node], name, [], [helper.make_tensor_value_info(out, F, shape)])


def if_reads_outer_after_last_explicit_reader():
    """w's last explicit reader runs before the If whose branch reads w; with freed buffers of w's size
    around, a release at the explicit reader would let a later node overwrite w."""
    n = helper.make_node
    then_g = _branch("then", n("Add", ["w", "v"], ["t"]), "t", [4, 8])
    else_g = _branch("else", n("Sub", ["w", "v"], ["e"]), "e", [4, 8])
    return _model([n("Mul", ["x", "x"], ["w"]), n("Relu", ["w"], ["v"]), n("Sigmoid", ["v"], ["p"]),
                   n("Tanh", ["p"], ["q"]), n("Neg", ["q"], ["u"]),
                   n("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g), n("Add", ["y", "u"], ["z"])],
                  [("x", F, [4, 8]), ("c", TensorProto.BOOL, [])], [("z", F, [4, 8])]), \
        {"x": _x(4, 8), "c": np.array(True)}


def loop_and_scan_read_outer_values(scan_reads="g"):
    """A Loop whose body reads an outer value through a nested If, and a Scan whose body reads `scan_reads`
    (an outer value, or its own running sum)."""
    n = helper.make_node
    v = helper.make_tensor_value_info
    inner_then = _branch("it", n("Add", ["acc", "w"], ["it_o"]), "it_o", [4, 8])
    inner_else = _branch("ie", n("Sub", ["acc", "w"], ["ie_o"]), "ie_o", [4, 8])
    body = helper.make_graph(
        [n("If", ["cond"], ["acc_next"], then_branch=inner_then, else_branch=inner_else),
         n("Identity", ["cond"], ["cond_out"])], "body",
        [v("i", TensorProto.INT64, []), v("cond", TensorProto.BOOL, []), v("acc", F, [4, 8])],
        [v("cond_out", TensorProto.BOOL, []), v("acc_next", F, [4, 8])])
    scan_body = helper.make_graph(
        [n("Add", ["s_acc", "row"], ["s_sum"]), n("Mul", ["s_sum", scan_reads], ["s_next"]),
         n("Identity", ["s_next"], ["s_out"])], "scan_body",
        [v("s_acc", F, [8]), v("row", F, [8])], [v("s_next", F, [8]), v("s_out", F, [8])])
    trip = numpy_helper.from_array(np.array(3, np.int64), "trip")
    cond = numpy_helper.from_array(np.array(True), "cond0")
    zero = numpy_helper.from_array(np.zeros(8, np.float32), "zero")
    return _model([n("Mul", ["x", "x"], ["w"]), n("Relu", ["x"], ["a"]), n("Sigmoid", ["a"], ["g0"]),
                   n("ReduceMean", ["g0"], ["g"], axes=[0], keepdims=0),
                   n("Neg", ["w"], ["nw"]), n("Tanh", ["nw"], ["tw"]),
                   n("Loop", ["trip", "cond0", "tw"], ["looped"], body=body),
                   n("Scan", ["zero", "looped"], ["final", "rows"], body=scan_body, num_scan_inputs=1),
                   n("Relu", ["rows"], ["y"])],
                  [("x", F, [4, 8])], [("y", F, [4, 8]), ("final", F, [8])], [trip, cond, zero], opset=16), \
        {"x": _x(4, 8)}


def loop_and_scan_read_own_values():
    return loop_and_scan_read_outer_values(scan_reads="s_sum")


def sequence_map_reads_outer_values():
    """A sequence built from a value whose last tensor reader is SequenceConstruct (its buffer is free right
    after), then mapped by a body reading outer values."""
    n = helper.make_node
    v = helper.make_tensor_value_info
    body = helper.make_graph([n("Mul", ["elem", "w"], ["m"]), n("Add", ["m", "g"], ["out"])], "body",
                             [v("elem", F, [4, 8])], [v("out", F, [4, 8])])
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    return _model([n("Mul", ["x", "x"], ["w"]), n("Relu", ["x"], ["a"]), n("Sigmoid", ["a"], ["g"]),
                   n("Neg", ["x"], ["nx"]), n("SequenceConstruct", ["x", "nx"], ["seq"]),
                   n("SequenceMap", ["seq"], ["mapped"], body=body), n("SequenceAt", ["mapped", "one"], ["y0"]),
                   n("Tanh", ["y0"], ["t"]), n("Exp", ["t"], ["y"])],
                  [("x", F, [4, 8])], [("y", F, [4, 8])], [one]), {"x": _x(4, 8)}


def strings_through_the_plan():
    """String tensors (never reused: ORT's SameSize is false for strings) next to floats."""
    n = helper.make_node
    return _model([n("Cast", ["x"], ["s"], to=TensorProto.STRING), n("Identity", ["s"], ["si"]),
                   n("Relu", ["x"], ["r"]), n("Neg", ["r"], ["y"])],
                  [("x", F, [3, 4])], [("si", TensorProto.STRING, [3, 4]), ("y", F, [3, 4])]), \
        {"x": np.array([[1.5, -2, 0, 3]] * 3, np.float32)}


MODELS = {f.__name__: f for f in (output_also_read, input_and_weight_are_outputs, unread_and_optional_outputs,
                                  if_reads_outer_after_last_explicit_reader, loop_and_scan_read_own_values,
                                  loop_and_scan_read_outer_values, sequence_map_reads_outer_values,
                                  strings_through_the_plan)}


@pytest.mark.parametrize("name", list(MODELS))
def test_heldout_model_matches_ort_under_every_option_and_its_plan_is_safe(name):
    check_every_combo(*MODELS[name]())


def test_a_string_output_runs_without_the_memory_pattern():
    """ORT never reuses a string buffer; the engine's ReusePlan frame must not try to view one as bytes
    (it failed with numpy's 'Cannot change data-type for object array')."""
    model, feeds = strings_through_the_plan()
    sess = InferenceSession(model.SerializeToString(), SessionOptions(enable_mem_pattern=False,
                                                                      graph_optimization_level=0))
    assert_same(ort_outputs(model, feeds), sess.run(None, feeds))


def test_a_value_a_loop_body_defines_is_no_outer_read_of_the_loop():
    """A nested If inside a Loop body reads the body's own input `acc` and the outer `w`: the Loop's implicit
    inputs (ORT: Node::ImplicitInputDefs) are `w` alone. Taking `acc` for an outer value handed the body
    None in its place (KernelFailure in the Loop)."""
    model, feeds = loop_and_scan_read_own_values()
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=0))
    loop = next(s.node for s in sess.state.steps if s.node.op_type == "Loop")
    assert loop.implicit_input_names() == ["w"]
    assert_same(ort_outputs(model, feeds), sess.run(None, feeds))


def test_a_scan_body_reading_an_outer_value_runs_as_in_ort():
    """onnx.reference's Scan takes no outer-scope context: a body reading an outer value failed with
    'Unable to find input' (KernelFailure); ORT runs it."""
    model, feeds = loop_and_scan_read_outer_values()
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=0))
    assert_plan_safe(sess)
    assert_same(ort_outputs(model, feeds), sess.run(None, feeds))


@pytest.mark.parametrize("name", ["mlp", "gpt"])
def test_training_graphs_match_ort_under_every_option_and_their_plans_are_safe(name):
    from engine_models import training_graph

    check_every_combo(*training_graph(name, "ortlab"), runs=1)


def symbolic_chain():
    """Symbolic batch: freelist reuse by symbolic shape; a graph output (b) read later; a branch (z) that
    only_execute_path_to_fetches may run alone."""
    n = helper.make_node
    return _model([n("Relu", ["x"], ["a"]), n("Sigmoid", ["a"], ["b"]), n("Exp", ["b"], ["c"]), n("Neg", ["c"], ["d"]),
                   n("Add", ["a", "d"], ["y"]), n("Tanh", ["x"], ["side"]), n("Mul", ["side", "side"], ["z"])],
                  [("x", F, ["N", 8])], [("y", F, ["N", 8]), ("z", F, ["N", 8]), ("b", F, ["N", 8])])


@pytest.mark.parametrize("options", COMBOS[::3], ids=combo_id)
def test_runs_with_other_shapes_paths_to_fetches_and_bound_outputs_match_ort(options):
    """One session run with batch 3, 7, 2, 7 in turn; each time every output, the path to one fetch alone
    (RunOptions.only_execute_path_to_fetches) and an IOBinding with one output bound to a caller's buffer."""
    from ortlab.engine import RunOptions

    model = symbolic_chain()
    sess = InferenceSession(model.SerializeToString(), SessionOptions(log_severity_level=3, **options))
    assert_plan_safe(sess)
    path_only = RunOptions(only_execute_path_to_fetches=True)
    for batch in (3, 7, 2, 7):
        feeds = {"x": _x(batch, 8, seed=batch)}
        y, z, b = ort_outputs(model, feeds)
        assert_same([y, z, b], sess.run(None, feeds))
        assert_same([z], sess.run(["z"], feeds, path_only))
        got = sess.run(["y"], feeds, path_only)
        assert_same([y], got)
        assert_peak_holds_outputs(sess, feeds, got)
        binding = sess.io_binding()
        binding.bind_cpu_input("x", feeds["x"])
        bound = np.empty((batch, 8), np.float32)
        binding.bind_output("b", "cpu", 0, np.float32, [batch, 8], bound.ctypes.data)
        binding.bind_output("y")
        sess.run_with_iobinding(binding)
        assert_same([b, y], binding.copy_outputs_to_cpu())
        np.testing.assert_allclose(bound, b, rtol=1e-5, atol=1e-6)
        assert sess.last_run.preplaced_fetches == ["b"]  # written into the bound buffer: no new bytes


def test_a_sequence_keeps_its_tensors_when_their_buffers_are_reused():
    """SequenceConstruct's input nx is released after it and its buffer goes to the next node's output
    (freelist reuse, without the memory pattern): the sequence must hold its own copy, as ORT's TensorSeq
    does. It held the frame's array, so SequenceAt read the Relu/Sigmoid output written over it (every
    element wrong, no error)."""
    model, feeds = sequence_map_reads_outer_values()
    sess = InferenceSession(model.SerializeToString(), SessionOptions(enable_mem_pattern=False,
                                                                      graph_optimization_level=0))
    assert_same(ort_outputs(model, feeds), sess.run(None, feeds))


PRETEND = "PretendDeviceExecutionProvider"
PRETEND_KERNELS = {  # op: (kernel, KernelDef fields), each declared as ORT's CUDA EP declares it
    "Relu": (lambda ctx: np.maximum(ctx.input(0), 0), dict(may_inplace=((0, 0),))),
    "Sigmoid": (lambda ctx: 1 / (1 + np.exp(-ctx.input(0))), dict(may_inplace=((0, 0),))),
    "Add": (lambda ctx: ctx.input(0) + ctx.input(1), dict(may_inplace=((0, 0),))),
    "Reshape": (lambda ctx: ctx.input(0).reshape(ctx.input(1)), dict(alias=((0, 0),), input_memory=(1,))),
    "MemcpyFromHost": (lambda ctx: np.array(ctx.input(0)), dict(input_memory=(0,))),
    "MemcpyToHost": (lambda ctx: np.array(ctx.input(0)), dict(output_memory=(0,))),
}


@pytest.fixture
def pretend_device():
    """A device EP (its memory stands in for a GPU's; no GPU needed) claiming a few ops, so that the plan has
    device values, Memcpy nodes and buffers in two locations."""
    from ortlab.engine import (ExecutionProvider, OrtDevice, register_execution_provider, register_op_kernel,
                               unregister_op_kernel)
    from ortlab.engine.execution_provider import EXECUTION_PROVIDERS

    @register_execution_provider
    class PretendDeviceExecutionProvider(ExecutionProvider):
        type = PRETEND
        device = OrtDevice("GPU", 0, "host arrays standing in for device memory")

    for op, (fn, kernel_def) in PRETEND_KERNELS.items():
        register_op_kernel(op, provider=PRETEND, **kernel_def)(fn)
    try:
        yield PRETEND
    finally:
        for op in PRETEND_KERNELS:
            unregister_op_kernel(op, provider=PRETEND)
        EXECUTION_PROVIDERS.unregister(PRETEND)


def device_and_host_chain():
    """Nodes alternating between the device EP and the CPU (Memcpy nodes between), device values that are
    graph outputs and read later on the host, Alias and MayInplace on the device, a weight read on the device."""
    n = helper.make_node
    shape = numpy_helper.from_array(np.array([8, 4], np.int64), "shape")
    shape2 = numpy_helper.from_array(np.array([4, 8], np.int64), "shape2")
    w = numpy_helper.from_array(_x(4, 8, seed=3), "w")
    return _model([n("Relu", ["x"], ["a"]), n("Neg", ["a"], ["b"]), n("Sigmoid", ["b"], ["c"]), n("Tanh", ["c"], ["d"]),
                   n("Add", ["d", "a"], ["e"]), n("Exp", ["e"], ["f"]), n("Reshape", ["f", "shape"], ["fr"]),
                   n("Reshape", ["fr", "shape2"], ["g"]), n("Relu", ["g"], ["h"]), n("Neg", ["h"], ["i"]),
                   n("Add", ["i", "w"], ["y"]), n("Abs", ["a"], ["z"])],
                  [("x", F, [4, 8])], [("y", F, [4, 8]), ("a", F, [4, 8]), ("z", F, [4, 8]), ("w", F, [4, 8])],
                  [shape, shape2, w]), {"x": _x(4, 8)}


@pytest.mark.parametrize("options", COMBOS, ids=combo_id)
def test_a_session_with_a_device_ep_and_memcpy_nodes_matches_ort(pretend_device, options):
    model, feeds = device_and_host_chain()
    sess = InferenceSession(model.SerializeToString(), SessionOptions(log_severity_level=3, **options),
                            providers=[pretend_device])
    assert sess.memcpy_count > 0
    assert_plan_safe(sess)
    expected = ort_outputs(model, feeds)
    for _ in range(2):
        got = sess.run(None, feeds)
        assert_same(expected, got)
        assert_peak_holds_outputs(sess, feeds, got)


# ----------------------------------------------------------------------------------------------
# onnx's backend node cases whose graph holds a subgraph (If, Loop, Scan, SequenceMap)
# ----------------------------------------------------------------------------------------------
SUBGRAPH_OPS = {"If", "Loop", "Scan", "SequenceMap"}


def _backend():
    import test_engine_backend_cases as backend

    return backend


def in_graph_sequences(model, feeds):
    """(model, feeds) with each sequence feed built in the graph by SequenceConstruct of tensor feeds, so that
    the plan covers the sequence as a value the graph makes; None when a feed is neither an array, a list of
    arrays nor an empty optional (None)."""
    graph, new_feeds, built = model.graph, {}, []
    for value in list(graph.input):
        fed = feeds.get(value.name)
        if value.type.HasField("sequence_type"):
            if not isinstance(fed, list):
                return None
            elem = value.type.sequence_type.elem_type.tensor_type.elem_type
            names = [f"{value.name}__{k}" for k in range(len(fed))]
            new_feeds.update(zip(names, fed))
            graph.input.extend(helper.make_tensor_value_info(name, elem, None) for name in names)
            built.append(helper.make_node("SequenceConstruct", names, [value.name]) if names else
                         helper.make_node("SequenceEmpty", [], [value.name], dtype=elem))
            graph.input.remove(value)
        elif value.name in feeds:
            if not isinstance(fed, np.ndarray) and not (fed is None and value.type.HasField("optional_type")):
                return None
            new_feeds[value.name] = fed
    for node in reversed(built):
        graph.node.insert(0, node)
    return model, new_feeds


def _subgraph_case_params():
    import os

    import onnx

    backend, params = _backend(), []
    for case_dir in backend.probe.list_cases(None):
        name = os.path.basename(case_dir)
        model = onnx.load(os.path.join(case_dir, "model.onnx"))
        if backend.probe.ai_onnx_opset(model) > 21 or not {n.op_type for n in model.graph.node} & SUBGRAPH_OPS:
            continue
        rule = backend._rule(name, model, case_dir)
        if rule is not None:
            continue
        params.append(pytest.param(case_dir, id=name[len("test_"):]))
    return params


@pytest.mark.parametrize("case_dir", _subgraph_case_params())
def test_backend_subgraph_case_matches_ort_under_every_option(case_dir):
    """Each case (sequence feeds built in the graph) under all 16 SessionOptions combinations, run twice:
    the backend test's comparison with ORT, the plan checker, a peak never below zero."""
    backend = _backend()
    found = in_graph_sequences(*backend.load_case(case_dir))
    if found is None:
        pytest.skip("a feed that is neither a tensor, a sequence of tensors nor an empty optional")
    model, feeds = found
    try:
        expected = backend.run_ort(model, feeds)
    except Exception as exc:  # noqa: BLE001 (ORT's refusal decides: nothing to compare)
        pytest.skip(f"ORT 1.19.2 cannot run it: {str(exc)[:120]}")
    names = [o.name for o in model.graph.output]
    for options in COMBOS:
        sess = InferenceSession(model.SerializeToString(), SessionOptions(log_severity_level=3, **options))
        assert_plan_safe(sess)
        for _ in range(2):
            got = sess.run(None, feeds)
            for name, o, e in zip(names, expected, got):
                backend.assert_same(o, e, f"{combo_id(options)} output {name!r}")


def subgraph_reads_a_shared_constant():
    """Two equal one-element initializers: `c1` read in the graph, `c2` read in the graph and by an If
    branch, `c3` by the branch only."""
    n = helper.make_node
    then_g = _branch("then", n("Add", ["x", "c2"], ["t0"]), "t0", [4])
    then_g.node.append(n("Mul", ["t0", "c3"], ["t"]))
    then_g.output[0].name = "t"
    else_g = _branch("else", n("Neg", ["x"], ["e"]), "e", [4])
    consts = [numpy_helper.from_array(np.array([2.0], np.float32), name) for name in ("c1", "c2", "c3")]
    return _model([n("Add", ["x", "c1"], ["a"]), n("Mul", ["a", "c2"], ["b"]),
                   n("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g), n("Add", ["y", "b"], ["z"])],
                  [("x", F, [4]), ("c", TensorProto.BOOL, [])], [("z", F, [4])], consts), \
        {"x": np.arange(4, dtype=np.float32), "c": np.array(True)}


@pytest.mark.parametrize("level", [1, 99])
def test_constants_a_subgraph_reads_survive_the_transformers(level):
    """An initializer only a subgraph reads is used (ORT's CleanUnusedInitializersAndNodeArgs counts implicit
    inputs), and ConstantSharing leaves one a subgraph reads alone (constant_sharing.cc). The cleaner
    dropped it and the session was refused ('InvalidGraph ... ConstantSharing left a graph that does not
    resolve'), as onnx's AffineGrid expanded cases were at levels >= 1."""
    model, feeds = subgraph_reads_a_shared_constant()
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))
    assert_plan_safe(sess)
    assert_same(ort_outputs(model, feeds), sess.run(None, feeds))


def _branch_reads(nodes, read, initializers=()):
    """`nodes` (the last writes `last`), then an If whose branches read `read` from the graph around them."""
    n = helper.make_node
    then_g = _branch("then", n("Neg", [read], ["t"]), "t", [4, 8])
    else_g = _branch("else", n("Abs", [read], ["e"]), "e", [4, 8])
    branch = n("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)
    return _model(nodes + [branch, n("Add", ["y", "last"], ["z"])],
                  [("x", F, [4, 8]), ("c", TensorProto.BOOL, [])], [("z", F, [4, 8])], list(initializers))


def fusable_values_a_subgraph_reads():
    n, const = helper.make_node, numpy_helper.from_array
    w, b = const(_x(8, 8, seed=5), "W"), const(_x(8, seed=6), "B")
    gelu = [const(np.array(1.4142135, np.float32), "sq2"), const(np.array(1.0, np.float32), "one"),
            const(np.array(0.5, np.float32), "half")]
    return {
        "identity": _branch_reads([n("Identity", ["x"], ["i"]), n("Relu", ["i"], ["last"])], "i"),
        "identity_read_only_there": _branch_reads([n("Identity", ["x"], ["i"]), n("Relu", ["x"], ["last"])], "i"),
        "matmul_add": _branch_reads([n("MatMul", ["x", "W"], ["mm"]), n("Add", ["mm", "B"], ["last"])], "mm", [w, b]),
        "gelu": _branch_reads([n("Div", ["x", "sq2"], ["d"]), n("Erf", ["d"], ["er"]), n("Add", ["er", "one"], ["ad"]),
                               n("Mul", ["x", "ad"], ["mu"]), n("Mul", ["mu", "half"], ["last"])], "er", gelu),
    }


@pytest.mark.parametrize("name", ["identity", "identity_read_only_there", "matmul_add", "gelu"])
@pytest.mark.parametrize("level", [1, 99])
def test_a_value_a_subgraph_reads_is_not_fused_or_bypassed_away(name, level):
    """A value an If branch reads counts as used (ORT: an implicit input is an edge of its producer), so no
    fusion swallows it and no Identity elimination renames it away. The transformers removed it and the
    session was refused (InvalidGraph: '... left a graph that does not resolve')."""
    model = fusable_values_a_subgraph_reads()[name]
    feeds = {"x": _x(4, 8), "c": np.array(True)}
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))
    assert_plan_safe(sess)
    assert_same(ort_outputs(model, feeds), sess.run(None, feeds))


@pytest.mark.parametrize("read", ["back", "there"])
@pytest.mark.parametrize("level", [0, 1, 99])
def test_a_cast_pair_a_subgraph_reads_is_kept(read, level):
    """x -> Cast(double) 'there' -> Cast(float) 'back': RemoveDuplicateCastTransformer (insert_cast_transformer.cc,
    run at every level) removes the pair, yet an If branch reads `read`, which must stay. The branch read a
    removed value (KernelFailure in the If). Reading 'there', the outputs are ORT's; reading 'back', ORT 1.19.2
    itself fails ('Missing Input: back'), so numpy gives them: Cast to double and back is exact."""
    n = helper.make_node
    then_g = helper.make_graph([n("Cast", [read], ["t"], to=TensorProto.FLOAT)], "then", [],
                               [helper.make_tensor_value_info("t", F, [4, 8])])
    else_g = helper.make_graph([n("Neg", ["x"], ["e"])], "else", [], [helper.make_tensor_value_info("e", F, [4, 8])])
    model = _model([n("Cast", ["x"], ["there"], to=TensorProto.DOUBLE), n("Cast", ["there"], ["back"], to=F),
                    n("Relu", ["back"], ["r"]), n("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g),
                    n("Add", ["y", "r"], ["z"])],
                   [("x", F, [4, 8]), ("c", TensorProto.BOOL, [])], [("z", F, [4, 8])])
    feeds = {"x": _x(4, 8), "c": np.array(True)}
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=level))
    assert_plan_safe(sess)
    expected = ort_outputs(model, feeds) if read == "there" else [feeds["x"] + np.maximum(feeds["x"], 0)]
    assert_same(expected, sess.run(None, feeds))


def test_the_checker_sees_an_early_release_and_a_write_over_a_live_value():
    """plan_problems is no tautology: a release moved before a reader, a feed released, and a kReuse into a
    buffer whose value is read later are each reported."""
    model, _ = output_also_read()
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=0))
    assert not plan_problems(sess)
    state, plan = sess.state, sess.state.allocation_plan
    steps, index = state.steps, state.index_of
    steps[0].releases = steps[0].releases + [index["b"], index["x"]]    # b is read at step 2; x is a feed
    found = "\n".join(plan_problems(sess))
    assert "b read at step 2" in found and "x (a feed" in found
    steps[0].releases = []
    c = plan.values[index["c"]]
    c.kind, c.reused_buffer, c.inplace = K_REUSE, index["a"], False   # c written where a (read at step 4) lives
    assert any("written at step 2 into the buffer of a" in p for p in plan_problems(sess))

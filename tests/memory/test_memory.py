"""ortlab.memory against ORT 1.19.2 itself.

The reference is what ORT logs on its first run, read at the file-descriptor level with its default
logger at verbose: the training build plans the memory pattern statically and asks its CPU arena for
the whole block first ("Extending BFCArena for Cpu. bin_num:N (requested) num_bytes: <block>"), and
its session logger names the tensors whose shapes it cannot resolve ("[Static memory planning] Could
not resolve shape for tensor with ML index N"). Shapes are chosen so that the block exceeds the
arena's initial 1 MiB region (otherwise the block fits and nothing is logged).
"""
import functools
import itertools
import re

import numpy as np
import pytest
from onnx import TensorProto, helper

from engine_models import training_graph
from ortlab import models, session
from ortlab.capture import captured_lines
from ortlab.env import quiet_import
from ortlab.errors import OrtlabError
from ortlab.engine import cpu_execution_provider
from ortlab.memory import BFCArena, PlanValidationError, ValuePlan, plan, session_graph, validate
from ortlab.memory.allocation_planner import K_ALLOCATE, K_ALLOCATE_OUTPUT, K_PRE_EXISTING, K_REUSE
from ortlab.memory.bfc_arena import K_SAME_AS_REQUESTED, NUM_BINS, bin_num_for_size, bin_num_to_size

ort = quiet_import("onnxruntime")

EXTENDING = re.compile(r"Extending BFCArena for Cpu\. bin_num:\d+ \(requested\) num_bytes: (\d+)")
UNRESOLVED = re.compile(r"\[Static memory planning\] Could not resolve shape for tensor with ML index (\d+)")
ARENA_LINE = re.compile(r"(Extending BFCArena for Cpu.*|Extended allocation by.*|Total allocated bytes.*|"
                        r"Reserving memory.*)$")
BINS_LINE = re.compile(r"Creating (\d+) bins of max chunk size (\d+) to (\d+)")
MIB = 1 << 20


# --- ORT, the reference ------------------------------------------------------------------------------
def ort_first_run(model, feeds, order="default", reuse=True, pattern=True):
    """(init lines, run lines) ORT logs at verbose while creating a session and running it once."""
    ort.set_default_logger_severity(0)
    try:
        so = session.session_options("disable", order, enable_mem_pattern=pattern, enable_mem_reuse=reuse)
        so.log_severity_level = 0
        with captured_lines(fds=(2,), python=False) as init:
            sess = session.create(model, so, ["CPUExecutionProvider"])
        with captured_lines(fds=(2,), python=False) as run:
            sess.run(None, feeds)
    finally:
        ort.set_default_logger_severity(2)
    return init, run


def ort_block_and_unresolved(model, feeds, order, reuse):
    _, run = ort_first_run(model, feeds, order, reuse)
    requests = [int(m.group(1)) for line in run if (m := EXTENDING.search(line))]
    unresolved = [int(m.group(1)) for line in run if (m := UNRESOLVED.search(line))]
    return (requests[0] if requests else None), unresolved


# --- the models --------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=None)
def inference_export(name):
    """The zoo model's eval export (dynamic batch), as ORTModule exports it."""
    module = models.get(name, dropout=0.0)
    inputs = module.example_inputs() if name == "mlp" else module.example_inputs(4, 16)
    return models.export(module, inputs[:1])


@functools.lru_cache(maxsize=None)
def training_model(name, builder, batch):
    """Forward + backward graph at `batch` (sequence 16), as the engine tests build it."""
    return training_graph(name, builder, batch)


def model_and_feeds(name, graph, batch):
    if graph == "inference":
        model = inference_export(name)
        module = models.get(name, dropout=0.0)
        inputs = module.example_inputs(batch) if name == "mlp" else module.example_inputs(batch, 16)
        return model, {model.graph.input[0].name: inputs[0].numpy()}
    return training_model(name, graph, batch)


CASES = [("mlp", "inference", 16384), ("mlp", "inference", 32768),
         ("bert", "inference", 512), ("bert", "inference", 1024),
         ("gpt", "inference", 512), ("gpt", "inference", 1024),
         ("mlp", "ortlab", 16384), ("mlp", "ort", 32768),
         ("bert", "ortlab", 32), ("bert", "ortlab", 64), ("bert", "ort", 128),
         ("gpt", "ortlab", 32), ("gpt", "ortlab", 64), ("gpt", "ort", 96), ("gpt", "ort", 128)]


@pytest.mark.parametrize("name, graph, batch", CASES)
def test_block_equals_orts_first_arena_request(name, graph, batch):
    """plan().peak_bytes is the block ORT 1.19.2 asks its arena for, to the byte, in both execution
    orders, with memory reuse on and off; the tensors ORT cannot resolve are the same ML indices; and
    every plan validates."""
    model, feeds = model_and_feeds(name, graph, batch)
    shared = session_graph(model)
    for order, reuse in itertools.product(("default", "priority"), (True, False)):
        want, unresolved = ort_block_and_unresolved(model, feeds, order, reuse)
        got = plan(shared, feeds, order=order, enable_mem_reuse=reuse)
        assert got.peak_bytes > MIB, "the block must exceed the arena's first region for ORT to log it"
        assert (got.peak_bytes, got.unresolved) == (want, unresolved), (order, reuse)
        assert validate(got) == len(got.planned())
        assert got.lower_bound_bytes <= got.peak_bytes



@pytest.mark.parametrize("seed", range(24))
def test_block_equals_orts_on_random_dags(seed):
    """The same fidelity on random DAGs (shapes, element sizes, in-place ops, Cast pairs and fan-out vary
    with the seed): ORT's first arena request, both orders, reuse on and off; and the engine's block."""
    from ortlab.engine import InferenceSession, SessionOptions
    from ortlab.walkthroughs.memory import random_dag

    model, feeds = random_dag(seed, nodes=12 + seed % 10)
    shared = session_graph(model)
    for order, reuse in itertools.product(("default", "priority"), (True, False)):
        want, unresolved = ort_block_and_unresolved(model, feeds, order, reuse)
        assert want is not None, "ORT logged no block: make the DAG's tensors larger"
        got = plan(shared, {"x": feeds["x"].shape}, order=order, enable_mem_reuse=reuse)
        validate(got)
        assert (got.peak_bytes, got.unresolved) == (want, unresolved), (order, reuse)
    options = SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    engine = InferenceSession(model, options)
    engine.run(None, feeds)
    assert engine.last_run.pattern_bytes == ort_block_and_unresolved(model, feeds, "default", True)[0]


def _cast_chain(steps, outputs):
    """x: float [4] through Casts and Relus; steps: (name, op, input, output, to or None)."""
    types = {"x": TensorProto.FLOAT}
    nodes = []
    for name, op, source, out, to in steps:
        nodes.append(helper.make_node(op, [source], [out], name=name, **({"to": to} if to else {})))
        types[out] = to or types[source]
    graph = helper.make_graph(nodes, "casts", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [4])],
                              [helper.make_tensor_value_info(o, types[o], [4]) for o in outputs])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


D, F, I64, B = TensorProto.DOUBLE, TensorProto.FLOAT, TensorProto.INT64, TensorProto.BOOL
CAST_CHAINS = {
    "widen then back, first cast also read elsewhere": (
        [("a", "Cast", "x", "d", D), ("b", "Cast", "d", "f", F), ("r", "Relu", "f", "y", None),
         ("m", "Neg", "d", "z", None)], ["y", "z"]),
    "widen then back, only casts read the first": (
        [("a", "Cast", "x", "d", D), ("b", "Cast", "d", "f", F), ("r", "Relu", "f", "y", None)], ["y"]),
    "lossy then widen: kept": (
        [("a", "Cast", "x", "i", I64), ("b", "Cast", "i", "f", F), ("r", "Relu", "f", "y", None)], ["y"]),
    "second cast is a graph output: kept": (
        [("a", "Cast", "x", "d", D), ("b", "Cast", "d", "f", F)], ["f"]),
    "cast to another type: the first goes": (
        [("r", "Relu", "x", "x2", None), ("a", "Cast", "x2", "d", D), ("b", "Cast", "d", "i", I64),
         ("n", "Neg", "i", "y", None)], ["y"]),
    "to bool and back": (
        [("a", "Cast", "x", "t", B), ("b", "Cast", "t", "f", F), ("r", "Relu", "f", "y", None)], ["y"]),
}


@pytest.mark.parametrize("case", CAST_CHAINS)
def test_duplicate_casts_are_removed_as_orts_transform_does_at_every_level(case, tmp_path):
    """ORT 1.19.2 removes Cast pairs even at ORT_DISABLE_ALL (InsertCastTransformer's
    RemoveDuplicateCastTransformer): the graph ortlab plans keeps exactly the nodes ORT's saved graph keeps,
    reading the same values."""
    model = _cast_chain(*CAST_CHAINS[case])
    saved = session.optimized_model(model, level="disable", providers=["CPUExecutionProvider"])
    ours = session_graph(model).graph
    assert sorted((n.name, tuple(n.input)) for n in saved.graph.node) == \
        sorted((n.name, tuple(a.name for a in n.inputs)) for n in ours.nodes())

def test_the_plan_of_a_small_graph_reads_as_orts_rules():
    """In-place reuse at last use only (MayInplace), aliasing (Reshape), the freelist by shape and
    element size (that a dead [B, A] buffer is not taken by an [A, B] value is shown on
    ortlab.walkthroughs.memory.rules_model, tests/memory/test_memory_views.py), graph outputs never reused; ORT's
    block for the same graph is the plan's."""
    a, b = 512, 1024
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Exp", ["x"], ["t1"]),               # [a, b]
             helper.make_node("Relu", ["t1"], ["r1"]),             # t1 read again later: no in-place
             helper.make_node("Transpose", ["r1"], ["t2"]),        # [b, a]: no dead buffer yet
             helper.make_node("Relu", ["t2"], ["r2"]),             # t2's last use: in place
             helper.make_node("Transpose", ["r2"], ["t3"]),        # [a, b]: takes a dead [a, b] buffer
             helper.make_node("Add", ["t3", "t1"], ["t4"]),
             helper.make_node("Reshape", ["t4", "flat"], ["t5"]),  # Alias(0, 0)
             helper.make_node("Exp", ["t5"], ["y"])]
    graph = helper.make_graph(nodes, "rules", [helper.make_tensor_value_info("x", f, [a, b])],
                              [helper.make_tensor_value_info("y", f, [a * b])],
                              [helper.make_tensor("flat", TensorProto.INT64, [1], [a * b])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"x": np.ones((a, b), np.float32)}
    p = plan(model, feeds)
    kind = {v.name: (v.kind, v.reuses, v.inplace) for v in p.values}
    assert kind["x"][0] == K_PRE_EXISTING and kind["y"][0] == K_ALLOCATE_OUTPUT
    assert kind["r1"] == (K_ALLOCATE, None, False)
    assert kind["t2"][0] == K_ALLOCATE
    assert kind["r2"] == (K_REUSE, "t2", True)
    assert kind["t3"] == (K_REUSE, "r1", False)
    assert kind["t5"] == (K_REUSE, "t4", True)
    want, _ = ort_block_and_unresolved(model, feeds, "default", True)
    assert p.peak_bytes == want


def chain_model():
    """Element-wise ops only (no kernel scratch buffers): every arena request is a node output. The
    Concat output's size ORT cannot resolve statically, so with the pattern on it is allocated alone."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Mul", ["a", "x"], ["b"]),
             helper.make_node("Sub", ["b", "a"], ["c"]), helper.make_node("Add", ["c", "b"], ["d"]),
             helper.make_node("Concat", ["d", "c"], ["e"], axis=0),
             helper.make_node("Mul", ["e", "e"], ["g"]), helper.make_node("Add", ["g", "e"], ["h"]),
             helper.make_node("ReduceSum", ["h"], ["y"], keepdims=1)]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", f, ["n"])],
                              [helper.make_tensor_value_info("y", f, [1]),
                               helper.make_tensor_value_info("g", f, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


@pytest.mark.parametrize("n", [100_000, 1_000_000])
@pytest.mark.parametrize("pattern", [False, True])
def test_arena_replay_logs_orts_extensions(n, pattern):
    """The BFCArena simulation, fed the plan's allocation trace, extends the arena exactly as ORT's
    log says (requested bytes, bin, growth by powers of two, totals), pattern off and on."""
    model, feeds = chain_model(), {"x": np.ones(n, np.float32)}
    init, run = ort_first_run(model, feeds, pattern=pattern)
    want = [m.group(1) for line in init + run if (m := ARENA_LINE.search(line))]
    arena = BFCArena()
    arena.replay(plan(model, feeds).allocation_trace(pattern=pattern))
    assert arena.lines() == want
    assert len(want) >= 6


def test_arena_bins_match_orts_log_and_rounding_is_256():
    init, _ = ort_first_run(chain_model(), {"x": np.ones(10, np.float32)})
    count, smallest, largest = next(map(int, m.groups()) for line in init if (m := BINS_LINE.search(line)))
    assert (NUM_BINS, bin_num_to_size(0), bin_num_to_size(NUM_BINS - 1)) == (count, smallest, largest)
    assert [bin_num_for_size(s) for s in (1, 256, 511, 512, 1 << 20, 1 << 40)] == [0, 0, 0, 1, 12, 20]
    arena = BFCArena()
    arena.alloc(1)
    assert arena.stats.bytes_in_use == 256


def test_arena_best_fit_split_coalesce_and_stats():
    """Best fit within bins, the split rule and coalescing, checked by arithmetic on one 1 MiB region."""
    kib = 1024
    arena = BFCArena()
    a = arena.alloc(256 * kib)                        # 1 MiB >= 2 x 256 KiB: split, 768 KiB free
    b = arena.alloc(256 * kib)                        # split again, 512 KiB free
    c = arena.alloc(128 * kib)                        # split, 384 KiB free
    assert arena.free_bytes() == 384 * kib and arena.stats.bytes_in_use == 640 * kib
    arena.free(b)                                     # neighbours in use: no coalescing
    d = arena.alloc(200 * kib)                        # bin 10 holds b (256 KiB) and the tail (384 KiB)
    assert d == b and arena.stats.bytes_in_use == 640 * kib   # smallest fit, not split (256 < 2 x 200)
    arena.free(a)
    arena.free(c)                                     # merges with the free tail
    arena.free(d)                                     # merges with both neighbours: one free region
    assert arena.free_bytes() == MIB and arena.stats.bytes_in_use == 0
    assert arena.alloc(MIB) == a and arena.stats.num_arena_extensions == 1
    assert (arena.stats.num_allocs, arena.stats.max_bytes_in_use, arena.stats.max_alloc_size) == (5, MIB, MIB)


def test_arena_best_fit_takes_the_smallest_chunk_that_fits():
    arena = BFCArena()
    blocks = [arena.alloc(64 * 1024) for _ in range(8)]   # 512 KiB used, a 512 KiB tail free
    arena.free(blocks[2])                                  # a 64 KiB hole among used chunks
    assert arena.alloc(60 * 1024) == blocks[2]             # the hole (64 KiB) beats the 512 KiB tail


def test_arena_extends_by_powers_of_two_or_as_requested():
    arena = BFCArena()
    arena.alloc(100)
    arena.alloc(3 * MIB)
    arena.alloc(1)                                         # fits in the first region
    arena.alloc(5 * MIB)
    assert [e.extended_by for e in arena.extensions] == [MIB, 4 * MIB, 8 * MIB]
    same = BFCArena(arena_extend_strategy=K_SAME_AS_REQUESTED)
    same.alloc(100)
    same.alloc(3 * MIB + 1)
    assert [e.extended_by for e in same.extensions] == [256, 3 * MIB + 256]
    assert same.stats.total_allocated_bytes == 3 * MIB + 512


def test_validator_names_the_overlapping_pair():
    model, feeds = model_and_feeds("gpt", "inference", 512)
    p = plan(model, feeds)
    planned = p.planned()
    first = planned[0]
    other = next(v for v in planned[1:] if v.start <= first.end and first.start <= v.end)
    other.offset = first.offset
    with pytest.raises(PlanValidationError, match="overlap in the block") as info:
        validate(p)
    assert other.name in str(info.value)        # the moved tensor is in every pair it now breaks
    other.offset = p.peak_bytes
    with pytest.raises(PlanValidationError, match="must fit"):
        validate(p)


def test_table_and_plot():
    import matplotlib

    matplotlib.use("Agg")
    model, feeds = model_and_feeds("bert", "inference", 512)
    p = plan(model, feeds)
    table = p.table()
    assert len(table.rows) == len(p.values) and "kAllocate" in repr(table)
    assert {row[2] for row in p.table(kinds=("kReuse",)).rows} == {"kReuse"}
    ax = p.plot()
    assert len(ax.patches) >= len(p.planned())
    assert isinstance(p.value(p.planned()[0].name), ValuePlan)


@pytest.mark.parametrize("name, graph, batch", [("gpt", "inference", 512), ("gpt", "ortlab", 32)])
def test_engine_declarations_give_orts_block(name, graph, batch):
    """Reading Alias/MayInplace through ortlab.engine's CPU EP instead of ORT's table gives ORT's block."""
    model, feeds = model_and_feeds(name, graph, batch)
    want, _ = ort_block_and_unresolved(model, feeds, "default", True)
    assert plan(model, feeds, declarations=cpu_execution_provider.declaration).peak_bytes == want


def if_model():
    f = TensorProto.FLOAT
    branch = lambda op: helper.make_graph([helper.make_node(op, ["x"], ["z"])], op,  # noqa: E731
                                          [], [helper.make_tensor_value_info("z", f, ["n"])])
    node = helper.make_node("If", ["c"], ["y"], then_branch=branch("Relu"), else_branch=branch("Neg"))
    graph = helper.make_graph([node], "if", [helper.make_tensor_value_info("c", TensorProto.BOOL, []),
                                             helper.make_tensor_value_info("x", f, ["n"])],
                              [helper.make_tensor_value_info("y", f, ["n"])])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


@pytest.mark.parametrize("call, phrase", [
    (lambda m, f: plan(if_model(), {"c": (), "x": (3,)}), "holds a subgraph"),
    (lambda m, f: plan(m, f, order="fast"), "order must be one of"),
    (lambda m, f: plan(m, {}), "not in input_shapes"),
    (lambda m, f: plan(m, {"x": (3, 4, 5)}), "declared with rank 1"),
    (lambda m, f: plan("missing.onnx", f), "no such model file"),
    (lambda m, f: plan(42, f), "takes an onnx.ModelProto"),
    (lambda m, f: plan(m, f).value("nope"), "no value named"),
])
def test_bad_arguments_are_explained(call, phrase):
    with pytest.raises(OrtlabError, match=re.escape(phrase)):
        call(chain_model(), {"x": (10,)})


def test_a_zero_byte_allocation_replays_and_frees():
    arena = BFCArena()
    addresses = arena.replay([("alloc", 0), ("free", 0), ("alloc", 100), ("free", 2)])
    assert addresses == {} and arena.stats.bytes_in_use == 0 and arena.stats.num_allocs == 1  # freed ones leave


def test_a_data_dependent_shape_is_named_and_the_engine_supplies_the_runtime_size():
    """NonZero's output size depends on the data: no plan can size it before running. allocation_trace()
    says so, naming the value and where the runtime size comes from; the engine's run has it, and its arena
    replay agrees with ORT's CPU arena growth for the same run (pattern off)."""
    from ortlab.engine import InferenceSession, SessionOptions

    f = TensorProto.FLOAT
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("NonZero", ["r"], ["nz"]),
             helper.make_node("Cast", ["nz"], ["c"], to=f), helper.make_node("Neg", ["c"], ["y"])]
    graph = helper.make_graph(nodes, "nonzero", [helper.make_tensor_value_info("x", f, ["n"])],
                              [helper.make_tensor_value_info("y", f, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    x = np.linspace(-1, 1, 600_001, dtype=np.float32)
    with pytest.raises(OrtlabError, match=r"value '\w+' has no shape ORT can resolve before running.*"
                                          r"last_run\.allocation_trace"):
        plan(model, {"x": x.shape}).allocation_trace(pattern=False)
    options = SessionOptions(enable_mem_pattern=False)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    engine = InferenceSession(model, options)
    engine.run(None, {"x": x})
    sizes = [n for op, n in engine.last_run.allocation_trace if op == "alloc"]
    assert 300_000 * 8 in sizes          # NonZero's int64 [1, 300000], known only at run time
    init, run = ort_first_run(model, {"x": x}, pattern=False)
    want = [m.group(1) for line in init + run if (m := ARENA_LINE.search(line))]
    assert engine.arena().lines() == want


GROWTH = re.compile(r"Extended allocation by (\d+) bytes")


@pytest.mark.parametrize("name, graph, batch", CASES)
def test_arena_growth_with_the_pattern_off_is_orts(name, graph, batch):
    """With the memory pattern off ORT allocates tensor by tensor through its arena, still following its
    allocation plan (in-place and freelist reuse). The engine's run does the same; replayed through BFCArena
    its allocations grow the arena by ORT's amounts in ORT's order. ORT's session creation makes one small
    allocation first (its log shows the arena's first 1 MiB region reserved then); the replay starts from
    there."""
    from ortlab.engine import InferenceSession, SessionOptions

    model, feeds = model_and_feeds(name, graph, batch)
    init, run = ort_first_run(model, feeds, pattern=False)
    assert [int(m.group(1)) for line in init if (m := GROWTH.search(line))] == [MIB]
    want = [int(m.group(1)) for line in run if (m := GROWTH.search(line))]
    options = SessionOptions(enable_mem_pattern=False)
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    engine = InferenceSession(model, options)
    engine.run(None, feeds)
    arena = BFCArena()
    arena.alloc(256)                      # session creation's first allocation
    arena.replay(engine.last_run.allocation_trace)
    assert [e.extended_by for e in arena.extensions[1:]] == want
    assert len(want) >= 1


# --- outputs no node reads (allocation_planner.unread_outputs) ----------------------------------------
def _unread_model(nodes, outputs):
    """x: float [n, 256]; Dropout ratio 0 in training mode; `outputs`: (name, elem type) graph outputs."""
    f, b = TensorProto.FLOAT, TensorProto.BOOL
    graph = helper.make_graph(nodes, "unread", [helper.make_tensor_value_info("x", f, ["n", 256])],
                              [helper.make_tensor_value_info(o, t, None) for o, t in outputs],
                              [helper.make_tensor("ratio", f, [], [0.0]),
                               helper.make_tensor("training", b, [], [True]),
                               helper.make_tensor("zero", f, [], [0.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _dropout(x, y, mask):
    return helper.make_node("Dropout", [x, "ratio", "training"], [y, mask])


UNREAD_X = {"x": np.zeros((4096, 256), np.float32)}   # 4 MiB float, 1 MiB bool per [n, 256] value


@pytest.mark.parametrize("nodes, outputs, unread", [
    ([_dropout("x", "y0", "m0"), _dropout("y0", "y1", "m1")], [("y1", TensorProto.FLOAT)], "m1"),
    ([helper.make_node("Neg", ["x"], ["a0"]), helper.make_node("Neg", ["x"], ["a1"]),
      helper.make_node("Neg", ["x"], ["z"])], [("z", TensorProto.FLOAT)], "a1"),
], ids=["two-dropout-masks", "two-neg-outputs"])
def test_an_output_no_node_reads_takes_no_freed_buffer(nodes, outputs, unread):
    """An output no node reads gets a buffer of its own although a freed one of its size waits on the
    freelist (the first unread output's): ORT's block counts both, in both orders."""
    model = _unread_model(nodes, outputs)
    for order in ("default", "priority"):
        want, _ = ort_block_and_unresolved(model, UNREAD_X, order, True)
        got = plan(model, UNREAD_X, order=order)
        assert got.peak_bytes == want, order
        assert got.value(unread).kind == K_ALLOCATE
        validate(got)


def test_a_read_output_takes_the_buffer_an_unread_output_freed():
    """The rule is about the output asking, not the buffer: a mask nobody reads is freed at once, and the
    next bool value of its shape, which a node reads, lives in that buffer (ORT's block: y0 and one mask)."""
    model = _unread_model([_dropout("x", "y0", "m0"), helper.make_node("Greater", ["y0", "zero"], ["b"]),
                           helper.make_node("Not", ["b"], ["c"])], [("c", TensorProto.BOOL)])
    for order in ("default", "priority"):
        want, _ = ort_block_and_unresolved(model, UNREAD_X, order, True)
        got = plan(model, UNREAD_X, order=order)
        assert got.peak_bytes == want, order
        assert (got.value("b").kind, got.value("b").reuses) == (K_REUSE, "m0")

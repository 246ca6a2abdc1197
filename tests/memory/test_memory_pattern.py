"""The engine runs with ORT's memory pattern: one block of the size ORT requests, each planned tensor
at its offset, the same outputs as allocating each tensor on its own."""
import numpy as np
import pytest

from ortlab.engine import InferenceSession, SessionOptions
from ortlab.memory import plan
from engine_models import training_graph
from test_engine import ZOO
from test_memory import model_and_feeds, ort_block_and_unresolved


def run(model, feeds, **options):
    sess = InferenceSession(model, SessionOptions(**options))
    return sess, sess.run(None, feeds)


@pytest.mark.parametrize("name, graph, batch", [("gpt", "ortlab", 32), ("bert", "ort", 128)])
def test_the_engines_block_is_the_one_ort_requests(name, graph, batch):
    model, feeds = model_and_feeds(name, graph, batch)
    ort_block, _ = ort_block_and_unresolved(model, feeds, "default", True)
    sess, outputs = run(model, feeds, graph_optimization_level=0)
    assert sess.last_run.pattern_bytes == ort_block == plan(model, {k: v.shape for k, v in feeds.items()}).peak_bytes
    assert sess.last_run.placed_in_pattern > 0
    _, without = run(model, feeds, graph_optimization_level=0, enable_mem_pattern=False)
    for a, b in zip(outputs, without):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", list(ZOO))
@pytest.mark.parametrize("level", [0, 99])
def test_pattern_on_or_off_gives_identical_outputs(name, level):
    """A tensor placed where another still lives would change an output: none does."""
    model, feeds = ZOO[name]
    _, on = run(model, feeds, graph_optimization_level=level)
    _, off = run(model, feeds, graph_optimization_level=level, enable_mem_pattern=False)
    for a, b in zip(on, off):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", ["gpt"])
@pytest.mark.parametrize("order", ["default", "priority"])
@pytest.mark.parametrize("reuse", [True, False])
def test_gradient_graphs_with_the_pattern(name, order, reuse):
    model, feeds = training_graph(name, "ortlab")
    sess, on = run(model, feeds, graph_optimization_level=0, execution_order=order, enable_mem_reuse=reuse)
    predicted = plan(model, {k: v.shape for k, v in feeds.items()}, order=order, enable_mem_reuse=reuse)
    assert sess.last_run.pattern_bytes == predicted.peak_bytes
    _, off = run(model, feeds, graph_optimization_level=0, execution_order=order, enable_mem_pattern=False)
    for a, b in zip(on, off):
        np.testing.assert_array_equal(a, b)


def test_a_second_run_with_other_shapes_plans_again():
    model, feeds = ZOO["gpt-logits"]
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    sess.run(None, feeds)
    first = sess.last_run.pattern_bytes
    doubled = {k: np.concatenate([v, v]) for k, v in feeds.items()}
    out, = sess.run(None, doubled)
    assert sess.last_run.pattern_bytes > first and len(sess._patterns) == 2
    np.testing.assert_array_equal(out, InferenceSession(model, SessionOptions(
        graph_optimization_level=0, enable_mem_pattern=False)).run(None, doubled)[0])


@pytest.mark.parametrize("pattern", [False, True])
def test_the_engines_allocations_through_the_arena_log_what_orts_do(pattern):
    """The engine's own run, its host allocations replayed through BFCArena, extends the arena as ORT's
    log says for the same model and feeds (pattern off: every tensor; on: the block, then the rest)."""
    from test_memory import ARENA_LINE, chain_model as large_chain, ort_first_run

    model, feeds = large_chain(), {"x": np.ones(1_000_000, np.float32)}
    init, ort_run = ort_first_run(model, feeds, pattern=pattern)
    want = [m.group(1) for line in init + ort_run if (m := ARENA_LINE.search(line))]
    sess, _ = run(model, feeds, graph_optimization_level=0, enable_mem_pattern=pattern)
    assert sess.arena().lines() == want and len(want) >= 6


def test_a_learner_kernel_that_declares_no_mayinplace_is_never_run_in_place():
    """The plan reads the kernels the session created: ORT's Relu may run in place, a learner's Relu
    that zeroes its output before reading its input must not (it would read zeros)."""
    from engine_models import chain_model, feeds_for
    from ortlab.engine import register_op_kernel, unregister_op_kernel

    model = chain_model(("Neg", "Relu", "Exp"), (4, 64))
    feeds = feeds_for(model)
    _, want = run(model, feeds, graph_optimization_level=0, enable_mem_pattern=False)

    @register_op_kernel("Relu", override=True)
    def zero_first(ctx):
        x = ctx.input(0)
        out = ctx.output(0, x.shape)
        out[:] = 0
        np.maximum(x, out, out=out)

    try:
        _, got = run(model, feeds, graph_optimization_level=0)
    finally:
        unregister_op_kernel("Relu")
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)

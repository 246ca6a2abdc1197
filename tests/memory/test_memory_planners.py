"""A memory planner is one registered function, and the engine runs with it: SessionOptions(memory_planner=...)
re-places the plan's pattern tensors, the block the run allocates is the one the planner predicted, and the
outputs are those of a run with no pattern at all. A planner that breaks the rules never runs."""
import numpy as np
import pytest

from ortlab.engine import InferenceSession, InvalidArgument, SessionOptions
from ortlab.memory import OFFSET_PLANNERS, PlannerError, plan, placement_of, register_offset_planner
from engine_models import training_graph
from test_engine import ZOO


def run(model, feeds, **options):
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0, **options))
    return sess, sess.run(None, feeds)


def stacked(tensors):
    """Every tensor on bytes of its own: valid for any lifetimes, the block is the sum of the sizes."""
    offsets, top = {}, 0
    for t in tensors:
        offsets[t.name], top = top, top + t.size
    return offsets


def shapes(feeds):
    return {k: v.shape for k, v in feeds.items()}


@pytest.mark.parametrize("planner", ["greedy_by_size", "greedy_by_size_best_fit", stacked])
@pytest.mark.parametrize("name", ["gpt-logits", "bert-loss-training", "mlp-loss"])
def test_the_engines_block_is_the_planners_prediction_and_outputs_do_not_change(name, planner):
    model, feeds = ZOO[name]
    sess, outputs = run(model, feeds, memory_planner=planner)
    predicted = placement_of(plan(sess.model, shapes(feeds)), planner)
    assert sess.last_run.pattern_bytes == predicted.peak_bytes > 0
    _, plain = run(model, feeds, enable_mem_pattern=False)
    for a, b in zip(outputs, plain):
        np.testing.assert_array_equal(a, b)


def test_stacking_gives_the_sum_of_the_sizes_and_greedy_never_exceeds_it():
    model, feeds = training_graph("gpt", "ortlab")
    p = plan(model, shapes(feeds))
    total = sum(v.size for v in p.planned())
    assert placement_of(p, stacked).peak_bytes == total
    assert p.lower_bound_bytes <= placement_of(p, "greedy_by_size").peak_bytes <= total


def test_a_registered_planner_is_used_by_name_and_the_default_is_orts():
    model, feeds = ZOO["gpt-logits"]
    with OFFSET_PLANNERS.using("stacked", stacked):
        sess, _ = run(model, feeds, memory_planner="stacked")
        assert sess.last_run.pattern_bytes == sum(v.size for v in plan(sess.model, shapes(feeds)).planned())
    ort, _ = run(model, feeds)
    assert ort.last_run.pattern_bytes == plan(ort.model, shapes(feeds)).peak_bytes


def test_register_offset_planner_files_the_function_under_its_name():
    @register_offset_planner("test_only_stacked")
    def mine(tensors):
        return stacked(tensors)
    try:
        assert OFFSET_PLANNERS.lookup("test_only_stacked") is mine
    finally:
        OFFSET_PLANNERS.unregister("test_only_stacked")


def all_at_zero(tensors):
    return {t.name: 0 for t in tensors}


@pytest.mark.parametrize("planner, match", [
    (all_at_zero, "same bytes"),
    (lambda tensors: {t.name: 0.5 for t in tensors}, "ints >= 0"),
    (lambda tensors: {}, "missing"),
    (lambda tensors: [0 for _ in tensors], "return {tensor name: offset}"),
])
def test_a_planner_that_breaks_a_rule_is_refused_with_what_it_did(planner, match):
    model, feeds = ZOO["gpt-logits"]
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0, memory_planner=planner))
    with pytest.raises(PlannerError, match=match):
        sess.run(None, feeds)


@pytest.mark.parametrize("value", ["greedy", 3, None])
def test_an_unknown_planner_is_refused_when_the_session_is_made(value):
    model, _ = ZOO["gpt-logits"]
    with pytest.raises(InvalidArgument, match="memory_planner must be 'ort', one of"):
        InferenceSession(model, SessionOptions(memory_planner=value))

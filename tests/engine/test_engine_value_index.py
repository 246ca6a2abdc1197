"""One value-index map: ortlab.engine's SessionState numbers values as ORT's OrtValueNameIdxMap does
(graph inputs, then node by node in index order each input, implicit input and output, then the graph
outputs), the same map the allocation planner uses, and the ML indices ORT 1.19.2 itself logs."""
import pytest

from ortlab.engine import InferenceSession, SessionOptions
from ortlab.memory import plan
from test_memory import model_and_feeds, ort_block_and_unresolved


def shapes(feeds):
    return {k: v.shape for k, v in feeds.items()}


@pytest.mark.parametrize("name, graph, batch", [("gpt", "ortlab", 32), ("bert", "ort", 128), ("gpt", "inference", 512),
                                                ("mlp", "ortlab", 64)])
def test_the_engines_indices_are_the_planners(name, graph, batch):
    model, feeds = model_and_feeds(name, graph, batch)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    planned = plan(model, shapes(feeds)).execution_plan.index_of
    shared = {n: i for n, i in sess.state.index_of.items() if n in planned}
    assert shared == planned
    assert set(planned) <= set(sess.state.index_of)


@pytest.mark.parametrize("name, graph, batch", [("gpt", "ortlab", 32), ("bert", "ort", 128)])
def test_the_indices_ort_logs_name_the_same_values_in_the_engine(name, graph, batch):
    """ORT logs 'Could not resolve shape for tensor with ML index N' for tensors whose shape has a symbol no
    input defines: the engine's index of each such value is the N ORT printed."""
    model, feeds = model_and_feeds(name, graph, batch)
    _, unresolved = ort_block_and_unresolved(model, feeds, "default", True)
    p = plan(model, shapes(feeds))
    names = [v.name for v in p.values if v.index in unresolved]
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0))
    assert sorted(sess.state.index_of[n] for n in names) == sorted(unresolved)

"""ortlab.walkthroughs.memory_recompute against ORT 1.19.2 itself.

The recompute graph is ORT's: its MemoryOptimizer transformer (memory_optimizer.cc) makes it, on the plans
its own probe (TrainingAgent.get_serialized_ortmodule_memory_stat) proposes. The references are ORT's
log (what it applied), ORT's first-run arena request (its memory-pattern block, as in tests/memory/test_memory.py),
ORT's run of both graphs (the loss and gradients), and the real ORTModule with ORTMODULE_MEMORY_OPT_LEVEL=1.
"""
import functools

import numpy as np
import pytest

from ortlab import session
from ortlab.memory import plan
from ortlab.walkthroughs.memory import training_step
from ortlab.walkthroughs import memory_recompute as mo

BATCH = 32  # the blocks exceed the arena's first 1 MiB region, so ORT logs them


@functools.lru_cache(maxsize=None)
def graphs(name):
    return mo.recompute_graphs(name, BATCH, 16)


def run(model, feeds):
    so = session.session_options("disable", intra_op_num_threads=1)
    sess = session.create(model, so, ["CPUExecutionProvider"])
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


@pytest.mark.parametrize("name", ["gpt", "bert"])
def test_the_recompute_nodes_are_orts(name):
    """Every plan applied is one ORT's probe proposed; ORT's log names each activation it recomputes; each
    added node duplicates a node of the graph without recompute (same op, name + '_recompute')."""
    g = graphs(name)
    assert g.plans and set(g.plans) <= set(g.opportunities)
    assert g.recomputed_activations > 0
    assert any(f"Total number of recomputed nodes: {g.recomputed_activations}" in line for line in g.log)
    original = {n.name: n.op_type for n in g.without.graph.node}
    assert len(g.recompute_nodes) >= g.recomputed_activations
    for node in g.recompute_nodes:
        assert original[node.name[:-len(mo.RECOMPUTE_SUFFIX)]] == node.op_type
    assert len(g.with_recompute.graph.node) == len(g.without.graph.node) + len(g.recompute_nodes)
    assert "Enabled, requested count=-1" in "\n".join(g.summary())


def test_no_plan_leaves_the_graph_as_it_was():
    """With an empty config the optimizer skips ("No optimization pattern is specified"): no node added."""
    training, feeds = training_step("gpt", 4, 16)
    yielded = mo.with_yield_op(training, [n for n in feeds if n.endswith("_grad_output")])
    plain, _ = mo.apply(yielded, [])
    assert not mo.recompute_nodes(plain)
    assert [n.op_type for n in mo.without_yield_op(plain, training).graph.node].count("YieldOp") == 0


@pytest.mark.parametrize("name", ["gpt", "bert"])
def test_recompute_lowers_the_peak_for_ort_and_for_the_prediction(name):
    """ORT's own block is smaller with recompute, and so are the predicted block and the lower bound."""
    g = graphs(name)
    for order in ("default", "priority"):
        ort_without = mo.ort_block(g.without, g.feeds, order)
        ort_with = mo.ort_block(g.with_recompute, g.feeds, order)
        assert ort_with < ort_without, order
        without, with_ = plan(g.without, g.feeds, order=order), plan(g.with_recompute, g.feeds, order=order)
        assert with_.peak_bytes < without.peak_bytes
        assert with_.lower_bound_bytes < without.lower_bound_bytes


@pytest.mark.parametrize("name", ["gpt", "bert"])
def test_the_prediction_is_orts_block_without_recompute(name):
    """The graph without recompute (out of the same ORT session, YieldOp taken out) is planned to the byte."""
    g = graphs(name)
    for order in ("default", "priority"):
        assert plan(g.without, g.feeds, order=order).peak_bytes == mo.ort_block(g.without, g.feeds, order)


@pytest.mark.parametrize("plans", [["MatMul+Add+Reshape+Transpose+:1:-1"],
                                   ["Mul+Add+:1:-1", "Transpose+:1:-1"], ["MatMul+Div+Where+Softmax+:1:-1"]])
def test_the_prediction_is_orts_block_with_recompute_that_orphans_no_output(plans):
    """Plans whose recompute leaves no node output unread: ORT's block to the byte, both orders."""
    g = mo.recompute_graphs("gpt", BATCH, 16, plans=plans)
    assert g.recompute_nodes
    for order in ("default", "priority"):
        assert plan(g.with_recompute, g.feeds, order=order).peak_bytes == \
            mo.ort_block(g.with_recompute, g.feeds, order)


def test_the_prediction_is_orts_block_with_every_plan():
    """TinyGPT with all of ORT's recompute plans, both orders. (With an earlier gradient graph the default order
    came out 64 KiB above ORT's block, for a reason not found: the planner may still miss a rule there.)"""
    g = graphs("gpt")
    for order in ("default", "priority"):
        assert plan(g.with_recompute, g.feeds, order=order).peak_bytes == \
            mo.ort_block(g.with_recompute, g.feeds, order)


@pytest.mark.parametrize("name", ["gpt", "bert"])
def test_loss_and_gradients_are_the_same_with_recompute(name):
    """ORT runs the three graphs (the training graph, and ORT's without / with recompute): same loss and
    gradients (dropout 0, so the recomputed subgraphs produce the same values)."""
    g = graphs(name)
    training, _ = training_step(name, BATCH, 16)
    reference = run(training, g.feeds)
    for model in (g.without, g.with_recompute):
        got = run(model, g.feeds)
        assert set(got) == set(reference)
        for key, value in reference.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-6, atol=1e-7, err_msg=key)


def test_ortmodule_recomputes_on_cpu():
    """The real ORTModule 1.19.2 on CPU with ORTMODULE_MEMORY_OPT_LEVEL=1 runs recompute: its execution graph
    holds '_recompute' nodes (none without the variable); ORT runs both graphs (YieldOp out, ATen executor
    in) to the same gradients, with a smaller block; ortlab plans both within 1% of ORT's block (the known
    gaps: the unread-output rule above, and ORTModule's fused ops)."""
    g = mo.ortmodule_graphs("gpt", BATCH, 16)
    assert not mo.recompute_nodes(g.without) and len(g.recompute_nodes) > 0
    without, with_ = run(g.without, g.feeds), run(g.with_recompute, g.feeds)
    assert set(without) == set(with_) and any(k.endswith("weight_grad") for k in without)
    for key, value in without.items():
        np.testing.assert_allclose(with_[key], value, rtol=1e-5, atol=1e-6, err_msg=key)
    for order in ("default", "priority"):
        ort_without, ort_with = (mo.ort_block(m, g.feeds, order) for m in (g.without, g.with_recompute))
        assert ort_with < 0.9 * ort_without
        for model, ort in ((g.without, ort_without), (g.with_recompute, ort_with)):
            assert abs(plan(model, g.feeds, order=order).peak_bytes - ort) < 0.01 * ort


def test_errors_say_what_to_give():
    training, feeds = training_step("gpt", 4, 16)
    with pytest.raises(mo.MemoryOptimizerError, match="output-gradient inputs"):
        mo.with_yield_op(training, ["nope_grad_output"])
    with pytest.raises(mo.MemoryOptimizerError, match="one YieldOp"):
        mo.opportunities(training)
    with pytest.raises(mo.MemoryOptimizerError, match="not among ORT's candidates"):
        mo.recompute_graphs("gpt", 4, 16, plans=["Gelu+:1:-1"])
    with pytest.raises(mo.MemoryOptimizerError, match="RecomputeGraphs"):
        mo.recompute_peaks(training)
    with pytest.raises(mo.MemoryOptimizerError, match="batch must be an int >= 1"):
        mo.recompute_graphs("gpt", -1)
    with pytest.raises(mo.MemoryOptimizerError, match="plans must be 'all' or a list"):
        mo.recompute_graphs("gpt", 4, 16, plans="bogus")
    with pytest.raises(mo.MemoryOptimizerError, match="takes an onnx.ModelProto"):
        mo.opportunities(3)


def test_two_dropouts_whose_masks_nobody_reads():
    from onnx import TensorProto, helper

    f = TensorProto.FLOAT
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["y0", "mask0"]),
             helper.make_node("Dropout", ["y0", "ratio", "training"], ["y1", "mask1"])]
    graph = helper.make_graph(nodes, "two_dropouts", [helper.make_tensor_value_info("x", f, ["n", 256])],
                              [helper.make_tensor_value_info("y1", f, None)],
                              [helper.make_tensor("ratio", f, [], [0.0]),
                               helper.make_tensor("training", TensorProto.BOOL, [], [True])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"x": np.zeros((4096, 256), np.float32)}
    assert mo.ort_block(model, feeds) == 6 << 20
    assert plan(model, feeds).peak_bytes == mo.ort_block(model, feeds)


def test_a_block_inside_the_arenas_first_region_is_reported_as_not_logged():
    from ortlab.walkthroughs.memory_recompute import FIRST_REGION, _ort_cells

    assert _ort_cells(None, 5 * FIRST_REGION) == ["not logged", "(fits the first 1 MiB region)"]
    assert _ort_cells(1024, FIRST_REGION // 2)[0] == "not logged"  # a later, unrelated extension: not the block
    assert _ort_cells(3 * FIRST_REGION, 3 * FIRST_REGION) == [3 * FIRST_REGION, "yes"]
    assert _ort_cells(3 * FIRST_REGION, 3 * FIRST_REGION + 512) == [3 * FIRST_REGION, "no (+512 B)"]

"""ortlab.distributed.tensor_parallel: Megatron's column/row-parallel layers on 2 real gloo ranks.

One launch (the `ranks` fixture) trains, on every rank, a one-process MLP and attention block, their
Megatron shards and DTensor's parallelize_module copy of the MLP, and returns the differences; the other
tests need no process group (bad input is refused when a layer is built).
"""
import pytest
import torch
from torch import nn

from ortlab.distributed import launch
from ortlab.distributed.tensor_parallel import (MLP, CollectiveCount, ColumnParallelLinear, ParallelMLP,
                                                ParallelSelfAttention, RowParallelLinear, TensorParallelError,
                                                causal_mask, count_collectives)
from ortlab.distributed.checks.tensor_parallel import tp_check
from ortlab.errors import OrtlabError

TOL = 1e-6
WORLD = 2
D_MODEL, D_HIDDEN, HEADS, STEPS = 8, 16, 4, 3


@pytest.fixture(scope="module")
def ranks():
    return launch(tp_check, world_size=WORLD, args=(D_MODEL, D_HIDDEN, HEADS, STEPS), timeout=150)


def _each(ranks, part):
    return [result[part] for result in ranks]


# ---------------------------------------------------------------------------------------------
# The MLP: Megatron against one process and against DTensor.


def test_mlp_output_and_input_grad_equal_one_process(ranks):
    for mlp in _each(ranks, "mlp"):
        assert mlp["out"] < TOL
        assert mlp["x_grad"] < TOL


def test_mlp_param_grads_equal_the_rank_slice_of_one_process(ranks):
    for mlp in _each(ranks, "mlp"):
        assert set(mlp["grads"]) == {"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"}
        assert max(mlp["grads"].values()) < TOL


def test_mlp_weights_after_training_equal_one_process(ranks):
    for mlp in _each(ranks, "mlp"):
        assert max(mlp["weights"].values()) < TOL
        assert len(mlp["losses"]["megatron"]) == STEPS
        assert mlp["losses"]["megatron"] == pytest.approx(mlp["losses"]["reference"], abs=TOL)
        assert mlp["losses"]["reference"][-1] < mlp["losses"]["reference"][0]  # it did train


def test_mlp_equals_dtensor_colwise_rowwise(ranks):
    for mlp in _each(ranks, "mlp"):
        assert mlp["dtensor_out"] < TOL
        assert max(mlp["dtensor_weights"].values()) < TOL
        assert mlp["losses"]["dtensor"] == pytest.approx(mlp["losses"]["megatron"], abs=TOL)


def test_mlp_local_shapes_are_megatrons_and_dtensors(ranks):
    half = D_HIDDEN // WORLD
    expected = {"fc1.weight": (half, D_MODEL), "fc1.bias": (half,), "fc2.weight": (D_MODEL, half),
                "fc2.bias": (D_MODEL,)}
    for mlp in _each(ranks, "mlp"):
        assert mlp["local_shapes"] == expected
        assert mlp["dtensor_local_shapes"] == expected


def test_mlp_one_all_reduce_forward_and_one_backward(ranks):
    for mlp in _each(ranks, "mlp"):
        counts = mlp["counts"]["input_grad"]
        assert (counts["forward"], counts["backward"]) == (1, 1)
        # what torch.distributed.all_reduce itself was called for, counted independently
        assert (counts["forward_dist_calls"], counts["backward_dist_calls"]) == (1, 1)


def test_mlp_backward_all_reduce_only_when_the_input_needs_a_gradient(ranks):
    for mlp in _each(ranks, "mlp"):
        counts = mlp["counts"]["no_input_grad"]
        assert (counts["forward"], counts["backward"]) == (1, 0)
        assert counts["backward_dist_calls"] == 0


def test_dtensor_runs_as_many_all_reduces(ranks):
    for mlp in _each(ranks, "mlp"):
        dtensor = mlp["counts"]["dtensor"]
        assert sum(n for op, n in dtensor.items() if "all_reduce" in op) == 2
        assert all("all_reduce" in op for op in dtensor)


# ---------------------------------------------------------------------------------------------
# Attention with heads split, against torch.nn.MultiheadAttention.


def test_attention_equals_multihead_attention(ranks):
    for attention in _each(ranks, "attention"):
        assert attention["out"] < TOL
        assert attention["x_grad"] < TOL
        assert max(attention["grads"].values()) < TOL
        assert max(attention["weights"].values()) < TOL
        assert attention["losses"]["megatron"] == pytest.approx(attention["losses"]["reference"], abs=TOL)
        assert attention["moved"] > 1e-3  # the reference's weights did change


def test_attention_one_all_reduce_each_way_per_step(ranks):
    for attention in _each(ranks, "attention"):
        assert attention["all_reduces_per_step"] == {"forward": 1.0, "backward": 1.0}


def test_attention_repr_names_the_local_heads(ranks):
    for rank, attention in enumerate(_each(ranks, "attention")):
        assert f"{HEADS // WORLD} on rank {rank}/{WORLD}" in attention["repr"]


def test_gathered_output_and_split_input_equal_one_process(ranks):
    for part in _each(ranks, "gather_scatter"):
        diffs = ("hidden", "out", "x_grad", "fc1_grad", "fc1_bias_grad", "fc2_grad", "fc2_bias_grad")
        assert max(part[key] for key in diffs) < TOL
        # forward: the all-gather of the outputs and g; backward: the scatter's all-gather and f
        assert part["forward"] == {"all_reduce": 1, "all_gather": 1}
        assert part["backward"] == {"all_reduce": 1, "all_gather": 1}


# ---------------------------------------------------------------------------------------------
# Built without a process group: slices, repr, bad input.


def test_column_and_row_slices_rebuild_the_full_weight():
    torch.manual_seed(0)
    linear = nn.Linear(6, 4)
    columns = [ColumnParallelLinear(linear, r, WORLD) for r in range(WORLD)]
    rows = [RowParallelLinear(linear, r, WORLD) for r in range(WORLD)]
    torch.testing.assert_close(torch.cat([c.weight for c in columns], 0), linear.weight, rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([c.bias for c in columns], 0), linear.bias, rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([r.weight for r in rows], 1), linear.weight, rtol=0, atol=0)
    torch.testing.assert_close(rows[1].bias, linear.bias, rtol=0, atol=0)
    # the row-parallel partial products sum to the full product (what g computes)
    x = torch.randn(3, 6)
    partial = sum(x.chunk(WORLD, -1)[r] @ rows[r].weight.T for r in range(WORLD))
    torch.testing.assert_close(partial + linear.bias, linear(x))
    assert "rank=1/2" in repr(columns[1]) and "(2, 6)" in repr(columns[1])
    assert "(4, 3)" in repr(rows[0])


def test_parallel_mlp_repr_and_counter_repr():
    layer = ParallelMLP(MLP(4, 8), rank=0, world_size=2)
    assert "ColumnParallelLinear" in repr(layer) and "RowParallelLinear" in repr(layer)
    with count_collectives() as counter:
        pass
    assert isinstance(counter, CollectiveCount) and counter.count() == 0
    assert "forward=0" in repr(counter)


def test_causal_mask_hides_the_future():
    assert causal_mask(3).tolist() == [[False, True, True], [False, False, True], [False, False, False]]


@pytest.mark.parametrize("build, words", [
    (lambda: ColumnParallelLinear(nn.Linear(8, 7), 0, 2),
     "out_features (7) is not divisible by world_size (2)"),
    (lambda: RowParallelLinear(nn.Linear(5, 8), 0, 2), "in_features (5) is not divisible"),
    (lambda: ParallelMLP(MLP(4, 6), 0, 4), "out_features (6) is not divisible by world_size (4)"),
    (lambda: ParallelSelfAttention(nn.MultiheadAttention(6, 3, batch_first=True), 0, 2),
     "num_heads (3) is not divisible by world_size (2)"),
    (lambda: ParallelSelfAttention(nn.MultiheadAttention(8, 4), 0, 2), "batch_first=True"),
    (lambda: ParallelSelfAttention(nn.MultiheadAttention(8, 4, batch_first=True, dropout=0.1), 0, 2),
     "dropout=0"),
    (lambda: ParallelSelfAttention(nn.Linear(8, 8), 0, 2), "must be a torch.nn.MultiheadAttention"),
    (lambda: ColumnParallelLinear(nn.Conv1d(4, 4, 1), 0, 2), "must be a torch.nn.Linear"),
    (lambda: ParallelMLP(nn.Sequential(nn.Linear(4, 4)), 0, 2), "mlp.fc1 must be a torch.nn.Linear"),
    (lambda: ColumnParallelLinear(nn.Linear(8, 8), 2, 2), "rank must be in [0, world_size)"),
    (lambda: ColumnParallelLinear(nn.Linear(8, 8), -1, 2), "rank must be in [0, world_size)"),
    (lambda: ColumnParallelLinear(nn.Linear(8, 8), True, 2), "rank must be an int"),
    (lambda: RowParallelLinear(nn.Linear(8, 8), 0, 2.0), "world_size must be an int"),
    (lambda: ColumnParallelLinear(nn.Linear(8, 8)), "no process group"),
])
def test_bad_input_is_refused_with_the_reason(build, words):
    with pytest.raises(TensorParallelError) as info:
        build()
    assert words in str(info.value)
    assert isinstance(info.value, OrtlabError)


def test_check_table_reads_every_rank_and_flags_a_difference(ranks):
    from ortlab.distributed.checks.tensor_parallel import check_table

    table = check_table(ranks)
    assert [row[0] for row in table.rows] == ["ParallelMLP", "ParallelSelfAttention"]
    assert all(cell == "<= 1e-06" for row in table.rows for cell in row[1:5])
    assert [row[5] for row in table.rows] == ["1 / 1", "1 / 1"]  # Megatron's count: one all-reduce each way
    spoiled = [dict(r) for r in ranks]
    spoiled[1] = {**spoiled[1], "mlp": {**spoiled[1]["mlp"], "weights": {"fc1.weight": 0.5}}}
    assert check_table(spoiled).rows[0][4] == "5.0e-01"  # a wrong slice on rank 1 shows
    with pytest.raises(OrtlabError, match="launch"):
        check_table([{"x": 1}])

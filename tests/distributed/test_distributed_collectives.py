"""ortlab.distributed.collectives: ring collectives and all-to-all from send/recv, on 3 real gloo ranks.

One launch (the `ranks` fixture, 3 ranks so the ring has a middle) runs every mirror next to the stock
collective on the same data; the answers are checked against the sum computed in this process from
every rank's rebuilt input (maths), against the stock op, and the bytes against the ring formulas.
"""
import warnings

import pytest
import torch

from ortlab.distributed import collectives as col, launch
from ortlab.distributed.collectives import (CollectiveError, CollectiveTrace, all_to_all, format_collective,
                                            origin_label, plot_collective, ring_all_gather, ring_all_reduce,
                                            ring_bytes_per_rank, ring_reduce_scatter)
from ortlab.distributed.checks.collectives import (all_to_all_input, all_to_all_splits, check_table, collectives_check,
                                                   example_tensor)
from ortlab.errors import OrtlabError

TOL = 1e-6
WORLD, NUMEL, ROWS, COLS, SEED = 3, 10, 2, 3, 0


@pytest.fixture(scope="module")
def ranks():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 ranks on fewer cores: a LaunchWarning, the results are the same
        return launch(collectives_check, world_size=WORLD, args=(NUMEL, ROWS, COLS, SEED), timeout=150)


def _close(a, b):
    return a.shape == b.shape and (a.numel() == 0 or float((a.double() - b.double()).abs().max()) < TOL)


def _inputs(shape, seed):
    return [example_tensor(r, shape, seed) for r in range(WORLD)]


# ---------------------------------------------------------------------------------------------
# Answers: equal to the maths and to the stock collective.


def test_ring_all_reduce_equals_sum_and_stock_all_reduce(ranks):
    total = sum(_inputs((NUMEL,), SEED))
    for result in ranks:
        assert _close(result["all_reduce"]["mirror"], total)
        assert _close(result["all_reduce"]["mirror"], result["all_reduce"]["stock"])


def test_ring_reduce_scatter_equals_sum_chunk_and_reduce_scatter_tensor(ranks):
    total = sum(x.t() for x in _inputs((COLS, WORLD * ROWS), SEED + 1))  # a transposed (strided) input
    for rank, result in enumerate(ranks):
        assert _close(result["reduce_scatter"]["mirror"], total[rank * ROWS:(rank + 1) * ROWS])
        assert _close(result["reduce_scatter"]["mirror"], result["reduce_scatter"]["stock"])


def test_ring_all_gather_equals_concat_and_all_gather_into_tensor(ranks):
    expected = torch.cat(_inputs((ROWS, COLS), SEED + 2))
    uneven = torch.cat([example_tensor(r, (r + 1, COLS), SEED + 3) for r in range(WORLD)])
    for result in ranks:
        assert _close(result["all_gather"]["mirror"], expected)
        assert _close(result["all_gather"]["mirror"], result["all_gather"]["stock"])
        assert _close(result["all_gather"]["uneven_mirror"], uneven)


def test_all_to_all_uneven_equals_transpose_and_all_to_all_single(ranks):
    splits = all_to_all_splits(WORLD)
    assert any(0 in row for row in splits) and len({n for row in splits for n in row}) > 2
    sent = [all_to_all_input(r, WORLD, COLS, SEED) for r in range(WORLD)]
    for rank, result in enumerate(ranks):
        mirror, stock = result["all_to_all"]["mirror"], result["all_to_all"]["stock"]
        for source in range(WORLD):
            assert _close(mirror[source], sent[source][rank])
            assert _close(mirror[source], stock[source])


# ---------------------------------------------------------------------------------------------
# Bytes and messages against the ring formulas.


def test_ring_all_reduce_sends_2_n_minus_1_over_n_of_the_tensor(ranks):
    nbytes = WORLD * 4 * 4  # all_reduce_even: world_size * 4 float32
    for result in ranks:
        trace = result["all_reduce_even"]["trace"]
        assert trace["bytes_sent"] == 2 * (WORLD - 1) * nbytes / WORLD
        assert trace["bytes_sent"] == ring_bytes_per_rank("all_reduce", nbytes, WORLD)
        assert trace["messages"] == 2 * (WORLD - 1)


def test_uneven_all_reduce_sends_the_formula_summed_over_ranks(ranks):
    sent = [result["all_reduce"]["trace"]["bytes_sent"] for result in ranks]
    assert sum(sent) == 2 * (WORLD - 1) * NUMEL * 4
    assert max(sent) - min(sent) <= 2 * 4  # chunks differ by at most one element


def test_reduce_scatter_and_all_gather_send_n_minus_1_over_n(ranks):
    full = WORLD * ROWS * COLS * 4
    for result in ranks:
        assert result["reduce_scatter"]["trace"]["bytes_sent"] == (WORLD - 1) * full / WORLD
        assert result["all_gather"]["trace"]["bytes_sent"] == (WORLD - 1) * full / WORLD
        assert result["reduce_scatter"]["trace"]["bytes_sent"] == ring_bytes_per_rank(
            "reduce_scatter", full, WORLD)


def test_all_to_all_sends_every_chunk_but_its_own(ranks):
    splits = all_to_all_splits(WORLD)
    for rank, result in enumerate(ranks):
        expected = sum(splits[rank][j] * COLS * 4 for j in range(WORLD) if j != rank)
        assert result["all_to_all"]["trace"]["bytes_sent"] == expected
        assert result["all_to_all"]["trace"]["meta_bytes_sent"] > 0


# ---------------------------------------------------------------------------------------------
# Snapshots: every chunk's label says whose data it sums, and its values agree.


def _check_labels(trace, parts):
    """Each snapshot chunk's values equal the sum of its origins' inputs; `parts[r][i]`: rank r's chunk i."""
    for snap in trace["snapshots"]:
        for index, origins in enumerate(snap["origins"]):
            if not origins:
                continue
            expected = sum(parts[o][index].reshape(-1).double() for o in origins)
            assert torch.allclose(torch.tensor(snap["values"][index], dtype=torch.float64), expected,
                                  atol=TOL)


def test_all_reduce_snapshots_label_partial_sums_truthfully(ranks):
    parts = [list(torch.tensor_split(x, WORLD)) for x in _inputs((NUMEL,), SEED)]
    for rank, result in enumerate(ranks):
        trace = result["all_reduce"]["trace"]
        snaps = trace["snapshots"]
        assert len(snaps) == 1 + 2 * (WORLD - 1)
        assert [s["phase"] for s in snaps] == ["start"] + ["reduce-scatter"] * 2 + ["all-gather"] * 2
        assert snaps[0]["origins"] == [[rank]] * WORLD
        assert snaps[WORLD - 1]["origins"][rank] == list(range(WORLD))  # chunk r finished after N-1 steps
        assert snaps[-1]["origins"] == [list(range(WORLD))] * WORLD
        assert snaps[1]["received"] == [(rank - 2) % WORLD, (rank - 1) % WORLD]
        _check_labels(trace, parts)


def test_reduce_scatter_all_gather_and_all_to_all_snapshots(ranks):
    rs_parts = [list(torch.tensor_split(x.t(), WORLD)) for x in _inputs((COLS, WORLD * ROWS), SEED + 1)]
    ag_parts = [[x] * WORLD for x in _inputs((ROWS, COLS), SEED + 2)]
    sent = [all_to_all_input(r, WORLD, COLS, SEED) for r in range(WORLD)]
    for rank, result in enumerate(ranks):
        _check_labels(result["reduce_scatter"]["trace"], rs_parts)
        _check_labels(result["all_gather"]["trace"], ag_parts)
        a2a = result["all_to_all"]["trace"]
        assert a2a["snapshots"][-1]["origins"] == [[j] for j in range(WORLD)]
        for snap in a2a["snapshots"][1:]:
            source = snap["received"][1]
            assert snap["values"][source] == sent[source][rank].reshape(-1).double().tolist()


def test_text_and_picture_show_every_rank_and_step(ranks):
    traces = [result["all_reduce"]["trace"] for result in ranks]
    text = format_collective(traces)
    assert text.splitlines()[0] == "ring all-reduce"
    assert text.count("step ") == 1 + 2 * (WORLD - 1)
    assert "Σ" in text and "0+1" in text
    import matplotlib

    matplotlib.use("Agg")
    fig = plot_collective(traces, "ring all-reduce, 3 ranks")
    assert len(fig.axes) == WORLD * (1 + 2 * (WORLD - 1))
    assert fig.axes[0].get_title() == "start"
    import matplotlib.pyplot as plt

    plt.close(fig)
    assert origin_label([0, 1, 2], 3) == "Σ" and origin_label([0, 2], 3) == "0+2"
    assert origin_label([], 3) == "-"


# ---------------------------------------------------------------------------------------------
# gloo's capabilities and bad input.


def test_gloo_capability_errors_reproduced(ranks):
    for result in ranks:
        errors = result["gloo_errors"]
        assert "Cannot use ReduceOp.AVG with Gloo" in errors["all_reduce(op=ReduceOp.AVG)"]
        assert "does not support reduce_scatter" in errors["reduce_scatter (list form)"]
        assert "does not support alltoall" in errors["all_to_all (list form)"]


def test_bad_input_inside_a_group_gives_the_same_clear_error_on_every_rank(ranks):
    hostile = [result["hostile"] for result in ranks]
    assert all(h == hostile[0] for h in hostile)
    found = hostile[0]
    assert "does not divide into 3 equal chunks" in found["reduce_scatter not divisible"]
    assert "ring_all_reduce" in found["reduce_scatter not divisible"]
    assert "rank 0: (2, 2)" in found["all_gather shapes differ"]
    assert "one tensor per rank (3), got 4" in found["all_to_all wrong count"]
    assert "torch.bool" in found["all_reduce bool"]


def test_outside_a_process_group_is_a_clear_error():
    for call in (lambda: ring_all_reduce(torch.ones(3)), lambda: ring_reduce_scatter(torch.ones(4)),
                 lambda: ring_all_gather(torch.ones(2)), lambda: all_to_all([torch.ones(1)])):
        with pytest.raises(CollectiveError, match="no process group.*launch"):
            call()
    assert issubclass(CollectiveError, OrtlabError)


def test_wrong_types_and_dtypes_are_clear_errors():
    with pytest.raises(CollectiveError, match="must be a torch.Tensor.*as_tensor"):
        ring_all_reduce([1.0, 2.0])
    with pytest.raises(CollectiveError, match="complex64.*view_as_real"):
        ring_all_reduce(torch.ones(2, dtype=torch.complex64))
    with pytest.raises(CollectiveError, match="sparse"):
        ring_all_gather(torch.eye(2).to_sparse())
    with pytest.raises(CollectiveError, match="non-empty list"):
        plot_collective([])
    with pytest.raises(CollectiveError, match="not a trace"):
        format_collective([{"snapshots": [1]}])
    with pytest.raises(CollectiveError, match="collective must be one of"):
        ring_bytes_per_rank("broadcast", 8, 2)
    assert "bytes_sent=0" in repr(CollectiveTrace())


def test_check_table_summarises_the_launch_against_one_process_and_the_formula(ranks):
    table = check_table(ranks)
    rows = {row[0]: row for row in table.rows}
    assert list(rows) == ["all_reduce", "reduce_scatter", "all_gather", "all_to_all"]
    for op, vs_stock, vs_one, sent, formula in table.rows:
        assert float(vs_stock) <= 1e-6 and float(vs_one) <= 1e-6, op
    world = len(ranks)
    x = ranks[0]["all_reduce"]["input"]
    expected = 2 * (world - 1) * x.numel() * x.element_size() / world  # the textbook volume, recomputed here
    assert float(rows["all_reduce"][4]) == pytest.approx(expected)
    for op in ("reduce_scatter", "all_gather"):
        assert rows[op][3] == f"{float(rows[op][4]):g}"  # even sizes: every rank sends exactly the formula
    with pytest.raises(col.CollectiveError, match="launch"):
        check_table({"all_reduce": 1})

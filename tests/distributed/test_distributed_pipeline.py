"""Pipeline schedules (GPipe, 1F1B) on 2 real ranks against one process and torch's pipelining.

One launch runs everything (ortlab.distributed.pipeline.pipeline_job); one more shows torch 2.6's
Schedule1F1B hanging on gloo without the _batch_p2p patch.
"""
import re

import pytest
import torch

from ortlab.distributed import LaunchError, launch
from ortlab.distributed.pipeline import (
    IMPLEMENTATIONS, SCHEDULES, Action, Event, PipelineError, batch_p2p_waits_all, bubble_fraction,
    bubble_table, gpipe_schedule, make_batch, make_model, measured_bubble, merged_grads, microbatches,
    one_f_one_b_schedule, pipeline_job, plot_timelines, reference_gradients, schedule, schedule_table,
    simulate, stage_module, timelines_of, torch_1f1b_unpatched)

M = 4  # microbatches
WORLD = 2


@pytest.fixture(scope="module")
def job():
    # seed 0, width 8, 4 layers, batch 8, M microbatches, 20 ms slept in every timed F and B
    return launch(pipeline_job, world_size=WORLD, args=(0, 8, 4, 8, M, (0.02, 0.02)), timeout=180)


def one_process_grads():
    """Plain torch, no ortlab: the full batch's mean-loss gradient times the number of microbatches."""
    model = make_model(0, 8, 4)
    x, y = make_batch(0, 8, 8)
    (torch.nn.functional.mse_loss(model(x), y) * M).backward()
    return {name: p.grad for name, p in model.named_parameters()}


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", SCHEDULES)
def test_pipeline_grads_equal_one_process(job, implementation, name):
    reference = one_process_grads()
    grads = merged_grads(job, implementation, name)
    assert sorted(grads) == sorted(reference)  # the two stages together hold every parameter
    for key, value in reference.items():
        torch.testing.assert_close(grads[key], value, atol=1e-6, rtol=0)


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
@pytest.mark.parametrize("name", SCHEDULES)
def test_last_rank_losses_are_the_microbatch_losses(job, implementation, name):
    model = make_model(0, 8, 4)
    x, y = make_batch(0, 8, 8)
    with torch.no_grad():
        expected = [torch.nn.functional.mse_loss(model(a), b).item()
                    for a, b in zip(x.chunk(M), y.chunk(M))]
    assert job[-1][implementation][name]["losses"] == pytest.approx(expected, abs=1e-6)


def test_reference_gradients_are_the_sum_over_microbatches():
    grads, losses = reference_gradients(n_microbatches=M)
    for key, value in one_process_grads().items():
        torch.testing.assert_close(grads[key], value, atol=1e-6, rtol=0)
    assert len(losses) == M


def test_each_rank_holds_its_stage_only(job):
    names = [sorted(result["ortlab"]["gpipe"]["grads"]) for result in job]
    assert names == [["0.bias", "0.weight", "2.bias", "2.weight"],
                     ["4.bias", "4.weight", "6.bias", "6.weight"]]


def test_schedules_mirror_torch():
    # Schedule1F1B: stage s runs min(m, p - s) forwards first, then alternates B and F.
    f, b = (lambda i: Action("F", i)), (lambda i: Action("B", i))
    assert one_f_one_b_schedule(2, 4) == [[f(0), f(1), b(0), f(2), b(1), f(3), b(2), b(3)],
                                          [f(0), b(0), f(1), b(1), f(2), b(2), f(3), b(3)]]
    assert gpipe_schedule(3, 2) == [[f(0), f(1), b(0), b(1)]] * 3
    assert one_f_one_b_schedule(4, 2)[0] == [f(0), f(1), b(0), b(1)]  # fewer microbatches than stages
    for p, m in ((2, 4), (3, 5), (4, 8)):
        for name in SCHEDULES:
            for actions in schedule(name, p, m):
                assert sorted(actions) == sorted([f(i) for i in range(m)] + [b(i) for i in range(m)])


@pytest.mark.parametrize("p,m", [(2, 1), (2, 4), (3, 3), (4, 8), (8, 32)])
@pytest.mark.parametrize("times", [(1.0, 1.0), (1.0, 2.0)])
@pytest.mark.parametrize("name", SCHEDULES)
def test_simulated_bubble_is_the_formula(name, p, m, times):
    timelines = simulate(schedule(name, p, m), *times)
    assert measured_bubble(timelines) == pytest.approx((p - 1) / (m + p - 1), abs=1e-12)
    assert bubble_fraction(p, m) == pytest.approx((p - 1) / (m + p - 1))
    makespan = max(e.end for t in timelines for e in t)
    assert makespan == pytest.approx((m + p - 1) * sum(times))


def test_simulate_finds_a_deadlock():
    bad = [[Action("F", 0), Action("B", 0), Action("F", 1), Action("B", 1)],
           [Action("F", 1), Action("B", 1), Action("F", 0), Action("B", 0)]]
    # rank 0 waits for B0 from rank 1, which waits for F1 that rank 0 runs after B0
    with pytest.raises(PipelineError, match=r"cannot finish: every rank waits \(\{0: B0, 1: F1\}\)"):
        simulate(bad)
    circular = [[Action("B", 0), Action("F", 0)], [Action("F", 0), Action("B", 0)]]
    with pytest.raises(PipelineError, match="cannot finish"):
        simulate(circular)
    agreed = [Action("F", 0), Action("F", 1), Action("B", 1), Action("B", 0)]
    simulate([agreed] * 2)  # any order both ranks agree on finishes


def test_measured_timelines(job):
    for name in SCHEDULES:
        timelines = timelines_of(job, name)
        assert [len(t) for t in timelines] == [2 * M] * WORLD
        for rank, timeline in enumerate(timelines):
            assert [(e.kind, e.microbatch) for e in timeline] == list(schedule(name, WORLD, M)[rank])
            assert all(e.end > e.start for e in timeline)
            assert all(a.end <= b.start for a, b in zip(timeline, timeline[1:]))
        # F(i) on rank 1 starts after F(i) ends on rank 0; B(i) on rank 0 after B(i) on rank 1
        first, second = ({(e.kind, e.microbatch): e for e in t} for t in timelines)
        for i in range(M):
            assert second[("F", i)].start >= first[("F", i)].end
            assert first[("B", i)].start >= second[("B", i)].end
        # 20 ms slept per action dominates: the measured bubble is near (p-1)/(m+p-1) = 0.2
        assert measured_bubble(timelines) == pytest.approx(bubble_fraction(WORLD, M), abs=0.1)


def test_1f1b_holds_fewer_activations(job):
    assert [r["ortlab"]["gpipe"]["peak"] for r in job] == [M, M]
    assert [r["ortlab"]["1f1b"]["peak"] for r in job] == [min(M, WORLD - s) for s in range(WORLD)]


def test_tables(job):
    table = bubble_table(job, M)
    assert [row[0] for row in table.rows] == list(SCHEDULES)
    assert [row[2] for row in table.rows] == ["0.20", "0.20"]
    assert [list(row[3:]) for row in table.rows] == [[M, M], [2, 1]]
    assert schedule_table("1f1b", 2, 3).rows == [(0, "F0 F1 B0 F2 B1 B2"), (1, "F0 B0 F1 B1 F2 B2")]
    with pytest.raises(PipelineError, match="per-rank results"):
        bubble_table([{}], M)


def test_plot(job):
    figure = plot_timelines(timelines_of(job, "1f1b"), "1F1B", n_microbatches=M)
    axes = figure.axes[0]
    assert len(axes.patches) == WORLD * 2 * M
    assert "theory (p-1)/(m+p-1) = 0.20" in axes.get_title(loc="left")
    with pytest.raises(PipelineError, match="one list of Events per rank"):
        plot_timelines([])


def test_patch_is_undone():
    from torch.distributed.pipelining import schedules

    original = schedules._batch_p2p
    with batch_p2p_waits_all():
        assert schedules._batch_p2p is not original
        assert schedules._batch_p2p([]) is None
    assert schedules._batch_p2p is original
    with pytest.raises(KeyError), batch_p2p_waits_all():
        raise KeyError("inside")
    assert schedules._batch_p2p is original


def test_unpatched_1f1b_hangs_on_gloo():
    """torch 2.6's Schedule1F1B waits on one Work of several (pytorch issue 132644): a deadlock."""
    with pytest.raises(LaunchError) as caught:
        launch(torch_1f1b_unpatched, world_size=WORLD, args=(4.0,), timeout=120)
    assert caught.value.kind == "raised"
    message = str(caught.value)
    assert re.search(r"raised PipelineHang: torch's Schedule1F1B did not finish within 4 s on rank \d: "
                     r"a deadlock; it waits at schedules.py:\d+ in _step_microbatches", message)
    assert "batch_p2p_waits_all()" in message


@pytest.mark.parametrize("call,match", [
    (lambda: gpipe_schedule(0, 4), "n_stages must be a positive int"),
    (lambda: one_f_one_b_schedule(2, 2.0), "n_microbatches must be a positive int"),
    (lambda: schedule("zb", 2, 4), "schedule must be one of"),
    (lambda: bubble_fraction(True, 4), "n_stages"),
    (lambda: microbatches(torch.zeros(6, 2), 4), "does not split into 4"),
    (lambda: stage_module(make_model(n_layers=3), 0, 2), "equal stages"),
    (lambda: measured_bubble([[], []]), "needs timelines"),
])
def test_bad_input(call, match):
    with pytest.raises(PipelineError, match=match):
        call()


@pytest.mark.parametrize("kwargs,match", [
    ({"n_microbatches": 3}, "does not split into 3"),
    ({"n_layers": 3}, "equal stages"),
    ({"delays": (0.1,)}, "delays must be"),
    ({"delays": (0.1, -1)}, "delays must be"),
])
def test_rank_function_checks_before_any_message(kwargs, match):
    from ortlab.distributed.pipeline import ortlab_pipeline

    with pytest.raises(PipelineError, match=match):  # no process group here: it fails before using one
        ortlab_pipeline(0, WORLD, "gpipe", **kwargs)
    with pytest.raises(PipelineError, match="schedule must be one of"):
        ortlab_pipeline(0, WORLD, "interleaved")


def test_reprs():
    assert repr(Action("F", 3)) == "F3"
    assert "rank 1, B2" in repr(Event(1, "B", 2, 0.0, 1.0))


def test_check_table_reads_every_stage_and_flags_a_difference(job):
    from ortlab.distributed.pipeline import PipelineError, check_table

    table = check_table(job, n_microbatches=M)
    assert [(row[0], row[1]) for row in table.rows] == [(s, i) for s in ("gpipe", "1f1b") for i in ("ortlab", "torch")]
    assert all(row[2] == row[3] == "<= 1e-06" for row in table.rows)
    assert table.rows[0][4] == f"{M} / {M}"  # GPipe: every microbatch's activations at once on every rank
    assert check_table(job, seed=1, n_microbatches=M).rows[0][2] != "<= 1e-06"  # another model: seen
    with pytest.raises(PipelineError, match="launch"):
        check_table([{"x": 1}])

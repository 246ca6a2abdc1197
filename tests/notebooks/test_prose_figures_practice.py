"""The prose of the practice walkthroughs (L0_07, D_01, D_03, L2_03) says what their stored outputs show, and the
helpers behind their new cells compute what they claim.

Prose against stored output (each figure or claim is read from the stored notebook's markdown and compared with
the output beside it, or recomputed from that output): L0_07 introduces the graph doctor where its checks first
run, before any other mention of it; D_01's first run stores one progress line whose step count is the one the
prose gives, and the step time the prose promises (a range of milliseconds) holds the median the cell printed;
D_01's learning-rate range test picks by the rule its prose states, recomputed from the stored table; D_03 says
ORT prints no plan and the stored output of ORT's VERBOSE session shows none (no dump line, one planner line,
no dump header in ORT's library); L2_03's per-rank totals for ORT's sampler, and the per-step gaps, waiting
shares and step counts it gives for ORT's LoadBalancingDistributedBatchSampler against torch's sampler, are
those of the stored output.

Helpers: training_domain_knowledge.pick_lr / lr_table / lr_range_test,
debugging_knowhows.ort_plan_dump, distributed_training.sample_lengths / step_tokens / balance_table /
sections_job / section.
"""
import re

import pytest

from stored_notebook import code_cell as _code_cell, markdown as _markdown
from stored_notebook import markdown_cells as _markdown_cells, output as _output, table as _table

L0_07 = "L0_07_performance_investigation"
D_01 = "D_01_training_domain_knowledge"
D_03 = "D_03_debugging_knowhows"
L2_03 = "L2_03_distributed_training"














def _as_drawn(text):
    """Terminal text as a reader sees it: each line keeps what follows its last carriage return."""
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n") if line.rsplit("\r", 1)[-1].strip()]


# --- L0_07 -------------------------------------------------------------------------------------------------

def test_l0_07_introduces_the_graph_doctor_where_it_first_speaks_of_it():
    first = next(text for text in _markdown_cells(L0_07) if "doctor" in text)
    assert "graph doctor" in first and "graph_doctor.py" in first, (
        f"L0_07's first mention of the doctor does not say what it is: {first[:200]!r}")


# --- D_01 --------------------------------------------------------------------------------------------------

def test_d_01_first_run_stores_one_progress_line_of_the_steps_the_prose_gives():
    drawn = _as_drawn(_output(D_01, "baseline = run(", stream="stderr"))
    assert len(drawn) == 1, f"D_01's first run stores {len(drawn)} progress lines, not one: {drawn[:3]}"
    done, total = map(int, re.search(r"\| (\d+)/(\d+) \[", drawn[0]).groups())
    said = re.search(r"so the (\d+) steps take at most about (\d+) s", _markdown(D_01))
    assert done == total == int(said.group(1))
    minutes, seconds = map(int, re.search(r"\[(\d+):(\d+)<", drawn[0]).groups())
    assert 60 * minutes + seconds <= int(said.group(2)), (
        f"D_01 says the run takes at most {said.group(2)} s; its bar says {drawn[0]}")


def test_d_01_step_time_prose_holds_the_median_the_cell_printed():
    said = re.search(r"A step of this model takes\s+between (\d+) and (\d+) ms", _markdown(D_01))
    low, high = map(int, said.groups())
    median = int(re.search(r"median step time: (\d+) ms", _output(D_01, "baseline = run(", stream="stdout")).group(1))
    assert low <= median <= high, f"D_01 says a step takes {low} to {high} ms; its stored run took {median} ms"


def test_d_01_range_test_picks_by_the_rule_its_prose_states():
    text = _markdown(D_01)
    assert "lowest final loss" in text and "one grid\nstep below it" in text.replace("grid step", "grid\nstep")
    output = _output(D_01, "tdk.lr_range_test(")
    rows = _table(output[output.index("lr "):])[1:]
    lrs = [float(r[0]) for r in rows]
    healthy = [(float(r[1]), float(r[0])) for r in rows if r[2] == "decreasing"]
    lowest = min(healthy)[1]
    picked = lrs[lrs.index(lowest) - 1]
    printed = re.search(r"lowest final loss at lr ([\d.e-]+); one grid step below it: pick lr ([\d.e-]+)", output)
    assert (float(printed.group(1)), float(printed.group(2))) == (lowest, picked)
    grid = re.search(r"\((\S+) to\s+(\S+) here, (\d+) steps each\)", text)
    assert (float(grid.group(1)), float(grid.group(2))) == (lrs[0], lrs[-1])
    assert f"steps={grid.group(3)}" in "".join(_code_cell(D_01, "tdk.lr_range_test(")["source"])


# --- D_03 --------------------------------------------------------------------------------------------------

def test_d_03_says_ort_prints_no_plan_and_its_verbose_session_printed_none():
    text = _markdown(D_03)
    assert "No plan: the planner's only line is which partitioner it uses" in text
    output = _output(D_03, "dk.ort_plan_dump(")
    assert re.search(r"lines of a plan dump: 0\b", output)
    planner = [line for line in output.splitlines() if "allocation_planner.cc:" in line and "]" in line]
    assert len(planner) == 1 and "Partition" in planner[0]
    assert re.search(r"'Allocation Plan:' in \S+: False", output)


# --- L2_03 -------------------------------------------------------------------------------------------------

def test_l2_03_sampler_totals_in_prose_are_the_tables():
    said = re.search(r"not the per-rank totals \((\d+) and (\d+) below\)", _markdown(L2_03))
    rows = _table(_output(L2_03, "ort.workload_table("))
    header, body = rows[0], rows[1:]
    ort = [r for r in body if r[0] == "ORT LoadBalancing"]
    totals = {(int(r[header.index("rank 0 total")]), int(r[header.index("rank 1 total")])) for r in ort}
    assert totals == {tuple(map(int, said.groups()))}


def _steps(output, name):
    line = next(line for line in output.splitlines() if line.startswith(name + ","))
    return [tuple(map(int, pair)) for pair in re.findall(r"\((\d+), (\d+)\)", line)]


def test_l2_03_batch_sampler_figures_in_prose_are_the_outputs():
    text = _markdown(L2_03)
    said = re.search(r"torch's ranks differ by up to (\d+) tokens and ORT's by (\d+) at most; the share of\s+"
                     r"rank-steps spent waiting falls from (\d+)% to (\d+)%\. ORT takes one more step", text)
    assert said, "L2_03 no longer gives the batch sampler's gaps and waiting shares"
    output = _output(L2_03, "examples.step_tokens(")
    torch_steps = _steps(output, "torch DistributedSampler")
    ort_steps = _steps(output, "ORT LoadBalancingDistributedBatchSampler")
    gap = lambda steps: max(abs(a - b) for a, b in steps)  # noqa: E731
    assert (int(said.group(1)), int(said.group(2))) == (gap(torch_steps), gap(ort_steps))
    rows = _table(output[output.index("sampler "):])
    waiting = {r[0]: r[rows[0].index("ranks waiting")] for r in rows[1:]}
    assert (f"{said.group(3)}%", f"{said.group(4)}%") == (waiting["torch DistributedSampler"],
                                                          waiting["ORT LoadBalancingDistributedBatchSampler"])
    assert len(ort_steps) == len(torch_steps) + 1


# --- helpers -----------------------------------------------------------------------------------------------

def test_pick_lr_takes_one_grid_step_below_the_lowest_decreasing_run():
    from ortlab.walkthroughs.training_domain_knowledge import LrRun, lr_table, pick_lr

    runs = [LrRun(1e-3, 2.7, "plateau", []), LrRun(3e-3, 2.4, "decreasing", []),
            LrRun(1e-2, 1.5, "decreasing", []), LrRun(3e-2, 1.2, "spiky", []), LrRun(1e-1, 2.9, "diverging", [])]
    assert pick_lr(runs) == (3e-3, 1e-2)  # the spiky run's lower loss does not count
    assert lr_table(runs).rows[3] == ("0.03", "-", "spiky")
    assert lr_table(runs).rows[0] == ("0.001", "2.700", "plateau")
    with pytest.raises(ValueError, match="no run of the sweep decreased"):
        pick_lr([LrRun(1.0, 9.0, "diverging", [])])


def test_lr_range_test_trains_the_same_model_per_lr():
    from ortlab import models
    from ortlab.training import SGD, progression_batches
    from ortlab.walkthroughs import training_domain_knowledge as tdk

    data = progression_batches(2, batch=4, seq=8, vocab=16)

    def gpt():
        return models.get("gpt", vocab=16, dropout=0.0)

    runs = tdk.lr_range_test(gpt, lambda params, lr: SGD(params, lr=lr), data, (0.0, 0.1), steps=10)
    assert [r.lr for r in runs] == [0.0, 0.1] and all(len(r.losses) == 10 for r in runs)
    assert runs[0].losses[0] == runs[1].losses[0]  # the same weights before the first step
    assert runs[0].shape == "plateau" and runs[0].final == pytest.approx(sum(runs[0].losses[-5:]) / 5)


def test_ort_plan_dump_finds_no_plan_in_orts_verbose_log():
    from ortlab.walkthroughs import debugging_knowhows as dk
    from ortlab.walkthroughs.iobinding_dlpack import mlp_model

    dump = dk.ort_plan_dump(mlp_model())
    assert dump.log_lines > 10 and dump.plan_lines == []
    assert any("allocation_planner.cc" in line for line in dump.planner_lines)
    assert dump.library.startswith("onnxruntime_pybind11_state") and dump.header_in_library is False


def test_step_tokens_deal_every_sample_once_per_sampler_and_the_table_adds_up():
    from ortlab.walkthroughs import distributed_training as examples

    lengths = examples.sample_lengths(12, low=1, high=20)
    assert lengths == examples.sample_lengths(12, low=1, high=20) and all(1 <= n <= 20 for n in lengths)
    tokens = examples.step_tokens(lengths, world_size=2, batch_size=3)
    torch_steps = tokens["torch DistributedSampler"]
    assert sum(map(sum, torch_steps)) == sum(lengths)  # 12 samples, 2 ranks: torch repeats none
    # ORT's batch sampler gives every rank as many batches as the rank with most (it repeats batches)
    assert sum(map(sum, tokens["ORT LoadBalancingDistributedBatchSampler"])) >= sum(lengths)
    rows = examples.balance_table(tokens).rows
    for (name, steps), row in zip(tokens.items(), rows):
        assert row[0] == name and row[1] == len(steps)
        assert row[4] == f"{sum(max(step) for step in steps):,}"


def test_sections_job_names_its_checks_and_section_reads_one_per_rank():
    from ortlab.errors import OrtlabError
    from ortlab.walkthroughs import distributed_training as examples

    with pytest.raises(OrtlabError, match=r"no check for sections \['nope'\]"):
        examples.sections_job(0, 2, sections=("nope",))
    per_rank = [{"ddp": "rank 0's", "moe": 0}, {"ddp": "rank 1's", "moe": 1}]
    assert examples.section(per_rank, "ddp") == ["rank 0's", "rank 1's"]

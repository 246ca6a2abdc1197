"""ortlab.walkthroughs.memory against hand-derived answers (ORT 1.19.2's planner rules worked by hand on a
small graph, arithmetic on the arena) and against ORT's own log."""
import numpy as np
import pytest

from ortlab import session
from ortlab.memory import BFCArena, plan
from ortlab.walkthroughs import memory as mv

KIB, MIB = 1 << 10, 1 << 20


@pytest.fixture(scope="module")
def rules():
    return plan(mv.rules_model(), {"x": (4, 8)})


def test_decision_table_reads_as_orts_rules(rules):
    """Worked by hand from allocation_planner.cc's order: e is read again later (no in-place for
    relu), t is a [8, n] (no dead [n, 8] buffer fits), u in place at t's last use, v and w from the
    freelist (most recently freed first: g after pc 3, then r after pc 2), z aliases w, y is an output."""
    rows = {row[4]: (row[6], row[7], row[8]) for row in mv.decision_table(rules).rows}
    assert rows == {"e": ("kAllocate", "", ""), "r": ("kAllocate", "", ""), "g": ("kAllocate", "", ""),
                    "t": ("kAllocate", "", ""), "u": ("kReuse", "t", "MayInplace"),
                    "v": ("kReuse", "g", "freelist"), "w": ("kReuse", "r", "freelist"),
                    "z": ("kReuse", "r", "Alias"), "y": ("kAllocateOutput", "", "")}


def test_use_counts_are_counted_as_compute_reuse_count_counts(rules):
    counts = {row[0]: row[-1] for row in mv.use_count_table(rules).rows}
    # x: graph input + Exp; e: Relu + Add + its slot; y: its slot + graph output; flat: initializer + Reshape
    assert (counts["x"], counts["e"], counts["y"], counts["flat"], counts["t"]) == (2, 3, 2, 2, 2)


def test_freelist_table_gives_the_idle_program_counters(rules):
    assert mv.freelist_table(rules).rows == [(5, "v", "g", 3, 1, 256), (6, "w", "r", 2, 3, 256)]


def test_live_bytes_by_hand(rules):
    # buffers of 256 bytes held over e [0, 6], r [1, 8] (r, w, z), g [2, 6] (g, v), t [3, 5] (t, u)
    want = [256, 512, 768, 1024, 1024, 1024, 768, 256, 256, 0]
    assert mv.live_bytes(rules).tolist() == want
    assert max(want) == rules.lower_bound_bytes


@pytest.mark.parametrize("reuse, buffers", [(True, 4), (False, 3)])
def test_ort_log_readers_give_orts_block(reuse, buffers):
    """With n = 65536 every tensor is 2 MiB; by hand the block holds 4 of them with reuse on (e, r's
    chain, g's chain, t at pcs 3 to 5) and 3 with reuse off (r's and t's intervals no longer meet)."""
    feeds = {"x": np.ones((65536, 8), np.float32)}
    lines = mv.ort_first_run_log(mv.rules_model(), feeds, enable_mem_reuse=reuse)
    assert mv.arena_requests(lines)[0] == buffers * 2 * MIB
    assert mv.arena_growth(lines)[0] >= buffers * 2 * MIB
    assert mv.arena_lines(lines)[0].startswith("Extending BFCArena for Cpu.")
    assert not any("ThreadMain" in line for line in lines)


def test_arena_views_by_arithmetic():
    arena = BFCArena()
    a, b, c, d = (arena.alloc(256 * KIB) for _ in range(4))
    arena.free(a)
    arena.free(c)
    q = 256 * KIB
    assert mv.snapshot(arena) == [(0, 0, q, False, 0), (0, q, q, True, q), (0, 2 * q, q, False, 0),
                                  (0, 3 * q, q, True, q)]
    arena.free(b)
    arena.alloc(600 * KIB)                # the merged 768 KiB chunk, not split (768 < 2 x 600)
    rows = mv.chunk_table(arena).rows
    assert rows == [(0, 0, 768, "in use", "600", ""), (0, 768, 256, "in use", "256", "")]
    figure = mv.plot_arena([("end", mv.snapshot(arena))])
    assert len(figure.axes[0].patches) == 2


def test_training_step_gives_torchs_gradients_in_ort_and_plots():
    import matplotlib

    from ortlab import models

    matplotlib.use("Agg")
    model, feeds = mv.training_step("gpt", batch=2, seq=8)
    assert feeds["input_ids"].shape == (2, 8)
    outputs = session.run_model(model, feeds)
    module = models.get("gpt", dropout=0.0)
    module(*module.example_inputs(2, 8)).backward()
    for name, parameter in module.named_parameters():
        assert np.abs(outputs[f"{name}_grad"] - parameter.grad.numpy()).max() < 1e-5, name
    p = plan(model, feeds)
    ax = mv.plot_live_bytes({"step": p}, marks={"loss": 1})
    assert ax.lines[0].get_ydata().max() * MIB == pytest.approx(p.lower_bound_bytes)
    assert {row[0] for row in mv.kind_counts(p).rows} >= {"kAllocate", "kReuse", "kAllocateOutput"}

"""L2_02's exercises are judged by ortlab.memory.plan; on the exercises' model its block is ORT's own first
arena request (ORT 1.19.2's verbose log, ortlab.memory.ort_arena_log), with the freelist on and off, and its
decisions follow the rules the exercise states (an independent reading of the same graph)."""
import numpy as np
import pytest

from ortlab.labs import l2_02
from ortlab.memory import plan
from ortlab.memory.ort_arena_log import arena_requests, ort_first_run_log


@pytest.mark.parametrize("reuse", [True, False])
def test_the_block_of_the_exercise_model_is_orts_request(reuse):
    model, feeds = l2_02.buffers_model(), {"x": np.ones((l2_02.ROWS, 3), np.float32)}
    theirs = arena_requests(ort_first_run_log(model, feeds, enable_mem_reuse=reuse))[0]
    assert plan(model, feeds, enable_mem_reuse=reuse).peak_bytes == theirs


def test_the_plan_follows_the_rules_the_exercise_states():
    """Rebuilt by hand from the rules (not from the reference answer): in-place only at a last read, the
    freelist by symbolic shape, newest first, Reshape aliased, the graph output never reused."""
    p = plan(l2_02.buffers_model(), {"x": (4, 3)})
    order = [n.name for n in p.order]
    assert order.index("add") == len(order) - 2  # ORT's default order runs b + x late
    owner = {v.name: v.reuses for v in p.values if v.kind in ("kAllocate", "kReuse", "kAllocateOutput")}
    assert owner["b"] is None and p.value("a").last_use > p.value("b").defined_at  # a is read again
    assert owner["m"] == owner["s"] == "c"  # Relu in place over s, which took c's buffer
    assert owner["p"] is None and list(p.value("t").shape) == [3, "n"]  # t's buffer: another shape
    assert owner["r"] == "p" and owner["q"] == "a" and p.value("y").kind == "kAllocateOutput"
    assert p.peak_bytes == p.lower_bound_bytes

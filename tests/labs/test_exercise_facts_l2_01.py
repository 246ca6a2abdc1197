"""L2_01's exercises: 'released_after' is judged by the release plan of ortlab.engine's SessionState, and
'needed_steps' by the nodes ORT itself runs. Here: the session runs loop_model() in ORT's own order and
computes ORT's outputs; its releases are those an independent reading of ortlab.memory.plan's buffers gives
(each buffer after the last reader of any value living in it); and the steps ORT runs for each of the
exercise's fetch lists are those ortlab's executor keeps (sequential_executor.needed_steps)."""
import numpy as np
import pytest

from ortlab import session
from ortlab.engine.sequential_executor import needed_steps
from ortlab.labs import l2_01
from ortlab.labs.judges.l2_01 import FETCHES, _ort_steps
from ortlab.memory import plan

CPU = ["CPUExecutionProvider"]


def test_the_session_runs_the_exercise_model_in_orts_order_with_orts_outputs():
    model, feeds = l2_01.loop_model(), l2_01.loop_feeds()
    sess = l2_01.loop_session(model)
    assert [s.node.name for s in sess.state.steps] == session.execution_order(model, feeds, providers=CPU)
    ours, theirs = sess.run(None, feeds), session.run_model(model, feeds)
    assert all(np.allclose(a, b, atol=1e-6) for a, b in zip(ours, theirs.values()))


def test_the_releases_are_each_buffers_last_reader():
    model = l2_01.loop_model()
    state = l2_01.loop_session(model).state
    released = {state.value_names[slot]: k for k, step in enumerate(state.steps) for slot in step.releases}
    p = plan(model, {"x": (2, 4)})
    last = {}
    for v in p.values:
        if v.kind in ("kAllocate", "kReuse") and v.last_use is not None:
            owner = v.reuses or v.name
            last[owner] = max(last.get(owner, -1), v.last_use)
    expected = {v.name: last[v.reuses or v.name] for v in p.values
                if v.kind in ("kAllocate", "kReuse") and (v.reuses or v.name) in last}
    assert released == expected
    assert released["h"] == released["r"] == released["a"]  # Relu and Sigmoid wrote in place


@pytest.mark.parametrize("fetches", FETCHES, ids=lambda f: "+".join(f))
def test_orts_steps_for_the_fetches_are_the_executors(fetches):
    model = l2_01.loop_model()
    state = l2_01.loop_session(model).state
    assert _ort_steps(model, fetches) == [s.node.name for s in needed_steps(state, fetches)]

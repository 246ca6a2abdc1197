"""The checks of L2_01's exercises (run where the learner's code cannot reach them).

'released_after' reads the release plan of ortlab.engine's SessionState (the allocation planner's
GenerateDeallocationPlan, onnxruntime/core/framework/allocation_planner.cc), explained with ortlab.memory.plan's
buffers; 'needed_steps' compares with the nodes ORT 1.19.2 itself runs with only_execute_path_to_fetches
(session.execution_order, read from ORT's profiler; SessionState::UpdateToBeExecutedRange).
"""
from ortlab import session
from ortlab.env import quiet_import
from ortlab.labs.checks import CheckFailed
from ortlab.labs.l2_01 import loop_feeds, loop_model, loop_session, predicted_releases, steps_kept
from ortlab.memory import plan

FETCHES = (["y"], ["z"], ["u"], ["z", "u"])


def _fate(state, name):
    model = loop_model()
    if name in [i.name for i in model.graph.input]:
        return "a feed (the caller's)"
    if name in [t.name for t in model.graph.initializer]:
        return "an initializer (the session's)"
    if name in [o.name for o in model.graph.output]:
        return "a graph output (the caller gets it back)"
    return None


def released_after(remote, fn):
    got = remote.call(predicted_releases, fn)
    state = loop_session().state
    names = state.value_names
    truth = {names[slot]: k for k, step in enumerate(state.steps) for slot in step.releases}
    readers = {}
    for k, step in enumerate(state.steps):
        for slot in step.inputs:
            if slot >= 0:
                readers[names[slot]] = k
    buffers = plan(loop_model(), {"x": (2, 4)})
    for name in got:
        if name not in names:
            raise CheckFailed(f"{name!r} is not a value of loop_model(); its values are {', '.join(names)}")
        if name not in truth:
            raise CheckFailed(f"{name!r} is {_fate(state, name) or 'never released'}: never released by the plan, "
                              "so leave it out")
    for name, step in sorted(truth.items(), key=lambda kv: names.index(kv[0])):
        if name not in got:
            raise CheckFailed(f"{name!r} is missing: the plan releases it after step {step}")
        said = got[name]
        if said == step:
            continue
        owner = buffers.value(name).reuses or name
        mates = [v.name for v in buffers.values if (v.reuses or v.name) == owner]
        if len(mates) > 1 and said == readers.get(name):
            chain = " and ".join(m for m in mates if m != name)
            raise CheckFailed(f"{name!r}: you said step {said}, its own last read; but {chain} live in the same "
                              f"buffer as {name} (written in place), and a buffer is released after the last reader "
                              f"of any value living in it: step {step} ({state.steps[step].node.name})")
        order = [n.name for n in loop_model().graph.node]
        reader = state.steps[step].node.name
        if said == order.index(reader):
            raise CheckFailed(f"{name!r}: {said} is {reader}'s index in the model; steps are counted in the "
                              f"execution order (plan_table), where {reader} is step {step}")
        raise CheckFailed(f"{name!r} is released after step {step} ({reader}, the last reader of its buffer); "
                          f"you said {said!r}")
    return None


def _ort_steps(model, fetches):
    ort = quiet_import("onnxruntime")
    options = ort.RunOptions()
    options.only_execute_path_to_fetches = True
    return session.execution_order(model, loop_feeds(), fetches=list(fetches), run_options=options,
                                   providers=["CPUExecutionProvider"])


def _reading_slot_minus_one(state, fetches):
    """The steps a walk back from `fetches` keeps when it reads an input slot of -1 as a value (the usual slip)."""
    wanted, keep = set(fetches), []
    for step in reversed(state.steps):
        if any(state.value_names[s] in wanted for s in step.outputs):
            keep.append(step.node.name)
            wanted.update(state.value_names[s] for s in step.inputs)
    return keep[::-1]


def needed_steps(remote, fn):
    model = loop_model()
    state = loop_session(model).state
    names = state.value_names
    for fetches in FETCHES:
        truth = _ort_steps(model, fetches)
        got = remote.call(steps_kept, fn, model, fetches)
        known = [s.node.name for s in state.steps]
        unknown = [g for g in got if g not in known]
        if unknown:
            raise CheckFailed(f"fetching {fetches}: {unknown[0]!r} is not a step of the plan")
        extra = [g for g in got if g not in truth]
        if extra:
            step = next(s for s in state.steps if s.node.name == extra[0])
            writes = [names[o] for o in step.outputs if o >= 0]
            if got == _reading_slot_minus_one(state, fetches):
                raise CheckFailed(f"fetching {fetches}: you kept {extra[0]!r}, which writes {names[-1]!r}: an input "
                                  f"slot of -1 is an input the node leaves out (clip's `min`), and names[-1] is the "
                                  "last value, not a value it reads; skip slots below 0")
            raise CheckFailed(f"fetching {fetches}: {extra[0]!r} writes {writes}, which no fetch needs, not even "
                              f"through another step; ORT runs only {truth}")
        missing = [t for t in truth if t not in got]
        if missing:
            raise CheckFailed(f"fetching {fetches}: {missing[0]!r} is missing: a fetch needs it through the values "
                              "it writes; a step is needed when another needed step reads one of its outputs, "
                              f"so follow the inputs back (ORT runs {truth})")
        if got != truth:
            raise CheckFailed(f"fetching {fetches}: the right steps in the wrong order {got}; run them in the plan's "
                              f"order (state.steps), as ORT does: {truth}")
    return None

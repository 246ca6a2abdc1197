"""The checks of lab09_memory_planner (run where the learner's code cannot reach them).

The learner's functions get plain data (NodeProtos and shapes; Alloc/Free events; Tensors) from
cases the check builds here, including models the notebook never shows (random DAGs and a BERT
training step), and send back plain data. The references are ortlab.memory (byte-exact against ORT
in tests/memory/test_memory.py) and, for the block, ORT 1.19.2 itself: the bytes it asks its arena for on a
session's first run, read from its verbose log.
"""
from ortlab.labs.checks import CheckFailed, call_learner
from ortlab.labs.lab09 import (SEEN, Alloc, Lifetime, block_of, exercise_inputs, ort_block, pattern_events,
                               pattern_tensors, peak, placement, planning_case)
from ortlab.labs.remote import function
from ortlab.memory.mem_pattern_planner import MemPatternPlanner
from ortlab.memory.validator import PlanValidationError

HIDDEN = ("random dag 101", "random dag 202", "random dag 303", "bert training")


def case(name):
    """A case by name: the notebook's (SEEN) or the hidden ones."""
    return planning_case(name)


def reference_lifetimes(c):
    """{value: Lifetime} from ortlab.memory's plan, for every node output."""
    return {v.name: Lifetime(v.defined_at, v.last_use, v.size if v.resolved is not None else None)
            for v in c.plan.values if v.defined_at is not None}


def reference_best_fit(events):
    """ORT's MemPatternPlanner on the events: {name: offset}."""
    planner, names = MemPatternPlanner(using_counters=False), {}
    for event in events:
        if isinstance(event, Alloc):
            names[event.name] = len(names)
            planner.trace_allocation(names[event.name], event.size)
        else:
            planner.trace_free(names[event.name])
    blocks, _ = planner.pattern()
    return {name: blocks[i].offset for name, i in names.items()}


def _first_wrong_lifetime(c, got):
    expected = reference_lifetimes(c)
    if not isinstance(got, dict):
        return f"return a dict {{value name: Lifetime(defined_at, last_use, size)}}, not {type(got).__name__}"
    extra = sorted(set(got) - set(expected))
    if extra:
        return (f"{extra[0]!r} is not produced by any node: give a lifetime to node outputs only "
                "(graph inputs and initializers are not the planner's)")
    by_pc = sorted(expected.items(), key=lambda kv: (kv[1].defined_at, kv[0]))
    for name, want in by_pc:
        if name not in got:
            return f"no lifetime for {name!r}, produced at pc {want.defined_at}: every node output needs one"
        have = got[name]
        if not isinstance(have, tuple) or len(have) != 3:
            return f"lifetime of {name!r}: give (defined_at, last_use, size), not {have!r}"
        have = Lifetime(*have)
        node = c.plan.order[want.defined_at]
        for field, hint in (("defined_at", f"the pc of its producer, node {node.name!r}"),
                            ("last_use", "the pc of the last node reading it (None when no node reads it)"),
                            ("size", "prod(dims) * bytes per element rounded up to a multiple of 256 "
                                     "(None when the shape is not in `shapes`)")):
            if getattr(have, field) != getattr(want, field):
                return (f"case {c.name!r}, value {name!r}: {field} is {getattr(want, field)!r}, you gave "
                        f"{getattr(have, field)!r} ({field}: {hint})")
    return None


def lifetimes(remote, lifetimes):
    """Exercise 'lifetimes': lifetimes(nodes, shapes) -> {value: Lifetime(defined_at, last_use, size)}."""
    lifetimes = function(remote, lifetimes)
    for name in SEEN + HIDDEN:
        c = case(name)
        got = call_learner(lifetimes, *exercise_inputs(c), what=f"lifetimes(nodes, shapes) on case {name!r}")
        reason = _first_wrong_lifetime(c, got)
        if reason:
            return reason
    return None


def _offsets(result, names, what):
    if not isinstance(result, dict):
        raise CheckFailed(f"{what} must return a dict {{tensor name: offset}}, not {type(result).__name__}")
    missing = [n for n in names if n not in result]
    if missing:
        raise CheckFailed(f"{what} gave no offset for {missing[0]!r}: place every tensor")
    bad = [n for n in names if isinstance(result[n], bool) or not isinstance(result[n], int) or result[n] < 0]
    if bad:
        raise CheckFailed(f"{what}: the offset of {bad[0]!r} is {result[bad[0]]!r}; an offset is an int >= 0")
    return result


def _live_before(events, k, offsets):
    live = {}
    for event in events[:k]:
        if isinstance(event, Alloc):
            live[event.name] = (offsets[event.name], event.size)
        else:
            live.pop(event.name, None)
    return sorted(live.values())


def _first_wrong_offset(c, events, got):
    want = reference_best_fit(events)
    for k, event in enumerate(events):
        if isinstance(event, Alloc) and got[event.name] != want[event.name]:
            live = _live_before(events, k, want)
            return (f"case {c.name!r}, event {k} (Alloc({event.name!r}, {event.size})): ORT's best fit puts it at "
                    f"{want[event.name]}, you put it at {got[event.name]}; live blocks then (offset, size): "
                    f"{live[:8]}{' ...' if len(live) > 8 else ''}. Best fit takes the gap between live blocks, or "
                    "the gap from the highest live block to the block's end so far, that wastes least (the first "
                    "such gap on a tie), else the end of the highest live block")
    return None


def best_fit(remote, best_fit):
    """Exercise 'best_fit': best_fit(events) -> {tensor name: offset}, as ORT's MemPatternPlanner."""
    best_fit = function(remote, best_fit)
    for name in SEEN + HIDDEN:
        c = case(name)
        events = pattern_events(c, reference_lifetimes(c))
        names = [e.name for e in events if isinstance(e, Alloc)]
        got = _offsets(call_learner(best_fit, list(events), what=f"best_fit(events) on case {name!r}"),
                       names, "best_fit(events)")
        reason = _first_wrong_offset(c, events, got)
        if reason:
            return reason
        sizes = {e.name: e.size for e in events if isinstance(e, Alloc)}
        if peak(got, sizes) != ort_block(name):
            return f"case {name!r}: your block is {peak(got, sizes):,} bytes, ORT asked for {ort_block(name):,}"
    return None


def predicted_block(name, lifetimes, best_fit):
    """The block the learner's two functions (functions of data) predict for a case, hidden ones included."""
    return block_of(case(name), lifetimes, best_fit)


def prediction(remote, lifetimes, best_fit):
    """Both exercises together on cases the notebook never shows: the predicted block is ORT's request."""
    lifetimes, best_fit = function(remote, lifetimes), function(remote, best_fit)
    for name in HIDDEN:
        predicted, want = predicted_block(name, lifetimes, best_fit), ort_block(name)
        if predicted != want:
            return (f"case {name!r} (not shown in the notebook): you predict {predicted:,} bytes, ORT asked "
                    f"its arena for {want:,}")
    return None


def better_planner(remote, better_planner):
    """Exercise 'better_planner': better_planner(tensors) -> {name: offset}: valid on every case, never
    above ORT's block, and below it somewhere."""
    better_planner = function(remote, better_planner)
    better = []
    for name in SEEN + HIDDEN:
        c = case(name)
        tensors = pattern_tensors(c)
        got = _offsets(call_learner(better_planner, list(tensors), what=f"better_planner(tensors) on case {name!r}"),
                       [t.name for t in tensors], "better_planner(tensors)")
        placed = placement(c, got)
        try:
            placed.validate()
        except PlanValidationError as exc:
            return f"case {name!r}: {exc}"
        if placed.peak_bytes > c.plan.peak_bytes:
            return (f"case {name!r}: your block is {placed.peak_bytes:,} bytes, above ORT's best fit "
                    f"({c.plan.peak_bytes:,}); the lower bound is {c.plan.lower_bound_bytes:,}")
        better.append(placed.peak_bytes < c.plan.peak_bytes)
    if not any(better):
        return "valid, but never smaller than ORT's block: try placing the largest tensors first"
    return None



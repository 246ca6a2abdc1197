"""Checks for lab09_memory_planner: tensor lifetimes, ORT's best fit, and a planner that beats it.

The learner's code works on plain data. `lifetimes(nodes, shapes)` reads the nodes in ORT's execution
order; `best_fit(events)` places tensors as ORT's MemPatternPlanner does
(onnxruntime/core/framework/mem_pattern_planner.h); `better_planner(tensors)` sees every tensor's
lifetime first. The checks (ortlab.labs.judges.lab09, which this module never imports) compare with
ortlab.memory (byte-exact against ORT in tests/memory/test_memory.py) and, for the block, ORT 1.19.2 itself:
the bytes it asks its arena for on a session's first run, read from its verbose log. The graded cases
include models the notebook never shows, so a solution fitted to the notebook's examples does not pass.
"""
import functools
from collections import namedtuple
from dataclasses import dataclass

import numpy as np

from ortlab.labs.checks import CheckFailed, call_learner, judge
from ortlab.labs.remote import learner, register_tuple
from ortlab.memory import plan as make_plan
from ortlab.memory.lifetimes import Lifetime
from ortlab.walkthroughs import memory as views
from ortlab.memory import planners
from ortlab.memory.planners import Placement
from ortlab.viz import Table

Lifetime = register_tuple(Lifetime)  # ortlab.memory's: (defined_at, last_use, size)
Alloc = register_tuple(namedtuple("Alloc", "name size"))
Free = register_tuple(namedtuple("Free", "name"))
Tensor = register_tuple(planners.Tensor)  # the one Tensor the engine's planners take too

FIRST_REGION = 1 << 20   # the CPU arena's first region: a block that fits there is not logged
SEEN = ("rules", "gpt training")


@dataclass
class Case:
    """A model, the feeds of its first run, and ortlab's plan of it (default order, reuse on)."""

    name: str
    model: object
    feeds: dict

    @functools.cached_property
    def plan(self):
        return make_plan(self.model, {k: v.shape for k, v in self.feeds.items()})

    def __repr__(self):
        return f"Case({self.name!r}: {len(self.plan.order)} nodes, {len(self.plan.planned())} tensors in the pattern)"


def _build(name):
    if name == "rules":
        return views.rules_model(), {"x": np.random.RandomState(0).rand(65536, 8).astype(np.float32)}
    if name == "gpt training":
        return views.training_step("gpt", batch=64, seq=16)
    if name == "bert training":
        return views.training_step("bert", batch=128, seq=16, builder="ort")
    if name.startswith("random dag "):
        return views.random_dag(int(name.split()[-1]), nodes=22)
    raise CheckFailed(f"no case {name!r}; the notebook's cases are {SEEN}")


@functools.lru_cache(maxsize=None)
def planning_case(name):
    return Case(name, *_build(name))


def case(name):
    """The Case called `name` (one of SEEN; the checks also use cases the notebook does not show)."""
    if not isinstance(name, str) or name not in SEEN:
        raise CheckFailed(f"case() takes a case's name, one of {SEEN}, not {name!r}")
    return planning_case(name)


@functools.lru_cache(maxsize=None)
def ort_block(name):
    """The bytes ORT 1.19.2 asks its CPU arena for on the case's first run: its memory-pattern block
    (ORT_DISABLE_ALL, default order, reuse on; read from ORT's verbose log)."""
    c = planning_case(name)
    requests = views.arena_requests(views.ort_first_run_log(c.model, c.feeds))
    if not requests or c.plan.peak_bytes <= FIRST_REGION:
        raise CheckFailed(f"ORT logged no arena request for case {name!r}: its block fit in the arena's first "
                          "region (a bug in the lab's case: tell the maintainers)")
    return requests[0]


# --- the learner's inputs ----------------------------------------------------------------------------
def exercise_inputs(c):
    """(nodes, shapes) for lifetimes(): the onnx NodeProtos in ORT's execution order, and {value name:
    (dims, bytes per element)} for every node output whose shape ORT knows from the feeds."""
    p = c.plan
    nodes = [node.to_proto() for node in p.order]
    shapes = {}
    for v in p.values:
        if v.resolved is not None and v.defined_at is not None:
            arg = p.graph.node_arg(v.name)
            shapes[v.name] = (tuple(v.resolved), _itemsize(arg.dtype))
    return nodes, shapes


def _itemsize(dtype):
    return np.dtype(dtype).itemsize


def pattern_events(c, lifetimes):
    """ORT's allocation trace of the pattern, built from `lifetimes` ({value: Lifetime}) and ORT's reuse
    decisions (which values get a buffer of their own, and which live in another's): in execution order,
    an Alloc(name, size) when a buffer's producer runs, a Free(name) after the last reader of any value
    living in it. A buffer nobody reads is never freed."""
    p, events = c.plan, []
    buffers = sorted(p.planned(), key=lambda v: v.index)
    lifetimes = _normalized(lifetimes, [b.name for b in buffers])
    ends = {}
    for b in buffers:
        reads = [lifetimes[h.name].last_use for h in views.holders(p, b.index)
                 if h.name in lifetimes and lifetimes[h.name].last_use is not None]
        ends[b.name] = max(reads) if reads else None
    for pc in range(len(p.order)):
        events += [Alloc(b.name, lifetimes[b.name].size) for b in buffers if lifetimes[b.name].defined_at == pc]
        events += [Free(b.name) for b in buffers if ends[b.name] == pc]
    return events


def _normalized(lifetimes, buffers):
    """{name: Lifetime} from a dict of Lifetimes or 3-tuples; CheckFailed saying what is missing or wrong."""
    if not isinstance(lifetimes, dict):
        raise CheckFailed(f"lifetimes must be a dict {{value name: Lifetime}}, not {type(lifetimes).__name__}")
    found = {}
    for name, life in lifetimes.items():
        if not isinstance(life, tuple) or len(life) != 3:
            raise CheckFailed(f"the lifetime of {name!r} is {life!r}: give Lifetime(defined_at, last_use, size)")
        found[name] = Lifetime(*life)
    for name in buffers:
        if name not in found:
            raise CheckFailed(f"no lifetime for {name!r}, which ORT plans a buffer for: give every node output one")
        life = found[name]
        if not isinstance(life.defined_at, int) or not isinstance(life.size, int) or life.size <= 0:
            raise CheckFailed(f"the lifetime of {name!r} is {life}: ORT plans a buffer for it, so it needs an int "
                              "defined_at and a size in bytes (> 0)")
    return found


def pattern_tensors(c):
    """ORT's pattern tensors as Tensor(name, size, start, end): [start, end] the program counters its
    buffer is held (inclusive), for better_planner()."""
    return planners.pattern_tensors(c.plan)


def peak(offsets, sizes):
    """The block a placement needs: the end of its highest tensor."""
    return max((offsets[n] + sizes[n] for n in offsets), default=0)


# --- checks ------------------------------------------------------------------------------------------
def check_lifetimes(lifetimes):
    """Exercise 'lifetimes': lifetimes(nodes, shapes) -> {value: Lifetime(defined_at, last_use, size)}."""
    judge("lifetimes", "lab09.lifetimes", learner(lifetimes))


def check_best_fit(best_fit):
    """Exercise 'best_fit': best_fit(events) -> {tensor name: offset}, as ORT's MemPatternPlanner."""
    judge("best_fit", "lab09.best_fit", learner(best_fit))


def predicted_block(name, lifetimes, best_fit):
    """The block your two functions predict for a case, before anything runs."""
    return block_of(case(name), lifetimes, best_fit)


def block_of(c, lifetimes, best_fit):
    """The block two functions (lifetimes, best_fit) predict for the Case `c`."""
    mine = call_learner(lifetimes, *exercise_inputs(c), what=f"lifetimes on case {c.name!r}")
    events = pattern_events(c, mine)
    offsets = call_learner(best_fit, list(events), what=f"best_fit on case {c.name!r}")
    return peak(offsets, {e.name: e.size for e in events if isinstance(e, Alloc)})


def check_prediction(lifetimes, best_fit):
    """Both exercises together on cases the notebook never shows: the predicted block is ORT's request."""
    judge("prediction", "lab09.prediction", learner(lifetimes), learner(best_fit))


def check_better_planner(better_planner):
    """Exercise 'better_planner': better_planner(tensors) -> {name: offset}: valid on every case, never
    above ORT's block, and below it somewhere."""
    judge("better_planner", "lab09.better_planner", learner(better_planner))


def placement(c, offsets, algorithm="yours"):
    """A Placement (ortlab.memory.planners) of the case's pattern tensors at `offsets` ({name: offset}):
    .validate() checks it, .as_plan().plot() draws it."""
    p, sizes = c.plan, {t.name: t.size for t in pattern_tensors(c)}
    by_index = {p.value(n).index: o for n, o in offsets.items() if n in sizes}
    return Placement(algorithm, by_index, peak({n: offsets[n] for n in sizes}, sizes), p.lower_bound_bytes, p)


def planner_table(better_planner, names=SEEN):
    """One row per case: ORT's block (its own log), ortlab's prediction, your planner's block and the
    lower bound, with how far each is above the bound."""
    rows = []
    for name in names:
        c = planning_case(name)
        tensors = pattern_tensors(c)
        yours = placement(c, better_planner(list(tensors))).peak_bytes
        bound = c.plan.lower_bound_bytes
        over = lambda b: f"{(b - bound) / bound:+.2%}"  # noqa: E731
        rows.append((name, ort_block(name), c.plan.peak_bytes, yours, bound, over(c.plan.peak_bytes), over(yours)))
    return Table(("case", "ORT's request", "ortlab's prediction", "your planner", "lower bound",
                  "ORT over bound", "yours over bound"), rows)


def engine_table(better_planner, names=SEEN):
    """Your planner inside ortlab's engine: each case run by InferenceSession with
    SessionOptions(memory_planner=better_planner). One row per case: your planner's block, the block the
    engine's run allocated, and whether the outputs equal a run with no memory pattern at all."""
    from ortlab.engine import InferenceSession, SessionOptions  # lazy: loads the whole engine, for this table only

    rows = []
    for name in names:
        c = planning_case(name)
        predicted = placement(c, better_planner(list(pattern_tensors(c)))).peak_bytes
        runs = {}
        for pattern in (True, False):
            options = SessionOptions(graph_optimization_level=0, enable_mem_pattern=pattern,
                                     memory_planner=better_planner)
            sess = InferenceSession(c.model, options)
            runs[pattern] = (sess.run(None, c.feeds), sess.last_run.pattern_bytes)
        same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(runs[True][0], runs[False][0]))
        rows.append((name, predicted, runs[True][1], "yes" if same else "NO"))
    return Table(("case", "your planner's block", "the engine's block", "outputs equal without a pattern"), rows)


def plot_placements(c, placements, ax=None):
    """The memory-time picture of each Placement of a case, side by side (a row of Axes)."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    if ax is None:
        _, ax = plt.subplots(1, len(placements), figsize=(6 * len(placements), 4), sharey=True)
    for axis, placed in zip(list(ax) if len(placements) > 1 else [ax], placements):
        placed.as_plan().plot(ax=axis, title=f"{placed.algorithm}: {placed.peak_bytes:,} B")
    return ax

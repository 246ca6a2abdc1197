"""The checks of L0_07's exercises (run where the learner's code cannot reach them).

'self_times' records a profile of its own (a small MLP's forward and backward, never shown in the notebook),
hands the learner its 'cpu_op' events in shuffled order, and compares the learner's self times, summed per op,
with torch.profiler's own self CPU time (key_averages().self_cpu_time_total, torch/autograd/profiler_util.py);
each wrong event is explained from the events' nesting. 'fused_matmuls' reads the graph ORT itself saves after
its transformers at level extended (session.optimized_model: SessionOptions.optimized_model_filepath), where
MatmulTransposeFusion and MatMulScaleFusion (level 2) run after constant folding (level 1).
"""
import functools
from collections import defaultdict

import numpy as np

from ortlab import session
from ortlab.labs.checks import CheckFailed
from ortlab.labs.l0_07 import matmul_model, predicted_fusions, profiled, self_times_of

CPU = ["CPUExecutionProvider"]


# --- 'self_times' ---------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def recorded():
    """(events in shuffled order, torch's {op name: self CPU µs}) of one forward and backward of a small MLP."""
    import torch  # heavy: torch

    with torch.random.fork_rng():  # the notebook's random state stays as it was
        torch.manual_seed(0)
        layers = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                                     torch.nn.Linear(32, 4))
        x = torch.randn(8, 16)

    def step():
        layers.zero_grad()
        layers(x).pow(2).mean().backward()

    prof, events = profiled(step)
    order = np.random.default_rng(0).permutation(len(events))
    shuffled = [events[i] for i in order]
    return shuffled, {k.key: float(k.self_cpu_time_total) for k in prof.key_averages()}


def tree(events):
    """[index of the event each event runs directly inside, or None]: the nearest enclosing event on its
    thread (it starts before the other ends)."""
    parent = [None] * len(events)
    for tid in {e["tid"] for e in events}:
        stack = []
        for i in sorted((i for i, e in enumerate(events) if e["tid"] == tid),
                        key=lambda i: (events[i]["ts"], -events[i]["dur"])):
            while stack and events[stack[-1]]["ts"] + events[stack[-1]]["dur"] <= events[i]["ts"]:
                stack.pop()
            parent[i] = stack[-1] if stack else None
            stack.append(i)
    return parent


def _close(a, b):
    return abs(a - b) <= 1e-3 + 1e-6 * abs(b)


def _descendants(parent, i):
    found, queue = [], [j for j, p in enumerate(parent) if p == i]
    while queue:
        j = queue.pop()
        found.append(j)
        queue += [k for k, p in enumerate(parent) if p == j]
    return found


def _explain(events, parent, got, wrong):
    """(the event whose self time is explained, why it is wrong), from the events' nesting; `wrong` holds the
    indices of the wrong events, in run order."""
    def where(i):
        return f"{events[i]['name']!r} (dur {events[i]['dur']:.3f} µs)"

    def children(i):
        return [j for j, p in enumerate(parent) if p == i]

    def own(i):
        return events[i]["dur"] - sum(events[j]["dur"] for j in children(i))

    def names(i):
        return ", ".join(sorted({events[j]["name"] for j in children(i)}))

    parents = [i for i in wrong if children(i)]
    if parents and all(_close(got[i], events[i]["dur"]) for i in parents):
        i = parents[0]
        return i, (f"{where(i)}: you gave its whole duration; its self time leaves out the ops that ran inside it "
                   f"(directly: {names(i)}), whose time is theirs, or nested times would count twice")
    nested = [i for i in wrong if len(_descendants(parent, i)) > len(children(i))]
    if nested and all(_close(got[i], events[i]["dur"] - sum(events[j]["dur"] for j in _descendants(parent, i)))
                      for i in nested):
        i = nested[0]
        return i, (f"{where(i)}: you subtracted every op nested inside it, grandchildren too; a grandchild's time "
                   "is already inside its parent's duration, so subtract only the direct children "
                   f"({names(i)})")
    for i in wrong:
        if got[i] < own(i):
            return i, (f"{where(i)}: your {got[i]:.3f} µs is less than its duration minus the ops directly inside "
                       f"it ({own(i):.3f} µs): you subtracted ops that did not run inside it; an op is inside "
                       "another only when it starts before the other ends (ts < other.ts + other.dur), on the same "
                       "thread")
    i = wrong[0]
    return i, (f"{where(i)}: you said {got[i]:.3f} µs, its self time is {own(i):.3f} µs (its duration minus those "
               f"of the ops directly inside it{': ' + names(i) if children(i) else ', none here'})")


def self_times(remote, fn):
    events, truth = recorded()
    got = remote.call(self_times_of, fn, events)
    if isinstance(got, str):
        raise CheckFailed(got)
    if len(got) != len(events):
        raise CheckFailed(f"the check gave you {len(events)} events and you returned {len(got)} self times: "
                          "return one per event, in the order of the events given")
    parent = tree(events)
    totals = defaultdict(float)
    for e, value in zip(events, got):
        totals[e["name"]] += value
    wrong_ops = [name for name, us in truth.items() if not _close(totals.get(name, 0.0), us)]
    if not wrong_ops:
        return None
    expected = [e["dur"] - sum(events[j]["dur"] for j, p in enumerate(parent) if p == i) for i, e in enumerate(events)]
    wrong = sorted((i for i, e in enumerate(events) if not _close(got[i], expected[i])), key=lambda i: events[i]["ts"])
    if not wrong:  # right per op, but not per event: given to the wrong calls of the same op
        first = min(wrong_ops, key=lambda name: min(e["ts"] for e in events if e["name"] == name))
        raise CheckFailed(f"your self times of {first} add up to {totals.get(first, 0.0):.3f} µs, torch.profiler's "
                          f"self CPU time is {truth[first]:.3f} µs")
    i, why = _explain(events, parent, got, wrong)
    name = events[i]["name"]
    raise CheckFailed(f"{why}. Added up over its {sum(e['name'] == name for e in events)} call(s), your self times "
                      f"of {name} make {totals.get(name, 0.0):.3f} µs, torch.profiler's self CPU time is "
                      f"{truth.get(name, 0.0):.3f} µs")


# --- 'fused_matmuls' ------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=1)
def ort_fusions():
    """{"fused": MatMul names ORT folded into a FusedMatMul, "transposes_left": Transposes in ORT's graph} at
    level extended, on the CPU EP."""
    model = matmul_model()
    optimized = session.optimized_model(model, "extended", providers=CPU).graph.node
    matmuls = [n.name for n in model.graph.node if n.op_type == "MatMul"]
    fused = sorted(m for m in matmuls if any(n.op_type == "FusedMatMul" and n.name.startswith(m + "/")
                                             for n in optimized))
    left = sorted(n.name for n in optimized if n.op_type == "Transpose")
    return {"fused": fused, "transposes_left": left}


WHY = {
    "mm_scores": "t_keys' perm [0, 1, 3, 2] swaps the last two axes, which FusedMatMul does itself (transB=1): "
                 "MatmulTransposeFusion folds it",
    "mm_context": "t_heads' perm [0, 2, 1, 3] moves the head axis, not the last two axes; FusedMatMul's transA/"
                  "transB transpose only the last two axes, so MatmulTransposeFusion leaves it",
    "mm_projected": "W is an initializer: constant folding (level 1) computes Transpose(W) once into a new "
                    "initializer before the level-2 fusions run, so the MatMul reads a plain weight and stays a "
                    "MatMul",
    "mm_shared": "relu also reads t_shared's output, but that does not stop the fusion: the FusedMatMul reads a "
                 "directly (transA=1) and the Transpose stays for relu",
    "mm_first": "a Transpose on the first input is folded as well (transA=1)",
    "mm_scaled": "MatMulScaleFusion folds the Mul by the scalar constant 0.125 into FusedMatMul's alpha",
}
WHY_LEFT = {
    "t_keys": "its only reader, mm_scores, became a FusedMatMul reading k directly, so it was removed",
    "t_heads": "mm_context was not fused (the perm moves the head axis), so it stays",
    "t_weight": "constant folding replaced Transpose(W) by a new initializer: no Transpose node is left",
    "t_shared": "relu still reads its output, so it stays although mm_shared was fused",
    "t_first": "its only reader, mm_first, became a FusedMatMul reading c directly, so it was removed",
}


def fused_matmuls(remote, fn):
    got = remote.call(predicted_fusions, fn)
    if isinstance(got, str):
        raise CheckFailed(got)
    truth = ort_fusions()
    model = matmul_model()
    matmuls = [n.name for n in model.graph.node if n.op_type == "MatMul"]
    transposes = [n.name for n in model.graph.node if n.op_type == "Transpose"]
    for key, known in (("fused", matmuls), ("transposes_left", transposes)):
        unknown = [name for name in got[key] if name not in known]
        if unknown:
            raise CheckFailed(f"{unknown[0]!r} under {key!r} is not one of the model's "
                              f"{'MatMuls' if key == 'fused' else 'Transposes'}: {', '.join(known)}")
    for name in matmuls:
        said, real = name in got["fused"], name in truth["fused"]
        if said != real:
            verdict = "becomes a FusedMatMul" if real else "stays a MatMul"
            raise CheckFailed(f"{name} {verdict} in ORT's graph: {WHY[name]}")
    for name in transposes:
        said, real = name in got["transposes_left"], name in truth["transposes_left"]
        if said != real:
            raise CheckFailed(f"{name} {'is still' if real else 'is no longer'} in ORT's graph: {WHY_LEFT[name]}")
    return None

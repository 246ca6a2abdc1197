"""compare()'s four checks, each a list of Rows: the optimized graph at each level, the gradient graphs
and their values, the engine's outputs, the memory block. ortlab's graph rewrites run here; ORT's side runs in a
child process (ortlab.compare.ort_child), and ORT dying there ends the whole comparison (OrtDied); the
engine's run too, in a child of its own, so that a run that never ends is stopped (a row says so)."""
from collections import Counter

import numpy as np

from ortlab.compare import ort_child
from ortlab.compare.feeds import describe_feeds
from ortlab.compare.ort_child import OrtDied, in_child
from ortlab.compare.report import AGREE, DIFFER, INFO, SKIPPED, Row, max_diff, why
from ortlab.engine import InferenceSession
from ortlab.errors import OrtlabError
from ortlab.gradients.added_nodes import gradient_nodes
from ortlab.gradients.graph_builder import build_gradient_graph
from ortlab.memory import plan
from ortlab.onnx_defs import op_counts
from ortlab.transformers.manager import GraphTransformerManager

ORT_LEVELS = (("basic", 1), ("extended", 2), ("all", 2))  # ORT's level, ortlab's closest one
FIRST_REGION = 1 << 20   # BFCArena's first region: a block that fits is never logged


def attempt(fn, *args, **kwargs):
    """fn(*args, **kwargs), or the OrtlabError it raised; ORT dying in its child (OrtDied) is raised on."""
    try:
        return fn(*args, **kwargs)
    except OrtDied:
        raise
    except OrtlabError as exc:
        return exc


def _running(feeds):
    return f"running the model on the feeds {describe_feeds(feeds)}"


# --- 1. the optimized graph ----------------------------------------------------------------------

def ortlab_optimized(model, level):
    """ortlab's optimized graph at `level` (1, 2), the rules and transformers that fired, and the
    reasons its rules declined ({reason: count}, last step)."""

    manager = GraphTransformerManager.from_registry(level, providers=["CPUExecutionProvider"])
    optimized = manager.optimize(model)
    fired = {k: v for k, v in manager.fire_counts().items() if v}
    declined = Counter(f"{r[0]}: {r[2]}" for r in manager.declined().rows)
    return optimized, fired, declined




def graph_rows(model):
    """One row per ORT level: op counts of ortlab's level next to ORT's, what fired, why rules declined."""
    rows = []
    for ort_level, level in ORT_LEVELS:
        check = f"graph: ORT {ort_level} vs ortlab level {level}"
        theirs = attempt(in_child, f"optimizing the model at its {ort_level} level", ort_child.ort_optimized,
                         model, ort_level)
        if isinstance(theirs, Exception):
            rows.append(Row(check, DIFFER, f"ORT cannot optimize it: {why(theirs)}"))
            continue
        ours = attempt(ortlab_optimized, model, level)
        if isinstance(ours, Exception):
            rows.append(Row(check, DIFFER, f"ortlab cannot optimize it: {why(ours)}"))
            continue
        rows.append(_graph_row(check, ours, theirs))
    return rows


def _graph_row(check, ours, theirs):
    (ours, our_fired, declined), (theirs, ort_fired) = ours, theirs
    a, b = op_counts(ours), op_counts(theirs)
    diff = [f"{op} {a.get(op, 0)} vs {b.get(op, 0)}" for op in sorted(set(a) | set(b))
            if a.get(op, 0) != b.get(op, 0)]
    detail = [f"same op counts ({len(ours.graph.node)} nodes)" if not diff else
              f"op counts ortlab vs ORT: {'; '.join(diff)}",
              "ortlab fired: " + (", ".join(f"{k} x{v}" for k, v in our_fired.items()) or "none"),
              "ORT fired: " + (", ".join(f"{k} x{v}" for k, v in ort_fired.items()) or "none")]
    if declined:
        detail.append("ortlab declined: " + "; ".join(f"{k}" + (f" (x{v})" if v > 1 else "")
                                                      for k, v in list(declined.items())[:6]))
    return Row(check, DIFFER if diff else AGREE, " | ".join(detail))


# --- 2. gradients --------------------------------------------------------------------------------

def gradient_rows(model, loss, xs, feeds):
    """ortlab's gradient graph next to ORT's: gradient node counts, then max |difference| per x when ORT
    runs both on the same feeds."""

    check = f"gradients of {loss}"
    theirs = attempt(in_child, "building the gradient graph", ort_child.ort_gradient_graph, model, xs, loss)
    ours = attempt(build_gradient_graph, model, xs, loss)
    if isinstance(ours, Exception) or isinstance(theirs, Exception):
        if isinstance(ours, Exception) and isinstance(theirs, Exception):
            return [Row(check, AGREE, f"both refuse: ortlab: {why(ours)} | ORT: {why(theirs)}")]
        who, exc = ("ortlab", ours) if isinstance(ours, Exception) else ("ORT", theirs)
        return [Row(check, DIFFER, f"only {who} refuses: {why(exc)}")]
    n_ours, n_theirs = len(gradient_nodes(ours, model)), len(gradient_nodes(theirs, model))
    rows = [Row(f"{check}: graph", INFO, f"gradient nodes: ortlab {n_ours}, ORT {n_theirs} (counts differ by "
                                          "builder design; values below decide)")]
    running = _running(feeds).replace("the model", "a gradient graph")
    a = attempt(in_child, running, ort_child.run_model, ours, feeds)
    b = a if isinstance(a, Exception) else attempt(in_child, running, ort_child.run_model, theirs, feeds)
    if isinstance(a, Exception) or isinstance(b, Exception):
        exc = a if isinstance(a, Exception) else b
        return rows + [Row(f"{check}: values", DIFFER, f"a gradient graph does not run in ORT: {why(exc)}")]
    for x in xs:
        rows.append(_gradient_row(f"{check}: d/d{x}", f"{x}_grad", a, b))
    return rows


def _gradient_row(check, name, a, b):
    if name not in a or name not in b:
        return Row(check, DIFFER, f"{name} missing from {'ortlab' if name not in a else 'ORT'}")
    gap, ok = max_diff(a[name], b[name])
    return Row(check, AGREE if ok else DIFFER, f"max |ortlab - ORT| = {gap:.2g}")


# --- 3. the engine -------------------------------------------------------------------------------

def engine_rows(model, feeds):
    """ortlab.engine.InferenceSession's outputs next to ORT's InferenceSession's, same feeds."""
    theirs = attempt(in_child, _running(feeds), ort_child.run_model, model, feeds)
    ours = attempt(in_child, _running(feeds), _engine_run, model, feeds, who="ortlab's engine")
    if isinstance(theirs, Exception) and isinstance(ours, Exception):
        return [Row("engine outputs", AGREE, f"both refuse these feeds: ortlab: {why(ours)} | ORT: {why(theirs)}")]
    if isinstance(theirs, Exception):
        return [Row("engine outputs", DIFFER, f"ORT cannot run it: {why(theirs)}")]
    if isinstance(ours, Exception):
        return [Row("engine outputs", DIFFER, f"ortlab's engine cannot run it: {why(ours)}")]
    rows = []
    for name, ref in theirs.items():
        gap, ok = max_diff(ours[name], ref)
        rows.append(Row(f"engine output {name}", AGREE if ok else DIFFER,
                        f"max |engine - ORT| = {gap:.2g}, shape {list(np.shape(ref))} {np.asarray(ref).dtype}"))
    return rows


def _engine_run(model, feeds):

    session = InferenceSession(model)
    names = [o.name for o in model.graph.output]
    return dict(zip(names, session.run(names, feeds)))


# --- 4. memory -----------------------------------------------------------------------------------

def memory_rows(model, feeds):
    """ortlab.memory.plan's memory-pattern block next to the one ORT logs requesting on its first run."""

    check = "memory block"
    try:
        predicted = plan(model, feeds).peak_bytes
    except OrtlabError as exc:
        return [Row(check, SKIPPED, f"ortlab.memory cannot plan it: {why(exc)}")]
    if predicted < FIRST_REGION:
        return [Row(check, SKIPPED, f"predicted {predicted:,} B fits ORT's first 1 MiB arena region, "
                                    "which ORT never logs: nothing to compare (feed larger dims)")]
    theirs = attempt(in_child, f"{_running(feeds)} with its arena logged", ort_child.ort_block, model, feeds)
    if isinstance(theirs, Exception):
        return [Row(check, SKIPPED, f"predicted {predicted:,} B, but ORT cannot run it on these feeds: "
                                    f"{why(theirs)}")]
    if theirs is None:
        return [Row(check, DIFFER, f"predicted {predicted:,} B, but ORT logged no arena request")]
    return [Row(check, AGREE if theirs == predicted else DIFFER,
                f"predicted {predicted:,} B, ORT requested {theirs:,} B")]

"""ortlab's optimizer next to ORT's on the same model: op counts and outputs.

ORT's side is the graph an InferenceSession writes to SessionOptions.optimized_model_filepath
after running its transformers (onnxruntime/core/session/inference_session.cc, TransformGraph).
"""
import numpy as np

from ortlab import session
from ortlab.transformers import registry
from ortlab.transformers.examples import op_counts
from ortlab.transformers.manager import optimize

ORT_LEVEL = {1: "basic", 2: "extended", 3: "all"}


def side_by_side(model, level=2, changed_only=True):
    """A Table of op counts: the original, ortlab's optimize(level) and ORT's own (CPU EP)."""
    from ortlab.viz import Table
    ours = optimize(model, level=level, providers=["CPUExecutionProvider"])
    theirs = session.optimized_model(model, ORT_LEVEL[level], providers=["CPUExecutionProvider"])
    counts = [op_counts(m) for m in (model, ours, theirs)]
    ops = sorted(set().union(*counts))
    rows = [(op, *(c.get(op, 0) for c in counts)) for op in ops
            if not changed_only or len({c.get(op, 0) for c in counts}) > 1]
    rows.append(("all nodes", *(len(m.graph.node) for m in (model, ours, theirs))))
    return Table(("op", "original", f"ortlab level {level}", f"ORT {ORT_LEVEL[level]}"), rows)


def largest_difference(model, optimized, feeds):
    """The largest |difference| between the two models' outputs when ORT runs both."""
    a, b = session.run_model(model, feeds), session.run_model(optimized, feeds)
    return max(float(np.max(np.abs(a[n].astype(np.float64) - b[n]))) for n in a)


def levels_table():
    """Every registered transformer and rule: level, kind, EPs, and the first line of its docstring."""
    from ortlab.viz import Table
    rows = [(level, f"{registry.rule_transformer_name(level)}: {cls.__name__}", "rule", "all",
             (cls.__doc__ or "").strip().splitlines()[0]) for level, cls in registry.RULES.values()]
    rows += [(level, cls.__name__, "transformer", ", ".join(eps) if eps else "all",
              (cls.__doc__ or "").strip().splitlines()[0]) for level, cls, eps in registry.in_ort_order()]
    rows.sort(key=lambda r: r[0])
    return Table(("level", "name", "kind", "EPs", "rewrite"), rows)

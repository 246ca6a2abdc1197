"""The checks of L1_01's exercises (run where the learner's code cannot reach them).

'level_ops' reads the graph ORT itself saves after its transformers at each level (session.optimized_model:
SessionOptions.optimized_model_filepath), and explains each wrong count by the transformer responsible
(onnxruntime/core/optimizer/graph_transformer_utils.cc registers them by level). 'not_where' runs the
learner's rule in ortlab's manager and compares the graph with the one ORT's NotWhereFusion
(onnxruntime/core/optimizer/not_where_fusion.cc, level 1) makes of the same model, then runs both in ORT.
"""
from collections import Counter

import numpy as np

from ortlab import session
from ortlab.labs.checks import CheckFailed
from ortlab.labs.l1_01 import block_model, not_where_cases, optimize_with_rule, predicted, rule_facts, where_feeds

CPU = ["CPUExecutionProvider"]
LEVELS = ("basic", "extended")
FUSED = ("LayerNormalization", "BiasGelu", "Gelu", "FusedMatMul", "SkipLayerNormalization")


def ort_counts(model, level):
    return dict(Counter(n.op_type for n in session.optimized_model(model, level, providers=CPU).graph.node))


def _why(level, op, said, truth):
    """The transformer behind a wrong count of `op` at `level`."""
    if op in FUSED and level == "basic" and said:
        return (f"a fusion into {op} (a com.microsoft op) is level 2, extended: at basic ORT runs only rewrites "
                "that stay within ONNX ops")
    if op == "Gemm":
        return "MatMulAddFusion (level 1) turns MatMul + Add into Gemm only when A is 2-D; here it is [2, 4, 8]"
    if op == "Dropout":
        return ("EliminateDropout (level 1) removes a Dropout only when it may remove the node (CanRemoveNode), "
                "and a node whose output is a graph output, here y, may not be removed")
    if op == "Identity":
        return "EliminateIdentity (level 1) removes it: its output xi is no graph output, so its reader takes x"
    if op == "Gelu" or (op == "BiasGelu" and not said):
        return ("GeluFusion makes a Gelu of the Erf pattern, then BiasGeluFusion folds the Add of the bias in "
                "front of it into one BiasGelu (both level 2; the manager's loop lets the second see the first's "
                "work)")
    if op == "LayerNormalization" or level == "extended":
        return ("LayerNormFusion (level 2) replaces the whole ReduceMean, Sub, Pow, ReduceMean, Add, Sqrt, Div, "
                "Mul, Add pattern with one LayerNormalization, and the GELU pattern goes into BiasGelu")
    return "count the nodes of the pattern that no level-1 rule touches"


def level_ops(remote, fn):
    got = remote.call(predicted, fn)
    model = block_model()
    for level in LEVELS:
        if level not in got:
            raise CheckFailed(f"your dict has no {level!r} key; give {{'basic': {{...}}, 'extended': {{...}}}}")
        truth, said = ort_counts(model, level), {op: c for op, c in got[level].items() if c}
        ops = list(truth) + [op for op in said if op not in truth]
        for op in sorted(ops, key=lambda o: (o not in ("Identity", "Dropout", "Gemm") + FUSED, ops.index(o))):
            if said.get(op, 0) != truth.get(op, 0):
                raise CheckFailed(f"at {level!r}: you said {said.get(op, 0)} {op}, ORT's graph has "
                                  f"{truth.get(op, 0)}: {_why(level, op, said.get(op, 0), truth.get(op, 0))}")
    return None


WHY_NOT = {"Not(c) also read by a Cast": "the Cast reads Not(c) too, and removing the Not would leave it reading "
                                          "a value nobody produces: every reader of Not(c) must be a Where",
           "Not(c) also a graph output": "Not(c) is a graph output, which the user expects; the Not must stay",
           "Where(Greater(a, b), a, b), no Not at all": "the Where's condition comes from a Greater: check "
                                                         "that it is produced by a Not (and produced at all)"}


def _wheres(model):
    return {n.output[0]: list(n.input) for n in model.graph.node if n.op_type == "Where"}


def not_where(remote, cls):
    facts = remote.call(rule_facts, cls)
    if not facts["rule"]:
        raise CheckFailed(f"give the class itself, a subclass of RewriteRule, not {facts['repr']}")
    for what, model in not_where_cases():
        theirs = session.optimized_model(model, "basic", providers=CPU)
        try:
            ours = remote.call(optimize_with_rule, cls, model)
        except (NotImplementedError, NameError, CheckFailed):
            raise
        except Exception as exc:
            raised = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200]
            if what in WHY_NOT:
                raise CheckFailed(f"on {what}: your rule fired where ORT's declines, and the rewrite failed "
                                  f"({raised}): {WHY_NOT[what]}") from None
            raise CheckFailed(f"on {what}: your rule raised {raised}. A rule is applied wherever its condition "
                              "holds, again after each change (the manager loops), so the condition must check "
                              "all that apply relies on: that the Where's condition is produced by a Not") from None
        fired, ort_fired = (not any(n.op_type == "Not" for n in m.graph.node) for m in (ours, theirs))
        lost = sorted(set(n.op_type for n in model.graph.node) - {"Not"} - {n.op_type for n in ours.graph.node})
        if lost:
            raise CheckFailed(f"on {what}: your rule removed the {lost[0]}: {WHY_NOT.get(what, '')}")
        if fired and not ort_fired:
            raise CheckFailed(f"on {what}: your rule fired, ORT's declines: {WHY_NOT[what]}")
        if ort_fired and not fired:
            raise CheckFailed(f"on {what}: ORT's rule fires and yours did not (Not-1 feeding the condition of "
                              "Where-9 nodes only, no graph output)")
        if _wheres(ours) != _wheres(theirs):
            out, inputs = next((o, i) for o, i in _wheres(ours).items() if _wheres(theirs).get(o) != i)
            raise CheckFailed(f"on {what}: the Where making {out!r} reads {inputs}, ORT's reads "
                              f"{_wheres(theirs).get(out)}")
        feeds = where_feeds()
        try:
            got = session.run_model(ours, feeds)
        except Exception as exc:
            raise CheckFailed(f"on {what}: ORT cannot run the graph your rule left: {str(exc)[:160]}") from None
        expected = session.run_model(model, feeds)
        for name, value in expected.items():
            if not np.array_equal(got[name], value):
                raise CheckFailed(f"on {what}: output {name!r} changed: {got[name]} instead of {value}")
    return None

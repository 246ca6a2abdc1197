"""The checks of lab02_graph_transformer (run where the learner's code cannot reach them).

The learner's class runs in the learner's process (ortlab.labs.lab02.optimize_with: ortlab's manager
with that class registered); the optimized model comes back as bytes and is judged here: the ops it
holds, and its outputs next to the original's in ORT.
"""
import numpy as np

from ortlab import session
from ortlab.labs.checks import CheckFailed
from ortlab.labs.lab02 import bias_gelu_cases, class_facts, noop_cases, optimize_with
from ortlab.walkthroughs import graph_transformers as ex


def _outputs_match(model, optimized, what):
    feeds = ex.feeds(model)
    want = session.run_model(model, feeds)
    try:
        got = session.run_model(optimized, feeds)
    except Exception as exc:
        raise CheckFailed(f"{what}: ORT cannot run the optimized model: {str(exc).splitlines()[0]}") from None
    for name, value in want.items():
        if name not in got or not np.allclose(got[name], value, rtol=1e-5, atol=1e-6):
            return f"{what}: output '{name}' changed; a transformer must keep every output the same"
    return None


def _run(remote, cls, kind, model, what):
    try:
        return remote.call(optimize_with, cls, kind, model)
    except NotImplementedError:
        raise
    except Exception as exc:
        raise CheckFailed(f"{what}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}") from None


def _facts(remote, cls, kind):
    facts = remote.call(class_facts, cls)
    base = "GraphTransformer" if kind == "fusion" else "RewriteRule"
    if facts.get("kind") != kind:
        raise CheckFailed(f"pass your class (a {base} subclass), not {facts.get('repr')}")
    if not facts.get("registered"):
        decorator = "register_transformer(level=2)" if kind == "fusion" else "register_rule(level=1)"
        raise CheckFailed(f"{facts.get('name')} is not registered; decorate the class with @{decorator}")


def bias_gelu(remote, cls):
    """Exercise 'bias_gelu': a GraphTransformer fusing Add(X, 1-D bias) -> Gelu into BiasGelu."""
    _facts(remote, cls, "fusion")
    for what, model, fires in bias_gelu_cases():
        out = _run(remote, cls, "fusion", model, what)
        counts = ex.op_counts(out)
        if fires and counts.get("com.microsoft:BiasGelu") != 1:
            return f"{what}: expected one com.microsoft BiasGelu, got {counts}"
        if fires and ("Add" in counts or "com.microsoft:Gelu" in counts):
            return f"{what}: the Add and the Gelu should both be gone, got {counts}"
        if not fires and "com.microsoft:BiasGelu" in counts:
            return f"{what}: must not fuse (it is not safe here), but your transformer did"
        reason = _outputs_match(model, out, what)
        if reason:
            return reason
    return None


def noop_elimination(remote, cls):
    """Exercise 'noop_elimination': a RewriteRule removing Add(x, 0) and Mul(x, 1)."""
    _facts(remote, cls, "rule")
    for what, model, fires in noop_cases():
        out = _run(remote, cls, "rule", model, what)
        before, after = len(model.graph.node), len(out.graph.node)
        if fires and after != before - 1:
            return f"{what}: expected the {model.graph.node[-2 if before > 1 else 0].op_type} node removed"
        if not fires and after != before:
            return f"{what}: must be left alone (removing it changes the result or the graph's interface)"
        reason = _outputs_match(model, out, what)
        if reason:
            return reason
    return None

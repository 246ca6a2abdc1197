"""ExpandElimination: Expand(x, shape) -> x when the shape adds no axis and broadcasts no dim.

Mirrors onnxruntime/core/optimizer/expand_elimination.cc (a level-1 rewrite rule, every EP): x's
rank is known, the target shape is a non-empty 1-D int64 constant initializer of no more
entries than x has axes, and from the last axis back each target entry is 1 or equals x's dim
(a symbolic dim only against a 1); the node removable as graph_utils::CanRemoveNode allows (x
from a node, no graph output). ORT 1.19.2 also removes an Expand to a 0 dim, whose result is
empty (x [3, 1] expanded to [3, 0] is [3, 0], not x); ortlab declines that and says so.
"""
import numpy as np

from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import RewriteRule, RuleEffect
from ortlab.transformers.noop_elimination import removal_reason
from ortlab.transformers.registry import register_rule


def broadcast_reason(dims, target):
    """Why Expand(x of `dims`, `target`) is not x ('' when it is x, None when it is a real broadcast
    not worth a word)."""
    if len(target) > len(dims):
        return f"the shape {target} has more entries than x has axes ({len(dims)}): it adds axes"
    for d, t in zip(reversed(dims), reversed(target)):
        if t <= 0 and d != t:
            return f"the shape {target} holds {t}: the result is empty, not x"
        if isinstance(d, int):
            if d != t and t > 1:
                return None
        elif t > 1:
            return f"x's dim '{d}' is not known, so expanding it to {t} may broadcast it"
    return ""


@register_rule(level=1)
class ExpandElimination(RewriteRule):
    """Expand(x, shape) -> x when every shape entry is 1 or x's own dim (from the last axis back)."""

    target_op_types = ("Expand",)

    def satisfy_condition(self, graph, node):
        if not gu.is_op(node, "Expand") or len(node.input_names) < 2:
            return False
        reason = removal_reason(graph, node, 0)
        if reason is not None:
            return self.decline(node, reason)
        dims = gu.shape(graph, node.input_names[0])
        if dims is None:
            return self.decline(node, "the rank of x is unknown")
        target = gu.constant(graph, node.input_names[1])
        if target is None or target.dtype != np.int64 or target.ndim != 1 or target.size == 0:
            return self.decline(node, "the target shape is not a non-empty 1-D int64 constant")
        why = broadcast_reason(dims, [int(t) for t in target])
        if why is None:
            return False
        return True if why == "" else self.decline(node, why)

    def apply(self, graph, node):
        gu.bypass(graph, node)
        return RuleEffect.REMOVED_CURRENT_NODE

"""NoopElimination: Add/Sub of zero and Mul/Div by one removed, their consumers reading x.

Mirrors onnxruntime/core/optimizer/noop_elimination.cc (a level-1 rewrite rule, every EP):
x + 0, 0 + x, x - 0, x * 1, 1 * x, x / 1 -> x, where the constant is a one-element
initializer (float, float16, double, int32 or int64) of no more axes than x (a constant of
more axes would add them to the result), x's rank is known, and the node can be removed
(graph_utils::CanRemoveNode: its output is no graph output, x comes from a node).
ORT 1.19.2 also removes the node when the constant is empty, which changes the result's
shape (x [2, 1] + c [0] is [2, 0]); ortlab declines that and says so.
"""
import numpy as np

from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import RewriteRule, RuleEffect
from ortlab.transformers.registry import register_rule

NEUTRAL = {"Add": 0.0, "Sub": 0.0, "Mul": 1.0, "Div": 1.0}  # the constant that leaves x unchanged
NOOP_DTYPES = {np.dtype(t) for t in (np.float32, np.float16, np.float64, np.int32, np.int64)}


def neutral_slot(graph, node, excluded=()):
    """(slot of the constant, its value) when exactly one input of the binary node is a constant
    initializer, not excluded (for Sub and Div, the second), else None."""
    if len(node.input_names) != 2:
        return None
    consts = [gu.constant(graph, n, excluded) for n in node.input_names]
    if (consts[0] is None) == (consts[1] is None):
        return None
    slot = 0 if consts[0] is not None else 1
    if slot == 0 and node.op_type in ("Sub", "Div"):
        return None
    return slot, consts[slot]


def removal_reason(graph, node, keep):
    """Why the node cannot be removed with input `keep` taking its place, or None
    (graph_utils::CanRemoveNode for a node with one input edge)."""
    if any(o in graph.outputs for o in node.output_names):
        return "its output is a graph output"
    if graph.producer(node.input_names[keep]) is None:
        return "x is a graph input or initializer, not a node's output"
    return None


@register_rule(level=1)
class NoopElimination(RewriteRule):
    """x + 0, x - 0, x * 1, x / 1 -> x."""

    target_op_types = tuple(NEUTRAL)

    def __init__(self, excluded_initializers=()):
        """excluded_initializers: trainable weights, never taken for a constant 0 or 1."""
        super().__init__()
        self.excluded = set(excluded_initializers)

    def satisfy_condition(self, graph, node):
        if not gu.is_op(node, node.op_type) or node.op_type not in NEUTRAL:
            return False
        found = neutral_slot(graph, node, self.excluded)
        if found is None:
            return False
        slot, value = found
        keep = 1 - slot
        dims = gu.shape(graph, node.input_names[keep])
        if dims is None:
            return self.decline(node, "the rank of x is unknown")
        if value.ndim > len(dims):
            return self.decline(node, f"the constant has {value.ndim} axes, more than x's {len(dims)}: "
                                      "it broadcasts x to more axes")
        if value.size == 0:
            return self.decline(node, "the constant is empty: the result is empty too, not x")
        if value.size > 1 or value.dtype not in NOOP_DTYPES:
            return False
        if float(value.reshape(-1)[0]) != NEUTRAL[node.op_type]:
            return False
        reason = removal_reason(graph, node, keep)
        return True if reason is None else self.decline(node, reason)

    def apply(self, graph, node):
        slot, _ = neutral_slot(graph, node, self.excluded)
        gu.bypass(graph, node, keep=1 - slot)
        return RuleEffect.REMOVED_CURRENT_NODE

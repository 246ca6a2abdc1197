"""EliminateSlice: Slice(x, starts=0, ends=INT64_MAX) -> x, a Slice that keeps every element.

Mirrors onnxruntime/core/optimizer/slice_elimination.cc (a level-1 rewrite rule, every EP):
Slice-1 (starts, ends, axes as attributes) or Slice-10/11/13 (as inputs: constant initializers,
int64 or int32; axes, when given, constant and as long as starts; steps all 1), every start 0
and every end INT64_MAX (an int32 INT32_MAX or an end equal to the dim does not count), and
the node removable as graph_utils::CanRemoveNode allows (x from a node, no graph output).
ORT 1.19.2 checks the steps only when axes is given too, so it also removes a Slice of steps
-1 given without axes, which changes the result; ortlab declines that and says so.
"""
import numpy as np

from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import RewriteRule, RuleEffect
from ortlab.transformers.noop_elimination import removal_reason
from ortlab.transformers.registry import register_rule

VERSIONS = (1, 10, 11, 13)
INT64_MAX = np.iinfo(np.int64).max
INDEX_DTYPES = (np.dtype(np.int64), np.dtype(np.int32))


def constant_ints(graph, node, slot):
    """The values of input `slot` (an int64/int32 constant), [] when it is not given, None when it
    is given but not such a constant."""
    names = node.input_names
    if len(names) <= slot or not names[slot]:
        return []
    value = gu.constant(graph, names[slot])
    if value is None or value.dtype not in INDEX_DTYPES or value.ndim != 1:
        return None
    return [int(v) for v in value]


def slice_arguments(graph, node):
    """(starts, ends, axes, steps) of a Slice as lists ([] when not given), or why they are not known."""
    if gu.since_version(graph, node) == 1:
        return node.attribute("starts", []), node.attribute("ends", []), node.attribute("axes", []), []
    args = [constant_ints(graph, node, slot) for slot in (1, 2, 3, 4)]
    if any(a is None for a in args):
        return "its starts, ends, axes or steps are not int64/int32 constants"
    return tuple(args)


@register_rule(level=1)
class EliminateSlice(RewriteRule):
    """Slice(x, starts=[0, ...], ends=[INT64_MAX, ...], steps=[1, ...]) -> x."""

    target_op_types = ("Slice",)
    target_versions = VERSIONS

    def satisfy_condition(self, graph, node):
        args = slice_arguments(graph, node)
        if isinstance(args, str):
            return self.decline(node, args)
        starts, ends, axes, steps = args
        if not starts or len(starts) != len(ends) or (axes and len(axes) != len(starts)):
            return False
        if any(s != 0 for s in starts) or any(e < INT64_MAX for e in ends):
            return False  # a real slice: nothing to say
        if steps and (len(steps) != len(starts) or any(s != 1 for s in steps)):
            return self.decline(node, f"its steps {steps} are not all 1: it reorders or skips elements "
                                      "(ORT 1.19.2 removes it anyway when axes is not given)")
        reason = removal_reason(graph, node, 0)
        return True if reason is None else self.decline(node, reason)

    def apply(self, graph, node):
        gu.bypass(graph, node)
        return RuleEffect.REMOVED_CURRENT_NODE

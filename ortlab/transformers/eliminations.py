"""Elimination rules: nodes that compute nothing, removed by wiring their input to their consumers.

Mirrors onnxruntime/core/optimizer/identity_elimination.cc (EliminateIdentity),
dropout_elimination.cc (EliminateDropout), cast_elimination.cc (CastElimination);
NoopReshapeElimination is ortlab's own (ORT 1.19.2 keeps a Reshape to the same shape).
"""
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import RewriteRule, RuleEffect
from ortlab.transformers.registry import register_rule


class _Bypass(RewriteRule):
    """An elimination: a node that changes nothing is removed, its consumers read its input.

    A rule states is_noop(graph, node): True (the node changes nothing), False (a real op here: nothing to
    say) or a str (why it cannot tell: recorded as the node's declined reason). The node then goes when
    gu.bypass_reason allows (its output no graph output, or its input may take that name). renames_graph_output:
    whether a node whose output is a graph output may go by renaming its input's producer (ORT's EliminateIdentity
    does; CanRemoveNode alone, which EliminateDropout and CastElimination ask, refuses a graph output)."""

    renames_graph_output = False

    def is_noop(self, graph, node):
        raise NotImplementedError(f"{self.name} must implement is_noop(graph, node) -> True, False or why not")

    def satisfy_condition(self, graph, node):
        verdict = self.is_noop(graph, node)
        if isinstance(verdict, str):
            return self.decline(node, verdict)
        if not verdict:
            return False
        reason = gu.bypass_reason(graph, node, rename_graph_output=self.renames_graph_output)
        return True if reason is None else self.decline(node, reason)

    def apply(self, graph, node):
        gu.bypass(graph, node)
        return RuleEffect.REMOVED_CURRENT_NODE


@register_rule(level=1)
class EliminateIdentity(_Bypass):
    """Identity(x) -> x."""

    target_op_types = ("Identity",)
    renames_graph_output = True  # identity_elimination.cc: the special case of a graph output

    def is_noop(self, graph, node):
        return gu.is_op(node, "Identity")


@register_rule(level=1)
class EliminateDropout(_Bypass):
    """Dropout(x) -> x when it cannot drop anything: inference mode, or ratio 0, and no mask used."""

    target_op_types = ("Dropout",)

    def is_noop(self, graph, node):
        names = node.input_names + ["", ""]
        ratio, training = names[1], names[2]
        in_training = False
        if training:
            mode = gu.constant(graph, training)
            if mode is None:
                return f"training_mode '{training}' is not a constant"
            in_training = bool(mode.reshape(-1)[0])
        if in_training and (not ratio or gu.scalar(graph, ratio) != 0.0):
            return "it runs in training mode with a ratio that is not a constant 0"
        return True


@register_rule(level=1)
class CastElimination(_Bypass):
    """Cast(x, to=T) -> x when x already has type T."""

    target_op_types = ("Cast",)

    def is_noop(self, graph, node):
        source = gu.elem_type(graph, node.input_names[0])
        return "the input's type is unknown" if source is None else source == node.attribute("to")


@register_rule(level=1)
class NoopReshapeElimination(_Bypass):
    """Reshape(x, shape) -> x when the target shape is a constant equal to x's static shape."""

    target_op_types = ("Reshape",)
    renames_graph_output = True  # ortlab's own rule: as EliminateIdentity

    def is_noop(self, graph, node):
        if len(node.input_names) < 2:
            return "Reshape before opset 5 takes its shape as an attribute, not an input"
        dims = gu.shape(graph, node.input_names[0])
        target = gu.constant(graph, node.input_names[1])
        if dims is None or not all(isinstance(d, int) for d in dims):
            return "the input's shape is not fully known"
        if target is None:
            return "the target shape is not a constant"
        wanted = [int(t) for t in target.reshape(-1)]
        allowzero = node.attribute("allowzero", 0)
        if len(wanted) != len(dims) or any(
                not (w == d or (w == 0 and not allowzero) or w == -1) for w, d in zip(wanted, dims)):
            return False
        if wanted.count(-1) > 1:
            return "the target shape has more than one -1"
        return True

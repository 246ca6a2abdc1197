"""NotWhereFusion: Where(Not(c), a, b) -> Where(c, b, a).

Mirrors onnxruntime/core/optimizer/not_where_fusion.cc (a level-1 rewrite rule, every EP): for
Where-9 and Not-1 only (a model importing opset 16 or later has Where-16, which the rule does
not touch); every reader of Not(c) must be such a Where, and the Not must be removable (its
output no graph output). Each Where then reads c and swaps its two branches; the Not goes.
ORT 1.19.2 only checks that the readers are Where nodes: one reading Not(c) as a branch
rather than as the condition gets its inputs swapped into a graph ORT refuses to load;
ortlab declines it and says so.
"""
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import RewriteRule, RuleEffect
from ortlab.transformers.graph_utils import label
from ortlab.transformers.registry import register_rule


@register_rule(level=1)
class NotWhereFusion(RewriteRule):
    """Where(Not(c), a, b) -> Where(c, b, a)."""

    target_op_types = ("Where",)
    target_versions = (9,)

    def satisfy_condition(self, graph, where):
        not_ = graph.producer(where.input_names[0])
        if not gu.is_op_version(graph, not_, "Not", (1,)):
            return False
        flipped = not_.output_names[0]
        readers = graph.consumers(flipped)
        if not all(gu.is_op_version(graph, r, "Where", (9,)) for r in readers):
            return self.decline(where, "Not(c) is also read by a node that is not a Where")
        if any(r.input_names[1:].count(flipped) for r in readers):
            return self.decline(where, "a Where reads Not(c) as a branch, not as its condition")
        if flipped in graph.outputs:
            return self.decline(where, "Not(c) is a graph output")
        return True

    def apply(self, graph, where):
        not_ = graph.producer(where.input_names[0])
        cond, flipped = not_.input_names[0], not_.output_names[0]
        readers = graph.consumers(flipped)
        graph.remove_node(not_)
        for r in readers:
            a, b = r.input_names[1], r.input_names[2]
            graph.replace_node_input(r, 0, cond)
            graph.replace_node_input(r, 1, b)
            graph.replace_node_input(r, 2, a)
            self.fused.append((label(r), "Where", ["Not", "Where"]))
        return RuleEffect.MODIFIED_REST_OF_GRAPH

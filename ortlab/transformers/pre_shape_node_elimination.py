"""PreShapeNodeElimination: Shape(Cast(x)) -> Shape(x), a Cast read only by Shape nodes removed.

Mirrors onnxruntime/core/optimizer/pre_shape_node_elimination.cc (a level-1 rewrite rule, every
EP): a Cast-13/19 whose output is no graph output and is read by at least one node, every one a
Shape. Shape reads only the dims, which a Cast keeps, so the Shapes read x itself (a graph
input, initializer or node output alike) and the Cast goes.
"""
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import RewriteRule, RuleEffect
from ortlab.transformers.registry import register_rule

VERSIONS = (13, 19)


@register_rule(level=1)
class PreShapeNodeElimination(RewriteRule):
    """Shape(Cast(x)) -> Shape(x) when only Shape nodes read the Cast."""

    target_op_types = ("Cast",)
    target_versions = VERSIONS

    def satisfy_condition(self, graph, node):
        if not node.input_names[0]:
            return False
        out = node.output_names[0]
        readers = graph.consumers(out)
        if not readers or any(not gu.is_op(r, "Shape") for r in readers):
            return False
        if out in graph.outputs:
            return self.decline(node, "its output is a graph output")
        return True

    def apply(self, graph, node):
        source, out = node.input_names[0], node.output_names[0]
        graph.remove_node(node)
        graph.replace_all_uses(out, source)
        return RuleEffect.REMOVED_CURRENT_NODE

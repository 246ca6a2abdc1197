"""DivMulFusion: Mul(Div(1, x), y) -> Div(y, x).

Mirrors onnxruntime/core/optimizer/div_mul_fusion.cc (a level-1 rewrite rule, every EP): the
Div's numerator is a one-element constant initializer equal to 1 (float, float16, double,
int32 or int64), its output goes only to that Mul (one edge, no graph output), and both are
Div-7/13/14 and Mul-7/13/14. The Div takes y as numerator and the Mul's output; the Mul goes.
ORT 1.19.2 also fuses when the 1 has more axes than x and y, which drops axes from the result
(1 [1, 1, 1] / x [3] * y [3] is [1, 1, 3], y / x is [3]); ortlab declines that and says so.
"""
import numpy as np

from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import RewriteRule, RuleEffect
from ortlab.transformers.graph_utils import label
from ortlab.transformers.registry import register_rule

VERSIONS = (7, 13, 14)
ONE_DTYPES = {np.dtype(t) for t in (np.float32, np.float16, np.float64, np.int32, np.int64)}


@register_rule(level=1)
class DivMulFusion(RewriteRule):
    """Mul(Div(1, x), y) -> Div(y, x)."""

    target_op_types = ("Div",)

    def __init__(self, excluded_initializers=()):
        """excluded_initializers: trainable weights, never taken for a constant 1."""
        super().__init__()
        self.excluded = set(excluded_initializers)

    def satisfy_condition(self, graph, div):
        if not gu.is_op_version(graph, div, "Div", VERSIONS):
            return False
        one = gu.constant(graph, div.input_names[0], self.excluded)
        if one is None or one.size != 1 or one.dtype not in ONE_DTYPES or float(one.reshape(-1)[0]) != 1.0:
            return False
        mul = gu.single_consumer(graph, div.output_names[0])
        if not gu.is_op_version(graph, mul, "Mul", VERSIONS):
            return False
        ranks = [gu.shape(graph, n) for n in (div.input_names[1], gu.other_input(mul, div.output_names[0]))]
        if one.ndim and (any(r is None for r in ranks) or one.ndim > max(len(r) for r in ranks)):
            return self.decline(div, f"its 1 has {one.ndim} axes, more than x and y may have: "
                                     "dropping it would drop axes from the result")
        return True

    def apply(self, graph, div):
        mul = gu.single_consumer(graph, div.output_names[0])
        y, out = gu.other_input(mul, div.output_names[0]), mul.output_names[0]
        graph.remove_node(mul)
        graph.replace_node_input(div, 0, y)
        graph.replace_node_output(div, 0, out)
        self.fused.append((label(div), "Div", ["Div", "Mul"]))
        return RuleEffect.MODIFIED_REST_OF_GRAPH

"""GemmSumFusion: Sum(Gemm(A, B), C) -> Gemm(A, B, C, beta=1).

Mirrors onnxruntime/core/optimizer/gemm_sum_fusion.cc (a level-1 rewrite rule, every EP): a
Gemm-11/13 without C (opset 11 made C optional), its output no graph output and read only by
a Sum-1/6/8/13 of exactly two inputs; the Sum's other input becomes C when its shape is one
Gemm broadcasts one way to the [M, N] result: [N], [1, N], [M, 1] or [M, N]. The new Gemm keeps
transA, transB and alpha, sets beta to 1 and takes the Sum's output.
"""
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import PlannedRule, RuleEffect
from ortlab.transformers.registry import register_rule


def bias_fits(c, m, n):
    """True when a bias of dims `c` broadcasts one way to [m, n] (equal dims, or a static 1)."""
    if c is None or m is None or n is None:
        return False
    return ((len(c) == 1 and c[0] == n) or (len(c) == 2 and c[0] == 1 and c[1] == n)
            or (len(c) == 2 and c[0] == m and (c[1] == 1 or c[1] == n)))


@register_rule(level=1)
class GemmSumFusion(PlannedRule):
    """Sum(Gemm(A, B), C) -> Gemm(A, B, C, beta=1)."""

    target_op_types = ("Gemm",)
    target_versions = (11, 13)

    def plan(self, graph, gemm):
        """(the Sum, its other input), or None; says why when the Sum is there but does not fit."""
        if len(gemm.input_names) != 2:
            return None
        out = gemm.output_names[0]
        s = gu.single_consumer(graph, out)
        if not gu.is_op_version(graph, s, "Sum", (1, 6, 8, 13)) or len(s.input_names) != 2:
            return None
        bias = s.input_names[1] if s.input_names[0] == out else s.input_names[0]
        dims = gu.shape(graph, out)
        if dims is None or len(dims) != 2 or not bias_fits(gu.shape(graph, bias), dims[0], dims[1]):
            self.decline(gemm, f"the Sum's other input, of shape {gu.shape(graph, bias)}, is not a bias "
                               f"Gemm broadcasts to its result {dims}")
            return None
        return s, bias

    def rewrite(self, graph, gemm, plan):
        s, bias = plan
        attrs = {"transA": gemm.attribute("transA", 0), "transB": gemm.attribute("transB", 0),
                 "alpha": gemm.attribute("alpha", 1.0), "beta": 1.0}
        gu.fuse(self, graph, [gemm, s], "Gemm", gemm.input_names + [bias], s.output_names, **attrs)
        return RuleEffect.REMOVED_CURRENT_NODE

"""GemmTransposeFusion: a 2-D Transpose into or out of a Gemm folded into transA/transB.

Mirrors onnxruntime/core/optimizer/gemm_transpose_fusion.cc (a level-1 rewrite rule, every EP):

    Gemm(Transpose(A), B)        -> Gemm(A, B, transA=!transA)   (the same for B)
    Transpose(Gemm(A, B)), no C  -> Gemm(B, A, transA=!transB, transB=!transA)    ((AB)' = B'A')

for a Transpose of a 2-D matrix (perm [1, 0], or no perm on a 2-D input) whose readers are
all Gemm nodes and whose output is no graph output, a Gemm whose output has at most one
reader; the output form needs Gemm-11/13 (C optional) and a Gemm output read only by the
Transpose. A Transpose read by other Gemms stays until the last of them folds it.
"""
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import PlannedRule, RuleEffect
from ortlab.transformers.registry import register_rule

GEMM_VERSIONS = (1, 6, 7, 9, 11, 13)
TRANSPOSE_VERSIONS = (1, 13)


def is_matrix_transpose(graph, t):
    """A Transpose that swaps the two axes of a 2-D tensor (IsMatrixTranspose)."""
    if not gu.is_op_version(graph, t, "Transpose", TRANSPOSE_VERSIONS):
        return False
    dims = gu.shape(graph, t.input_names[0])
    if dims is not None and len(dims) != 2:
        return False
    perm = t.attribute("perm")
    if perm is None:
        return dims is not None
    return list(perm) == [1, 0]


def _foldable_input(graph, t):
    """A matrix Transpose, no graph output, read only by Gemm nodes."""
    if t is None or not is_matrix_transpose(graph, t) or t.output_names[0] in graph.outputs:
        return False
    return all(gu.is_op(c, "Gemm") for c in graph.consumers(t.output_names[0]))


@register_rule(level=1)
class GemmTransposeFusion(PlannedRule):
    """Gemm(Transpose(A), B) -> Gemm(A, B, transA=1); Transpose(Gemm(A, B)) -> Gemm(B, A, transA=1, transB=1)."""

    target_op_types = ("Gemm",)
    target_versions = GEMM_VERSIONS

    def plan(self, graph, gemm):
        """([slots whose Transpose folds], the output Transpose or None), or None when nothing folds."""
        out = gemm.output_names[0]
        if len(graph.consumers(out)) > 1 or gu.uses(graph, out) - graph.outputs.count(out) > 1:
            return None
        slots = [s for s in (0, 1) if _foldable_input(graph, graph.producer(gemm.input_names[s]))]
        after = None
        reader = graph.consumers(out)[0] if graph.consumers(out) else None
        if (len(gemm.input_names) <= 2 or not gemm.input_names[2]) and out not in graph.outputs \
                and gu.is_op_version(graph, gemm, "Gemm", (11, 13)) and reader is not None \
                and is_matrix_transpose(graph, reader) and gu.uses(graph, out) == 1:
            after = reader
        if not slots and after is None:
            return None
        return slots, after

    def rewrite(self, graph, gemm, plan):
        slots, after = plan
        trans = [gemm.attribute("transA", 0), gemm.attribute("transB", 0)]
        inputs, removed = list(gemm.input_names), [gemm]
        for s in slots:
            t = graph.producer(inputs[s])
            trans[s] = 1 - trans[s]
            reads = sum(1 for k in slots if gemm.input_names[k] == t.output_names[0])
            if gu.uses(graph, t.output_names[0]) == reads and t not in removed:
                removed.append(t)  # no other Gemm reads it: it goes with this fusion
            inputs[s] = t.input_names[0]
        outputs = gemm.output_names
        if after is not None:
            inputs[0], inputs[1] = inputs[1], inputs[0]
            trans = [1 - trans[1], 1 - trans[0]]
            removed.append(after)
            outputs = after.output_names
        gu.fuse(self, graph, removed, "Gemm", inputs, outputs, transA=trans[0], transB=trans[1],
                alpha=gemm.attribute("alpha", 1.0), beta=gemm.attribute("beta", 1.0))
        return RuleEffect.REMOVED_CURRENT_NODE

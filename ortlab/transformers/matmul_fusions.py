"""Fusions around MatMul and Gemm: into Gemm, FusedMatMul and FusedGemm.

Mirrors onnxruntime/core/optimizer/matmul_add_fusion.cc (MatMulAddFusion),
matmul_transpose_fusion.cc (MatmulTransposeFusion), matmul_scale_fusion.cc
(MatMulScaleFusion) and gemm_activation_fusion.cc (GemmActivationFusion).
FusedMatMul(A, B) = alpha * op(A) @ op(B), op = transpose of the last two axes when transA/transB.
"""
from ortlab.onnx_defs import MS_DOMAIN, ONNX_DOMAIN, domain_of
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.pattern import Match, PatternFusion
from ortlab.transformers.registry import register_transformer

FLOAT32_ONLY = "FusedMatMul's CPU kernel is float32 only"
MATMULS = ["MatMul", ("FusedMatMul", MS_DOMAIN)]  # the anchor of the fusions into FusedMatMul


def _matmul_attributes(node):
    """alpha, transA, transB (and the batch-transpose flags) of a MatMul or FusedMatMul."""
    if gu.is_op(node, "MatMul"):
        return {"alpha": 1.0, "transA": 0, "transB": 0, "transBatchA": 0, "transBatchB": 0}
    return {k: v for k, v in node.attributes.items()}


def _fused_matmul(matmul, extra, inputs, outputs, **changes):
    """The Match of a FusedMatMul replacing `matmul` and `extra`, its attributes updated by `changes`."""
    return Match([matmul] + extra, inputs, outputs, dict(_matmul_attributes(matmul), **changes))


@register_transformer(level=1)
class MatMulAddFusion(PatternFusion):
    """Add(MatMul(A, B), C) -> Gemm(A, B, C), for 2-D A and B (ORT 1.19.2 does not fuse higher ranks)."""

    anchor, fused_op = "MatMul", "Gemm"

    def match(self, graph, matmul):
        out = matmul.output_names[0]
        add = gu.single_consumer(graph, out)
        if not gu.is_op(add, "Add"):
            return "its output does not go to exactly one Add" if add else None
        a, b = (gu.shape(graph, n) for n in matmul.input_names)
        if a is None or b is None or len(a) != 2 or len(b) != 2:
            return f"Gemm needs 2-D A and B; shapes are {a} and {b}"
        if gu.elem_type(graph, out) not in (1, 11):
            return "ORT's CPU Gemm is float and double only"
        bias = gu.other_input(add, out)
        c = gu.shape(graph, bias) if bias else None
        m, n = a[0], b[1]
        allowed = ([n], [1], [1, n], [m, 1], [m, n], [1, 1])
        if c is None or list(c) not in [list(s) for s in allowed] or not isinstance(c[-1], int):
            return f"the bias shape {c} does not broadcast to Gemm's [M, N] = [{m}, {n}]"
        return Match([matmul, add], matmul.input_names + [bias], add.output_names)


def _last_two_swapped(perm):
    rank = len(perm)
    return rank >= 2 and list(perm[:-2]) == list(range(rank - 2)) and list(perm[-2:]) == [rank - 1, rank - 2]


@register_transformer(level=2)
class MatmulTransposeFusion(PatternFusion):
    """MatMul(Transpose(A), B) -> FusedMatMul(A, B, transA=1) when the Transpose swaps the last two axes."""

    anchor, fused_op = MATMULS, ("FusedMatMul", MS_DOMAIN)

    def match(self, graph, matmul):
        if not gu.is_float(graph, matmul.output_names[0]):
            return None
        if gu.elem_type(graph, matmul.output_names[0]) != 1:
            return FLOAT32_ONLY
        inputs, changes, used = list(matmul.input_names), {}, []
        for slot, flag in ((0, "transA"), (1, "transB")):
            t = self._foldable_transpose(graph, inputs[slot])
            if t is not None:
                inputs[slot] = t.input_names[0]
                changes[flag] = 1 - _matmul_attributes(matmul)[flag]
                used.append(t)
        if not used:
            return None
        kept = [t for t in used if gu.uses(graph, t.output_names[0]) > 1]  # still read elsewhere
        return _fused_matmul(matmul, [t for t in used if t not in kept], inputs, matmul.output_names, **changes)

    def _foldable_transpose(self, graph, name):
        """The Transpose producing `name` when it only swaps the last two axes, else None (a
        Transpose that does something else is declined with its reason)."""
        t = graph.producer(name)
        if not gu.is_op(t, "Transpose"):
            return None
        reason = _transpose_reason(graph, t)
        if reason:
            self.decline(t, reason)
            return None
        return t


def _transpose_reason(graph, transpose):
    perm = transpose.attribute("perm")
    if perm is None or not _last_two_swapped(perm):
        return f"perm {perm} does not just swap the last two axes"
    if any(o in graph.outputs for o in transpose.output_names):
        return "its output is a graph output"
    return None


@register_transformer(level=2)
class MatMulScaleFusion(PatternFusion):
    """Mul(MatMul(A, B), s), MatMul(Mul(A, s), B) or Div(MatMul(A, B), s) -> FusedMatMul(alpha=s or 1/s)."""

    anchor, fused_op = MATMULS, ("FusedMatMul", MS_DOMAIN)

    def match(self, graph, matmul):
        if gu.elem_type(graph, matmul.output_names[0]) != 1:
            return None
        return self._scaled_after(graph, matmul) or self._scaled_before(graph, matmul)

    def _scale(self, graph, node, value_name):
        """The factor a Mul/Div node applies to `value_name`, or None."""
        other = gu.other_input(node, value_name)
        if other is None or other in self.excluded:
            return None
        s = gu.scalar(graph, other)
        if s is None:
            return None
        if gu.is_op(node, "Mul"):
            return s
        if gu.is_op(node, "Div") and node.input_names[0] == value_name and s != 0:
            return 1.0 / s
        return None

    def _scaled_after(self, graph, matmul):
        scaler = gu.single_consumer(graph, matmul.output_names[0])
        if scaler is None or (s := self._scale(graph, scaler, matmul.output_names[0])) is None:
            return None
        alpha = _matmul_attributes(matmul)["alpha"] * s
        return _fused_matmul(matmul, [scaler], matmul.input_names, scaler.output_names, alpha=alpha)

    def _scaled_before(self, graph, matmul):
        inputs = list(matmul.input_names)
        for slot in (0, 1):
            scaler = graph.producer(inputs[slot])
            if scaler is None or gu.single_consumer(graph, inputs[slot]) is not matmul:
                continue
            data = [n for n in scaler.input_names if gu.scalar(graph, n) is None]
            if len(data) != 1 or (s := self._scale(graph, scaler, data[0])) is None:
                continue
            inputs[slot] = data[0]
            alpha = _matmul_attributes(matmul)["alpha"] * s
            return _fused_matmul(matmul, [scaler], inputs, matmul.output_names, alpha=alpha)
        return None


ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu")


@register_transformer(level=2, compatible_eps=("CPUExecutionProvider",))
class GemmActivationFusion(PatternFusion):
    """Relu(Gemm(A, B, C)) -> FusedGemm(A, B, C, activation='Relu') (a CPU-only kernel)."""

    anchor, fused_op = "Gemm", ("FusedGemm", MS_DOMAIN)

    def match(self, graph, gemm):
        if gu.elem_type(graph, gemm.output_names[0]) != 1:
            return None
        act = gu.single_consumer(graph, gemm.output_names[0])
        if act is None or act.op_type not in ACTIVATIONS or domain_of(act.domain) != ONNX_DOMAIN:
            return None
        attrs = dict(gemm.attributes, activation=act.op_type)
        if act.op_type == "LeakyRelu":
            attrs["activation_alpha"] = act.attribute("alpha", 0.01)
        return Match([gemm, act], gemm.input_names, act.output_names, attrs)

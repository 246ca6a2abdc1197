"""Fusions around MatMul and Gemm: into Gemm, FusedMatMul and FusedGemm.

Mirrors onnxruntime/core/optimizer/matmul_add_fusion.cc (MatMulAddFusion),
matmul_transpose_fusion.cc (MatmulTransposeFusion), matmul_scale_fusion.cc
(MatMulScaleFusion) and gemm_activation_fusion.cc (GemmActivationFusion).
FusedMatMul(A, B) = alpha * op(A) @ op(B): transA/transB swap the last two axes of A/B,
transBatchA/transBatchB move the first axis of A/B to the front of its last two (a [M, b.., K]
tensor read as [b.., M, K]).
"""
from typing import NamedTuple

import numpy as np

from ortlab.onnx_defs import MS_DOMAIN, ONNX_DOMAIN, domain_of
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.pattern import Match, PatternFusion
from ortlab.transformers.registry import register_transformer

FLOAT32_ONLY = "FusedMatMul's CPU kernel is float32 only"
MATMULS = ["MatMul", ("FusedMatMul", MS_DOMAIN)]  # the anchor of the fusions into FusedMatMul
# FusedMatMul's attributes and their defaults (ORT's contrib_defs.cc schema)
FUSED_MATMUL_DEFAULTS = {"alpha": 1.0, "transA": 0, "transB": 0, "transBatchA": 0, "transBatchB": 0}


def _matmul_attributes(node):
    """alpha, transA, transB, transBatchA, transBatchB of a MatMul or FusedMatMul (defaults filled in,
    as ORT's Graph fills a node's missing attributes from its schema)."""
    if gu.is_op(node, "MatMul"):
        return dict(FUSED_MATMUL_DEFAULTS)
    return dict(FUSED_MATMUL_DEFAULTS, **node.attributes)


def _fused_matmul(matmul, extra, inputs, outputs, **changes):
    """The Match of a FusedMatMul replacing `matmul` and `extra`, its attributes updated by `changes`."""
    return Match([matmul] + extra, inputs, outputs, dict(_matmul_attributes(matmul), **changes))


def matmul_elem_type(graph, matmul):
    """The element type of a MatMul's or FusedMatMul's output, or None when unknown.

    onnx's shape inference has no schema for com.microsoft ops, so the output of a FusedMatMul
    that came with the model (or that reads another one) is untyped; FusedMatMul's type
    constraint (one T for A, B and Y) gives it from whichever input is typed.
    """
    out = gu.elem_type(graph, matmul.output_names[0])
    if out:
        return out
    known = {t for t in (gu.elem_type(graph, n) for n in matmul.input_names[:2]) if t}
    return known.pop() if len(known) == 1 else None


def _type_reason(graph, matmul):
    """Why a MatMul cannot become a FusedMatMul for its element type (a str), or None."""
    elem = matmul_elem_type(graph, matmul)
    if elem is None:
        return "the element type of its output is unknown (and its inputs do not give it)"
    return None if elem == 1 else FLOAT32_ONLY


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


def transpose_perm(graph, transpose):
    """A Transpose's perm: its attribute, or the reversed axes when it has none (the ONNX
    default), or None when it has none and its input's rank is unknown."""
    perm = transpose.attribute("perm")
    if perm is not None:
        return [int(p) for p in perm]
    dims = gu.shape(graph, transpose.input_names[0])
    return None if dims is None else list(range(len(dims)))[::-1]


def transpose_flags(perm):
    """(transposes the last two axes, moves the first axis behind the batch axes), or None when
    FusedMatMul cannot read the Transpose's input in place of its output.

    Mirrors GetTransposeNodeFromOutput in matmul_transpose_fusion.cc: the input's last axis
    must end up in one of the last two places, and the batch axes must keep their order,
    contiguous, starting at axis 0 or 1 (so the flags are transA/transB and transBatchA/B).
    """
    rank = len(perm)
    if rank < 2:
        return None
    last = rank - 1
    if perm[-1] == last:
        trans = False
    elif perm[-2] == last:
        trans = True
    else:
        return None
    if rank >= 3:
        if perm[0] not in (0, 1) or any(perm[i] + 1 != perm[i + 1] for i in range(rank - 3)):
            return None
    return trans, rank >= 3 and perm[0] == 1


@register_transformer(level=2)
class MatmulTransposeFusion(PatternFusion):
    """MatMul(Transpose(A), B) -> FusedMatMul(A, B, transA=1) when the Transpose swaps the last two axes.

    Also (transBatchA=1) when it moves the first axis behind contiguous batch axes, as
    [M, b.., K] -> [b.., M, K], or both; the same for B (transB, transBatchB); a Transpose with
    no perm (the reversed axes) counts by its input's rank. A batch move needs A and B of one
    known rank. Mirrors matmul_transpose_fusion.cc (ORT 1.19.2; not its Cast reordering).
    """

    anchor, fused_op = MATMULS, ("FusedMatMul", MS_DOMAIN)

    def match(self, graph, matmul):
        if not gu.is_float(graph, matmul.input_names[0]):
            return None
        reason = _type_reason(graph, matmul)
        if reason:
            return reason
        attrs = _matmul_attributes(matmul)
        inputs, changes, used, batch = list(matmul.input_names), {}, [], []
        for slot, side in ((0, "A"), (1, "B")):
            if attrs[f"transBatch{side}"]:
                continue  # ORT folds no second batch transpose into that side
            found = self._foldable_transpose(graph, inputs[slot])
            if found is None:
                continue
            t, (trans, trans_batch) = found
            if trans_batch:
                batch.append(slot)
            used.append((slot, side, t, trans, trans_batch))
        if batch and not self._same_rank(graph, matmul):
            for slot, side, t, *_ in [u for u in used if u[0] in batch]:
                self.decline(t, f"it moves the batch axes of {side} (transBatch{side}), which needs the "
                                "two inputs' ranks known and equal")
            used = [u for u in used if u[0] not in batch]
        if not used:
            return None
        for slot, side, t, trans, trans_batch in used:
            inputs[slot] = t.input_names[0]
            changes[f"trans{side}"] = attrs[f"trans{side}"] ^ int(trans)
            changes[f"transBatch{side}"] = attrs[f"transBatch{side}"] ^ int(trans_batch)
        transposes = [u[2] for u in used]
        removed = [t for i, t in enumerate(transposes)
                   if t not in transposes[:i] and gu.uses(graph, t.output_names[0]) == transposes.count(t)]
        return _fused_matmul(matmul, removed, inputs, matmul.output_names, **changes)

    @staticmethod
    def _same_rank(graph, matmul):
        a, b = (gu.shape(graph, n) for n in matmul.input_names[:2])
        return a is not None and b is not None and len(a) == len(b)

    def _foldable_transpose(self, graph, name):
        """(the Transpose producing `name`, its (trans, trans_batch) flags) when FusedMatMul can
        fold it, else None (a Transpose that does something else is declined with its reason)."""
        t = graph.producer(name)
        if not gu.is_op(t, "Transpose"):
            return None
        if any(o in graph.outputs for o in t.output_names):
            self.decline(t, "its output is a graph output")
            return None
        perm = transpose_perm(graph, t)
        if perm is None:
            self.decline(t, "it has no perm and its input's rank is unknown")
            return None
        flags = transpose_flags(perm)
        if flags is None:
            self.decline(t, f"perm {perm} neither just swaps the last two axes nor just moves the first "
                            "axis behind contiguous batch axes")
            return None
        return t, flags


class Scale(NamedTuple):
    """A Mul or Div by a constant scalar next to a MatMul: the node, the factor it applies, and
    the input that is not the scale."""
    node: object
    factor: float
    data: str


@register_transformer(level=2)
class MatMulScaleFusion(PatternFusion):
    """Mul(MatMul(A, B), s), MatMul(Mul(A, s), B) or Div(MatMul(A, B), s) -> FusedMatMul(alpha=s or 1/s).

    Mirrors matmul_scale_fusion.cc: every scaled input and the scaled output are folded at once,
    alpha = the product of the factors (float32 arithmetic); a Mul that also feeds other nodes
    stays for them. It declines a scale that broadcasts: a rank-0 input (FusedMatMul needs rank
    >= 1) or a scale of more axes than the value it scales (it would add axes to the result).
    """

    anchor, fused_op = MATMULS, ("FusedMatMul", MS_DOMAIN)

    def match(self, graph, matmul):
        elem = matmul_elem_type(graph, matmul)
        if elem is None:
            if self._scales_before(graph, matmul, quiet=True) or self._scale_after(graph, matmul, quiet=True):
                return "the element type of its output is unknown (and its inputs do not give it)"
            return None
        if elem != 1:
            return None
        before = self._scales_before(graph, matmul)
        after = self._scale_after(graph, matmul)
        if not before and after is None:
            return None
        alpha = np.float32(_matmul_attributes(matmul)["alpha"])
        for _, scale in before:
            alpha = np.float32(alpha * np.float32(scale.factor))
        if after is not None:
            alpha = np.float32(alpha * np.float32(after.factor))
        inputs, extra = list(matmul.input_names), []
        for slot, scale in before:
            inputs[slot] = scale.data
            reads = sum(1 for s, sc in before if sc.node is scale.node)
            if gu.uses(graph, scale.node.output_names[0]) == reads and scale.node not in extra:
                extra.append(scale.node)  # nothing else reads it: it goes with the fusion
        outputs = matmul.output_names
        if after is not None:
            extra.append(after.node)
            outputs = after.node.output_names
        return _fused_matmul(matmul, extra, inputs, outputs, alpha=float(alpha))

    def _scales_before(self, graph, matmul, quiet=False):
        """[(input slot, Scale)] for the MatMul's inputs made by a constant-scalar Mul or Div."""
        found = []
        for slot in (0, 1):
            scaler = graph.producer(matmul.input_names[slot])
            scale = self._scale(graph, scaler, quiet) if scaler is not None else None
            if scale is None:
                continue
            dims = gu.shape(graph, scale.data)
            if dims is None or len(dims) == 0:
                if not quiet:
                    self.decline(scaler, f"the value it scales ('{scale.data}') has rank "
                                 f"{'unknown' if dims is None else 0}; FusedMatMul needs inputs of rank >= 1")
                continue
            found.append((slot, scale))
        return found

    def _scale_after(self, graph, matmul, quiet=False):
        """The Scale reading the MatMul's output, when it is the output's only reader."""
        out = matmul.output_names[0]
        scaler = gu.single_consumer(graph, out)
        if scaler is None:
            return None
        scale = self._scale(graph, scaler, quiet)
        return scale if scale is not None and scale.data == out else None

    def _scale(self, graph, node, quiet=False):
        """The Scale a Mul or Div node applies, or None (GetScaleFromNode in matmul_scale_fusion.cc):
        Div(x, s) gives 1/s, Mul(s, x) or Mul(x, s) gives s, for s a constant one-element
        initializer, not excluded, of no more axes than x."""
        if not (gu.is_op(node, "Mul") or gu.is_op(node, "Div")) or len(node.input_names) != 2:
            return None
        slots = (1,) if gu.is_op(node, "Div") else (0, 1)
        for slot in slots:
            name, data = node.input_names[slot], node.input_names[1 - slot]
            if name in self.excluded:
                continue
            s = gu.scalar(graph, name)
            if s is None:
                continue
            s_rank, x_dims = len(gu.shape(graph, name) or ()), gu.shape(graph, data)
            if s_rank > len(x_dims or ()):
                if not quiet:
                    self.decline(node, _broadcast_reason(name, s_rank, data, x_dims))
                continue
            if gu.is_op(node, "Div"):
                if s == 0:
                    if not quiet:
                        self.decline(node, "it divides by zero: there is no alpha to fold")
                    continue
                s = float(np.float32(1.0) / np.float32(s))
            return Scale(node, s, data)
        return None


def _broadcast_reason(scale, scale_rank, data, dims):
    """Why a one-element scale of `scale_rank` axes cannot be folded into alpha next to `data`."""
    if dims is None:
        return f"the rank of '{data}' is unknown, so its scale '{scale}' may broadcast it"
    if not dims:
        return (f"'{data}' has rank 0 and its scale '{scale}' broadcasts it to rank {scale_rank}: "
                "FusedMatMul needs inputs of rank >= 1")
    return (f"its scale '{scale}' has {scale_rank} axes, more than the {len(dims)} of '{data}': it "
            "broadcasts, and folding it would drop axes from the result")


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

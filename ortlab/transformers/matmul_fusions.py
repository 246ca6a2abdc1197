"""Fusions around MatMul and Gemm: into Gemm, FusedMatMul and FusedGemm.

Mirrors onnxruntime/core/optimizer/matmul_add_fusion.cc (MatMulAddFusion),
matmul_transpose_fusion.cc (MatmulTransposeFusion), matmul_scale_fusion.cc
(MatMulScaleFusion) and gemm_activation_fusion.cc (GemmActivationFusion).
FusedMatMul(A, B) = alpha * op(A) @ op(B), op = transpose of the last two axes when transA/transB.
"""
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import GraphTransformer
from ortlab.transformers.registry import register_transformer

FLOAT32_ONLY = "FusedMatMul's CPU kernel is float32 only"


def _is_matmul(node):
    return gu.is_op(node, "MatMul") or gu.is_op(node, "FusedMatMul", gu.MS)


def _matmul_attributes(node):
    """alpha, transA, transB (and the batch-transpose flags) of a MatMul or FusedMatMul."""
    if gu.is_op(node, "MatMul"):
        return {"alpha": 1.0, "transA": 0, "transB": 0, "transBatchA": 0, "transBatchB": 0}
    return {k: v for k, v in node.attributes.items()}


def _to_fused_matmul(owner, graph, matmul, extra, inputs, outputs, **changes):
    attrs = _matmul_attributes(matmul)
    attrs.update(changes)
    return gu.fuse(owner, graph, [matmul] + extra, "FusedMatMul", inputs, outputs, domain=gu.MS, **attrs)


@register_transformer(level=1)
class MatMulAddFusion(GraphTransformer):
    """Add(MatMul(A, B), C) -> Gemm(A, B, C), for 2-D A and B (ORT 1.19.2 does not fuse higher ranks)."""

    def apply_impl(self, graph):
        modified = False
        for node in self.nodes(graph):
            if gu.is_op(node, "MatMul") and self.fusable(graph, node):
                add = gu.single_consumer(graph, node.output_names[0])
                bias = gu.other_input(add, node.output_names[0])
                gu.fuse(self, graph, [node, add], "Gemm", node.input_names + [bias], add.output_names)
                modified = True
        return modified

    def fusable(self, graph, node):
        out = node.output_names[0]
        add = gu.single_consumer(graph, out)
        if not gu.is_op(add, "Add"):
            return self.decline(node, "its output does not go to exactly one Add") if add else False
        a, b = (gu.shape(graph, n) for n in node.input_names)
        if a is None or b is None or len(a) != 2 or len(b) != 2:
            return self.decline(node, f"Gemm needs 2-D A and B; shapes are {a} and {b}")
        if gu.elem_type(graph, out) not in (1, 11):
            return self.decline(node, "ORT's CPU Gemm is float and double only")
        bias = gu.other_input(add, out)
        c = gu.shape(graph, bias) if bias else None
        m, n = a[0], b[1]
        allowed = ([n], [1], [1, n], [m, 1], [m, n], [1, 1])
        if c is None or list(c) not in [list(s) for s in allowed] or not isinstance(c[-1], int):
            return self.decline(node, f"the bias shape {c} does not broadcast to Gemm's [M, N] = [{m}, {n}]")
        return True


def _last_two_swapped(perm):
    rank = len(perm)
    return rank >= 2 and list(perm[:-2]) == list(range(rank - 2)) and list(perm[-2:]) == [rank - 1, rank - 2]


@register_transformer(level=2)
class MatmulTransposeFusion(GraphTransformer):
    """MatMul(Transpose(A), B) -> FusedMatMul(A, B, transA=1) when the Transpose swaps the last two axes."""

    def apply_impl(self, graph):
        modified = False
        for node in self.nodes(graph):
            if not _is_matmul(node) or not gu.is_float(graph, node.output_names[0]):
                continue
            if gu.elem_type(graph, node.output_names[0]) != 1:
                self.decline(node, FLOAT32_ONLY)
                continue
            modified |= self._fuse(graph, node)
        return modified

    def _fuse(self, graph, node):
        inputs, changes, used = list(node.input_names), {}, []
        for slot, flag in ((0, "transA"), (1, "transB")):
            t = graph.producer(inputs[slot])
            if not gu.is_op(t, "Transpose"):
                continue
            perm = t.attribute("perm")
            if perm is None or not _last_two_swapped(perm):
                self.decline(t, f"perm {perm} does not just swap the last two axes")
                continue
            if any(o in graph.outputs for o in t.output_names):
                self.decline(t, "its output is a graph output")
                continue
            inputs[slot] = t.input_names[0]
            changes[flag] = 1 - _matmul_attributes(node)[flag]
            used.append(t)
        if not used:
            return False
        out = node.output_names
        shared = [t for t in used if gu.uses(graph, t.output_names[0]) > 1]
        _to_fused_matmul(self, graph, node, [t for t in used if t not in shared], inputs, out, **changes)
        return True


@register_transformer(level=2)
class MatMulScaleFusion(GraphTransformer):
    """Mul(MatMul(A, B), s), MatMul(Mul(A, s), B) or Div(MatMul(A, B), s) -> FusedMatMul(alpha=s or 1/s)."""

    def apply_impl(self, graph):
        modified = False
        for node in self.nodes(graph):
            if _is_matmul(node) and gu.elem_type(graph, node.output_names[0]) == 1:
                modified |= self._fuse_after(graph, node) or self._fuse_before(graph, node)
        return modified

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

    def _fuse_after(self, graph, node):
        scaler = gu.single_consumer(graph, node.output_names[0])
        if scaler is None or (s := self._scale(graph, scaler, node.output_names[0])) is None:
            return False
        alpha = _matmul_attributes(node)["alpha"] * s
        _to_fused_matmul(self, graph, node, [scaler], node.input_names, scaler.output_names, alpha=alpha)
        return True

    def _fuse_before(self, graph, node):
        inputs = list(node.input_names)
        for slot in (0, 1):
            scaler = graph.producer(inputs[slot])
            if scaler is None or gu.single_consumer(graph, inputs[slot]) is not node:
                continue
            data = [n for n in scaler.input_names if gu.scalar(graph, n) is None]
            if len(data) != 1 or (s := self._scale(graph, scaler, data[0])) is None:
                continue
            inputs[slot] = data[0]
            alpha = _matmul_attributes(node)["alpha"] * s
            _to_fused_matmul(self, graph, node, [scaler], inputs, node.output_names, alpha=alpha)
            return True
        return False


ACTIVATIONS = ("Relu", "Sigmoid", "Tanh", "LeakyRelu")


@register_transformer(level=2, compatible_eps=("CPUExecutionProvider",))
class GemmActivationFusion(GraphTransformer):
    """Relu(Gemm(A, B, C)) -> FusedGemm(A, B, C, activation='Relu') (a CPU-only kernel)."""

    def apply_impl(self, graph):
        modified = False
        for node in self.nodes(graph):
            if not gu.is_op(node, "Gemm") or gu.elem_type(graph, node.output_names[0]) != 1:
                continue
            act = gu.single_consumer(graph, node.output_names[0])
            if act is None or act.op_type not in ACTIVATIONS or (act.domain or "") != "":
                continue
            attrs = dict(node.attributes, activation=act.op_type)
            if act.op_type == "LeakyRelu":
                attrs["activation_alpha"] = act.attribute("alpha", 0.01)
            gu.fuse(self, graph, [node, act], "FusedGemm", node.input_names, act.output_names,
                    domain=gu.MS, **attrs)
            modified = True
        return modified

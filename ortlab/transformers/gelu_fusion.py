"""GeluFusion and BiasGeluFusion: the Erf form of GELU -> com.microsoft Gelu, then Add + Gelu -> BiasGelu.

Mirrors onnxruntime/core/optimizer/gelu_fusion.cc and bias_gelu_fusion.cc.

    Gelu(x) = 0.5 * x * (1 + erf(x / sqrt(2)))
    torch exports: Mul(Mul(x, Add(Erf(Div(x, 1.4142)), 1)), 0.5)   (or 0.5 * x first)

ortlab also matches Mul(x, 0.7071) for the Div, which ORT 1.19.2 does not.
"""
import math

from ortlab.onnx_defs import MS_DOMAIN
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.pattern import Match, PatternFusion
from ortlab.transformers.registry import register_transformer


@register_transformer(level=2)
class GeluFusion(PatternFusion):
    """0.5 * x * (1 + erf(x / sqrt 2)) -> Gelu(x) (com.microsoft)."""

    anchor, fused_op = "Erf", ("Gelu", MS_DOMAIN)

    def match(self, graph, erf):
        scale = graph.producer(erf.input_names[0])
        x = self._scaled_input(graph, scale)
        if x is None or gu.single_consumer(graph, scale.output_names[0]) is not erf:
            return "its input is not x / sqrt(2) (or x * 0.7071) read only by this Erf"
        if not gu.is_float(graph, x):
            return "x is not a float tensor"
        add = gu.single_consumer(graph, erf.output_names[0])
        one = gu.other_input(add, erf.output_names[0]) if gu.is_op(add, "Add") else None
        if one is None or not gu.is_scalar_close(graph, one, 1.0):
            return "erf(...) is not only read by Add(., 1)"
        mul = gu.single_consumer(graph, add.output_names[0])
        other = gu.other_input(mul, add.output_names[0]) if gu.is_op(mul, "Mul") else None
        if other is None:
            return "1 + erf(...) is not only read by a Mul"
        if other == x:  # (x * (1 + erf)) * 0.5
            half = gu.single_consumer(graph, mul.output_names[0])
            c = gu.other_input(half, mul.output_names[0]) if gu.is_op(half, "Mul") else None
            if c is None or not gu.is_scalar_close(graph, c, 0.5):
                return "x * (1 + erf(...)) is not only read by Mul(., 0.5)"
            return Match([scale, erf, add, mul, half], [x], [half.output_names[0]])
        half = graph.producer(other)  # (0.5 * x) * (1 + erf)
        if (gu.is_op(half, "Mul") and gu.other_input(half, x) is not None
                and gu.is_scalar_close(graph, gu.other_input(half, x), 0.5)
                and gu.single_consumer(graph, other) is mul):
            return Match([scale, erf, add, half, mul], [x], [mul.output_names[0]])
        return "the 0.5 * x factor is missing or shared"

    @staticmethod
    def _scaled_input(graph, node):
        """x when node is Div(x, sqrt 2) or Mul(x, 1/sqrt 2), else None."""
        if gu.is_op(node, "Div") and gu.is_scalar_close(graph, node.input_names[1], math.sqrt(2)):
            return node.input_names[0]
        if gu.is_op(node, "Mul"):
            for x, c in (node.input_names, node.input_names[::-1]):
                if gu.is_scalar_close(graph, c, 1 / math.sqrt(2)) and gu.scalar(graph, x) is None:
                    return x
        return None


@register_transformer(level=2)
class BiasGeluFusion(PatternFusion):
    """Gelu(Add(X, bias)) -> BiasGelu(X, bias), bias 1-D of X's last dimension."""

    anchor, fused_op = ("Gelu", MS_DOMAIN), ("BiasGelu", MS_DOMAIN)

    def match(self, graph, gelu):
        found = bias_add(graph, gelu)
        if isinstance(found, str):
            return found
        add, x, bias = found
        return Match([add, gelu], [x, bias], gelu.output_names)


def bias_add(graph, node, one_d=True):
    """(Add, X, bias) when node's input is Add(X, bias) (either order) read only by node, with
    (one_d) a 1-D bias of X's last dimension; else why not (str). Without one_d: (Add, A, B)."""
    add = graph.producer(node.input_names[0])
    if not gu.is_op(add, "Add") or gu.single_consumer(graph, add.output_names[0]) is not node:
        return f"its input is not an Add read only by this {node.op_type}"
    pair = _data_and_bias(graph, add) if one_d else add.input_names
    if pair is None:
        return "neither Add input is a 1-D bias of the other's last dimension"
    return (add, *pair)


def _data_and_bias(graph, add):
    """(X, bias) for Add(X, bias) or Add(bias, X) with a 1-D bias of X's last dim, else None."""
    a, b = add.input_names
    for x, bias in ((a, b), (b, a)):
        if gu.broadcasts_to_last_dim(graph, bias, x) and gu.is_float(graph, x):
            return x, bias
    return None

"""BiasSoftmaxFusion and BiasDropoutFusion: an Add folded into the Softmax or Dropout after it.

Mirrors onnxruntime/core/optimizer/bias_softmax_fusion.cc and bias_dropout_fusion.cc.
ORT registers both for the CUDA and ROCm EPs only: its CPU EP has no BiasSoftmax or
BiasDropout kernel, so ortlab runs them only when asked by name or when a GPU EP is
in the providers, and checks their output with the reference kernels of contrib_ops.py.
"""
from ortlab.onnx_defs import MS_DOMAIN, opset_of
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.gelu_fusion import bias_add
from ortlab.transformers.pattern import Match, PatternFusion
from ortlab.transformers.registry import register_transformer

GPU_EPS = ("CUDAExecutionProvider", "ROCMExecutionProvider")


def _same_dim(a, b):
    return a == b and a is not None


def broadcast_kind(data, bias):
    """How `bias` repeats over `data` for BiasSoftmax: 0 (outer dims), 1 (inner dims), or None.

    Broadcast dims (bias 1, data not 1) must form one block, at the front (outer) or just
    before the last axis (inner); every other dim must match; the last axis never broadcasts.
    """
    if data is None or bias is None or len(bias) > len(data):
        return None
    bias = [1] * (len(data) - len(bias)) + list(bias)
    spread = [i for i, (d, b) in enumerate(zip(data, bias)) if b == 1 and d != 1]
    if any(i not in spread and not _same_dim(d, b) for i, (d, b) in enumerate(zip(data, bias))):
        return None
    if len(data) - 1 in spread:
        return None
    if not spread or spread == list(range(len(spread))):
        return 0
    if spread == list(range(spread[0], len(data) - 1)):
        return 1
    return None


@register_transformer(level=2, compatible_eps=GPU_EPS)
class BiasSoftmaxFusion(PatternFusion):
    """Softmax(Add(X, bias), axis=-1) -> BiasSoftmax(X, bias) with a repeatable broadcast of bias."""

    anchor, fused_op = "Softmax", ("BiasSoftmax", MS_DOMAIN)

    def match(self, graph, softmax):
        found = bias_add(graph, softmax, one_d=False)
        if isinstance(found, str):
            return found
        add = found[0]
        dims = gu.shape(graph, add.output_names[0])
        opset = opset_of(graph.opset_imports) or 0
        axis = softmax.attribute("axis", -1 if opset >= 13 else 1)
        if dims is None or opset < 13 or axis not in (-1, len(dims) - 1):
            return f"it is not a Softmax over the last axis (axis={axis}, opset 13+)"
        if not gu.is_float(graph, add.output_names[0]):
            return "its input is not a float tensor"
        for x, bias in (add.input_names, add.input_names[::-1]):
            if gu.shape(graph, x) == dims:
                kind = broadcast_kind(dims, gu.shape(graph, bias))
                if kind is not None:
                    return Match([add, softmax], [x, bias], softmax.output_names,
                                 {"axis": -1, "is_inner_broadcast": kind})
        return ("the Add's inputs do not broadcast in a way BiasSoftmax repeats "
                "(one block of outer or inner dims, never the last axis)")


@register_transformer(level=2, compatible_eps=GPU_EPS)
class BiasDropoutFusion(PatternFusion):
    """Dropout(Add(X, bias)) [+ residual] -> BiasDropout(X, bias, residual), bias 1-D of X's last dim."""

    anchor, fused_op = "Dropout", ("BiasDropout", MS_DOMAIN)

    def match(self, graph, dropout):
        found = bias_add(graph, dropout)
        if isinstance(found, str):
            return found
        add, x, bias = found
        rest = (dropout.input_names + ["", ""])[1:3]
        out, mask = (dropout.output_names + [""])[:2]
        nodes, residual = [add, dropout], ""
        after = gu.single_consumer(graph, out)
        other = gu.other_input(after, out) if gu.is_op(after, "Add") else None
        if other and gu.shape(graph, other) == gu.shape(graph, x) and gu.shape(graph, x) is not None:
            nodes, residual, out = nodes + [after], other, after.output_names[0]
        seed = dropout.attribute("seed")
        return Match(nodes, [x, bias, residual, *rest], [out, mask], {} if seed is None else {"seed": seed})

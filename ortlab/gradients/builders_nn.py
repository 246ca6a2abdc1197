"""Gradients of softmax, layer norm and the loss. Mirrors GetXxxGradient in
orttraining/orttraining/core/graph/gradient_builder.cc; each docstring names what ORT emits."""
from ortlab.gradients.builder_base import MS, GradientBuilderError
from ortlab.gradients.registry import register_gradient
from ortlab.onnx_defs import opset_of


def _opset(b):
    return opset_of(b.graph.opset_imports) or 0


@register_gradient("Softmax")
def get_softmax_gradient(b):
    """dX = Y·(dY - Σ dY·Y) along the axis. ORT: SoftmaxGrad_13 (com.microsoft) from opset 13."""
    if _opset(b) < 13:
        raise GradientBuilderError("Softmax before opset 13 flattens its input; export at opset >= 13")
    return [b.emit("SoftmaxGrad_13", [b.GO(0), b.O(0)], [b.GI(0)], domain=MS, axis=b.attr("axis", -1))]


@register_gradient("LogSoftmax")
def get_logsoftmax_gradient(b):
    """dX = dY - exp(Y)·Σ dY along the axis. ORT: LogSoftmaxGrad_13 (com.microsoft)."""
    if _opset(b) < 13:
        raise GradientBuilderError("LogSoftmax before opset 13 flattens its input; export at opset >= 13")
    return [b.emit("LogSoftmaxGrad_13", [b.GO(0), b.O(0)], [b.GI(0)], domain=MS, axis=b.attr("axis", -1))]


@register_gradient("LayerNormalization")
def get_layernorm_gradient(b):
    """dX, dScale, dBias from the saved mean and inverse std (outputs 1 and 2, added to the
    forward node when absent). ORT: LayerNormalizationGrad (com.microsoft)."""
    # at every opset: below 17 the node is ORT's own LayerNormalization of the ONNX domain
    inputs = [b.GO(0), b.I(0), b.I(1), b.O(1), b.O(2)]
    outs = [b.GI(0), b.GI(1), b.GI(2) if len(b.node.inputs) > 2 and b.I(2) else b.IA("unused_dbias")]
    b.emit("LayerNormalizationGrad", inputs, outs, domain=MS, axis=b.attr("axis", -1))
    return outs[:len(b.node.inputs)]


@register_gradient("SoftmaxCrossEntropyLoss")
def get_sce_loss_gradient(b):
    """d_scores from the log-probabilities (output 1, added to the forward node when absent).
    ORT: SoftmaxCrossEntropyLossGrad (com.microsoft); labels and weights get none."""
    inputs = [b.GO(0), b.O(1), b.I(1)] + ([b.I(2)] if len(b.node.inputs) > 2 and b.I(2) else [])
    attrs = {"reduction": b.attr("reduction", "mean")}
    if b.attr("ignore_index") is not None:
        attrs["ignore_index"] = b.attr("ignore_index")
    grad = b.emit("SoftmaxCrossEntropyLossGrad", inputs, [b.GI(0)], domain=MS, **attrs)
    return [grad, None, None]

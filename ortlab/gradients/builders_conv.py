"""Gradients of convolution and pooling. Mirrors GetConvGradient, GetMaxPoolGradient,
GetAveragePoolGradient and GetGlobalAveragePoolGradient in
orttraining/orttraining/core/graph/gradient_builder.cc; each docstring names what ORT emits."""
import numpy as np

from ortlab.gradients.builder_base import MS, GradientBuilderError
from ortlab.gradients.registry import register_gradient
from ortlab.ops.contrib_ops import conv_pads


@register_gradient("Conv")
def get_conv_gradient(b):
    """dX = the transposed convolution of dY with W, dW = the correlation of X with dY, dB = dY
    summed over batch and space, all three from one node. ORT: ConvGrad (com.microsoft) with the
    Conv's own attributes; an output not needed is left out (''). ortlab differs in one place:
    auto_pad SAME_UPPER/SAME_LOWER becomes explicit pads, since ORT 1.19.2's ConvGrad kernel
    ignores auto_pad and computes wrong gradients."""
    outputs = [b.GI(i) if b.needs(i) else "" for i in range(len(b.node.inputs))]
    b.emit("ConvGrad", [b.GO(0), b.I(0), b.I(1)], outputs, domain=MS, **_conv_attributes(b))
    return [o or None for o in outputs]


def _conv_attributes(b):
    """The Conv's attributes, with auto_pad SAME_* turned into the pads it means (static shapes)."""
    attributes = dict(b.node.attributes)
    auto_pad = b.attr("auto_pad", "NOTSET")
    if auto_pad not in ("SAME_UPPER", "SAME_LOWER"):
        return attributes
    x, w = b.shape(b.I(0)), b.shape(b.I(1))
    spatial = None if x is None or w is None else list(x[2:]) + list(w[2:])
    if spatial is None or not all(isinstance(d, int) for d in spatial):
        raise GradientBuilderError(
            f"Conv {_label(b)}: auto_pad={auto_pad} needs the static spatial shapes of X and W "
            f"(got {x} and {w}), because ORT's ConvGrad ignores auto_pad; give the Conv explicit pads")
    n = len(x) - 2
    strides, dilations = attributes.get("strides") or [1] * n, attributes.get("dilations") or [1] * n
    begin, end = conv_pads(auto_pad, None, x[2:], w[2:], strides, dilations)
    attributes.update(auto_pad="NOTSET", pads=[int(p) for p in begin + end])
    return attributes


@register_gradient("GlobalAveragePool")
def get_globalaveragepool_gradient(b):
    """dX = dY / (H·W·...) expanded over the pooled dimensions. ORT: a constant of the pooled size
    when it is known (else Size(X) / Size(Y)), Scale(scale_down=1) (com.microsoft), Shape, Expand."""
    shape = b.shape(b.I(0))
    dims = None if shape is None else shape[2:]
    if dims is not None and all(isinstance(d, int) for d in dims):
        scale = b.constant(float(np.prod(dims, dtype=np.int64)), like=b.I(0))
    else:
        scale = b.emit("Div", [b.emit("Size", [b.I(0)]), b.emit("Size", [b.O(0)])])
    scaled = b.emit("Scale", [b.GO(0), scale], domain=MS, scale_down=1)
    return [b.emit("Expand", [scaled, b.emit("Shape", [b.I(0)])], [b.GI(0)])]


@register_gradient("MaxPool")
def get_maxpool_gradient(b):
    """dX = dY added at the position each window's maximum came from (the Indices output, added to
    the forward node when absent). ORT: MaxPoolGrad (ORT's own op in the ONNX domain) with the
    MaxPool's attributes."""
    _require_static_shape(b)
    return [b.emit("MaxPoolGrad", [b.GO(0), b.O(1)], [_typed_like_x(b)], **b.node.attributes)]


@register_gradient("AveragePool")
def get_averagepool_gradient(b):
    """dX = each window's dY / (its element count) spread over the window. ORT: AveragePoolGrad
    (ORT's own op in the ONNX domain) with the AveragePool's attributes."""
    _require_static_shape(b)
    return [b.emit("AveragePoolGrad", [b.GO(0)], [_typed_like_x(b)], **b.node.attributes)]


def _require_static_shape(b):
    """ORT's MaxPoolGrad and AveragePoolGrad take dX's shape from the graph, not from an input. ORT
    1.19.2's AveragePoolGrad gives a dX with 0 for each symbolic dim, silently; its MaxPoolGrad kills
    the process on a symbolic spatial dim; both kill it when dX has no shape. Refuse instead."""
    shape = b.shape(b.I(0))
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise GradientBuilderError(
            f"{b.node.op_type} {_label(b)}: its gradient ({b.node.op_type}Grad) needs the static shape "
            f"of X, got {shape}; ORT's kernel reads dX's shape from the graph, and with a symbolic dimension "
            "ORT 1.19.2 returns an empty dX or crashes. Give the model's inputs fixed shapes")


def _typed_like_x(b):
    """dX's name, its NodeArg given X's type and static shape: the graph then carries the shape the pool
    gradient's kernel reads (ORT's builders declare GI(0) with IType(0) the same way)."""
    name = b.GI(0)
    b.graph.get_or_create_node_arg(name, b.graph.node_arg(b.I(0)).type_proto)
    return name


def _label(b):
    """The node's name, or its index when it has none."""
    return repr(b.node.name) if b.node.name else f"#{b.node.index}"

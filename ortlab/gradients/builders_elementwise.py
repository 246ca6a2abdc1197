"""Gradients of elementwise ops. Mirrors GetXxxGradient in
orttraining/orttraining/core/graph/gradient_builder.cc; each docstring names what ORT emits."""
import math

from ortlab.gradients.builder_base import MS
from ortlab.gradients.registry import register_gradient
from ortlab.onnx_defs import opset_of


def _binary(b, grads, identity=False):
    """Reduce each input's full-shape gradient over its broadcast axes; with `identity`, a
    gradient that needs no reduction is copied by an Identity node, as ORT's Add/Sub do."""
    result = []
    for i, g in enumerate(grads):
        if g is None or not b.needs(i):
            result.append(None)
            continue
        reduced = b.handle_broadcasting(g, b.I(i))
        result.append(b.emit("Identity", [g], [b.GI(i)]) if identity and reduced == g else reduced)
    return result


@register_gradient("Add")
def get_add_gradient(b):
    """dA = dY, dB = dY, each reduced over broadcast axes. ORT: Identity or HandleBroadcasting."""
    return _binary(b, [b.GO(0), b.GO(0)], identity=True)


@register_gradient("Sum")
def get_sum_gradient(b):
    """Every input gets dY, reduced over its broadcast axes (the variadic Add).
    ORT 1.19.2 has no Sum builder."""
    return _binary(b, [b.GO(0)] * len(b.node.inputs), identity=True)


@register_gradient("Sub")
def get_sub_gradient(b):
    """dA = dY, dB = -dY, reduced over broadcast axes. ORT: as Add, plus Neg for input 1."""
    return _binary(b, [b.GO(0), b.emit("Neg", [b.GO(0)]) if b.needs(1) else None], identity=True)


@register_gradient("Mul")
def get_mul_gradient(b):
    """dA = dY·B, dB = dY·A, reduced over broadcast axes. ORT: Mul then HandleBroadcasting."""
    return _binary(b, [b.emit("Mul", [b.GO(0), b.I(1)]) if b.needs(0) else None,
                       b.emit("Mul", [b.GO(0), b.I(0)]) if b.needs(1) else None])


@register_gradient("Div")
def get_div_gradient(b):
    """dA = dY / B, dB = -dY·A / B². ORT: Div then HandleBroadcasting when only A needs a
    gradient; else one DivGrad (com.microsoft), whose outputs are already shaped like A and B
    (it reduces over the broadcast axes itself), so nothing is reduced after it."""
    if not b.needs(1):
        return _binary(b, [b.emit("Div", [b.GO(0), b.I(1)]), None])
    outputs = [b.GI(0) if b.needs(0) else "", b.GI(1)]
    b.emit("DivGrad", [b.GO(0), b.I(0), b.I(1)], outputs, domain=MS)
    return [outputs[0] or None, outputs[1]]


def _min_max(b):
    """dX_i = dY·[X_i = Y] / Σ_j [X_j = Y], reduced over X_i's broadcast axes: tied inputs share
    dY equally. ORT (GetMinMaxGradient): Equal, Cast per input, Sum, Div, Mul, HandleBroadcasting;
    a single input gets Identity."""
    n = len(b.node.inputs)
    if n == 1:
        return [b.emit("Identity", [b.GO(0)], [b.GI(0)])]
    masks = [b.emit("Cast", [b.emit("Equal", [b.I(i), b.O(0)])], to=b.elem_type(b.I(i))) for i in range(n)]
    scaled = b.emit("Div", [b.GO(0), b.emit("Sum", masks)])
    return _binary(b, [b.emit("Mul", [scaled, masks[i]]) if b.needs(i) else None for i in range(n)])


@register_gradient("Max")
def get_max_gradient(b):
    """dX_i = dY where X_i is the maximum (shared among ties), reduced over broadcast axes.
    ORT: Equal, Cast, Sum, Div, Mul, then HandleBroadcasting (GetMinMaxGradient)."""
    return _min_max(b)


@register_gradient("Min")
def get_min_gradient(b):
    """dX_i = dY where X_i is the minimum (shared among ties), reduced over broadcast axes.
    ORT: Equal, Cast, Sum, Div, Mul, then HandleBroadcasting (GetMinMaxGradient)."""
    return _min_max(b)


@register_gradient("Abs")
def get_abs_gradient(b):
    """dX = dY·sign(X) (0 at X = 0). ORT: Sign, Mul."""
    return [b.emit("Mul", [b.GO(0), b.emit("Sign", [b.I(0)])], [b.GI(0)])]


@register_gradient("Clip")
def get_clip_gradient(b):
    """dX = dY·[min <= X <= max] (1 at the bounds: a subgradient); min and max get none.
    ORT: GreaterOrEqual, LessOrEqual, And, Cast, Mul (Identity when neither bound is given). ORT
    1.19.2 reads only the inputs, so before opset 11 (bounds as attributes) it passes dY through
    unclipped, and before opset 12 its GreaterOrEqual does not exist; ortlab handles both."""
    low = b.I(1) or (b.constant(b.attr("min"), like=b.I(0)) if b.attr("min") is not None else "")
    high = b.I(2) or (b.constant(b.attr("max"), like=b.I(0)) if b.attr("max") is not None else "")
    masks = []  # before opset 11 the bounds are the attributes min and max
    if low:
        masks.append(_compare(b, "GreaterOrEqual", low))
    if high:
        masks.append(_compare(b, "LessOrEqual", high))
    nones = [None] * (len(b.node.inputs) - 1)
    if not masks:
        return [b.emit("Identity", [b.GO(0)], [b.GI(0)])] + nones
    mask = masks[0] if len(masks) == 1 else b.emit("And", masks)
    mask = b.emit("Cast", [mask], to=b.elem_type(b.I(0)))
    return [b.emit("Mul", [b.GO(0), mask], [b.GI(0)])] + nones


def _compare(b, op, bound):
    """X >= bound or X <= bound; before opset 12, which lacks those ops, Not(Less) or Not(Greater)."""
    if (opset_of(b.graph.opset_imports) or 0) >= 12:
        return b.emit(op, [b.I(0), bound])
    return b.emit("Not", [b.emit("Less" if op == "GreaterOrEqual" else "Greater", [b.I(0), bound])])


@register_gradient("LeakyRelu")
def get_leakyrelu_gradient(b):
    """dX = dY where Y > 0, alpha·dY elsewhere. ORT: LeakyReluGrad (com.microsoft) reading Y."""
    return [b.emit("LeakyReluGrad", [b.GO(0), b.O(0)], [b.GI(0)], domain=MS, alpha=b.attr("alpha", 0.01))]


@register_gradient("Neg")
def get_neg_gradient(b):
    """dX = -dY. ORT: Neg."""
    return [b.emit("Neg", [b.GO(0)], [b.GI(0)])]


@register_gradient("Pow")
def get_pow_gradient(b):
    """dX = dY·p·X^(p-1) for the exponent p (input 1, which gets no gradient).
    ORT: Sub, Pow, Mul, Mul (exponent-gradient only when asked)."""
    p, x = b.I(1), b.I(0)
    if b.elem_type(p) != b.elem_type(x):
        p = b.emit("Cast", [p], to=b.elem_type(x))
    p_minus_1 = b.emit("Sub", [p, b.constant(1.0, like=p)])
    local = b.emit("Mul", [b.emit("Pow", [x, p_minus_1]), p])
    return [b.handle_broadcasting(b.emit("Mul", [b.GO(0), local]), b.I(0)), None]


@register_gradient("Sqrt")
def get_sqrt_gradient(b):
    """dX = dY·0.5 / Y. ORT: Constant 0.5, Div(half, Y), Mul(dY, ·)."""
    half = b.constant(0.5, like=b.O(0))
    return [b.emit("Mul", [b.GO(0), b.emit("Div", [half, b.O(0)])], [b.GI(0)])]


@register_gradient("Exp")
def get_exp_gradient(b):
    """dX = dY·Y. ORT: Mul."""
    return [b.emit("Mul", [b.GO(0), b.O(0)], [b.GI(0)])]


@register_gradient("Log")
def get_log_gradient(b):
    """dX = dY / X. ORT: Div."""
    return [b.emit("Div", [b.GO(0), b.I(0)], [b.GI(0)])]


@register_gradient("Sin")
def get_sin_gradient(b):
    """dX = dY·cos(X). ORT: Cos, Mul."""
    return [b.emit("Mul", [b.GO(0), b.emit("Cos", [b.I(0)])], [b.GI(0)])]


@register_gradient("Cos")
def get_cos_gradient(b):
    """dX = -dY·sin(X). ORT: Sin, Sub (0 - sin), Mul."""
    return [b.emit("Neg", [b.emit("Mul", [b.GO(0), b.emit("Sin", [b.I(0)])])], [b.GI(0)])]


@register_gradient("Softsign")
def get_softsign_gradient(b):
    """Y = X / (1 + |X|), dX = dY / (1 + |X|)². ORT 1.19.2 has no Softsign builder; L0_06
    registers this one into ORT's C++ builder."""
    denominator = b.emit("Add", [b.emit("Abs", [b.I(0)]), b.constant(1.0, like=b.I(0))])
    return [b.emit("Div", [b.GO(0), b.emit("Mul", [denominator, denominator])], [b.GI(0)])]


@register_gradient("Relu")
def get_relu_gradient(b):
    """dX = dY·[Y > 0]. ORT: ReluGrad (com.microsoft)."""
    return [b.emit("ReluGrad", [b.GO(0), b.O(0)], [b.GI(0)], domain=MS)]


@register_gradient("Sigmoid")
def get_sigmoid_gradient(b):
    """dX = dY·Y·(1 - Y). ORT: SigmoidGrad (com.microsoft)."""
    return [b.emit("SigmoidGrad", [b.GO(0), b.O(0)], [b.GI(0)], domain=MS)]


@register_gradient("Tanh")
def get_tanh_gradient(b):
    """dX = dY·(1 - Y²). ORT: TanhGrad (com.microsoft)."""
    return [b.emit("TanhGrad", [b.GO(0), b.O(0)], [b.GI(0)], domain=MS)]


@register_gradient("Erf")
def get_erf_gradient(b):
    """dX = dY·2/√π·exp(-X²). ORT: Mul, Neg, Exp, Mul, Mul."""
    x = b.I(0)
    gauss = b.emit("Exp", [b.emit("Neg", [b.emit("Mul", [x, x])])])
    scaled = b.emit("Mul", [gauss, b.constant(2.0 / math.sqrt(math.pi), like=x)])
    return [b.emit("Mul", [b.GO(0), scaled], [b.GI(0)])]


@register_gradient("Gelu", domain=MS)
def get_gelu_gradient(b):
    """dX = dY·(Φ(X) + X·φ(X)). ORT: GeluGrad (com.microsoft)."""
    return [b.emit("GeluGrad", [b.GO(0), b.I(0)], [b.GI(0)], domain=MS)]


@register_gradient("Identity")
def get_identity_gradient(b):
    """dX = dY. ORT: Identity."""
    return [b.emit("Identity", [b.GO(0)], [b.GI(0)])]


@register_gradient("Cast")
def get_cast_gradient(b):
    """dX = Cast(dY) back to X's type. ORT: Cast."""
    return [b.emit("Cast", [b.GO(0)], [b.GI(0)], to=b.elem_type(b.I(0)))]


@register_gradient("Where")
def get_where_gradient(b):
    """dX = Where(C, dY, 0), dY' = Where(C, 0, dY), reduced over broadcast axes.
    ORT: the same Where nodes, but 1.19.2 does not reduce them over broadcast axes."""
    zero = b.constant(0.0, like=b.GO(0))
    dx = b.emit("Where", [b.I(0), b.GO(0), zero]) if b.needs(1) else None
    dy = b.emit("Where", [b.I(0), zero, b.GO(0)]) if b.needs(2) else None
    return [None] + _binary(b, [None, dx, dy])[1:]


@register_gradient("Dropout")
def get_dropout_gradient(b):
    """dX = dY·mask / (1 - ratio). ORT: DropoutGrad (com.microsoft) reading the mask output.
    Without a training_mode input Dropout is the identity, and so is its gradient."""
    if not b.I(2):
        return [b.GO(0), None, None]
    ratio = b.I(1) or b.constant(0.5, like=b.I(0))
    return [b.emit("DropoutGrad", [b.GO(0), b.O(1), ratio, b.I(2)], [b.GI(0)], domain=MS), None, None]

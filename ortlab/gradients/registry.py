"""The gradient registry: one builder function per (op type, domain), added by a decorator.

Mirrors orttraining/orttraining/core/graph/gradient_builder_registry.cc, where
REGISTER_GRADIENT_BUILDER("Add", GetAddSubGradient) files ORT's builders, and
the STOP_GRADIENT_EDGES table of gradient_graph_builder.h.
"""
from ortlab.errors import OrtlabError
from ortlab.onnx_defs import op_key, op_name
from ortlab.registry import Registry

# Inputs through which no gradient flows: shapes, indices, masks, axes, ratios...
STOP_GRADIENT_EDGES = {
    ("Not", ""): {0}, ("And", ""): {0, 1}, ("Or", ""): {0, 1}, ("Xor", ""): {0, 1},
    ("Equal", ""): {0, 1}, ("Less", ""): {0, 1}, ("LessOrEqual", ""): {0, 1},
    ("Greater", ""): {0, 1}, ("GreaterOrEqual", ""): {0, 1},
    ("IsInf", ""): {0}, ("IsNaN", ""): {0}, ("NonZero", ""): {0},
    ("BatchNormalization", ""): {3, 4}, ("Pow", ""): {1},
    ("Gather", ""): {1}, ("GatherElements", ""): {1}, ("GatherND", ""): {1},
    ("Shape", ""): {0}, ("Size", ""): {0}, ("Reshape", ""): {1}, ("Expand", ""): {1},
    ("Dropout", ""): {1, 2}, ("Slice", ""): {1, 2, 3, 4}, ("SoftmaxCrossEntropyLoss", ""): {1, 2},
    ("ConstantOfShape", ""): {0}, ("Scatter", ""): {1}, ("ScatterElements", ""): {1},
    ("ScatterND", ""): {1}, ("OneHot", ""): {0, 1, 2}, ("Range", ""): {0, 1, 2}, ("Where", ""): {0},
    ("Tile", ""): {1}, ("TopK", ""): {1}, ("Squeeze", ""): {1}, ("Unsqueeze", ""): {1},
    ("ReduceSum", ""): {1}, ("Split", ""): {1}, ("Clip", ""): {1, 2},
    ("BroadcastGradientArgs", "com.microsoft"): {0, 1},
}


class UnknownGradientError(OrtlabError):
    """No gradient builder is registered for an op on the path to the loss."""


def _missing_builder(registry, key, where):
    return (f"no gradient builder is registered for {op_name(*key)}{where}, which lies on the path from "
            f"an x to the loss. Register one with @ortlab.gradients.register_gradient('{key[0]}'), or "
            f"mark the edge with stop_gradient_edges. Registered: {', '.join(registry.known())}")


# (op_type, domain) -> builder function. The last builder registered for an op wins, as a notebook
# cell that redefines `@register_gradient("Sqrt")` expects; `using_gradient` swaps one temporarily.
GRADIENT_BUILDERS = Registry("gradient builder", duplicates="replace", error=UnknownGradientError,
                             miss=_missing_builder)


def register_gradient(op_type, domain=""):
    """Decorator: register `builder(b)` as the gradient of `op_type` (REGISTER_GRADIENT_BUILDER)."""
    if not isinstance(op_type, str) or not op_type:
        raise OrtlabError(f"register_gradient() takes the op type as a non-empty str, not {op_type!r}")

    def decorate(builder):
        if not callable(builder):
            raise OrtlabError(f"register_gradient('{op_type}') decorates a builder function `f(b)`, "
                              f"not {type(builder).__name__}")
        return GRADIENT_BUILDERS.register(op_key(op_type, domain), builder)
    return decorate


def get_gradient_builder(op_type, domain="", node=""):
    """The builder for an op, or UnknownGradientError listing what is registered."""
    return GRADIENT_BUILDERS.lookup(op_key(op_type, domain), where=f" (node {node})" if node else "")


def stop_edges(op_type, domain, extra=None):
    """Input indices of an op that never receive a gradient (ORT's table plus `extra`)."""
    edges = set(STOP_GRADIENT_EDGES.get(op_key(op_type, domain), ()))
    return edges | set((extra or {}).get(op_type, ()))


def using_gradient(op_type, builder, domain=""):
    """Use `builder` for `op_type` inside a `with` block, then restore what was registered
    (how a lab checks a learner's builder without replacing ortlab's own)."""
    return GRADIENT_BUILDERS.using(op_key(op_type, domain), builder)

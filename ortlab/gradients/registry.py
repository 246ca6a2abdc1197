"""The gradient registry: one builder function per (op type, domain), added by a decorator.

Mirrors orttraining/orttraining/core/graph/gradient_builder_registry.cc, where
REGISTER_GRADIENT_BUILDER("Add", GetAddSubGradient) files ORT's builders, and
the STOP_GRADIENT_EDGES table of gradient_graph_builder.h.
"""
from contextlib import contextmanager

from ortlab.errors import OrtlabError

GRADIENT_BUILDERS = {}  # (op_type, domain) -> builder function

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


def _domain(domain):
    return "" if domain in ("", "ai.onnx", None) else domain


def register_gradient(op_type, domain=""):
    """Decorator: register `builder(b)` as the gradient of `op_type` (REGISTER_GRADIENT_BUILDER)."""
    if not isinstance(op_type, str) or not op_type:
        raise OrtlabError(f"register_gradient() takes the op type as a non-empty str, not {op_type!r}")

    def decorate(builder):
        if not callable(builder):
            raise OrtlabError(f"register_gradient('{op_type}') decorates a builder function `f(b)`, "
                              f"not {type(builder).__name__}")
        GRADIENT_BUILDERS[(op_type, _domain(domain))] = builder
        return builder
    return decorate


def get_gradient_builder(op_type, domain="", node=""):
    """The builder for an op, or UnknownGradientError listing what is registered."""
    builder = GRADIENT_BUILDERS.get((op_type, _domain(domain)))
    if builder is None:
        known = ", ".join(sorted(f"{d + ':' if d else ''}{o}" for o, d in GRADIENT_BUILDERS))
        where = f" (node {node})" if node else ""
        raise UnknownGradientError(
            f"no gradient builder is registered for {_domain(domain) + ':' if _domain(domain) else ''}"
            f"{op_type}{where}, which lies on the path from an x to the loss. Register one with "
            f"@ortlab.gradients.register_gradient('{op_type}'), or mark the edge with "
            f"stop_gradient_edges. Registered: {known}")
    return builder


def stop_edges(op_type, domain, extra=None):
    """Input indices of an op that never receive a gradient (ORT's table plus `extra`)."""
    edges = set(STOP_GRADIENT_EDGES.get((op_type, _domain(domain)), ()))
    return edges | set((extra or {}).get(op_type, ()))


@contextmanager
def using_gradient(op_type, builder, domain=""):
    """Use `builder` for `op_type` inside a `with` block, then restore what was registered
    (how a lab checks a learner's builder without replacing ortlab's own)."""
    key = (op_type, _domain(domain))
    previous = GRADIENT_BUILDERS.get(key)
    GRADIENT_BUILDERS[key] = builder
    try:
        yield builder
    finally:
        if previous is None:
            GRADIENT_BUILDERS.pop(key, None)
        else:
            GRADIENT_BUILDERS[key] = previous

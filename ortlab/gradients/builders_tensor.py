"""Gradients of matrix, shape and reduction ops. Mirrors GetXxxGradient in
orttraining/orttraining/core/graph/gradient_builder.cc; each docstring names what ORT emits."""
import numpy as np

from ortlab.gradients.builder_base import MS, GradientBuilderError
from ortlab.gradients.registry import register_gradient


@register_gradient("MatMul")
def get_matmul_gradient(b):
    """dA = dY·Bᵀ, dB = Aᵀ·dY, each reduced over broadcast batch axes.
    ORT: Gemm for 2-D operands; FusedMatMul (com.microsoft) with transA/transB for higher ranks."""
    a, w, dy = b.I(0), b.I(1), b.GO(0)
    if b.rank(a) is None or b.rank(w) is None or min(b.rank(a), b.rank(w)) < 2:
        raise GradientBuilderError(f"MatMul {b.node.name!r}: ortlab differentiates MatMul of "
                                   "operands of known rank >= 2 only")
    two_d = b.rank(a) == 2 and b.rank(w) == 2
    op, domain = ("Gemm", "") if two_d else ("FusedMatMul", MS)
    da = b.emit(op, [dy, w], domain=domain, transB=1) if b.needs(0) else None
    db = b.emit(op, [a, dy], domain=domain, transA=1) if b.needs(1) else None
    return [None if da is None else b.handle_broadcasting(da, a, grad_shape=_full_shape(b, 0)),
            None if db is None else b.handle_broadcasting(db, w, grad_shape=_full_shape(b, 1))]


def _full_shape(b, i):
    """Shape of the unreduced gradient of input i: the output's batch dims and input i's
    matrix dims (None when unknown, which sends handle_broadcasting down its dynamic path)."""
    out, mine = b.shape(b.O(0)), b.shape(b.I(i))
    return None if out is None or mine is None else list(out[:-2]) + list(mine[-2:])


@register_gradient("Gemm")
def get_gemm_gradient(b):
    """Y = alpha·op(A)·op(B) + beta·C. ORT: Gemm per input with the trans flags of each case,
    alpha kept, beta 0; for C, dY reduced over broadcast axes and scaled by beta."""
    ta, tb = b.attr("transA", 0), b.attr("transB", 0)
    alpha, beta = b.attr("alpha", 1.0), b.attr("beta", 1.0)
    dy, a, w = b.GO(0), b.I(0), b.I(1)
    grads = [None, None, None]
    if b.needs(0):
        grads[0] = (b.emit("Gemm", [w, dy], alpha=alpha, transA=tb, transB=1) if ta
                    else b.emit("Gemm", [dy, w], alpha=alpha, transB=1 - tb))
    if b.needs(1):
        grads[1] = (b.emit("Gemm", [dy, a], alpha=alpha, transA=1, transB=ta) if tb
                    else b.emit("Gemm", [a, dy], alpha=alpha, transA=1 - ta))
    if len(b.node.inputs) > 2 and b.I(2) and b.needs(2):
        dc = b.handle_broadcasting(dy, b.I(2))
        grads[2] = dc if beta == 1.0 else b.emit("Mul", [dc, b.constant(beta, like=dy)])
    return grads


@register_gradient("Transpose")
def get_transpose_gradient(b):
    """dX = Transpose(dY, inverse perm). ORT: Transpose."""
    perm = b.attr("perm") or list(reversed(range(b.rank(b.I(0)))))
    return [b.emit("Transpose", [b.GO(0)], [b.GI(0)], perm=[int(i) for i in np.argsort(perm)])]


@register_gradient("Reshape")
def get_reshape_gradient(b):
    """dX = Reshape(dY, Shape(X)). ORT: the same."""
    return [b.emit("Reshape", [b.GO(0), b.emit("Shape", [b.I(0)])], [b.GI(0)]), None]


@register_gradient("Flatten")
def get_flatten_gradient(b):
    """dX = Reshape(dY, Shape(X)). ORT: the same (GetFlattenGradient)."""
    return [b.emit("Reshape", [b.GO(0), b.emit("Shape", [b.I(0)])], [b.GI(0)])]


@register_gradient("Squeeze")
def get_squeeze_gradient(b):
    """dX = Unsqueeze(dY, axes), or Reshape to X's shape without axes. ORT: Unsqueeze."""
    if b.I(1):
        return [b.emit("Unsqueeze", [b.GO(0), b.I(1)], [b.GI(0)]), None]
    return [b.emit("Reshape", [b.GO(0), b.emit("Shape", [b.I(0)])], [b.GI(0)]), None]


@register_gradient("Unsqueeze")
def get_unsqueeze_gradient(b):
    """dX = Squeeze(dY, axes). ORT: Squeeze."""
    return [b.emit("Squeeze", [b.GO(0), b.I(1)], [b.GI(0)]), None]


def _sizes_along(b, names, axis):
    """A 1-D int64 value: each input's size along `axis` (static when known)."""
    dims = [(b.shape(n) or [None] * (abs(axis) + 1))[axis] for n in names]
    if all(isinstance(d, int) for d in dims):
        return b.constant(np.array(dims, dtype=np.int64))
    index = b.constant(np.array([axis], dtype=np.int64))
    return b.emit("Concat", [b.emit("Gather", [b.emit("Shape", [n]), index]) for n in names], axis=0)


@register_gradient("Concat")
def get_concat_gradient(b):
    """Split dY along the axis into pieces sized like the inputs. ORT: Split."""
    names = [a.name for a in b.node.inputs]
    outputs = [b.GI(i) for i in range(len(names))]
    b.emit("Split", [b.GO(0), _sizes_along(b, names, b.attr("axis"))], outputs, axis=b.attr("axis"))
    return outputs


@register_gradient("Split")
def get_split_gradient(b):
    """Concat the outputs' gradients (zeros where none arrived). ORT: Concat."""
    parts = []
    for i in range(len(b.node.outputs)):
        go = b.GO(i)
        if go is None:
            zero = b.constant(np.zeros(1), like=b.I(0))
            go = b.emit("Expand", [zero, b.emit("Shape", [b.O(i)])])
        parts.append(go)
    return [b.emit("Concat", parts, [b.GI(0)], axis=b.attr("axis", 0)), None]


@register_gradient("Slice")
def get_slice_gradient(b):
    """Scatter dY back into zeros shaped like X. ORT: SliceGrad (com.microsoft)."""
    extra = [b.I(i) for i in range(3, len(b.node.inputs)) if b.I(i)]
    if len(extra) < len(b.node.inputs) - 3:
        raise GradientBuilderError(f"Slice {b.node.name!r}: steps without axes are not supported")
    inputs = [b.GO(0), b.emit("Shape", [b.I(0)]), b.I(1), b.I(2)] + extra
    return [b.emit("SliceGrad", inputs, [b.GI(0)], domain=MS), None, None, None, None]


@register_gradient("Gather")
def get_gather_gradient(b):
    """Scatter-add dY into zeros shaped like X at the gathered indices (repeats add up).
    ORT: Shape(X), GatherGrad (com.microsoft)."""
    shape = b.emit("Shape", [b.I(0)])
    return [b.emit("GatherGrad", [shape, b.I(1), b.GO(0)], [b.GI(0)], domain=MS,
                   axis=b.attr("axis", 0)), None]


def _reduce_axes(b):
    """The reduced axes (attribute before opset 18 for ReduceMean, input from 13 for ReduceSum)."""
    if len(b.node.inputs) > 1 and b.I(1):
        return b.I(1), None
    axes = b.attr("axes")
    if axes is None:  # all axes
        rank = b.rank(b.I(0))
        return None, None if rank is None else list(range(rank))
    return b.axes(axes), list(axes)


def _expand_back(b, grad):
    """Restore the reduced axes of `grad` (when keepdims=0), then Expand to X's shape."""
    axes, static = _reduce_axes(b)
    reduces_all = axes is None and (static is None or len(static) == (b.rank(b.I(0)) or 0))
    if not b.attr("keepdims", 1) and not reduces_all:  # a scalar gradient expands as it is
        grad = b.emit("Unsqueeze", [grad, axes or b.axes(static)])
    return b.emit("Expand", [grad, b.emit("Shape", [b.I(0)])])


@register_gradient("ReduceSum")
def get_reducesum_gradient(b):
    """dX = Expand(dY with the reduced axes restored, Shape(X)). ORT: Unsqueeze (keepdims=0),
    Shape, Expand."""
    if b.attr("noop_with_empty_axes", 0) and not (len(b.node.inputs) > 1 and b.I(1)):
        return [b.GO(0), None]
    return [_expand_back(b, b.GO(0)), None]


@register_gradient("ReduceMean")
def get_reducemean_gradient(b):
    """As ReduceSum, scaled by 1/N for the N elements averaged: a constant when the reduced
    dimensions are known, else Size(X) / Size(Y) at run time. ORT: the same idea (Scale)."""
    _, static = _reduce_axes(b)
    shape = b.shape(b.I(0))
    dims = [shape[a] for a in static] if static is not None and shape is not None else [None]
    dims = dims or [1]
    if all(isinstance(d, int) for d in dims):
        return [b.emit("Mul", [_expand_back(b, b.GO(0)), b.constant(1.0 / np.prod(dims), like=b.I(0))]), None]
    count = b.emit("Div", [b.emit("Size", [b.I(0)]), b.emit("Size", [b.O(0)])])
    scale = b.emit("Cast", [count], to=b.elem_type(b.I(0)))
    return [b.emit("Div", [_expand_back(b, b.GO(0)), scale]), None]


@register_gradient("GatherElements")
def get_gatherelements_gradient(b):
    """Scatter-add dY into zeros shaped like X at the gathered positions along the axis (repeats
    add up). ORT: Shape(X), GatherElementsGrad (com.microsoft)."""
    shape = b.emit("Shape", [b.I(0)])
    return [b.emit("GatherElementsGrad", [b.GO(0), shape, b.I(1)], [b.GI(0)], domain=MS,
                   axis=b.attr("axis", 0)), None]


@register_gradient("Expand")
def get_expand_gradient(b):
    """dX = dY summed over the axes Expand broadcast, reshaped to X's shape. ORT: Identity when
    nothing broadcasts, else HandleBroadcasting (ReduceSum, Shape, Reshape)."""
    reduced = b.handle_broadcasting(b.GO(0), b.I(0))
    return [b.emit("Identity", [reduced], [b.GI(0)]) if reduced == b.GO(0) else reduced, None]


@register_gradient("Tile")
def get_tile_gradient(b):
    """Y = Tile(X[M, N], [a, b]) holds a·b copies of X: view dY as [a, M, b, N] and sum over the
    repeat axes 0, 2, ... ORT: Shape, Unsqueeze, Concat (the [[a, M], [b, N]] pairs), Reshape,
    Reshape, ReduceSum(keepdims=0); the even axes are a constant when X's rank is known."""
    one = b.axes([1])
    pairs = b.emit("Concat", [b.emit("Unsqueeze", [b.I(1), one]),
                              b.emit("Unsqueeze", [b.emit("Shape", [b.I(0)]), one])], axis=1)
    dims = b.emit("Reshape", [pairs, b.axes([-1])])
    grad = b.emit("Reshape", [b.GO(0), dims])
    rank = b.rank(b.I(0))
    if rank is not None:
        return [b.emit("ReduceSum", [grad, b.axes(list(range(0, 2 * rank, 2)))], [b.GI(0)], keepdims=0), None]
    start, delta = b.constant(np.array(0, np.int64)), b.constant(np.array(2, np.int64))
    even = b.emit("Range", [start, b.emit("Size", [dims]), delta])
    return [b.emit("ReduceSum", [grad, even], [b.GI(0)], keepdims=0), None]

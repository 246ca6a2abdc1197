"""Elementwise CPU kernels where ORT 1.19.2 computes differently from onnx.reference, on special values
(NaN, -0.0, infinities, integer extremes, empty inputs) and in broadcasting and integer division: ORT's
behaviour wins. Each kernel names the ORT file it mirrors; the table of differences from the ONNX spec is
ortlab/engine/cpu_kernels_ordering.py's ORT_VS_SPEC.
"""
import functools

import numpy as np
from onnx.reference.ops import load_op

from ortlab.engine.cpu_execution_provider import ReferenceKernel, override_reference_op
from ortlab.engine.errors import KernelFailure
from ortlab.engine.kernel_registry import CPU, register_op_kernel
from ortlab.engine.cpu_kernels import is_custom_dtype
from ortlab.engine.cpu_kernels_ordering import rows_extreme


# --- Relu, Sqrt -------------------------------------------------------------------------------
@register_op_kernel("Relu", provider=CPU, may_inplace=((0, 0),))
class OrtRelu(ReferenceKernel):
    """Relu as ORT: x < 0 ? 0 : x (Eigen's cwiseMax(0) is std::max(x, 0)), so -0.0 and NaN pass
    through; onnx.reference gives 0.0 for -0.0. ORT: core/providers/cpu/activation/activations.h."""

    def compute(self, ctx):
        x = ctx.input(0)
        if x.dtype.kind not in "iuf" or is_custom_dtype(x.dtype):
            return super().compute(ctx)
        return np.where(x < 0, x.dtype.type(0), x)


def eigen_fast_sqrt_float32(x):
    """ORT's float32 Sqrt: Eigen's SSE psqrt on the 4-lane packets of the flat tensor (rsqrt and
    one Newton step: +0.0 below FLT_MIN and for -0.0, NaN for +inf and negatives), IEEE sqrt on the
    last n % 4 elements. Finite results are IEEE's here; ORT's may differ by 1 ulp (the CPU's
    rsqrt approximation decides). ORT: core/providers/cpu/math/element_wise_ops.cc (Sqrt)."""
    flat = np.ascontiguousarray(x).reshape(-1)
    with np.errstate(invalid="ignore"):
        y = np.sqrt(flat)
    packed = in_sse_packets(flat.shape, np.float32)
    tiny = (flat < np.finfo(np.float32).tiny) & ~(flat < 0)
    y[packed & tiny] = np.float32(0)
    y[packed & (flat == np.inf)] = np.float32(np.nan)
    return y.reshape(x.shape)


@register_op_kernel("Sqrt", provider=CPU)
class OrtSqrt(ReferenceKernel):
    """Sqrt as ORT: float32 through Eigen's fast packet sqrt (eigen_fast_sqrt_float32); other
    types keep the reference. ORT: core/providers/cpu/math/element_wise_ops.cc."""

    def compute(self, ctx):
        x = ctx.input(0)
        return eigen_fast_sqrt_float32(x) if x.dtype == np.float32 else super().compute(ctx)


# --- Ceil, Floor ------------------------------------------------------------------------------
def in_sse_packets(shape, dtype):
    """Mask of the elements Eigen computes in full 16-byte SSE packets over a flat tensor starting
    16-byte aligned (4 float32 / 2 float64 lanes): all but the last n % lanes, which run scalar."""
    n = int(np.prod(shape))
    lanes = 16 // np.dtype(dtype).itemsize
    return (np.arange(n) < n // lanes * lanes).reshape(shape)


class OrtRoundToZeroSign(ReferenceKernel):
    """A rounding whose zero results are +0.0 in ORT's SSE packets (Ceil(-0.5), Floor(-0.0): Eigen's
    SSE2 pceil/pfloor round through an integer conversion) and IEEE's -0.0 in the scalar tail;
    onnx.reference keeps -0.0 everywhere. ORT: core/providers/cpu/math/element_wise_ops.cc (Ceil, Floor)."""

    def compute(self, ctx):
        y = super().compute(ctx)[0]
        if y.dtype in (np.float32, np.float64):
            y = np.where((y == 0) & in_sse_packets(y.shape, y.dtype), y.dtype.type(0), y)
        return y


@register_op_kernel("Ceil", provider=CPU)
class OrtCeil(OrtRoundToZeroSign):
    """Ceil as ORT: a zero result is +0.0 (OrtRoundToZeroSign)."""


@register_op_kernel("Floor", provider=CPU)
class OrtFloor(OrtRoundToZeroSign):
    """Floor as ORT: a zero result is +0.0 (OrtRoundToZeroSign)."""


# --- PRelu ------------------------------------------------------------------------------------
@register_op_kernel("PRelu", provider=CPU)
class OrtPRelu(ReferenceKernel):
    """PRelu as ORT: max(x, 0) + slope * min(x, 0) (Eigen's cwiseMax/cwiseMin keep x when the
    comparison is false), so a NaN or infinite slope poisons positive x and zeros too (2 with slope
    NaN gives NaN, 0 with slope inf gives NaN); onnx.reference selects x or x * slope.
    ORT: core/providers/cpu/math/element_wise_ops.cc (PRelu)."""

    def compute(self, ctx):
        x, slope = ctx.input(0), ctx.input(1)
        if x.dtype.kind != "f" or is_custom_dtype(x.dtype):
            return super().compute(ctx)
        zero = x.dtype.type(0)
        with np.errstate(invalid="ignore"):
            return (np.where(zero > x, zero, x) + slope * np.where(zero < x, zero, x)).astype(x.dtype)


# --- OneHot -----------------------------------------------------------------------------------
@register_op_kernel("OneHot", provider=CPU)
class OrtOneHot(ReferenceKernel):
    """OneHot as ORT: the off and on values copied as they are (-0.0 stays -0.0), and an index
    outside [-depth, depth - 1] gives a row of off values; onnx.reference computes
    off * (1 - hot) + on * hot and wraps out-of-range indices. ORT: core/providers/cpu/tensor/onehot.cc."""

    def compute(self, ctx):
        indices, depth, values = ctx.input(0), ctx.input(1), ctx.input(2)
        if values.dtype.kind not in "biuf" or is_custom_dtype(values.dtype):
            return super().compute(ctx)
        depth = int(np.asarray(depth).reshape(-1)[0])
        axis = self.info.attribute("axis", -1)
        axis = axis + indices.ndim + 1 if axis < 0 else axis
        index = np.asarray(indices).astype(np.int64)
        index = np.where(index < 0, index + depth, index)
        positions = np.arange(depth).reshape((1,) * indices.ndim + (depth,))
        hot = np.moveaxis(index[..., None] == positions, -1, axis)
        return np.where(hot, values[1], values[0]).astype(values.dtype)


# --- Erf --------------------------------------------------------------------------------------
@register_op_kernel("Erf", provider=CPU)
class OrtErf(ReferenceKernel):
    """Erf as ORT for float32: MLAS clamps |x| before its polynomial, so NaN gives 1 with NaN's
    sign (erf(NaN) = +-1); an empty input gives an empty output (onnx.reference's np.vectorize
    refuses it). Finite values: the reference's math.erf, within a few ulp of MLAS's polynomial.
    ORT: core/providers/cpu/math/element_wise_ops.cc (Erf), core/mlas/lib/erf.cpp."""

    def compute(self, ctx):
        x = ctx.input(0)
        if x.size == 0:
            return x.copy()
        y = super().compute(ctx)[0]
        if x.dtype == np.float32:
            nan = np.isnan(x)
            y = np.where(nan, np.copysign(np.float32(1), x), y).astype(np.float32)
        return y


# --- Empty inputs -----------------------------------------------------------------------------
class OrtEmptyPassThrough(ReferenceKernel):
    """A shape-keeping op that ORT runs on an empty tensor, giving it back empty; onnx.reference
    fails on it (numpy reductions over a 0-length axis have no identity)."""

    def compute(self, ctx):
        x = ctx.input(0)
        return x.copy() if x is not None and x.size == 0 else super().compute(ctx)


for _op in ("Gelu", "Softmax", "LogSoftmax"):
    register_op_kernel(_op, provider=CPU)(type(f"Ort{_op}", (OrtEmptyPassThrough,), {
        "__doc__": f"{_op} as ORT on an empty input: an empty output (OrtEmptyPassThrough); the reference elsewhere.",
        "__module__": __name__}))


# --- Hardmax ----------------------------------------------------------------------------------
@register_op_kernel("Hardmax", provider=CPU)
class OrtHardmax(OrtEmptyPassThrough):
    """Hardmax (float32) as ORT: each row's max by Eigen's vectorized maxCoeff (NaN kept only where
    it enters first, see eigen_redux_extreme), then 1 at the first element equal to it: a row
    whose max is NaN is all zeros, and a later NaN is skipped. Opset >= 13 swaps `axis` with the
    last axis first; before, rows are the input coerced to 2D at `axis`. onnx.reference takes
    numpy's argmax (the first NaN). ORT: core/providers/cpu/math/hardmax.cc (math::RowwiseMax)."""

    def compute(self, ctx):
        x = ctx.input(0)
        if x.size == 0 or x.dtype != np.float32:
            return super().compute(ctx)
        axis = self.info.attribute("axis", -1 if self.info.node.since_version >= 13 else 1) % x.ndim
        swapped = self.info.node.since_version >= 13 and axis != x.ndim - 1
        work = np.ascontiguousarray(np.swapaxes(x, axis, -1)) if swapped else x
        width = work.shape[-1] if swapped or self.info.node.since_version >= 13 else int(np.prod(x.shape[axis:]))
        rows = work.reshape(-1, width)
        best = rows_extreme(rows, np.arange(rows.shape[0]) * width, True)
        equal = rows == best[:, None]
        y = np.zeros_like(rows)
        hit = equal.any(axis=1)
        y[np.flatnonzero(hit), equal.argmax(axis=1)[hit]] = 1
        y = y.reshape(work.shape)
        return np.swapaxes(y, axis, -1) if swapped else y


# --- QuantizeLinear ---------------------------------------------------------------------------
@register_op_kernel("QuantizeLinear", provider=CPU)
class OrtQuantizeLinear(ReferenceKernel):
    """QuantizeLinear to int8/uint8 with one scale, as ORT: x / scale clamped to the type's range
    minus the zero point, rounded half to even, plus the zero point; +-inf and huge values
    saturate, NaN gives the type's minimum (MLAS's max(NaN, min) keeps min). onnx.reference casts
    without clamping, so inf and 1e10 wrap. NaN -> minimum is what MLAS's AVX-512 and SSE vector
    code gives (the machines measured run AVX-512); MLAS's scalar SSE tail would give 0.
    ORT: core/providers/cpu/quantization/quantize_linear.cc, core/mlas/lib/quantize.cpp."""

    def compute(self, ctx):
        x, scale, zero = ctx.input(0), ctx.input(1), ctx.input(2)
        out_type = np.dtype(np.uint8) if zero is None else zero.dtype
        if (x.dtype != np.float32 or scale.size != 1 or out_type not in (np.int8, np.uint8)
                or self.info.attribute("block_size", 0) or self.info.attribute("output_dtype", 0)):
            return super().compute(ctx)
        info = np.iinfo(out_type)
        zp = np.float32(0) if zero is None else np.float32(zero.reshape(-1)[0])
        with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
            v = x / scale.astype(np.float32).reshape(())
        v = np.clip(np.where(np.isnan(v), np.float32(info.min) - zp, v), np.float32(info.min) - zp,
                    np.float32(info.max) - zp)
        return (np.rint(v) + zp).astype(out_type)


# --- ReduceMean -------------------------------------------------------------------------------
@register_op_kernel("ReduceMean", provider=CPU)
class OrtReduceMean(ReferenceKernel):
    """ReduceMean over an empty set is 0 in ORT (it sums, and a 0 count leaves the sum); numpy's
    mean gives NaN. ORT: core/providers/cpu/reduction/reduction_ops.cc (ReduceAggregatorMean,
    fill_for_empty_set)."""

    def compute(self, ctx):
        y = super().compute(ctx)[0]
        x = ctx.input(0)
        if x.size == 0 and y.dtype.kind == "f":
            y = np.zeros_like(y)
        return y


# --- Compress ---------------------------------------------------------------------------------
@register_op_kernel("Compress", provider=CPU)
class OrtCompress(ReferenceKernel):
    """Compress of an input with a 0-length axis: ORT gives the empty selection (the condition's
    extra entries are ignored, as for any shorter axis); numpy's take refuses.
    ORT: core/providers/cpu/tensor/compress.cc."""

    def compute(self, ctx):
        x, condition = ctx.input(0), ctx.input(1)
        axis = self.info.attribute("axis")
        if x.size != 0 or axis is None:
            return super().compute(ctx)
        axis = axis % x.ndim
        keep = np.flatnonzero(np.asarray(condition).reshape(-1)[:x.shape[axis]])
        return np.take(x, keep, axis=axis)


# --- DynamicQuantizeLinear --------------------------------------------------------------------
@register_op_kernel("DynamicQuantizeLinear", provider=CPU)
class OrtDynamicQuantizeLinear(ReferenceKernel):
    """DynamicQuantizeLinear of an empty tensor: ORT gives an empty y, scale 1.0, zero point 0
    (its min/max start at 0); numpy's max of nothing refuses.
    ORT: core/providers/cpu/quantization/dynamicquantizelinear.cc."""

    def compute(self, ctx):
        x = ctx.input(0)
        if x.size != 0:
            return super().compute(ctx)
        return np.zeros(x.shape, np.uint8), np.array(1.0, np.float32), np.array(0, np.uint8)


# --- Binary elementwise ops: broadcasting, integer division -----------------------------------
@functools.lru_cache(maxsize=4096)
def _broadcast_failure(op, a, b):
    """ORT's broadcast error for shapes a and b, naming the op and both shapes, or None when they
    broadcast (remembered: a session runs the same shapes again and again).
    ORT: core/providers/cpu/math/element_wise_ops.h (BroadcastIterator::Append)."""
    ra, rb = list(a)[::-1], list(b)[::-1]
    for i in range(max(len(ra), len(rb))):
        x, y = (ra[i] if i < len(ra) else 1), (rb[i] if i < len(rb) else 1)
        if x != y and x != 1 and y != 1:
            return (f"Attempting to broadcast an axis by a dimension other than 1. {x} by {y} ({op}: input A has "
                    f"shape {list(a)}, input B has shape {list(b)}; each axis, counted from the last, needs equal "
                    "sizes or a 1)")
    return None


def _integer_division_failure(op, a, b):
    """Why ORT's process dies on an integer Div/Mod, or None: a zero divisor, or the type's minimum
    divided by -1 (the quotient does not fit); C++ integer division traps (SIGFPE)."""
    if b.dtype.kind not in "iu":
        return None
    a, b = np.broadcast_arrays(a, b)
    zero = b == 0
    overflow = (a == np.iinfo(a.dtype).min) & (b == -1) if a.dtype.kind == "i" else np.zeros_like(zero)
    if not (zero.any() or overflow.any()):
        return None
    what = f"{int(zero.sum())} zero divisor(s)" if zero.any() else f"{np.iinfo(a.dtype).min} / -1 (overflow)"
    return (f"integer {op} of {a.dtype} with {what}. ORT 1.19.2's CPU kernel divides in C++, which traps: the "
            "process dies with SIGFPE (Floating point exception), no Python error; numpy would return garbage "
            "with a warning. Make the divisors nonzero (and not -1 against the type's minimum), or divide in float.")


class OrtBinaryElementwise(ReferenceKernel):
    """A two-input broadcasting op checked first as ORT checks it: shapes that do not broadcast
    get ORT's message with both shapes (onnx.reference's is 'Issues with types ndarray, ndarray');
    integer Div/Mod by zero, which kills ORT's process, is refused with what ORT does."""

    def compute(self, ctx):
        args = ctx.inputs()
        a, b = (args + [None, None])[:2]
        op = self.info.node.op_type
        if a is not None and b is not None:
            why = _broadcast_failure(op, np.shape(a), np.shape(b))
            if why is None and op in ("Div", "Mod"):
                why = _integer_division_failure(op, np.asarray(a), np.asarray(b))
            if why:
                raise KernelFailure(why)
        return self.run_op(*args)  # (ReferenceKernel.compute, with the inputs already read)


for _op in ("Add", "Sub", "Mul", "Div", "Mod", "Pow", "And", "Or", "Xor", "Equal", "Less", "Greater",
            "LessOrEqual", "GreaterOrEqual", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"):
    register_op_kernel(_op, provider=CPU)(type(f"Ort{_op}", (OrtBinaryElementwise,), {
        "__doc__": f"{_op} with ORT's broadcast check (OrtBinaryElementwise); computed by onnx.reference.",
        "__module__": __name__}))


# --- Softplus, CumSum -------------------------------------------------------------------------
@override_reference_op("Softplus", 1, 10 ** 6)
class OrtSoftplus(load_op("", "Softplus", 1)):
    """Softplus as ORT: x + log1p(exp(-x)) for x > 0, log1p(exp(x)) otherwise, so 100 gives 100 and -100 gives
    3.8e-44 in float32; onnx.reference's log(exp(x) + 1) overflows to inf (and gives 0 for the tail).
    ORT: core/providers/cpu/activation/activations.h (Softplus)."""

    def _run(self, X):  # noqa: N803 (ONNX's name)
        if X.dtype.kind != "f" or is_custom_dtype(X.dtype):
            return super()._run(X)
        with np.errstate(over="ignore"):
            y = np.where(X > 0, X + np.log1p(np.exp(-np.abs(X))), np.log1p(np.exp(np.minimum(X, 0))))
        return (y.astype(X.dtype),)


@override_reference_op("CumSum", 11, 10 ** 6)
class OrtCumSum(load_op("", "CumSum", 14)):
    """CumSum in the input's own type, as ORT; numpy's cumsum of int32 gives int64 (the platform integer), which
    the engine refused as a wrong output type. ORT: core/providers/cpu/math/cumsum.cc."""

    def _run(self, x, *axis, **attributes):
        return tuple(np.asarray(y).astype(x.dtype, copy=False) for y in super()._run(x, *axis, **attributes))

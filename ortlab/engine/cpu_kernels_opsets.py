"""CPU kernels for ops whose meaning changed between ONNX opsets, where onnx.reference reads an old node
with its newest rule (or cannot run it) and ORT 1.19.2 keeps each opset's rule: ORT's behaviour wins.
Found by running each such op at each of its versions in ORT and in the engine; the same sweep found
LpNormalization's L1 norm, LogSoftmax's far tail and Pad's negative pads, which are here too.

Each is an override of onnx.reference's op at the opsets it concerns (override_reference_op), so it
also holds inside If, Loop and Scan bodies, and a kernel registered for the op (OrtSoftmax, OrtResize,
OrtReduceMean...) runs it. Checked against ORT by tests/engine/test_engine_opset_semantics.py.
"""
import numpy as np
from onnx.defs import get_schema
from onnx.reference.op_run import OpRun
from onnx.reference.ops import load_op

from ortlab.engine.cpu_execution_provider import override_reference_op
from ortlab.engine.errors import KernelFailure

LAST = 10 ** 6


# --- Softmax, LogSoftmax ----------------------------------------------------------------------
def softmax_rows(rows, log):
    """Softmax (or LogSoftmax) of each row of a 2-D array, in its own float type, as ORT computes
    it: exp(x - max) / sum, and x - max - log(sum) for the log (finite where the softmax underflows).
    ORT: onnxruntime/core/providers/cpu/math/softmax_shared.cc (SoftmaxCPU)."""
    work = rows if rows.dtype in (np.float32, np.float64) else rows.astype(np.float32)
    shifted = work - work.max(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        total = np.exp(shifted).sum(axis=1, keepdims=True)
        y = shifted - np.log(total) if log else np.exp(shifted) / total
    return y.astype(rows.dtype)


def _checked_axis(op, axis, rank):
    if not -rank <= axis < rank:
        raise KernelFailure(f"{op}: axis {axis} is out of range for an input of rank {rank}; "
                            f"it must be in [{-rank}, {rank - 1}]")
    return axis % rank


class CoercedSoftmax(OpRun):
    """Softmax before opset 13: the input coerced to 2-D [prod(shape[:axis]), prod(shape[axis:])]
    (default axis 1), each row normalised, so axis=1 of a [2, 3, 4] input normalises 12 values at a
    time. onnx.reference applies the opset-13 rule (one axis) to every opset.
    ORT: onnxruntime/core/providers/cpu/math/softmax.cc (opset < 13: the 2-D view)."""

    op_schema = get_schema("Softmax", 11)
    log = False

    def _run(self, x, axis=1, **_):
        if x.size == 0:
            return (x.copy(),)
        axis = _checked_axis(type(self).__name__, axis, x.ndim)
        rows = x.reshape(int(np.prod(x.shape[:axis], dtype=np.int64)), -1)
        return (softmax_rows(rows, self.log).reshape(x.shape),)


class CoercedLogSoftmax(CoercedSoftmax):
    """LogSoftmax before opset 13: the 2-D view of CoercedSoftmax, x - max - log(sum(exp)).
    ORT: onnxruntime/core/providers/cpu/math/softmax.cc."""

    op_schema = get_schema("LogSoftmax", 11)
    log = True


class AxisLogSoftmax(OpRun):
    """LogSoftmax from opset 13 along one axis as ORT computes it: x - max - log(sum(exp(x - max))),
    finite for a far tail (-200 stays -200 in float32); onnx.reference takes log(softmax), -inf there.
    ORT: onnxruntime/core/providers/cpu/math/softmax.cc (opset 13: the axis moved last)."""

    op_schema = get_schema("LogSoftmax", 13)

    def _run(self, x, axis=-1, **_):
        if x.size == 0:
            return (x.copy(),)
        axis = _checked_axis("LogSoftmax", axis, x.ndim)
        moved = np.moveaxis(x, axis, -1)
        y = softmax_rows(moved.reshape(-1, moved.shape[-1]), True).reshape(moved.shape)
        return (np.moveaxis(y, -1, axis),)


override_reference_op("Softmax", 1, 12)(CoercedSoftmax)
override_reference_op("LogSoftmax", 1, 12)(CoercedLogSoftmax)
override_reference_op("LogSoftmax", 13, LAST)(AxisLogSoftmax)


# --- Reduce* with noop_with_empty_axes --------------------------------------------------------
def _noop_reduce(op, since):
    """onnx.reference's `op` (axes as an input from opset `since`) with ORT's noop_with_empty_axes=1:
    an empty axes tensor returns the input unchanged (ReduceSumSquare and ReduceL1 too: no square, no
    abs), where the reference reduces over every axis; no axes input at all fails in ORT (its kernel
    reduces nothing and then checks for one value), so it is refused here, saying so.
    ORT: onnxruntime/core/providers/cpu/reduction/reduction_ops.cc (CommonReduce1Loop, ValidateNoTransposeReduce)."""
    base = load_op("", op, since)

    def _run(self, data, axes=None, **attributes):
        if attributes.get("noop_with_empty_axes"):
            if axes is not None and np.size(axes) == 0:
                return (data.copy(),)
            if axes is None:
                raise KernelFailure(f"{op} with noop_with_empty_axes=1 and no axes input: ORT 1.19.2's kernel fails "
                                    "here ('Reduction on all axes, output size should be 1'). Give an empty axes "
                                    "input to keep the input as it is, or noop_with_empty_axes=0 to reduce over "
                                    "every axis")
        return base._run(self, data, axes, **attributes)

    return type(f"Noop{op}", (base,), {"_run": _run, "__doc__": _noop_reduce.__doc__, "__module__": __name__,
                                       "op_schema": get_schema(op, since)})


for _op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
            "ReduceLogSumExp", "ReduceSumSquare"):
    override_reference_op(_op, 18, LAST)(_noop_reduce(_op, 18))
override_reference_op("ReduceSum", 13, LAST)(_noop_reduce("ReduceSum", 13))


# --- LpNormalization --------------------------------------------------------------------------
class OrtLpNormalization(OpRun):
    """x / ||x||_p along `axis`, p 1 or 2: the L1 norm sums |x| (onnx.reference sums x, so a row with
    negatives divides by the wrong norm); a zero norm gives 0. Other p are refused, as by ORT.
    ORT: onnxruntime/core/providers/cpu/nn/lp_norm.cc."""

    op_schema = get_schema("LpNormalization", 1)

    def _run(self, x, axis=-1, p=2, **_):
        if p not in (1, 2):
            raise KernelFailure(f"LpNormalization: p={p}; ORT's kernel supports p = 1 or 2 only")
        axis = _checked_axis("LpNormalization", axis, x.ndim)
        norm = (np.abs(x).sum(axis=axis, keepdims=True) if p == 1
                else np.sqrt((x * x).sum(axis=axis, keepdims=True)))
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.where(norm != 0, x / np.where(norm != 0, norm, 1), 0)
        return (y.astype(x.dtype),)


override_reference_op("LpNormalization", 1, LAST)(OrtLpNormalization)


# --- BatchNormalization 7 to 13 ---------------------------------------------------------------
class InferenceBatchNormalization(OpRun):
    """BatchNormalization at opsets 7 to 13. One output: inference, scale * (x - mean) / sqrt(var + epsilon) +
    bias with the given statistics, per channel (spatial=1) or per element of x.shape[1:] (spatial=0, opsets 7
    and 8). More outputs: ORT's training mode (batch_norm_training), as ORT reads optional outputs before
    opset 14. onnx.reference's opset-9 kernel takes batch statistics whenever `momentum` is set (its schema
    gives it a default), and its opset-6 kernel, used at 7 and 8, reads the removed is_test attribute.
    ORT: onnxruntime/core/providers/cpu/nn/batch_norm.h (is_train_ from the output count before opset 14)."""

    def _run(self, x, scale, bias, mean, var, epsilon=1e-5, momentum=0.9, spatial=1, **_):
        outputs = sum(1 for o in self.onnx_node.output if o)
        if outputs > 1:
            if spatial == 0:
                raise KernelFailure("BatchNormalization with spatial=0 and training outputs (mean, var, ...) is "
                                    "not modelled by the engine; use spatial=1 or only the output Y")
            return batch_norm_training(x, scale, bias, mean, var, epsilon, momentum)[:outputs]
        if spatial == 0:
            stats = [np.expand_dims(v, 0) for v in (scale, bias, mean, var)]
        else:
            shape = (1, -1) + (1,) * (x.ndim - 2)
            stats = [v.reshape(shape) for v in (scale, bias, mean, var)]
        s, b, m, v = stats
        return ((s * (x - m) / np.sqrt(v + x.dtype.type(epsilon)) + b).astype(x.dtype),)


def batch_norm_training(x, scale, bias, mean, var, epsilon, momentum):
    """(Y, running mean, running var, saved mean, saved inverse std) of ORT's training-mode BatchNormalization:
    Y normalised with the batch's mean and (population) variance, running = momentum * given + (1 - momentum)
    * batch, and the fourth and fifth outputs the batch mean and 1 / sqrt(batch var + epsilon).
    ORT: onnxruntime/core/providers/cpu/nn/batch_norm.h (is_train_)."""
    axes = (0,) + tuple(range(2, x.ndim))
    shape = (1, -1) + (1,) * (x.ndim - 2)
    batch_mean, batch_var = x.mean(axis=axes), x.var(axis=axes)
    inv_std = (1 / np.sqrt(batch_var + x.dtype.type(epsilon))).astype(x.dtype)
    y = scale.reshape(shape) * (x - batch_mean.reshape(shape)) * inv_std.reshape(shape) + bias.reshape(shape)
    m = x.dtype.type(momentum)
    return (y.astype(x.dtype), (mean * m + batch_mean * (1 - m)).astype(x.dtype),
            (var * m + batch_var * (1 - m)).astype(x.dtype), batch_mean.astype(x.dtype), inv_std)


InferenceBatchNormalization.op_schema = get_schema("BatchNormalization", 7)
override_reference_op("BatchNormalization", 7, 8)(InferenceBatchNormalization)
override_reference_op("BatchNormalization", 9, 13)(type(
    "InferenceBatchNormalization9", (InferenceBatchNormalization,),
    {"op_schema": get_schema("BatchNormalization", 9), "__doc__": InferenceBatchNormalization.__doc__,
     "__module__": __name__}))


# --- Pad with negative pads -------------------------------------------------------------------
def _full_pads(pads, axes, rank):
    """Begin and end pads for every axis from pads over `axes` (all axes when None)."""
    axes = list(range(rank)) if axes is None else [int(a) % rank for a in np.asarray(axes).reshape(-1)]
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    if len(pads) != 2 * len(axes):
        raise KernelFailure(f"Pad: {len(pads)} pads for {len(axes)} axes; give 2 per axis (all begins, then all ends)")
    begin, end = [0] * rank, [0] * rank
    for i, a in enumerate(axes):
        begin[a], end[a] = pads[i], pads[len(axes) + i]
    return begin, end


def _cropping_pad(version):
    """onnx.reference's Pad (`base`) that also takes negative pads: ORT crops those sides of the input
    first, then pads the cropped input (constant, edge, reflect or wrap); the reference refuses them
    ("index can't contain negative values"). ORT: onnxruntime/core/providers/cpu/tensor/pad.cc (slices)."""
    base = load_op("", "Pad", version)

    def _run(self, data, pads, *rest, **attributes):
        constant_value, axes = (list(rest) + [None, None])[:2]
        begin, end = _full_pads(pads, axes, data.ndim)
        if min(begin + end, default=0) >= 0:
            return base._run(self, data, pads, *rest, **attributes)
        if any(-b - e > n for b, e, n in zip(begin, end, data.shape) if min(b, e) < 0):
            raise KernelFailure(f"Pad: the negative pads {list(begin) + list(end)} crop more than the input's "
                                f"shape {list(data.shape)} holds")
        crop = tuple(slice(max(0, -b), n - max(0, -e)) for b, e, n in zip(begin, end, data.shape))
        kept = [max(0, b) for b in begin] + [max(0, e) for e in end]
        return base._run(self, data[crop], np.array(kept, np.int64), constant_value, **attributes)

    return type(f"Cropping{base.__name__}", (base,), {"_run": _run, "__doc__": _cropping_pad.__doc__,
                                                      "__module__": __name__, "op_schema": get_schema("Pad", version)})


override_reference_op("Pad", 11, 17)(_cropping_pad(11))
override_reference_op("Pad", 18, 18)(_cropping_pad(18))
override_reference_op("Pad", 19, LAST)(_cropping_pad(19))


# --- Resize with an empty roi -----------------------------------------------------------------
def _empty_is_absent(base):
    """onnx.reference's Resize (`base`) reading an empty roi (or scales, sizes) as absent, as ORT does: models
    carry roi as an empty initializer, which the reference indexes and fails on.
    ORT: onnxruntime/core/providers/cpu/tensor/upsamplebase.h (roi used only by tf_crop_and_resize)."""

    def _run(self, X, roi=None, scales=None, sizes=None, **attributes):  # noqa: N803 (ONNX's name)
        roi, scales, sizes = (None if v is None or np.size(v) == 0 else v for v in (roi, scales, sizes))
        return base._run(self, X, roi, scales, sizes, **attributes)

    return type(f"EmptyRoi{base.__name__}", (base,), {"_run": _run, "__doc__": _empty_is_absent.__doc__,
                                                      "__module__": __name__})


override_reference_op("Resize", 11, LAST)(_empty_is_absent(load_op("", "Resize", 11)))


# --- Upsample (7, 9), Resize 10 ---------------------------------------------------------------
def _linear_ranks_ok(scales):
    """ORT's ScalesValidation for 'linear' before opset 11: 2-D, 3-D, 4-D with the two outermost (or the
    outermost and innermost) scales 1, 5-D with the two outermost scales 1."""
    n = len(scales)
    return (n in (2, 3) or (n == 4 and scales[0] == 1 and (scales[1] == 1 or scales[3] == 1))
            or (n == 5 and scales[0] == 1 and scales[1] == 1))


def _check_scales(op, x, scales, mode):
    if scales.size != x.ndim:
        raise KernelFailure(f"{op}: {scales.size} scales for an input of rank {x.ndim}; give one scale per axis "
                            "(ORT: 'the input tensor's dimension does not match the scales')")
    if (scales <= 0).any() or (op == "Upsample" and (scales < 1).any()):
        low = "1" if op == "Upsample" else "0 (exclusive)"
        raise KernelFailure(f"{op}: scales {scales.tolist()}; each must be at least {low}, as ORT requires")
    if mode == "linear" and not _linear_ranks_ok(scales.tolist()):
        raise KernelFailure(f"{op}: 'linear' mode on a rank-{x.ndim} input with scales {scales.tolist()}: ORT "
                            "takes 2-D or 3-D inputs, 4-D with the two outermost (or the outermost and innermost) "
                            "scales 1, 5-D with the two outermost scales 1")
    if mode not in ("nearest", "linear"):
        raise KernelFailure(f"{op}: mode {mode!r}; before opset 11 ORT takes 'nearest' or 'linear'")


def asymmetric_resize(x, scales, mode):
    """x resized as ORT's Upsample and Resize-10: output length int(scale * length); output index o reads
    the input at o / scale (the asymmetric transform, in float32), nearest taking its floor (its ceiling
    where the scale is below 1), linear interpolating between floor and floor + 1 clamped to the input.
    ORT: onnxruntime/core/providers/cpu/tensor/upsample.cc (UpsampleNearest, UpsampleBilinear)."""
    y = x.astype(np.float32) if mode == "linear" and x.dtype.kind != "f" else x
    for axis, scale in enumerate(scales):
        n_in = x.shape[axis]
        n_out = int(np.float32(scale) * np.float32(n_in))
        if scale == 1:
            continue
        where = np.arange(n_out, dtype=np.float32) / np.float32(scale)
        if mode == "nearest":
            index = (np.ceil(where) if scale < 1 else np.floor(where)).astype(np.int64)
            y = np.take(y, np.clip(index, 0, n_in - 1), axis=axis)
            continue
        where = np.clip(where, np.float32(0), np.float32(n_in - 1))
        low = np.minimum(where.astype(np.int64), n_in - 1)
        high = np.minimum(low + 1, n_in - 1)
        shape = [1] * y.ndim
        shape[axis] = n_out
        weight = (where - low.astype(np.float32)).reshape(shape).astype(y.dtype)
        y = np.take(y, low, axis=axis) * (1 - weight) + np.take(y, high, axis=axis) * weight
    return y.astype(x.dtype)


class AsymmetricUpsample(OpRun):
    """Upsample (opset 7: scales an attribute; 9: an input) as ORT computes it (asymmetric_resize);
    onnx.reference implements only integer nearest scales. ORT: onnxruntime/core/providers/cpu/tensor/upsample.cc."""

    op_schema = get_schema("Upsample", 9)
    op_name = "Upsample"

    def _run(self, x, scales=None, mode="nearest", **_):
        mode = mode.decode() if isinstance(mode, bytes) else mode
        scales = np.asarray(scales, dtype=np.float32).reshape(-1)
        _check_scales(self.op_name, x, scales, mode)
        return (asymmetric_resize(x, scales.tolist(), mode),)


override_reference_op("Upsample", 7, 8)(type("AsymmetricUpsample7", (AsymmetricUpsample,), {
    "op_schema": get_schema("Upsample", 7), "__doc__": AsymmetricUpsample.__doc__, "__module__": __name__}))
override_reference_op("Upsample", 9, 9)(AsymmetricUpsample)
override_reference_op("Resize", 10, 10)(type("AsymmetricResize10", (AsymmetricUpsample,), {
    "op_schema": get_schema("Resize", 10), "op_name": "Resize", "__module__": __name__,
    "__doc__": "Resize at opset 10: Upsample's rule (asymmetric_resize), scales below 1 allowed; onnx.reference "
               "reads it with the opset-11 signature and fails. ORT: onnxruntime/core/providers/cpu/tensor/resize.h."}))


# --- Unsqueeze --------------------------------------------------------------------------------
class OrderedUnsqueeze(OpRun):
    """Unsqueeze: `axes` name positions in the output (rank + len(axes)), in any order: [3, 0] on [2, 3, 4]
    gives [1, 2, 3, 1, 4]. onnx.reference inserts them one by one in the order given ([2, 3, 4] -> [2, 3, 4, 1]
    -> [1, 2, 3, 4, 1]), a silently wrong shape. Repeated or out-of-range axes are refused, as by ORT.
    ORT: onnxruntime/core/providers/cpu/tensor/unsqueeze.cc (PrepareCompute)."""

    op_schema = get_schema("Unsqueeze", 13)

    def _run(self, data, axes=None, **_):
        axes = [int(a) for a in np.asarray(axes).reshape(-1)]
        rank = np.ndim(data) + len(axes)
        if any(not -rank <= a < rank for a in axes) or len({a % rank for a in axes}) != len(axes):
            raise KernelFailure(f"Unsqueeze: axes {axes} for an output of rank {rank}: each must be in [{-rank}, "
                                f"{rank - 1}] and appear once (ORT refuses repeated or out-of-range axes)")
        shape = list(np.shape(data))
        for a in sorted(a % rank for a in axes):
            shape.insert(a, 1)
        return (np.reshape(data, shape),)


override_reference_op("Unsqueeze", 1, 12)(type("OrderedUnsqueeze1", (OrderedUnsqueeze,), {
    "op_schema": get_schema("Unsqueeze", 11), "__doc__": OrderedUnsqueeze.__doc__, "__module__": __name__}))
override_reference_op("Unsqueeze", 13, LAST)(OrderedUnsqueeze)


# --- RoiAlign 10, GridSample 16 ---------------------------------------------------------------
class RoiAlign10(load_op("", "RoiAlign", 16)):
    """RoiAlign at opsets 10 to 15: the ROI corners mapped with 'output_half_pixel' (no half-pixel shift), the
    only rule before opset 16 added coordinate_transformation_mode; onnx.reference applies opset 16's default
    'half_pixel'. ORT: onnxruntime/core/providers/cpu/object_detection/roialign.h (half_pixel_ from the opset)."""

    op_schema = get_schema("RoiAlign", 10)

    def _run(self, *args, **attributes):
        attributes["coordinate_transformation_mode"] = "output_half_pixel"
        return super()._run(*args, **attributes)


class GridSample16(load_op("", "GridSample", 20)):
    """GridSample at opsets 16 to 19, whose modes are named 'bilinear' and 'bicubic' (opset 20: 'linear',
    'cubic'); onnx.reference knows only the new names and refuses 'bicubic'.
    ORT: onnxruntime/core/providers/cpu/tensor/grid_sample.cc."""

    op_schema = get_schema("GridSample", 16)

    def _run(self, X, grid, mode=None, **attributes):  # noqa: N803 (ONNX's name)
        mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)
        return super()._run(X, grid, mode=mode, **attributes)


class DequantizeLinear10(load_op("", "DequantizeLinear", 19)):
    """DequantizeLinear at opsets 10 to 18: (x - zero point) * scale, per tensor or (from 13) per `axis`;
    onnx.reference implements only opsets 19 and 21, so the node found no kernel. Opset 19's rule is the
    same for these types. ORT: onnxruntime/core/providers/cpu/quantization/quantize_linear.cc."""

    op_schema = get_schema("DequantizeLinear", 13)


override_reference_op("RoiAlign", 10, 15)(RoiAlign10)
override_reference_op("GridSample", 16, 19)(GridSample16)
override_reference_op("DequantizeLinear", 10, 18)(DequantizeLinear10)


# --- LRN --------------------------------------------------------------------------------------
class OrtLRN(OpRun):
    """LRN: x / (bias + alpha / size * sum of x^2 over the channels c - (size-1)/2 .. c + (size-1)/2) ^ beta for
    every channel c; onnx.reference loops over the batch axis instead of the channels, so with one image only
    channel 0 is normalised (silently). ORT takes odd sizes only and 4-D input.
    ORT: onnxruntime/core/providers/cpu/nn/lrn.cc."""

    op_schema = get_schema("LRN", 13)

    def _run(self, x, alpha=1e-4, beta=0.75, bias=1.0, size=None, **_):
        if size % 2 != 1:
            raise KernelFailure(f"LRN: size {size}; ORT 1.19.2 takes odd sizes only ('size_ % 2 == 1 was false')")
        if x.ndim != 4:
            raise KernelFailure(f"LRN: input of rank {x.ndim}; ORT's kernel takes 4-D input [N, C, H, W]")
        squares = (x * x).astype(x.dtype)
        total = np.zeros_like(squares)
        half = (size - 1) // 2
        for c in range(x.shape[1]):
            total[:, c] = squares[:, max(0, c - half):c + half + 1].sum(axis=1)
        scale = x.dtype.type(bias) + x.dtype.type(alpha / size) * total
        return ((x * scale ** x.dtype.type(-beta)).astype(x.dtype),)


override_reference_op("LRN", 1, LAST)(OrtLRN)


# --- Sum, Max, Min, Mean at opsets 6 and 7 ----------------------------------------------------
def _same_shape_variadic(op):
    """onnx.reference's `op` at opsets 6 and 7, where every input must have one shape (broadcasting comes at
    opset 8): ORT refuses other shapes; the reference broadcasts them silently.
    ORT: onnxruntime/core/providers/cpu/math/element_wise_ops.cc (Sum_6, Max_6, Min_6, Mean_6)."""
    base = load_op("", op, 6)

    def _run(self, *data, **attributes):
        shapes = [list(np.shape(d)) for d in data]
        if any(s != shapes[0] for s in shapes):
            raise KernelFailure(f"{op} before opset 8 takes inputs of one shape, got {shapes}; ORT 1.19.2 refuses "
                                "them. Give every input the same shape, or import opset 8 or later to broadcast")
        return base._run(self, *data, **attributes)

    return type(f"SameShape{op}", (base,), {"_run": _run, "__doc__": _same_shape_variadic.__doc__,
                                            "__module__": __name__, "op_schema": get_schema(op, 6)})


for _op in ("Sum", "Max", "Min", "Mean"):
    override_reference_op(_op, 6, 7)(_same_shape_variadic(_op))


# --- Reshape before opset 5 -------------------------------------------------------------------
class AttributeReshape(OpRun):
    """Reshape-1: the target shape is the `shape` attribute (an input from opset 5 on); 0 copies the input's
    dimension, -1 is inferred. onnx.reference has no Reshape-1. ORT: onnxruntime/core/providers/cpu/tensor/
    reshape.h (Reshape_1), through ReshapeHelper."""

    op_schema = get_schema("Reshape", 1)

    def _run(self, x, shape=None, **_):
        if shape is None:
            raise KernelFailure("Reshape-1: the node has no 'shape' attribute; give the target shape there")
        wanted = [x.shape[i] if d == 0 and i < x.ndim else int(d) for i, d in enumerate(shape)]
        if wanted.count(-1) > 1 or any(d < -1 for d in wanted):
            raise KernelFailure(f"Reshape-1: shape {list(shape)} has more than one -1 or a dimension below -1")
        known = int(np.prod([d for d in wanted if d != -1], dtype=np.int64))
        if -1 in wanted:
            if known == 0 or x.size % known:
                raise KernelFailure(f"Reshape-1: the input's {x.size} elements cannot fill shape {list(shape)}")
            wanted[wanted.index(-1)] = x.size // known
        if int(np.prod(wanted, dtype=np.int64)) != x.size:
            raise KernelFailure(f"Reshape-1: the input has {x.size} elements, shape {list(shape)} needs "
                                f"{int(np.prod(wanted, dtype=np.int64))}")
        return (x.reshape(wanted),)


override_reference_op("Reshape", 1, 4)(AttributeReshape)

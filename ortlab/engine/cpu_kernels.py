"""CPU kernels where ORT 1.19.2 computes differently from onnx.reference: ORT's behaviour wins.

Found by tools/probe_reference_vs_ort.py (onnx's backend node test cases run through both);
checked by tests/engine/test_engine_backend_cases.py, which runs those cases in ORT and in the engine.
Each kernel names the difference and the ORT file it mirrors. Most subclass ReferenceKernel and
hand the cases where the two agree back to onnx.reference. Where ORT is wrong by the ONNX spec
(Float8 *FNUZ casts of tiny negatives), the kernel still does what ORT does, and says so.

Types numpy lacks (bfloat16, float8, int4): onnx.reference holds them in onnx's own structured
dtypes (onnx._custom_element_types); the kernels below produce those too.

Two concepts have modules of their own, named after what they hold: cpu_kernels_signal (DFT, STFT)
and cpu_kernels_pool (MaxPool).
"""
import numpy as np
from onnx import AttributeProto, TensorProto
from onnx import _custom_element_types as custom
from onnx.reference.op_run import OpRun
from onnx.reference.ops.op_cast import Cast_19 as ReferenceCast19
from onnx.reference.ops.op_constant import Constant_9 as ReferenceConstant9
from onnx.reference.ops.op_constant import Constant_11 as ReferenceConstant11
from onnx.reference.ops.op_constant import Constant_12 as ReferenceConstant12
from onnx.reference.ops.op_constant_of_shape import ConstantOfShape as ReferenceConstantOfShape
from onnx.reference.ops.op_dropout import Dropout_12 as ReferenceDropout12
from onnx.reference.ops.op_identity import Identity as ReferenceIdentity
from onnx.reference.ops.op_scatter_elements import scatter_elements

from ortlab.engine.cpu_execution_provider import ReferenceKernel, override_reference_op
from ortlab.engine.kernel_registry import CPU, register_op_kernel
from ortlab.engine.cpu_kernels_indices import check_scatter_elements
from ortlab.engine.errors import KernelFailure
from ortlab.engine.execution_frame import EMPTY_OPTIONAL
from ortlab.ir.tensor_value import to_array as tensor_to_array
from ortlab.ops.loss_shapes import softmax_cross_entropy_label_problem, softmax_cross_entropy_shape_problem
from ortlab.ops.reference import draw_seed, label_weights

FNUZ_TYPES = (TensorProto.FLOAT8E4M3FNUZ, TensorProto.FLOAT8E5M2FNUZ)


def is_custom_dtype(dtype):
    """True for onnx's structured stand-ins (bfloat16, float8, int4), which numpy cannot compute with."""
    return np.dtype(dtype).names is not None


# --- Cast, CastLike ---------------------------------------------------------------------------
def float_to_bfloat16(x):
    """bfloat16 of x rounded to nearest even (Eigen's bfloat16(float), which ORT's Cast uses);
    NaN becomes the quiet NaN 0x7FC0 (0xFFC0 when negative). Returns onnx's bfloat16 dtype."""
    f = np.ascontiguousarray(x, dtype=np.float32)
    bits = f.view(np.uint32)
    with np.errstate(over="ignore"):
        rounded = ((bits + np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1))) >> 16).astype(np.uint16)
    nan = np.isnan(f)
    rounded[nan] = np.where(np.signbit(f[nan]), 0xFFC0, 0x7FC0).astype(np.uint16)
    return rounded.view(custom.bfloat16)


def keep_fnuz_negative_underflow(x, reference):
    """ORT's float8 *FNUZ value of x, given onnx.reference's: where a negative nonzero x
    underflows, ORT keeps the sign bit and writes 0x80, which is NaN in the FNUZ types (-0.0 gives 0).

    An ORT bug by the spec (FNUZ has no negative zero: the value should be 0); mirrored.
    ORT: include/onnxruntime/core/framework/float8.h (Float8E4M3FNUZ(float), Float8E5M2FNUZ(float)).
    """
    f = np.asarray(x, dtype=np.float32)
    bits = np.ascontiguousarray(reference).view(np.uint8).copy()
    bits[np.signbit(f) & (f != 0) & ~np.isnan(f) & (bits == 0)] = 0x80
    return bits.view(reference.dtype)


def _float_text(value):
    if np.isnan(value):
        return "NaN"
    if np.isinf(value):
        return "-INF" if value < 0 else "INF"
    return "%.8g" % value


def cast_to_string(x):
    """ORT's strings: floats printed with '%.8g' ('NaN', 'INF', '-INF'), integers with
    std::to_string (bool: '1' / '0'). ORT: onnxruntime/core/providers/cpu/tensor/cast_op.cc (CastToString)."""
    out = np.empty(x.shape, dtype=object)
    flat = out.reshape(-1)
    values = x.reshape(-1)
    if x.dtype.kind == "f":
        flat[:] = [_float_text(float(v)) for v in values]
    else:
        flat[:] = [str(int(v)) for v in values]
    return out


def ort_cast(x, to, reference):
    """x cast to TensorProto type `to` as ORT's Cast computes it (see OrtCastBase); `reference()` gives
    onnx.reference's cast, kept where the two agree."""
    if is_custom_dtype(x.dtype) or x.dtype.kind not in "biuf":
        return reference()
    if to == TensorProto.BFLOAT16:
        return float_to_bfloat16(x)
    if to == TensorProto.STRING:
        return cast_to_string(x)
    if to in FNUZ_TYPES and x.dtype.kind == "f":
        return keep_fnuz_negative_underflow(x, reference())
    return reference()


class OrtCastBase(ReferenceKernel):
    """Cast as ORT computes it where onnx.reference differs, the reference elsewhere.

    ORT: onnxruntime/core/providers/cpu/tensor/cast_op.cc. Differences:
    - to bfloat16: ORT rounds to nearest even (Eigen); onnx.reference truncates;
    - to float8 e4m3fnuz / e5m2fnuz: a negative value that underflows gives 0x80 (NaN) in ORT, 0 in
      the reference: an ORT bug by the spec, mirrored (include/onnxruntime/core/framework/float8.h);
    - to string: ORT prints floats with '%.8g' ('0.60484552'), the reference with numpy's shortest repr.
    """

    def target(self, ctx):
        raise NotImplementedError

    def compute(self, ctx):
        x, to = ctx.input(0), self.target(ctx)
        return ort_cast(x, to, lambda: super(OrtCastBase, self).compute(ctx)[0])


@register_op_kernel("Cast", provider=CPU, may_inplace=((0, 0),))  # cast_op.cc declares MayInplace(0, 0)
class OrtCast(OrtCastBase):
    """Cast (ORT: cast_op.cc): see OrtCastBase for where ORT and onnx.reference differ."""

    def target(self, ctx):
        return self.info.attribute("to")


@register_op_kernel("CastLike", provider=CPU)
class OrtCastLike(OrtCastBase):
    """CastLike, where its input types are unknown: the target is input 1's type. ORT has no CastLike kernel: its
    partitioner inlines ONNX's function body (a Cast), as ortlab's does wherever the types are known."""

    def target(self, ctx):
        node = self.info.node
        return node.graph.node_arg(node.inputs[1].name).elem_type


@override_reference_op("Cast", 1, 10**6)
class SubgraphCast(ReferenceCast19):
    """onnx.reference's Cast computing ORT's Cast (ort_cast): the Cast inside an If, Loop or Scan body, which
    onnx.reference's evaluator runs (it truncated to bfloat16 there, silently, where ORT rounds to nearest even).
    One class for every opset: the override is named Cast, so onnx.reference gives it the newest schema's
    attributes (saturate, which only float8 targets, from opset 19, read).
    ORT: onnxruntime/core/providers/cpu/tensor/cast_op.cc, the same kernel in every graph."""

    def _run(self, x, to=None, saturate=None):
        return (ort_cast(x, to, lambda: super(SubgraphCast, self)._run(x, to=to, saturate=saturate)[0]),)


# --- Resize -----------------------------------------------------------------------------------
@register_op_kernel("Resize", provider=CPU)
class OrtResize(ReferenceKernel):
    """Resize; with coordinate_transformation_mode='align_corners' and scales, ORT maps output
    x to x * (in - 1) / (out - 1) with the integer output length out = int(in * scale); the
    reference uses the unrounded in * scale. Here the scales become those sizes (the reference then
    maps as ORT does); antialias keeps the reference's path.
    ORT: onnxruntime/core/providers/cpu/tensor/upsamplebase.h (ALIGN_CORNERS lambda, ComputeOutputShape).
    """

    def compute(self, ctx):
        if self.info.node.since_version < 11 or not self._align_corners_scales(ctx):
            return super().compute(ctx)
        x, roi, scales = ctx.input(0), ctx.input(1), ctx.input(2)
        axes = self.info.attribute("axes") or list(range(x.ndim))
        dims = np.array([x.shape[a] for a in axes], dtype=np.float32)
        sizes = (scales.astype(np.float32) * dims).astype(np.int64)
        return self.op.run(x, roi, None, sizes)

    def _align_corners_scales(self, ctx):
        attribute = self.info.attribute
        scales, sizes = ctx.input(2), ctx.input(3)
        return (attribute("coordinate_transformation_mode", "half_pixel") == "align_corners"
                and not attribute("antialias", 0) and scales is not None and scales.size > 0
                and (sizes is None or sizes.size == 0))


# --- Dropout, opsets 7 to 11 ------------------------------------------------------------------
class IdentityDropout(OpRun):
    """Dropout 7 to 11 in inference as ORT runs it: y = x and a mask of all False (0 in T before opset
    10, bool from 10); onnx.reference gives a mask of all True, as ORT does from opset 12. Those
    opsets leave the test-mode mask open (the Dropout-7/10 docs say only that Y copies X in test mode).
    ORT: onnxruntime/core/providers/cpu/tensor/identity_op.h (IdentityOp<true> zeroes the mask)."""

    mask_dtype = None  # None: the input's type T (opsets 7 to 9)

    def _run(self, data, *unused_inputs, **unused_attributes):  # ratio and the like: no effect in inference
        if len(self.onnx_node.output) < 2 or not self.onnx_node.output[1]:
            return (data.copy(),)
        return data.copy(), np.zeros(data.shape, self.mask_dtype or data.dtype)


override_reference_op("Dropout", 7, 9)(IdentityDropout)


@override_reference_op("Dropout", 10, 11)
class IdentityDropout10(IdentityDropout):
    """Dropout 10 and 11 in inference as ORT runs them: y = x, a bool mask of all False."""

    mask_dtype = np.bool_


# --- Dropout, opset 12 on: a seeded node's generator advances from run to run --------------------
@override_reference_op("Dropout", 12, 10**6)
class AdvancingDropout(ReferenceDropout12):
    """Dropout draws a new mask every run of the same session, as ORT's does: its kernel has one generator, and
    each run goes on drawing where the last one stopped. With a `seed` the generator starts from it (the same
    masks, in the same order, in every session; the first is onnx.reference's mask); without one it starts from
    a seed drawn from numpy's global generator (so ortlab.env.seed_everything makes it reproducible, as
    onnxruntime.set_seed does ORT's). onnx.reference makes a new generator at every call: from the seed, so it
    repeats the first mask forever, or from the OS's entropy. ORT: onnxruntime/core/providers/cpu/nn/
    dropout_op.h (generator_ made from the seed in the constructor, else PhiloxGenerator::Default())."""

    def _run(self, *inputs, seed=None):
        ratio = 0.5 if len(inputs) < 2 or inputs[1] is None else float(np.asarray(inputs[1]))
        training = len(inputs) > 2 and inputs[2] is not None and bool(np.asarray(inputs[2]))
        if not training or ratio == 0:
            return super()._run(*inputs, seed=seed)
        if getattr(self, "generator", None) is None:
            self.generator = np.random.RandomState(draw_seed(seed))
        x = inputs[0]
        mask = self.generator.uniform(0, 1.0, x.shape) >= ratio
        y = mask * x * (1.0 / (1.0 - ratio))
        return (y, mask) if len(self.onnx_node.output) > 1 and self.onnx_node.output[1] else (y,)


# --- SoftmaxCrossEntropyLoss ------------------------------------------------------------------
def eigen_sum(values, packet=4):
    """Eigen's vectorized sum of a float32 vector (ORT's math::Sum): two SSE accumulators of 4
    lanes over blocks of 8, then lanes (0+2) + (1+3), then the tail one by one."""
    v = np.ascontiguousarray(values, dtype=np.float32).reshape(-1)
    n = v.size
    aligned = n // packet * packet
    if aligned == 0:
        return np.cumsum(v, dtype=np.float32)[-1] if n else np.float32(0)
    acc = v[:packet].copy()
    if aligned > packet:
        blocks = n // (2 * packet) * 2 * packet
        pairs = v[:blocks].reshape(-1, 2, packet)
        acc0 = np.cumsum(pairs[:, 0], axis=0, dtype=np.float32)[-1]
        acc1 = np.cumsum(pairs[:, 1], axis=0, dtype=np.float32)[-1]
        acc = acc0 + acc1
        if aligned > blocks:
            acc = acc + v[blocks:blocks + packet]
    total = (acc[0] + acc[2]) + (acc[1] + acc[3])
    for value in v[aligned:]:
        total = total + value
    return np.float32(total)


def ort_softmax_cross_entropy(scores, labels, weights=None, reduction="mean", ignore_index=-1):
    """(loss, log_prob) of float32 scores (N, C, D...) as ORT's CPU kernel computes them: log_prob
    in float32, per-element losses -log_prob[label] * w[label] in float32, summed with Eigen's
    vectorized float32 sum, the mean over a float32 running sum of the weights (or the count)."""
    classes = scores.shape[1]
    rows = np.moveaxis(scores, 1, -1).reshape(-1, classes)
    shifted = rows - rows.max(axis=1, keepdims=True)
    log_prob = shifted - np.log(np.exp(shifted).sum(axis=1, keepdims=True, dtype=np.float32))
    flat = labels.reshape(-1)
    w, safe = label_weights(classes, flat, weights, ignore_index)
    w = w.astype(np.float32)
    losses = np.where(flat != ignore_index, -log_prob[np.arange(flat.size), safe] * w, np.float32(0))
    log_prob = np.moveaxis(log_prob.reshape(labels.shape + (classes,)), -1, 1)
    if reduction == "none":
        return losses.reshape(labels.shape).astype(np.float32), log_prob
    total = eigen_sum(losses)
    if reduction == "mean":
        kept = flat != ignore_index
        divisor = np.cumsum(w[kept], dtype=np.float32)[-1] if weights is not None and kept.any() \
            else np.float32(kept.sum())
        if divisor != 0:
            total = total / divisor
    return np.array(total, np.float32), log_prob


@register_op_kernel("SoftmaxCrossEntropyLoss", provider=CPU)
class OrtSoftmaxCrossEntropyLoss(ReferenceKernel):
    """SoftmaxCrossEntropyLoss in float32 as ORT computes it (the reference sums in float64: a
    relative difference of ~2e-5 on 6480 weighted losses). ORT registers float32 scores only;
    other types keep the reference. ignore_index defaults to -1 in ORT's kernel.
    ORT: orttraining/orttraining/training_ops/cpu/loss/softmax_cross_entropy_loss.cc (the CPU kernel
    of the ai.onnx op) and cross_entropy.cc (ComputeShareSoftmaxCrossEntropyCPU)."""

    def compute(self, ctx):
        scores, labels, weights, ignore = (ctx.input(i) for i in range(4))
        ignore_index = int(ignore) if ignore is not None else self.info.attribute("ignore_index", -1)
        problem = (softmax_cross_entropy_shape_problem(scores.shape, labels.shape,
                                                       None if weights is None else weights.shape)
                   or softmax_cross_entropy_label_problem(labels, scores.shape[1],
                                                          None if weights is None else weights.size, ignore_index))
        if problem:
            raise KernelFailure(problem)
        if scores.dtype != np.float32:
            return super().compute(ctx)
        loss, log_prob = ort_softmax_cross_entropy(scores, ctx.input(1), ctx.input(2),
                                                   self.info.attribute("reduction", "mean"), ignore_index)
        return loss, log_prob


# --- QLinearMatMul ----------------------------------------------------------------------------
@register_op_kernel("QLinearMatMul", provider=CPU)
def qlinear_matmul(ctx):
    """QLinearMatMul as ORT: int32 products of (a - a_zp)(b - b_zp), times the float32 scale
    a_scale * b_scale / y_scale, clamped to the output type's range, rounded half to even, plus
    y_zp. The reference casts rint(y) without clamping, so -236 wraps to 20 in int8.
    ORT: onnxruntime/core/providers/cpu/quantization/quantize_linear_matmul.cc (MlasRequantizeOutput)."""
    a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = (ctx.input(i) for i in range(8))
    a_zp = np.int32(0) if a_zp is None else a_zp.astype(np.int32)
    b_zp = np.int32(0) if b_zp is None else b_zp.astype(np.int32)
    acc = np.matmul(a.astype(np.int32) - a_zp, b.astype(np.int32) - b_zp)
    scale = (a_scale.astype(np.float32) * b_scale.astype(np.float32)) / y_scale.astype(np.float32)
    out_type = a.dtype if y_zp is None else y_zp.dtype
    zero = np.float32(0) if y_zp is None else y_zp.astype(np.float32)
    info = np.iinfo(out_type)
    y = np.clip(acc.astype(np.float32) * scale, np.float32(info.min) - zero, np.float32(info.max) - zero)
    return (np.rint(y) + zero).astype(out_type)


# --- MaxUnpool --------------------------------------------------------------------------------
@register_op_kernel("MaxUnpool", provider=CPU)
class OrtMaxUnpool(ReferenceKernel):
    """MaxUnpool with an output_shape input: ORT writes each value at its flat index in a zero
    tensor of output_shape; the reference places the indices in the inferred shape and pads.
    ORT: onnxruntime/core/providers/cpu/nn/Unpool.cc."""

    def compute(self, ctx):
        shape = ctx.input(2)
        if shape is None or shape.size == 0:
            return super().compute(ctx)
        x, indices = ctx.input(0), ctx.input(1)
        y = np.zeros(int(np.prod(shape)), dtype=x.dtype)
        y[indices.reshape(-1)] = x.reshape(-1)
        return y.reshape(tuple(int(d) for d in shape))


# --- Scatter ----------------------------------------------------------------------------------
@register_op_kernel("Scatter", provider=CPU)
def scatter(ctx):
    """Scatter (opset 9-10, deprecated): ScatterElements without reduction, its indices checked as ORT checks
    them; onnx.reference has no implementation of it. ORT: onnxruntime/core/providers/cpu/tensor/scatter.cc."""
    data, indices, updates = ctx.input(0), ctx.input(1), ctx.input(2)
    check_scatter_elements(data, indices, axis=ctx.attribute("axis", 0), op="Scatter")
    return scatter_elements(data, indices, updates, axis=ctx.attribute("axis", 0))


# --- Optional ---------------------------------------------------------------------------------
@register_op_kernel("Optional", provider=CPU)
def optional(ctx):
    """Optional(x) holds x itself; Optional() with only its `type` attribute is an empty optional, which
    OptionalHasElement reads as false. onnx.reference wraps x as the list [x] and an absent x as [None], so
    its OptionalHasElement says true for an empty optional. ORT: onnxruntime/core/providers/cpu/optional/
    optional_ops.cc (an input is copied into the output; without one the output is not allocated)."""
    x = ctx.input(0) if ctx.input_count else None
    return EMPTY_OPTIONAL if x is None else x


@override_reference_op("Identity", 16, 10**6)
class OptionalIdentity(ReferenceIdentity):
    """Identity of an empty optional is an empty optional (from opset 16 Identity takes optionals; ORT:
    onnxruntime/core/providers/cpu/tensor/identity_op.h, which passes the empty value on). onnx.reference's
    Identity cannot return nothing (its run() refuses any result but a tensor, list or map)."""

    def run(self, *args, **kwargs):
        return (EMPTY_OPTIONAL,) if args and args[0] is None else super().run(*args, **kwargs)


@override_reference_op("Optional", 15, 10**6)
class SubgraphOptional(OpRun):
    """Optional inside an If, Loop or Scan body (run by onnx.reference's evaluator): Optional(x) holds x, as
    ORT's does, where onnx.reference's holds [x], so the If returned a list. An empty optional cannot travel
    between onnx.reference's ops (an OpRun may not return None), so Optional() there is refused, loudly."""

    def _run(self, x=None, type=None):  # noqa: A002 (ONNX's attribute name)
        if x is None:
            raise KernelFailure("Optional() without an input (an empty optional) inside a subgraph is not modelled "
                                "by the engine (onnx.reference's evaluator runs the body); at the top level of the "
                                "graph it is")
        return (x,)


# --- Constant and ConstantOfShape: BFLOAT16 attributes -------------------------------------------
def _reads_bfloat16_attributes(reference_class):
    """`reference_class` (an onnx.reference OpRun) whose BFLOAT16 tensor attributes are read bit for bit: onnx's
    attribute conversion returns wrong values for a BFLOAT16 tensor in raw_data, silently (uninitialized memory,
    or the bits as uint16). ORT: onnxruntime/core/providers/cpu/generator/constant_of_shape_base.h and
    constant.cc (via the initializer it becomes) read the bits."""

    class ReadsBFloat16Attributes(reference_class):
        def __init__(self, onnx_node, run_params):
            super().__init__(onnx_node, run_params)
            for att in onnx_node.attribute:
                if att.type == AttributeProto.TENSOR and att.t.data_type == TensorProto.BFLOAT16:
                    setattr(self, att.name, tensor_to_array(att.t))
                    if att.name == "value" and hasattr(self, "cst"):  # each keeps its value twice
                        of_shape = isinstance(self, ReferenceConstantOfShape)  # a 1-element value: its 0-d
                        self.cst = self.value.reshape(()) if of_shape else self.value

    ReadsBFloat16Attributes.__doc__ = _reads_bfloat16_attributes.__doc__
    return ReadsBFloat16Attributes


override_reference_op("Constant", 1, 10)(_reads_bfloat16_attributes(ReferenceConstant9))
override_reference_op("Constant", 11, 11)(_reads_bfloat16_attributes(ReferenceConstant11))
override_reference_op("Constant", 12, 10**6)(_reads_bfloat16_attributes(ReferenceConstant12))
override_reference_op("ConstantOfShape", 9, 10**6)(_reads_bfloat16_attributes(ReferenceConstantOfShape))


# --- ConcatFromSequence -----------------------------------------------------------------------
@override_reference_op("ConcatFromSequence", 11, 10**6)
class OrtConcatFromSequence(OpRun):
    """y = concatenate(seq, axis), or with new_axis=1 stack(seq, axis): a new axis at position `axis` (the ONNX
    spec; onnx.reference stacks at the last axis whatever `axis` says, silently). ORT: onnxruntime/core/
    providers/cpu/sequence/concat_from_sequence.cc (an empty sequence is refused)."""

    def _run(self, seq, axis=None, new_axis=None):
        if not seq:
            raise KernelFailure("ConcatFromSequence: the input sequence is empty; there is nothing to concatenate")
        try:
            return ((np.stack if new_axis else np.concatenate)(seq, axis=axis),)
        except ValueError as exc:  # numpy AxisError is a ValueError
            raise KernelFailure(f"ConcatFromSequence(axis={axis}, new_axis={new_axis or 0}) of elements shaped "
                                f"{[s.shape for s in seq]}: {exc}") from None

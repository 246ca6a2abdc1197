"""Reference kernels (numpy, for onnx.reference) of the com.microsoft ops in ortlab's graphs.

They define what each op computes, so a graph with ORT's contrib and training ops runs in
onnx.reference (`reference_run`) and can be checked against ORT 1.19.2's CPU kernels: the ops the
fusions emit (Gelu, BiasGelu, FusedMatMul, FusedGemm, SkipLayerNormalization; BiasSoftmax and
BiasDropout, whose only kernels are in onnxruntime/contrib_ops/cuda/), and the ops of training graphs
(the gradient builders' *Grad ops, BroadcastGradientArgs, Scale, and ReduceSumTraining, which ORT's
optimizers write). ORT registers a few of its own ops under the ONNX domain
(SimplifiedLayerNormalization, MaxPoolGrad, AveragePoolGrad): their classes say op_domain = "".
The maths lives in ortlab.ops.reference, one numpy function per op (plain numpy: no torch
or Triton is loaded here), except the layer norms' and pool gradients', kept with their classes
below; each class names the ORT kernel file it mirrors.
Schemas (attribute defaults): onnxruntime/core/graph/contrib_ops/contrib_defs.cc, bert_defs.cc,
and orttraining/orttraining/core/graph/training_op_defs.cc; an attribute's default is the
keyword default of the class's `_run`.
"""
import numpy as np
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ortlab.errors import OrtlabError
from ortlab.onnx_defs import MS_DOMAIN
from ortlab.ops import reference as ref
from ortlab.ops.loss_shapes import softmax_cross_entropy_label_problem, softmax_cross_entropy_shape_problem
from ortlab.registry import Registry

# (op type, domain) -> OpRun class: what onnx.reference runs for ORT's own ops (com.microsoft, and the
# few ORT registers under the ONNX domain, which onnx.reference does not have).
CONTRIB_OPS = Registry("reference op", duplicates="replace")


class ContribOpError(OrtlabError):
    """A reference op refused its inputs or attributes, where ORT's CPU kernel refuses them too."""


def register_reference_op(cls):
    """Class decorator: onnx.reference runs this OpRun subclass for (its name, its op_domain)."""
    return CONTRIB_OPS.register((cls.__name__, cls.op_domain), cls)


class ContribOp(OpRun):
    """Base of the reference ops: com.microsoft, no ONNX schema (onnx.reference would otherwise take
    the attributes of an ONNX op of the same name, e.g. Gelu-20's 'approximate'), and an output
    the node leaves out ("") comes back as None, so that onnx.reference's table of values keeps
    None under "", which later nodes read as an omitted optional input."""

    op_domain = MS_DOMAIN
    op_schema = None

    def _check_and_fix_outputs(self, res):
        res = super()._check_and_fix_outputs(res)
        names = list(self.onnx_node.output)
        return tuple(None if i < len(names) and not names[i] else r for i, r in enumerate(res))

    def refuse(self, message):
        """Raise ContribOpError naming this node."""
        name = f" {self.onnx_node.name!r}" if self.onnx_node.name else ""
        raise ContribOpError(f"{self.op_type} node{name}: {message}")

    def axis_of(self, axis, rank):
        """axis in [-rank, rank) as a non-negative axis, or refuse."""
        if not -rank <= axis < max(rank, 1):
            self.refuse(f"axis={axis} is out of range for rank {rank}")
        return axis % max(rank, 1)


# -- Forward ops the fusions emit --------------------------------------------------------------
@register_reference_op
class Gelu(ContribOp):
    """x * Phi(x), the erf form. Mirrors onnxruntime/contrib_ops/cpu/activations.h (Gelu, float)."""

    def _run(self, x):
        return (ref.gelu_reference(x),)


@register_reference_op
class BiasGelu(ContribOp):
    """Gelu(X + B), B 1-D over X's last dimension. Mirrors onnxruntime/contrib_ops/cpu/bert/bias_gelu.cc."""

    def _run(self, x, bias):
        if bias.ndim != 1 or x.ndim < 1 or x.shape[-1] != bias.shape[0]:
            self.refuse(f"input 1 (bias) must be 1-D with X's last dimension, got {bias.shape} "
                        f"for X {x.shape}")
        return (ref.gelu_reference(x + bias),)


@register_reference_op
class FusedMatMul(ContribOp):
    """alpha * A' @ B' with transA/transB and transBatchA/transBatchB.
    Mirrors onnxruntime/contrib_ops/cpu/fused_matmul.cc."""

    def _run(self, a, b, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
        if (transBatchA or transBatchB) and not (a.ndim == b.ndim and a.ndim > 2):
            self.refuse(f"transBatchA/transBatchB need two inputs of the same rank >= 3, got {a.shape} "
                        f"and {b.shape}")
        return (ref.fused_matmul_reference(a, b, alpha, transA, transB, transBatchA, transBatchB),)


@register_reference_op
class FusedGemm(ContribOp):
    """activation(Gemm(A, B, C)); the activation and its activation_* parameters are required, as
    onnxruntime/contrib_ops/cpu/fused_gemm.cc requires them (no defaults)."""

    def _run(self, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0, activation=None,
             activation_alpha=None, activation_beta=None, activation_gamma=None):
        if activation not in ref.GEMM_ACTIVATIONS:
            self.refuse(f"activation={activation!r} is not one ORT's FusedGemm knows; use one of "
                        f"{', '.join(ref.GEMM_ACTIVATIONS)}")
        given = {"alpha": activation_alpha, "beta": activation_beta, "gamma": activation_gamma}
        names = ref.GEMM_ACTIVATIONS[activation][0]
        missing = [f"activation_{n}" for n in names if given[n] is None]
        if missing:
            self.refuse(f"activation {activation} needs the attribute(s) {', '.join(missing)}")
        params = {n: given[n] for n in names}
        return (ref.fused_gemm_reference(a, b, c, alpha, beta, transA, transB, activation, params),)


@register_reference_op
class BiasSoftmax(ContribOp):
    """softmax(x + bias) over the dimensions from `axis` on; numpy's broadcast of bias covers
    both of ORT's (is_inner_broadcast 0 and 1). Mirrors onnxruntime/contrib_ops/cuda/math/
    bias_softmax.cc (no CPU kernel)."""

    def _run(self, x, bias, axis=1, is_inner_broadcast=0):
        return (ref.bias_softmax_reference(x, bias, self.axis_of(axis, x.ndim)),)


@register_reference_op
class BiasDropout(ContribOp):
    """Dropout(x + bias) [+ residual]: deterministic when it cannot drop (inference mode or
    ratio 0); otherwise seeded by `seed`. Mirrors onnxruntime/contrib_ops/cuda/bert/
    bias_dropout.cc (no CPU kernel)."""

    def _run(self, x, bias, residual=None, ratio=None, training_mode=None, seed=0):
        ratio = 0.5 if ratio is None else float(ratio)
        training = training_mode is not None and bool(training_mode)
        y, keep = ref.dropout_reference(x + bias, ratio, training, seed)
        return ((y if residual is None else y + residual).astype(x.dtype), keep)


# -- Training ops ------------------------------------------------------------------------------
@register_reference_op
class BroadcastGradientArgs(ContribOp):
    """The axes A and B were broadcast along (int64, highest first; empty when none).
    Mirrors orttraining/orttraining/training_ops/cpu/nn/broadcast_grad_args.cc."""

    def _run(self, a_shape, b_shape):
        try:
            return ref.broadcast_gradient_args_reference(a_shape, b_shape)
        except ValueError as exc:
            self.refuse(str(exc))


@register_reference_op
class DivGrad(ContribOp):
    """(dA, dB) of A / B, each reduced to its input's shape. ORT has no kernel: the function body in
    orttraining/orttraining/core/graph/training_op_defs.cc (BroadcastGradientArgs,
    ReduceSumTraining) runs."""

    def _run(self, dy, a, b):
        return ref.div_grad_reference(dy, a, b)


@register_reference_op
class ReduceSumTraining(ContribOp):
    """ReduceSum with the axes as an input. Mirrors
    orttraining/orttraining/training_ops/cpu/reduction/reduction_ops.cc."""

    def _run(self, data, axes=None, keepdims=1, noop_with_empty_axes=0):
        axes = np.zeros(0, np.int64) if axes is None else axes
        bad = [int(a) for a in np.asarray(axes).reshape(-1) if not -data.ndim <= int(a) < max(data.ndim, 1)]
        if bad:
            self.refuse(f"axes {bad} are out of range for rank {data.ndim}")
        return (ref.reduce_sum_training_reference(data, axes, keepdims, noop_with_empty_axes),)


@register_reference_op
class Scale(ContribOp):
    """input * scale, or input / scale when scale_down. Mirrors
    orttraining/orttraining/training_ops/cpu/math/scale.cc."""

    def _run(self, x, scale, scale_down=0):
        if np.asarray(scale).size != 1 or float(np.asarray(scale).reshape(-1)[0]) == 0:
            self.refuse(f"input 1 (scale) must hold one non-zero value, got {np.asarray(scale)!r}")
        return (ref.scale_reference(x, scale, scale_down),)


# The element-wise gradients with no attribute: (op, what it computes from dY and one forward tensor,
# the reference that computes it, ORT's kernel under orttraining/orttraining/training_ops/cpu/).
ELEMENTWISE_GRADS = (
    ("ReluGrad", "dY where X > 0", ref.relu_grad_reference, "op_gradients.cc"),
    ("SigmoidGrad", "dY * Y * (1 - Y), Y the forward output", ref.sigmoid_grad_reference, "op_gradients.cc"),
    ("TanhGrad", "dY * (1 - Y^2), Y the forward output", ref.tanh_grad_reference, "op_gradients.cc"),
    ("GeluGrad", "dY * gelu'(X)", ref.gelu_grad_reference, "activation/activations_grad.cc"),
)


def elementwise_grad_op(name, maths, reference, kernel):
    """The reference op `name`: (dY, the forward tensor) -> reference(dY, that tensor)."""
    def _run(self, dy, forward):
        return (reference(dy, forward),)

    doc = f"{maths}. Mirrors orttraining/orttraining/training_ops/cpu/{kernel}."
    return type(name, (ContribOp,), {"__doc__": doc, "__module__": __name__, "_run": _run})


for _row in ELEMENTWISE_GRADS:
    register_reference_op(elementwise_grad_op(*_row))


@register_reference_op
class LeakyReluGrad(ContribOp):
    """dY where Y > 0, alpha * dY elsewhere (Y the forward output). Mirrors
    orttraining/orttraining/training_ops/cpu/activation/activations_grad.cc."""

    def _run(self, dy, y, alpha=0.01):
        return (np.where(y > 0, dy, dy * np.asarray(alpha, dy.dtype)).astype(dy.dtype),)


@register_reference_op
class SoftmaxGrad_13(ContribOp):  # noqa: N801 (ORT's op name)
    """Y * (dY - sum(dY * Y)) along one axis (opset-13 Softmax). Mirrors
    orttraining/orttraining/training_ops/cpu/op_gradients.cc."""

    def _run(self, dy, y, axis=-1):
        return (ref.softmax_grad_reference(dy, y, self.axis_of(axis, y.ndim)),)


@register_reference_op
class LogSoftmaxGrad_13(ContribOp):  # noqa: N801 (ORT's op name)
    """dY - exp(Y) * sum(dY) along one axis (opset-13 LogSoftmax). Mirrors
    orttraining/orttraining/training_ops/cpu/op_gradients.cc."""

    def _run(self, dy, y, axis=-1):
        return (ref.log_softmax_grad_reference(dy, y, self.axis_of(axis, y.ndim)),)


@register_reference_op
class DropoutGrad(ContribOp):
    """mask * dy / (1 - ratio), ratio 0.5 when not given; training_mode is read by nobody (ORT's
    CPU kernel scales by the mask whatever it says). Mirrors
    orttraining/orttraining/training_ops/cpu/nn/dropout_op.cc."""

    def _run(self, dy, mask, ratio=None, training_mode=None):
        ratio = 0.5 if ratio is None else float(np.asarray(ratio).reshape(-1)[0])
        if not 0 <= ratio < 1:
            self.refuse(f"ratio must be in [0, 1), got {ratio}")
        return (ref.dropout_grad_reference(dy, mask, ratio),)


@register_reference_op
class GatherGrad(ContribOp):
    """zeros(shape) with dY added at the gathered positions. Mirrors
    orttraining/orttraining/training_ops/cpu/tensor/gather_grad.cc."""

    def _run(self, shape, indices, dy, axis=0):
        return (ref.gather_grad_reference(shape, indices, dy, self.axis_of(axis, len(shape))),)


@register_reference_op
class GatherElementsGrad(ContribOp):
    """zeros(shape) with dY added where GatherElements took each element along `axis` (repeats
    add up; negative indices count from the end). Mirrors
    orttraining/orttraining/training_ops/cpu/tensor/gather_elements_grad.cc."""

    def _run(self, dy, shape, indices, axis=0):
        shape = [int(d) for d in np.asarray(shape).reshape(-1)]
        axis = self.axis_of(axis, len(shape))
        if indices.shape != dy.shape or indices.ndim != len(shape):
            self.refuse(f"indices {indices.shape} must have dY's shape {dy.shape} and X's rank {len(shape)}")
        index = indices.astype(np.int64)
        if np.any(index < -shape[axis]) or np.any(index >= shape[axis]):
            self.refuse(f"indices must lie in [-{shape[axis]}, {shape[axis]}) along axis {axis}")
        where = list(np.indices(index.shape, sparse=True))
        where[axis] = np.where(index < 0, index + shape[axis], index)
        dx = np.zeros(shape, dy.dtype)
        np.add.at(dx, tuple(where), dy)
        return (dx,)


@register_reference_op
class ConvGrad(ContribOp):
    """(dX, dW, dB) of Conv (any number of spatial dims, groups, strides, pads, dilations,
    auto_pad): for each kernel offset, dW += the strided window of padded X times dY, and dY times
    W is added back into that window of padded dX. Mirrors
    orttraining/orttraining/training_ops/cpu/nn/conv_grad.cc."""

    def _run(self, dy, x, w, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None,
             strides=None):
        spatial = x.ndim - 2
        if spatial < 1 or w.ndim != x.ndim or dy.ndim != x.ndim:
            self.refuse(f"dY {dy.shape}, X {x.shape} and W {w.shape} must share one rank >= 3")
        if x.shape[1] % group or w.shape[0] % group or w.shape[1] * group != x.shape[1]:
            self.refuse(f"group={group} does not split X's {x.shape[1]} channels and W {w.shape}")
        strides, dilations = list(strides or [1] * spatial), list(dilations or [1] * spatial)
        begin, end = conv_pads(auto_pad, pads, x.shape[2:], w.shape[2:], strides, dilations)
        xpad = np.pad(x, [(0, 0), (0, 0)] + list(zip(begin, end)))
        dxpad, dw = np.zeros_like(xpad), np.zeros_like(w)
        cg, mg = x.shape[1] // group, w.shape[0] // group
        summed = [0] + list(range(2, x.ndim))  # batch and space
        for offset in np.ndindex(*w.shape[2:]):
            window = tuple(slice(o * d, o * d + s * (n - 1) + 1, s)
                           for o, d, s, n in zip(offset, dilations, strides, dy.shape[2:]))
            for g in range(group):
                xs = (slice(None), slice(g * cg, (g + 1) * cg)) + window
                ws = (slice(g * mg, (g + 1) * mg), slice(None)) + offset
                dys = dy[:, g * mg:(g + 1) * mg]
                dw[ws] += np.tensordot(dys, xpad[xs], axes=(summed, summed))
                dxpad[xs] += np.moveaxis(np.tensordot(dys, w[ws], axes=([1], [0])), -1, 1)
        dx = dxpad[(slice(None), slice(None)) + tuple(slice(p, p + n) for p, n in zip(begin, x.shape[2:]))]
        db = dy.sum(axis=(0,) + tuple(range(2, dy.ndim))).astype(dy.dtype)
        return (dx, dw, db)[:len(self.onnx_node.output)]


def conv_pads(auto_pad, pads, in_dims, k_dims, strides, dilations):
    """(begin, end) pads per spatial dim: the attribute, or what SAME_UPPER/SAME_LOWER/VALID make
    (total = max(0, (ceil(in / stride) - 1)·stride + (k - 1)·dilation + 1 - in), the odd one at the
    end for SAME_UPPER, at the start for SAME_LOWER; onnx/defs/nn/defs.cc)."""
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    n = len(in_dims)
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        total = [max(0, (-(-i // s) - 1) * s + (k - 1) * d + 1 - i)
                 for i, k, s, d in zip(in_dims, k_dims, strides, dilations)]
        small = [t // 2 for t in total]
        big = [t - h for t, h in zip(total, small)]
        return (small, big) if auto_pad == "SAME_UPPER" else (big, small)
    if auto_pad == "VALID" or not pads:
        return [0] * n, [0] * n
    return list(pads[:n]), list(pads[n:])


@register_reference_op
class SliceGrad(ContribOp):
    """zeros(shape) with dY written where Slice took its elements. Mirrors
    orttraining/orttraining/training_ops/cpu/tensor/slice_grad.cc (which fails on negative steps in
    ORT 1.19.2; this does not)."""

    def _run(self, dy, shape, starts, ends, axes=None, steps=None):
        return (ref.slice_grad_reference(dy, shape, starts, ends, axes, steps),)


@register_reference_op
class LayerNormalizationGrad(ContribOp):
    """(dX, dScale, dBias) from the saved mean and inverse std (float32, as the forward saves them).
    Mirrors orttraining/orttraining/training_ops/cpu/nn/layer_norm.cc."""

    def _run(self, dy, x, scale, mean, inv_std_dev, axis=-1):
        axis = self.axis_of(axis, x.ndim)
        if int(np.prod(x.shape[axis:], dtype=np.int64)) == 1:
            self.refuse(f"normalizing over one element (X {x.shape}, axis {axis}) is refused by ORT too")
        return ref.layer_norm_grad_reference(dy, x, scale, mean, inv_std_dev, axis)


@register_reference_op
class SoftmaxCrossEntropyLossGrad(ContribOp):
    """d_logits of SoftmaxCrossEntropyLoss from its log_prob; ignore_index is -1 when the node sets
    none (the CPU kernel's default). Mirrors
    orttraining/orttraining/training_ops/cpu/loss/softmax_cross_entropy_loss.cc."""

    def _run(self, dy, log_prob, label, weight=None, reduction="mean", ignore_index=-1):
        if reduction not in ("mean", "sum", "none"):
            self.refuse(f"reduction must be 'mean', 'sum' or 'none', got {reduction!r}")
        weight_shape, name = None if weight is None else weight.shape, "input 2 'label'"
        problem = (softmax_cross_entropy_shape_problem(log_prob.shape, label.shape, weight_shape, name)
                   or softmax_cross_entropy_label_problem(label, log_prob.shape[1],
                                                          None if weight is None else weight.size, ignore_index, name))
        if problem:
            self.refuse(problem)
        return (ref.softmax_cross_entropy_grad_ort(dy, log_prob, label, weight, reduction, ignore_index),)


# -- Layer normalizations the fusions emit ------------------------------------------------------
def ort_row_norm(rows, gamma, beta, epsilon, simplified):
    """Per row r of `rows` (2-D, one row per normalized slice), as ORT's CPU kernel computes it in the
    rows' dtype T: s1 = sum r, s2 = sum r*r (accumulated left to right), mean = s1 / n,
    d = sqrt(s2 / n - mean*mean + eps) (simplified: sqrt(s2 / n + eps), mean unused), then
    y = (r - mean) / d * gamma [+ beta] (simplified: r / d * gamma). Returns (y, mean, d).
    Mirrors ComputeJob in onnxruntime/core/providers/cpu/nn/layer_norm_impl.cc and
    onnxruntime/contrib_ops/cpu/skip_layer_norm.cc (float and double; epsilon a float)."""
    t = rows.dtype.type
    n = t(rows.shape[1])
    s1 = np.cumsum(rows, axis=1, dtype=t)[:, -1:]  # sequential, as ORT's loop adds
    s2 = np.cumsum(rows * rows, axis=1, dtype=t)[:, -1:]
    mean = s1 / n
    eps = t(np.float32(epsilon))
    d = np.sqrt(s2 / n + eps) if simplified else np.sqrt(s2 / n - mean * mean + eps)
    y = rows / d * gamma if simplified else (rows - mean) / d * gamma
    if beta is not None and not simplified:
        y = y + beta
    return y.astype(t), mean, d


@register_reference_op
class SkipLayerNormalization(ContribOp):
    """LayerNorm(input + skip [+ bias]) over the last dimension, times gamma [plus beta]; skip is
    broadcast over the batch (ORT reads it modulo its size); output 3 is input + skip [+ bias].
    Outputs 1 and 2 (mean, inv_std_var; float32, the input's shape with a last 1) are the row
    statistics as LayerNormalization saves them. ORT 1.19.2's CPU kernel never writes them (no value
    comes back, a node reading one fails); ortlab's engine wants a value for every named output, and a
    LayerNormalization fused with its saved statistics keeps their names. Mirrors onnxruntime/contrib_ops/cpu/
    skip_layer_norm.cc and skip_layer_norm_helper.h (CheckInputs)."""

    def _run(self, x, skip, gamma, beta=None, bias=None, epsilon=1e-12):
        self.check_inputs(x, skip, gamma, beta, bias)
        hidden = x.shape[-1]
        rows, skip_rows = x.reshape(-1, hidden), skip.reshape(-1, hidden)
        total = rows + skip_rows[np.arange(rows.shape[0]) % skip_rows.shape[0]]
        if bias is not None:
            total = total + bias
        y, mean, d = ort_row_norm(total, gamma, beta, epsilon, simplified=False)
        stats = x.shape[:-1] + (1,)
        return (y.reshape(x.shape), mean.astype(np.float32).reshape(stats),
                (1 / d).astype(np.float32).reshape(stats), total.reshape(x.shape))[:len(self.onnx_node.output)]

    def check_inputs(self, x, skip, gamma, beta, bias):
        """ORT's CheckInputs: input and skip of rank 2 or 3 with the same last two dimensions (a 2-D
        input: skip of its shape, or of one row), gamma/beta/bias 1-D of the hidden size; float32."""
        if x.dtype != np.float32 or skip.dtype != x.dtype:
            self.refuse(f"ortlab runs float32 input and skip (ORT also float16), got {x.dtype} and {skip.dtype}")
        if x.ndim not in (2, 3) or skip.ndim not in (2, 3):
            self.refuse(f"input and skip are expected to have 2 or 3 dimensions, got {x.shape} and {skip.shape}")
        if x.ndim == 2 and skip.shape != x.shape and not (skip.ndim == 2 and skip.shape[0] == 1):
            self.refuse(f"skip {skip.shape} must have the 2-D input's shape {x.shape}")
        if skip.shape[-2:] != x.shape[-2:]:
            self.refuse(f"the last two dimensions of skip {skip.shape} must be the input's {x.shape}")
        for name, v in (("gamma", gamma), ("beta", beta), ("bias", bias)):
            if v is not None and (v.ndim != 1 or v.shape[0] != x.shape[-1]):
                self.refuse(f"{name} is expected to be 1-D of the hidden size {x.shape[-1]}, got {v.shape}")


@register_reference_op
class SimplifiedLayerNormalization(ContribOp):
    """RMSNorm: X / sqrt(mean(X^2 over the axes from `axis`) + epsilon) * scale; inv_std_var
    (float32, X's shape with ones from `axis` on) is 1 / that sqrt. ORT registers it under the ONNX
    domain. Mirrors onnxruntime/core/providers/cpu/nn/layer_norm_impl.cc (simplified) and
    layer_norm.cc's registrations (no double kernel that writes inv_std_var in ORT 1.19.2)."""

    op_domain = ""

    def _run(self, x, scale, axis=-1, epsilon=1e-5, stash_type=1):
        axis = self.axis_of(axis, x.ndim)
        names = list(self.onnx_node.output) + [""]
        if x.dtype not in (np.float32, np.float64) or scale.dtype != x.dtype:
            self.refuse(f"X and scale must be float32 or float64 alike, got {x.dtype} and {scale.dtype}")
        if x.dtype == np.float64 and names[1]:
            self.refuse("ORT 1.19.2 has no CPU kernel for double X with the inv_std_var output")
        size = int(np.prod(x.shape[axis:], dtype=np.int64))
        if scale.size != size:
            self.refuse(f"scale has {scale.size} elements; X {x.shape} normalizes {size} from axis {axis}")
        y, _, d = ort_row_norm(x.reshape(-1, size), scale.reshape(-1), None, epsilon, simplified=True)
        stats = x.shape[:axis] + (1,) * (x.ndim - axis)
        return (y.reshape(x.shape), (np.float32(1) / d.astype(np.float32)).reshape(stats))[:len(names) - 1]


# -- Pooling gradients: dX's shape comes from the graph ----------------------------------------
class OutputShapeOp(ContribOp):
    """A kernel that, as ORT's pool gradient kernels do, reads its outputs' static shapes from
    the node's output types (InferOutputShapes in orttraining/orttraining/training_ops/cpu/nn/
    pool_gradient_op.cc). Whoever knows the graph sets `output_shapes` (ortlab's CPU EP, and
    `reference_run`); a dim is an int, or a str/None where the graph has no value."""

    op_domain = ""
    reads_output_shapes = True
    output_shapes = None

    def static_output_shape(self, free=()):
        """Output 0's shape from the graph; dims in `free` may be symbolic (filled in by the caller)."""
        shape = (self.output_shapes or [None])[0]
        if shape is None or any(not isinstance(d, int) for i, d in enumerate(shape) if i not in free):
            self.refuse(f"needs the static shape of its output {self.onnx_node.output[0]!r} from the graph, got "
                        f"{shape}; ORT's kernel reads dX's shape there. Give the model's inputs fixed shapes")
        return list(shape)


@register_reference_op
class MaxPoolGrad(OutputShapeOp):
    """dX = zeros(X's shape), dY added at each flat index of Indices (MaxPool's second output);
    dX's batch dimension is dY's. Mirrors orttraining/orttraining/training_ops/cpu/nn/
    pool_gradient_op.cc (MaxPoolGrad, float)."""

    def _run(self, dy, indices, **attributes):
        shape = self.static_output_shape(free=(0,))
        shape[0] = dy.shape[0]
        if dy.shape != indices.shape:
            self.refuse(f"dY {dy.shape} and Indices {indices.shape} must have one shape")
        size = int(np.prod(shape, dtype=np.int64))
        flat = indices.reshape(-1).astype(np.int64)
        if flat.size and (flat.min() < 0 or flat.max() >= size):
            self.refuse(f"Indices must lie in [0, {size}) for dX {shape} (ORT would write out of bounds)")
        dx = np.zeros(size, dy.dtype)
        np.add.at(dx, flat, dy.reshape(-1))
        return (dx.reshape(shape),)


@register_reference_op
class AveragePoolGrad(OutputShapeOp):
    """dX: each output position's dY / count added over its window [o*stride - pad_begin, + kernel)
    clipped to X, count the kernel's size (count_include_pad) or the clipped window's. ORT's
    1-D and 2-D kernels add; its 3-D kernel assigns, so overlapping 3-D windows keep only the last
    (an ORT defect: this adds, the gradient). Mirrors orttraining/orttraining/training_ops/cpu/
    nn/pool_gradient_op.cc (AveragePoolGrad, float; dilations and ceil_mode are not read there)."""

    def _run(self, dy, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, kernel_shape=None, pads=None,
             strides=None, dilations=None):
        shape = self.static_output_shape()
        spatial = len(shape) - 2
        if spatial not in (1, 2, 3) or dy.ndim != len(shape) or dy.shape[:2] != tuple(shape[:2]):
            self.refuse(f"dY {dy.shape} and dX {shape} must be N, C and 1 to 3 spatial dims alike")
        if not kernel_shape or len(kernel_shape) != spatial:
            self.refuse(f"kernel_shape {kernel_shape} must give one size per spatial dim ({spatial})")
        strides = list(strides or [1] * spatial)
        begin = list(pads or [0] * 2 * spatial)[:spatial]
        dx = np.zeros(shape, dy.dtype)
        for o in np.ndindex(*dy.shape[2:]):
            lo = [max(i * s - p, 0) for i, s, p in zip(o, strides, begin)]
            hi = [min(i * s - p + k, n) for i, s, p, k, n in zip(o, strides, begin, kernel_shape, shape[2:])]
            count = int(np.prod(kernel_shape)) if count_include_pad else int(np.prod(np.subtract(hi, lo)))
            scale = np.asarray(1, dy.dtype) / np.asarray(count, dy.dtype)
            window = (slice(None), slice(None)) + tuple(slice(a, b) for a, b in zip(lo, hi))
            dx[window] += (dy[(slice(None), slice(None)) + o] * scale)[(...,) + (None,) * spatial]
        return (dx,)


def static_shapes(model):
    """{value name: dims} from the model's inputs, outputs and value_info (ints; str or None where
    symbolic or unknown)."""
    shapes = {}
    for v in list(model.graph.input) + list(model.graph.value_info) + list(model.graph.output):
        t = v.type.tensor_type
        if v.type.HasField("tensor_type") and t.HasField("shape"):
            shapes[v.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
    return shapes


def reference_run(model, feeds):
    """Run a model with onnx.reference, com.microsoft ops included; returns {output name: array}."""
    evaluator = ReferenceEvaluator(model, new_ops=list(CONTRIB_OPS.values()))
    shapes = static_shapes(model)
    for op in evaluator.rt_nodes_:
        if getattr(op, "reads_output_shapes", False):
            op.output_shapes = [shapes.get(name) for name in op.onnx_node.output]
    names = [o.name for o in model.graph.output]
    return dict(zip(names, evaluator.run(None, feeds)))

"""CPU kernels where ORT 1.19.2 computes differently from onnx.reference: ORT's behaviour wins.

Found by tools/probe_reference_vs_ort.py (onnx's backend node test cases run through both);
checked by tests/test_engine_backend_cases.py, which runs those cases in ORT and in the engine.
Each kernel names the difference and the ORT file it mirrors. Most subclass ReferenceKernel and
hand the cases where the two agree back to onnx.reference. Where ORT is wrong by the ONNX spec
(Float8 *FNUZ casts of tiny negatives), the kernel still does what ORT does, and says so.

Types numpy lacks (bfloat16, float8, int4): onnx.reference holds them in onnx's own structured
dtypes (onnx._custom_element_types); the kernels below produce those too.
"""
import numpy as np
from onnx import TensorProto
from onnx import _custom_element_types as custom
from onnx.reference.ops.op_loop import Loop as ReferenceLoop
from onnx.reference.ops.op_scatter_elements import scatter_elements

from ortlab.engine.cpu_execution_provider import ReferenceKernel
from ortlab.engine.errors import KernelFailure
from ortlab.engine.kernel_registry import CPU, register_op_kernel
from ortlab.ops.reference import label_weights

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
        if is_custom_dtype(x.dtype) or x.dtype.kind not in "biuf":
            return super().compute(ctx)
        if to == TensorProto.BFLOAT16:
            return float_to_bfloat16(x)
        if to == TensorProto.STRING:
            return cast_to_string(x)
        if to in FNUZ_TYPES and x.dtype.kind == "f":
            return keep_fnuz_negative_underflow(x, super().compute(ctx)[0])
        return super().compute(ctx)


@register_op_kernel("Cast", provider=CPU, may_inplace=((0, 0),))  # cast_op.cc declares MayInplace(0, 0)
class OrtCast(OrtCastBase):
    """Cast (ORT: cast_op.cc): see OrtCastBase for where ORT and onnx.reference differ."""

    def target(self, ctx):
        return self.info.attribute("to")


@register_op_kernel("CastLike", provider=CPU)
class OrtCastLike(OrtCastBase):
    """CastLike (ORT: cast_op.cc, through the same Cast kernel): the target is input 1's type."""

    def target(self, ctx):
        node = self.info.node
        return node.graph.node_arg(node.inputs[1].name).elem_type


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


# --- DFT, STFT --------------------------------------------------------------------------------
# ORT's dft.cc works on complex<T> in the signal's own type T: a radix-2 FFT for power-of-2
# lengths, Bluestein's chirp-z transform (three radix-2 FFTs of length M >= 2n - 1) otherwise.
# The functions below take (real, imag) arrays [..., n] and repeat its operations in its order,
# vectorized over the leading axes: std::complex products are (ac - bd, ad + bc), each rounded in T.
def _bit_reverse(num, bits):
    return int(format(num, f"0{bits}b")[::-1], 2) if bits else 0


def _cmul(a_re, a_im, b_re, b_im):
    """std::complex multiplication: (ac - bd, ad + bc), each product rounded in the type."""
    return a_re * b_re - a_im * b_im, a_re * b_im + a_im * b_re


def _cos_sin(angle, dtype):
    """cos and sin of a T angle: the double functions (cmath's ::cos), rounded to T."""
    return dtype.type(np.cos(np.float64(angle))), dtype.type(np.sin(np.float64(angle)))


def _twiddles(n_fft, inverse, dtype):
    """The bit-reversed Vandermonde row V of fft_radix2: V[rev(i)] = exp(i * (+-2 pi / n)), pi = M_PI in T."""
    t = dtype.type
    velocity = (t(1) if inverse else t(-1)) * (t(2) * t(np.pi)) / t(n_fft)
    bits = n_fft.bit_length() - 1
    v_re, v_im = np.zeros(n_fft, dtype), np.zeros(n_fft, dtype)
    for i in range(n_fft):
        v_re[_bit_reverse(i, bits)], v_im[_bit_reverse(i, bits)] = _cos_sin(t(i) * velocity, dtype)
    return v_re, v_im


def _fft_radix2(re, im, n_fft, twiddles, inverse=False, window=None):
    """ORT's fft_radix2 on [..., n] (zero beyond n): bit-reversed load times the window, butterflies
    with the given twiddles, / n_fft when `inverse` (ORT keeps the twiddles of the first call)."""
    dtype = re.dtype
    bits = n_fft.bit_length() - 1
    v_re, v_im = twiddles
    y_re = np.zeros(re.shape[:-1] + (n_fft,), dtype)
    y_im = np.zeros_like(y_re)
    for i in range(n_fft):
        k = _bit_reverse(i, bits)
        if k < re.shape[-1]:
            w = dtype.type(1) if window is None else window[k]
            y_re[..., i] = re[..., k] * w
            y_im[..., i] = 0 if im is None else im[..., k] * w
    size, current = 2, 0
    while size <= n_fft:
        mid, current = size >> 1, current + 1
        for k in range(mid):
            first, second = _bit_reverse(k, current), _bit_reverse(mid + k, current)
            even, odd = np.arange(k, n_fft, size), np.arange(k + mid, n_fft, size)
            e_re, e_im, o_re, o_im = y_re[..., even], y_im[..., even], y_re[..., odd], y_im[..., odd]
            f_re, f_im = _cmul(v_re[first], v_im[first], o_re, o_im)
            s_re, s_im = _cmul(v_re[second], v_im[second], o_re, o_im)
            y_re[..., even], y_im[..., even] = e_re + f_re, e_im + f_im
            y_re[..., odd], y_im[..., odd] = e_re + s_re, e_im + s_im
        size <<= 1
    if inverse:
        y_re, y_im = y_re / dtype.type(n_fft), y_im / dtype.type(n_fft)
    return y_re, y_im


def _chirp(n, m, inverse, dtype):
    """Bluestein's chirp exp(+-i pi k^2 / n) for k < n (zero beyond, length m) and b = conj(chirp),
    mirrored into b's tail."""
    t = dtype.type
    c_re, c_im = np.zeros(m, dtype), np.zeros(m, dtype)
    for k in range(n):
        c_re[k], c_im[k] = _cos_sin((t(1) if inverse else t(-1)) * t(np.pi) * t(k) * t(k) / t(n), dtype)
    b_re, b_im = c_re.copy(), -c_im
    for k in range(m - n + 1, m):
        b_re[k], b_im[k] = b_re[m - k], b_im[m - k]
    return (c_re, c_im), (b_re, b_im)


def _dft_bluestein(re, im, n_fft, out_size, inverse, window):
    """ORT's dft_bluestein_z_chirp: a = x * window * chirp; c = FFT(FFT(a) * FFT(b)) / m with the
    forward twiddles (ORT reuses them), read back reversed; out = c * chirp * (1/n or 1)."""
    dtype = re.dtype
    m = 1 << (2 * n_fft - 2).bit_length()
    (c_re, c_im), b = _chirp(n_fft, m, inverse, dtype)
    twiddles = _twiddles(m, False, dtype)
    b_re, b_im = _fft_radix2(b[0], b[1], m, twiddles)
    count = min(re.shape[-1], m)
    a_re = np.zeros(re.shape[:-1] + (m,), dtype)
    a_im = np.zeros_like(a_re)
    w = np.ones(count, dtype) if window is None else window[:count]
    a_re[..., :count] = re[..., :count] * w
    a_im[..., :count] = 0 if im is None else im[..., :count] * w
    a_re, a_im = _cmul(a_re, a_im, c_re, c_im)
    f_re, f_im = _fft_radix2(a_re, a_im, m, twiddles)
    p_re, p_im = _cmul(f_re, f_im, b_re, b_im)
    r_re, r_im = _fft_radix2(p_re, p_im, m, twiddles, inverse=True)
    index = np.array([0] + [m - i for i in range(1, out_size)])
    o_re, o_im = _cmul(r_re[..., index], r_im[..., index], c_re[:out_size], c_im[:out_size])
    scale = dtype.type(np.float32(1) / np.float32(n_fft)) if inverse else dtype.type(1)
    return o_re * scale, o_im * scale


def ort_dft(re, im, n_fft, out_size, inverse=False, window=None):
    """(real, imag) [..., out_size] of the DFT of re + i*im over the last axis, as ORT computes
    it in the signal's own type: radix-2 FFT when n_fft is a power of 2, else Bluestein."""
    if n_fft & (n_fft - 1):
        return _dft_bluestein(re, im, n_fft, out_size, inverse, window)
    y_re, y_im = _fft_radix2(re, im, n_fft, _twiddles(n_fft, inverse, re.dtype), inverse, window)
    return y_re[..., :out_size], y_im[..., :out_size]


def _split_signal(x):
    """(real, imag or None) of a signal [batch, ..., 1 or 2] or [batch, n] (real)."""
    if x.ndim == 2 or x.shape[-1] == 1:
        return (x if x.ndim == 2 else x[..., 0]), None
    return x[..., 0], x[..., 1]


@register_op_kernel("DFT", provider=CPU)
class OrtDFT(ReferenceKernel):
    """DFT in the signal's type (float32 for float32), as ORT does: radix-2 FFT for power-of-2
    lengths, else Bluestein's chirp-z transform; onnx.reference computes in float64 (numpy's FFT),
    which differs by ~1e-6 of max|y|, visible where the exact value is 0.
    ORT: onnxruntime/core/providers/cpu/signal/dft.cc (fft_radix2, dft_bluestein_z_chirp)."""

    def compute(self, ctx):
        x, length = ctx.input(0), ctx.input(1)
        attribute = self.info.attribute
        if self.info.node.since_version >= 20:
            axis = ctx.input(2)
            axis = -2 if axis is None else int(axis)
        else:
            axis = attribute("axis", 1)
        axis = axis % x.ndim
        n_fft = int(length) if length is not None and np.size(length) else x.shape[axis]
        onesided, inverse = bool(attribute("onesided", 0)), bool(attribute("inverse", 0))
        out_size = n_fft // 2 + 1 if onesided else n_fft
        re, im = _split_signal(x)
        re = np.moveaxis(re, axis, -1)
        im = None if im is None else np.moveaxis(im, axis, -1)
        out_re, out_im = ort_dft(re, im, n_fft, out_size, inverse)
        return np.moveaxis(np.stack([out_re, out_im], -1), -2, axis)


@register_op_kernel("STFT", provider=CPU)
class OrtSTFT(ReferenceKernel):
    """STFT: each frame's DFT in the signal's type, as ORT does (see OrtDFT); the reference
    computes in float64. ORT: onnxruntime/core/providers/cpu/signal/dft.cc (short_time_fourier_transform)."""

    def compute(self, ctx):
        signal, step, window, length = (ctx.input(i) for i in range(4))
        step = int(step)
        size = window.shape[0] if window is not None else int(length)
        frames = int(np.floor((signal.shape[1] - size) / np.float32(step))) + 1
        onesided = bool(self.info.attribute("onesided", 1))
        re, im = _split_signal(signal)
        starts = np.arange(frames) * step
        index = starts[:, None] + np.arange(size)[None, :]
        out_re, out_im = ort_dft(re[:, index], None if im is None else im[:, index], size,
                                 size // 2 + 1 if onesided else size, window=window)
        return np.stack([out_re, out_im], -1)


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
        scores = ctx.input(0)
        if scores.dtype != np.float32:
            return super().compute(ctx)
        ignore = ctx.input(3)
        ignore_index = int(ignore) if ignore is not None else self.info.attribute("ignore_index", -1)
        loss, log_prob = ort_softmax_cross_entropy(scores, ctx.input(1), ctx.input(2),
                                                   self.info.attribute("reduction", "mean"), ignore_index)
        return loss, log_prob


# --- Loop -------------------------------------------------------------------------------------
class StackingLoop(ReferenceLoop):
    """onnx.reference's Loop with ORT's scan outputs: per-iteration values stacked on a new first
    axis (the reference's np.vstack gives [N, 1] for scalars and [N*a, b] for [a, b]); a missing
    condition means true; zero iterations give empty outputs of the body's rank + 1 (loop.cc)."""

    def _run(self, M, cond, *args, context=None, body=None, attributes=None):  # noqa: N803 (ONNX's name)
        cond = np.array(True) if cond is None else cond
        state, stacked = self._iterate(M, cond, args, context, attributes)
        return tuple(state + stacked)

    def _iterate(self, M, cond, args, context, attributes):  # noqa: N803
        body = self.body
        names = body.input_names
        inputs = {name: None for name in names}
        inputs.update(dict(zip(names[2:], args)))
        inputs.update(context or {})
        scans = [[] for _ in range(self.K)]
        state = list(args)
        it = 0
        while bool(cond) and (M is None or it < M):
            inputs[names[0]] = np.array(it, dtype=np.int64 if M is None else M.dtype)
            inputs[names[1]] = cond
            outputs = self._run_body(inputs, attributes=attributes)
            for k in range(self.K):
                scans[k].append(outputs[1 + self.N + k])
            cond = outputs[0]
            state = list(outputs[1:1 + self.N])
            inputs.update(dict(zip(names[2:], state)))
            it += 1
        return state, [np.stack(s) if s else self._empty_scan(k) for k, s in enumerate(scans)]

    def _empty_scan(self, k):
        """ORT's output of a scan that ran zero times: [0] + the body output's dims (0 for a
        symbolic one), [0] when the body declares no shape (loop.cc, LoopImpl::Execute)."""
        from onnx import helper

        body = next(a.g for a in self.onnx_node.attribute if a.name == "body")
        t = body.output[1 + self.N + k].type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else 0 for d in t.shape.dim] \
            if t.HasField("shape") else []
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type) if t.elem_type else np.float32
        return np.zeros([0] + dims, dtype=dtype)


@register_op_kernel("Loop", provider=CPU)
class OrtLoop(ReferenceKernel):
    """Loop with ORT's scan outputs (see StackingLoop).
    ORT: onnxruntime/core/providers/cpu/controlflow/loop.cc."""

    def __init__(self, info):
        super().__init__(info, op_class=StackingLoop)


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
    """Scatter (opset 9-10, deprecated): ScatterElements without reduction; onnx.reference has no
    implementation of it. ORT: onnxruntime/core/providers/cpu/tensor/scatter.cc."""
    data, indices, updates = ctx.input(0), ctx.input(1), ctx.input(2)
    return scatter_elements(data, indices, updates, axis=ctx.attribute("axis", 0))


# --- MaxPool ----------------------------------------------------------------------------------
def ort_pool_output_size(size, kernel, stride, pads, dilation, ceil_mode):
    """ORT 1.19's pooled length: (in + pads - dilation*(k-1) - 1) / stride + 1 in float, floored
    or, with ceil_mode, ceiled; a last window starting past the input is kept (ONNX opset 22
    drops it). ORT: onnxruntime/core/providers/cpu/nn/pool_attributes.h (ComputeOutputSize)."""
    value = np.float32(size + pads - dilation * (kernel - 1) - 1) / np.float32(stride) + np.float32(1)
    return int(np.ceil(value) if ceil_mode else np.floor(value))


def ort_maxpool_with_indices(x, out_spatial, kernel, strides, pads, dilations, storage_order=0):
    """(Y, Indices) of MaxPool as ORT computes them with Indices: per output position, the first
    element of its window (kernel offsets in row-major order) strictly greater than all before it;
    its index is flat over X: (n * C + c) * plane + the in-plane index (row-major; column-major with
    storage_order=1). A window with nothing above the type's lowest value (all -inf, NaN or padding)
    keeps ORT's start values: that lowest value, and every coordinate -1. onnx.reference's indices
    differ where windows overlap. ORT: onnxruntime/core/providers/cpu/nn/pool_functors.h
    (MaxPool1DTask, MaxPool2DTask, MaxPool3DTask)."""
    spatial = x.shape[2:]
    planes = x.reshape(x.shape[0] * x.shape[1], -1)
    lowest = np.finfo(x.dtype).min if x.dtype.kind == "f" else np.iinfo(x.dtype).min  # ORT's start value
    best = np.full((planes.shape[0],) + tuple(out_spatial), lowest, dtype=np.float64)
    order = "F" if storage_order else "C"
    steps = [int(np.prod(spatial[:i] if storage_order else spatial[i + 1:], dtype=np.int64))
             for i in range(len(spatial))]
    no_winner = -sum(steps)
    index = np.full(best.shape, no_winner, np.int64)  # every coordinate -1, as ORT leaves it
    grids = np.meshgrid(*[np.arange(n) for n in out_spatial], indexing="ij")
    for offset in np.ndindex(*kernel):
        pos = [g * s - p + k * d for g, s, p, k, d in zip(grids, strides, pads, offset, dilations)]
        inside = np.logical_and.reduce([(q >= 0) & (q < n) for q, n in zip(pos, spatial)])
        clipped = [np.clip(q, 0, n - 1) for q, n in zip(pos, spatial)]
        values = np.where(inside, planes[:, np.ravel_multi_index(clipped, spatial)], -np.inf)
        better = values > best
        best = np.where(better, values, best)
        index = np.where(better, np.ravel_multi_index(clipped, spatial, order=order), index)
    plane = int(np.prod(spatial, dtype=np.int64))
    offsets = (np.arange(planes.shape[0], dtype=np.int64) * plane).reshape((-1,) + (1,) * len(spatial))
    shape = x.shape[:2] + tuple(out_spatial)
    return best.astype(x.dtype).reshape(shape), (index + offsets).reshape(shape)


def ort_pool_geometry(attribute, in_dims, kernel, strides, dilations):
    """(output sizes, pads before each spatial dim) as ORT's PoolAttributes computes them: auto_pad
    SAME_* pads (out - 1) * stride + kernel - in (dilation left out; the odd one at the end for
    SAME_UPPER), VALID none, NOTSET the pads attribute with ort_pool_output_size (ceil_mode).
    ORT: onnxruntime/core/providers/cpu/nn/pool_attributes.h (ComputeSizePadDilations)."""
    n, auto_pad = len(kernel), attribute("auto_pad", "NOTSET")
    auto_pad = auto_pad.decode() if isinstance(auto_pad, bytes) else auto_pad
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        sizes = [-(-i // s) for i, s in zip(in_dims, strides)]
        needed = [(o - 1) * s + k - i for i, o, k, s in zip(in_dims, sizes, kernel, strides)]
        return sizes, [int((t + 1) / 2) if auto_pad == "SAME_LOWER" else int(t / 2) for t in needed]  # C++ division
    if auto_pad == "VALID":
        sizes = [ort_pool_output_size(i, k, s, 0, d, False) for i, k, s, d in zip(in_dims, kernel, strides, dilations)]
        return sizes, [0] * n
    pads = list(attribute("pads") or [0] * 2 * n)
    ceil_mode = attribute("ceil_mode", 0)
    return [ort_pool_output_size(in_dims[i], kernel[i], strides[i], pads[i] + pads[i + n], dilations[i], ceil_mode)
            for i in range(n)], pads[:n]


@register_op_kernel("MaxPool", provider=CPU)
class OrtMaxPool(ReferenceKernel):
    """MaxPool with ceil_mode=1: ORT 1.19 keeps a last window that starts past the input (and
    fills such an empty window with the type's lowest value); onnx.reference drops it (the opset-22
    rule) and gives a smaller output than shape inference at opset <= 21 says. Computed here by
    extending the input's end with the lowest value until that window starts inside it, running
    the reference and keeping ORT's length. With the Indices output, ORT's output size, values and
    indices (ort_pool_geometry, ort_maxpool_with_indices).
    Not mirrored: ORT (MLAS) fills an empty window along an outer spatial axis from the input
    (a 2x2 input, kernel 1, stride 2 gives [[1, lowest], [3, lowest]]); here it is the lowest value.
    ORT: onnxruntime/core/providers/cpu/nn/pool_attributes.h, pool.cc."""

    def compute(self, ctx):
        attribute = self.info.attribute
        x = ctx.input(0)
        if ctx.output_count > 1 and x.ndim > 2 and x.size:
            kernel = attribute("kernel_shape")
            n = len(kernel)
            strides, dilations = attribute("strides") or [1] * n, attribute("dilations") or [1] * n
            sizes, pads = ort_pool_geometry(attribute, x.shape[2:], kernel, strides, dilations)
            return ort_maxpool_with_indices(x, sizes, kernel, strides, pads, dilations, attribute("storage_order", 0))
        if (not attribute("ceil_mode", 0) or attribute("auto_pad", "NOTSET") != "NOTSET"
                or ctx.output_count > 1 or x.dtype.kind not in "fiu"):
            return super().compute(ctx)
        kernel = attribute("kernel_shape")
        n = len(kernel)
        strides = attribute("strides") or [1] * n
        pads = attribute("pads") or [0] * (2 * n)
        dilations = attribute("dilations") or [1] * n
        spatial = x.shape[2:]
        sizes = [ort_pool_output_size(spatial[i], kernel[i], strides[i], pads[i] + pads[i + n],
                                      dilations[i], True) for i in range(n)]
        extra = [max(0, (sizes[i] - 1) * strides[i] - pads[i] - spatial[i] + 1) for i in range(n)]
        if not any(extra):
            return super().compute(ctx)
        lowest = np.finfo(x.dtype).min if x.dtype.kind == "f" else np.iinfo(x.dtype).min
        wide = np.pad(x, [(0, 0), (0, 0)] + [(0, e) for e in extra], constant_values=lowest)
        y = self.op.run(wide)[0]
        return y[(slice(None), slice(None)) + tuple(slice(0, s) for s in sizes)]


# --- ORT against the ONNX spec ----------------------------------------------------------------
# Where ORT 1.19.2's CPU kernels contradict the ONNX spec (or the spec leaves the result open and
# ORT's answer is not onnx.reference's), the kernels here still compute what ORT computes. One row
# per difference: (op, inputs, what the spec or onnx.reference says, what ORT does, ORT source file).
# tests/test_engine_special_values.py checks each kernel against ORT on such inputs.
ORT_VS_SPEC = [
    ("Cast", "to float8 e4m3fnuz / e5m2fnuz, a negative value that underflows",
     "0 (FNUZ has no negative zero)", "0x80, which is NaN in FNUZ", "include/onnxruntime/core/framework/float8.h"),
    ("TopK", "ties (equal values, 0.0 and -0.0 included)", "the lower index first (spec)",
     "the lower index first; onnx.reference's order among ties is numpy's", "core/providers/cpu/math/top_k.cc"),
    ("TopK", "NaN in the input", "not specified",
     "NaN compares false with everything: where it lands follows ORT's selection (a scan for k=1, a "
     "binary heap for small k, else std::nth_element and std::sort)", "core/providers/cpu/math/top_k.cc"),
    ("TopK", "sorted=0", "the order of the k values is not specified",
     "the heap's or std::nth_element's order, whichever path ORT takes", "core/providers/cpu/math/top_k.cc"),
    ("ArgMax, ArgMin", "NaN in the reduced row", "not specified (numpy: the first NaN)",
     "NaN never wins a comparison: the index of the max/min of the other values, 0 when the row starts "
     "with NaN", "core/providers/cpu/reduction/reduction_ops.h (ReduceAggregatorArgMax, ...LastIndex)"),
    ("ReduceMax, ReduceMin", "NaN in the reduced row", "not specified (numpy: NaN)",
     "Eigen's vectorized std::max/std::min: NaN kept only where it enters first (the first element, or "
     "first in a 4-lane packet when reducing the last axes); otherwise skipped",
     "core/providers/cpu/reduction/reduction_ops.h (ReduceAggregatorMax, FastReduceKR/RK)"),
    ("Relu", "-0.0", "max(0, x): 0.0 (onnx.reference gives 0.0)", "-0.0 (Eigen cwiseMax keeps x when x < 0 is false)",
     "core/providers/cpu/activation/activations.h (Relu)"),
    ("Sqrt", "float32 -0.0, +inf, denormals, in the 4-lane packets (all but the n % 4 last elements)",
     "IEEE sqrt: -0.0, +inf, the denormal's root",
     "Eigen's fast SSE sqrt (rsqrt and one Newton step): +0.0, NaN, 0.0; finite results within 1 ulp of "
     "IEEE (the hardware's rsqrt decides the last bit)", "core/providers/cpu/math/element_wise_ops.cc (Sqrt)"),
    ("Ceil, Floor", "float32/float64 results that are zero, in the SSE packets (all but the n % lanes last)",
     "IEEE: Ceil(-0.5) = -0.0, Floor(-0.0) = -0.0", "+0.0", "core/providers/cpu/math/element_wise_ops.cc"),
    ("PRelu", "NaN or infinite slope", "x where x >= 0", "max(x, 0) + slope * min(x, 0): NaN for x = 2 with slope NaN, "
     "and for x = 0 with slope inf", "core/providers/cpu/math/element_wise_ops.cc (PRelu)"),
    ("OneHot", "an index outside [-depth, depth - 1]; off value -0.0", "not specified (onnx.reference wraps); -0.0",
     "a row of off values; -0.0 kept", "core/providers/cpu/tensor/onehot.cc"),
    ("Erf", "float32 NaN", "NaN", "+1 or -1 (the NaN's sign): MLAS clamps |x| first", "core/mlas/lib/erf.cpp"),
    ("Hardmax", "NaN in a row", "not specified (onnx.reference: 1 at the first NaN)",
     "1 at the first element equal to Eigen's row max: a row whose max is NaN is all zeros",
     "core/providers/cpu/math/hardmax.cc"),
    ("QuantizeLinear", "NaN, +-inf, values past the type's range (int8/uint8)",
     "saturate to the range; NaN not specified",
     "saturates; NaN gives the type's minimum (MLAS AVX-512 / SSE vectors; the SSE scalar tail would "
     "give 0)",
     "core/mlas/lib/quantize.cpp"),
    ("ReduceMean", "an empty reduced set", "not specified (numpy: NaN)", "0",
     "core/providers/cpu/reduction/reduction_ops.h"),
    ("Div, Mod", "integers divided by 0, or the type's minimum by -1", "undefined",
     "the process dies with SIGFPE (the engine refuses with an OrtlabError)",
     "core/providers/cpu/math/element_wise_ops.cc"),
]


# --- TopK -------------------------------------------------------------------------------------
# ORT's TopK orders positions with a comparator on (value, index): `a > b or (a == b and i < j)`
# for the largest (`<` for the smallest). With NaN this is not an order (NaN compares false), so
# where NaN lands follows the algorithm: the functions below repeat ORT's three paths and the
# libstdc++ algorithms it calls, on a Python list of positions.
def _better(values, largest):
    """ORT's GreaterValueCmp / LesserValueCmp over positions into `values` (top_k.cc)."""
    if largest:
        return lambda i, j: values[i] > values[j] or (values[i] == values[j] and i < j)
    return lambda i, j: values[i] < values[j] or (values[i] == values[j] and i < j)


def _heapify(heap, i, k, cmp):
    """top_k.cc HeapifyIthPosition: push heap[i] down while a child beats it (the root is the worst)."""
    while True:
        left, right = 2 * i + 1, 2 * i + 2
        if right < k:
            i_beats_left = cmp(heap[i], heap[left])
            if i_beats_left and cmp(heap[right], heap[left]):
                heap[i], heap[left], i = heap[left], heap[i], left
            elif i_beats_left or cmp(heap[i], heap[right]):
                heap[i], heap[right], i = heap[right], heap[i], right
            else:
                return
        elif left < k and cmp(heap[i], heap[left]):
            heap[i], heap[left], i = heap[left], heap[i], left
        else:
            return


def _topk_heap(values, k, largest, sorted_):
    """top_k.cc's priority-queue path: a k-heap of the first k positions, then each later value
    that beats the root replaces it; popped worst-first into the back when sorted, else heap order."""
    cmp, n = _better(values, largest), len(values)
    heap = [0] * k
    for pos in range(k):
        heap[k - pos - 1] = pos
        _heapify(heap, k - pos - 1, k, cmp)
    strictly = (lambda a, b: a > b) if largest else (lambda a, b: a < b)
    for pos in range(k, n):
        if strictly(values[pos], values[heap[0]]):
            heap[0] = pos
            _heapify(heap, 0, k, cmp)
    if not sorted_:
        return heap
    out = [0] * k
    for taken in range(k):
        out[k - taken - 1] = heap[0]
        heap[0] = heap[k - taken - 1]
        _heapify(heap, 0, k - taken - 1, cmp)
    return out


def _median_to_first(a, result, x, y, z, cmp):
    """libstdc++ std::__move_median_to_first."""
    if cmp(a[x], a[y]):
        pick = y if cmp(a[y], a[z]) else z if cmp(a[x], a[z]) else x
    else:
        pick = x if cmp(a[x], a[z]) else z if cmp(a[y], a[z]) else y
    a[result], a[pick] = a[pick], a[result]


def _partition_pivot(a, first, last, cmp):
    """libstdc++ std::__unguarded_partition_pivot: median of three to `first`, then Hoare partition."""
    _median_to_first(a, first, first + 1, first + (last - first) // 2, last - 1, cmp)
    pivot, lo, hi = a[first], first + 1, last
    while True:
        while cmp(a[lo], pivot):
            lo += 1
        hi -= 1
        while cmp(pivot, a[hi]):
            hi -= 1
        if not lo < hi:
            return lo
        a[lo], a[hi] = a[hi], a[lo]
        lo += 1


def _linear_insert(a, last, cmp, first):
    """libstdc++ std::__unguarded_linear_insert (stopped at `first`, where C++ would read past it)."""
    value, prev = a[last], last - 1
    while prev >= first and cmp(value, a[prev]):
        a[last], last, prev = a[prev], prev, prev - 1
    a[last] = value


def _insertion_sort(a, first, last, cmp):
    """libstdc++ std::__insertion_sort."""
    for i in range(first + 1, last):
        if cmp(a[i], a[first]):
            a[first:i + 1] = [a[i]] + a[first:i]
        else:
            _linear_insert(a, i, cmp, first)


def _adjust_heap(a, first, hole, length, value, cmp):
    """libstdc++ std::__adjust_heap then std::__push_heap (a max-heap under cmp)."""
    top = child = hole
    while child < (length - 1) // 2:
        child = 2 * (child + 1)
        if cmp(a[first + child], a[first + child - 1]):
            child -= 1
        a[first + hole], hole = a[first + child], child
    if length % 2 == 0 and child == (length - 2) // 2:
        child = 2 * (child + 1)
        a[first + hole], hole = a[first + child - 1], child - 1
    parent = (hole - 1) // 2
    while hole > top and cmp(a[first + parent], value):
        a[first + hole], hole = a[first + parent], parent
        parent = (hole - 1) // 2
    a[first + hole] = value


def _pop_heap(a, first, last, result, cmp):
    value, a[result] = a[result], a[first]
    _adjust_heap(a, first, 0, last - first, value, cmp)


def _heap_select(a, first, middle, last, cmp):
    """libstdc++ std::__heap_select: make_heap on [first, middle), then every later element that
    beats the heap's top is popped in."""
    length = middle - first
    for parent in range((length - 2) // 2, -1, -1) if length >= 2 else ():
        _adjust_heap(a, first, parent, length, a[first + parent], cmp)
    for i in range(middle, last):
        if cmp(a[i], a[first]):
            _pop_heap(a, first, middle, i, cmp)


def nth_element(a, nth, cmp):
    """libstdc++ std::nth_element (introselect: median-of-3 partitions, heap select past a depth of
    2*log2(n), insertion sort below 4 elements)."""
    first, last = 0, len(a)
    if nth == last:
        return
    depth = 2 * (last.bit_length() - 1)
    while last - first > 3:
        if depth == 0:
            _heap_select(a, first, nth + 1, last, cmp)
            a[first], a[nth] = a[nth], a[first]
            return
        depth -= 1
        cut = _partition_pivot(a, first, last, cmp)
        first, last = (cut, last) if cut <= nth else (first, cut)
    _insertion_sort(a, first, last, cmp)


def _introsort(a, first, last, depth, cmp):
    while last - first > 16:
        if depth == 0:  # std::partial_sort(first, last, last): heap select, then sort_heap
            _heap_select(a, first, last, last, cmp)
            for end in range(last - 1, first, -1):
                _pop_heap(a, first, end, end, cmp)
            return
        depth -= 1
        cut = _partition_pivot(a, first, last, cmp)
        _introsort(a, cut, last, depth, cmp)
        last = cut


def std_sort(a, first, last, cmp):
    """libstdc++ std::sort: introsort down to 16-element runs, then insertion sort."""
    if last - first < 2:
        return
    _introsort(a, first, last, 2 * ((last - first).bit_length() - 1), cmp)
    if last - first > 16:
        _insertion_sort(a, first, first + 16, cmp)
        for i in range(first + 16, last):
            _linear_insert(a, i, cmp, first)
    else:
        _insertion_sort(a, first, last, cmp)


def topk_positions(values, k, largest=True, sorted_=True):
    """The positions ORT's TopK returns for one slice `values` (a list), in its output order.

    top_k.cc: k == 1 scans, keeping the first strictly better value; k < 4 or
    log2(k) / log2(n) < 0.725 keeps a binary heap; otherwise std::nth_element, then std::sort
    of the first k when sorted."""
    n = len(values)
    if k == 1:
        best, strictly = 0, (lambda a, b: a > b) if largest else (lambda a, b: a < b)
        for pos in range(1, n):
            if strictly(values[pos], values[best]):
                best = pos
        return [best]
    if k < 4 or np.log2(k) / np.log2(n) < 0.725:
        return _topk_heap(values, k, largest, sorted_)
    cmp, order = _better(values, largest), list(range(n))
    nth_element(order, k - 1, cmp)
    if sorted_:
        std_sort(order, 0, k, cmp)
    return order[:k]


def ort_topk(x, k, axis=-1, largest=True, sorted_=True):
    """(values, int64 indices) of ORT's TopK: ties give the lower index first; NaN and sorted=0
    follow ORT's selection path (topk_positions). Without NaN and sorted, a stable sort gives the
    same result, computed vectorized."""
    axis = axis % x.ndim
    moved = np.moveaxis(x, axis, -1)
    if k == 0 or moved.size == 0:
        shape = moved.shape[:-1] + (k,)
        return np.moveaxis(np.empty(shape, x.dtype), -1, axis), np.moveaxis(np.empty(shape, np.int64), -1, axis)
    has_nan = x.dtype.kind == "f" and np.isnan(x).any()
    if sorted_ and not has_nan:
        if largest:  # stable descending: reverse, stable ascending, reverse back
            order = moved.shape[-1] - 1 - np.argsort(moved[..., ::-1], axis=-1, kind="stable")[..., ::-1]
        else:
            order = np.argsort(moved, axis=-1, kind="stable")
        index = order[..., :k].astype(np.int64)
    else:
        rows = moved.reshape(-1, moved.shape[-1])
        index = np.array([topk_positions(row.tolist(), k, largest, sorted_) for row in rows], np.int64)
        index = index.reshape(moved.shape[:-1] + (k,))
    values = np.take_along_axis(moved, index, axis=-1)
    return np.moveaxis(values, -1, axis), np.moveaxis(index, -1, axis)


@register_op_kernel("TopK", provider=CPU)
class OrtTopK(ReferenceKernel):
    """TopK as ORT: ties give the lower index first, NaN and sorted=0 follow ORT's selection
    (see topk_positions); onnx.reference orders ties by numpy's sort and refuses sorted=0.
    k comes from the input (opset >= 10) or the attribute (opset 1).
    ORT: onnxruntime/core/providers/cpu/math/top_k.cc."""

    def compute(self, ctx):
        attribute, x = self.info.attribute, ctx.input(0)
        if x.dtype.kind not in "biuf" or is_custom_dtype(x.dtype):
            return super().compute(ctx)
        k = int(np.asarray(ctx.input(1)).reshape(-1)[0]) if self.info.node.since_version >= 10 \
            else attribute("k")
        axis = attribute("axis", -1)
        if not -x.ndim <= axis < x.ndim:
            return super().compute(ctx)  # the reference's own refusal
        if k < 0:
            raise KernelFailure(f"value of k must not be negative (k = {k})")
        if x.size == 0 and x.shape[axis] != 0 and int(np.prod(x.shape[:axis % x.ndim])) == 0:
            raise KernelFailure(f"TopK of shape {list(x.shape)} along axis {axis}: no rows before the axis. ORT "
                                "1.19.2's top_k.cc divides the size by the row count (0 / 0) and the process dies "
                                "with SIGFPE; give the input at least one row or skip the node.")
        if k > x.shape[axis]:
            raise KernelFailure(f"k argument [{k}] should not be greater than specified axis dim value "
                                f"[{x.shape[axis]}]")
        return ort_topk(x, k, axis, bool(attribute("largest", 1)), bool(attribute("sorted", 1)))


# --- ArgMax, ArgMin ---------------------------------------------------------------------------
def ort_arg_extreme(x, axis, keepdims=True, largest=True, last=False):
    """ORT's ArgMax/ArgMin: start at the first element, move to a later one only when it compares
    strictly better (better or equal with select_last_index). NaN never compares true: it is
    skipped, and wins only as the first element. ORT: core/providers/cpu/reduction/reduction_ops.h
    (ReduceAggregatorArgMax, ReduceAggregatorArgMaxLastIndex, and the Min ones)."""
    moved = np.moveaxis(x, axis, 0)
    best, arg = moved[0].copy(), np.zeros(moved.shape[1:], np.int64)
    for i in range(1, moved.shape[0]):
        value = moved[i]
        if largest:
            take = value >= best if last else value > best
        else:
            take = value <= best if last else value < best
        best, arg = np.where(take, value, best), np.where(take, np.int64(i), arg)
    return np.expand_dims(arg, axis) if keepdims else arg


class OrtArgExtreme(ReferenceKernel):
    """ArgMax / ArgMin as ORT (see ort_arg_extreme); onnx.reference uses numpy's argmax, which
    returns the first NaN."""

    largest = True

    def compute(self, ctx):
        x, attribute = ctx.input(0), self.info.attribute
        axis = attribute("axis", 0)
        if x.dtype.kind not in "biuf" or is_custom_dtype(x.dtype) or not -x.ndim <= axis < max(x.ndim, 1) \
                or x.ndim == 0 or x.shape[axis] == 0:
            return super().compute(ctx)
        return ort_arg_extreme(x, axis % x.ndim, bool(attribute("keepdims", 1)), self.largest,
                               bool(attribute("select_last_index", 0)))


@register_op_kernel("ArgMax", provider=CPU)
class OrtArgMax(OrtArgExtreme):
    """ArgMax as ORT (ort_arg_extreme). ORT: core/providers/cpu/reduction/reduction_ops.cc."""


@register_op_kernel("ArgMin", provider=CPU)
class OrtArgMin(OrtArgExtreme):
    """ArgMin as ORT (ort_arg_extreme). ORT: core/providers/cpu/reduction/reduction_ops.cc."""

    largest = False


# --- ReduceMax, ReduceMin ---------------------------------------------------------------------
def _pick(largest):
    """std::max / std::min on arrays, as Eigen's pmax/pmin lanes: the second wins only when it
    compares strictly better, so NaN on the right is skipped and NaN on the left stays."""
    if largest:
        return lambda a, b: np.where(a < b, b, a)
    return lambda a, b: np.where(b < a, b, a)


def fold_extreme(moved, largest):
    """Left fold of std::max/min over axis 0 (ORT's update() loops and FastReduceRK)."""
    pick, acc = _pick(largest), moved[0]
    for value in moved[1:]:
        acc = pick(acc, value)
    return acc


def eigen_redux_extreme(rows, start, largest):
    """Eigen's vectorized maxCoeff()/minCoeff() of each row [R, n] whose first element sits at
    element offset `start` in a 16-byte aligned buffer (SSE: 4 float / 2 double lanes): the elements
    before the first aligned one and after the last full packet are folded in after the packets;
    packets run in two accumulators over pairs, merged, then the lanes (0 with 2, 1 with 3), each
    step std::max/min. ORT's aggall: Eigen's redux_impl (LinearVectorizedTraversal), SSE predux_max."""
    pick, lanes, n = _pick(largest), 16 // rows.dtype.itemsize, rows.shape[1]
    head = min((-start) % lanes, n)
    size = (n - head) // lanes * lanes
    if size == 0:
        return fold_extreme(np.moveaxis(rows, 1, 0), largest)
    packet = lambda i: rows[:, i:i + lanes]  # noqa: E731
    acc0 = packet(head)
    if size > lanes:
        acc1 = packet(head + lanes)
        pairs_end = head + size // (2 * lanes) * 2 * lanes
        for i in range(head + 2 * lanes, pairs_end, 2 * lanes):
            acc0, acc1 = pick(acc0, packet(i)), pick(acc1, packet(i + lanes))
        acc0 = pick(acc0, acc1)
        if head + size > pairs_end:
            acc0 = pick(acc0, packet(pairs_end))
    if lanes == 4:
        acc0 = pick(acc0[:, :2], acc0[:, 2:])
    result = pick(acc0[:, 0], acc0[:, 1])
    for i in list(range(head)) + list(range(head + size, n)):
        result = pick(result, rows[:, i])
    return result


def _fast_groups(shape, axes):
    """ORT's fast-reduce shape: [kept?, size] runs of consecutive dims, kept or reduced alike
    (reduction_ops.cc OptimizeShapeForFastReduce; dims of 1 stay)."""
    groups = []
    for d, size in enumerate(shape):
        kept = d not in axes
        if groups and groups[-1][0] == kept:
            groups[-1][1] *= size
        else:
            groups.append([kept, size])
    return groups


def packetwise_extreme(moved, largest):
    """Eigen's packetwise_redux over axis 0 (rowwise().maxCoeff() of a column-major block): the
    first slice, then groups of four combined as (a, b), (c, d), then pairs, then the rest one by one."""
    pick, n = _pick(largest), moved.shape[0]
    acc, i, size4 = moved[0], 1, (n - 1) & ~3
    while i < size4:
        acc = pick(acc, pick(pick(moved[i], moved[i + 1]), pick(moved[i + 2], moved[i + 3])))
        i += 4
    for value in moved[i:]:
        acc = pick(acc, value)
    return acc


def _rows_extreme(rows, starts, largest):
    """eigen_redux_extreme of each row [R, n], row r starting at element offset starts[r]."""
    result = np.empty(rows.shape[0], rows.dtype)
    lanes = 16 // rows.dtype.itemsize
    for start in range(lanes):
        chosen = np.flatnonzero(starts % lanes == start)
        if chosen.size:
            result[chosen] = eigen_redux_extreme(rows[chosen], start, largest)
    return result


def _reduce_krk(x3, largest):
    """FastReduceKRK: out[j] (C values at offset j*C) = rowwise extreme of the [C, B] block j;
    the output's full 4-lane (2-lane) packets take packetwise_extreme, the other values a fold."""
    a, _, c = x3.shape
    moved = np.moveaxis(x3, 1, 0)
    packed, folded = packetwise_extreme(moved, largest), fold_extreme(moved, largest)
    lanes = 16 // x3.dtype.itemsize
    head = np.minimum((-(np.arange(a) * c)) % lanes, c)[:, None]
    end = head + (c - head) // lanes * lanes
    col = np.arange(c)[None, :]
    return np.where((col >= head) & (col < end), packed, folded)


def _reduce_rkr(x3, largest):
    """FastReduceRKR: out[d] starts at the block's first element; each of the d0 contiguous runs
    of d2 values is reduced by Eigen's redux, and replaces it when strictly better."""
    d0, d1, d2 = x3.shape
    pick = _pick(largest)
    out = x3[0, :, 0].copy()
    for i in range(d0):
        starts = i * d1 * d2 + np.arange(d1) * d2
        out = pick(out, _rows_extreme(x3[i], starts, largest))
    return out


def ort_reduce_extreme(x, axes, keepdims, largest):
    """ORT's ReduceMax/ReduceMin of a float32/float64 tensor over `axes` (sorted, non-negative),
    by ORT's fast-reduce shape (runs of kept / reduced dims merged): all reduced, or the last axes
    (KR), run Eigen's vectorized redux on each contiguous row; KRK with >= 2 outer blocks and RKR
    with >= 2 kept values take _reduce_krk / _reduce_rkr; everything else folds along the
    flattened reduced axes in order (ORT's update() loops and FastReduceRK). NaN follows
    std::max/min: kept where it enters on the left. The KRK/RKR thresholds are ORT's for a thread
    pool of 1 or 2 threads (max(2, threads)).
    ORT: core/providers/cpu/reduction/reduction_ops.cc (CommonFastReduceSwitch, NoTransposeReduce1Loop),
    reduction_ops.h (ReduceAggregatorMax, ReduceAggregatorMin)."""
    groups = _fast_groups(x.shape, axes)
    out_shape = tuple(1 if d in axes else n for d, n in enumerate(x.shape)) if keepdims else \
        tuple(n for d, n in enumerate(x.shape) if d not in axes)
    sizes = [size for _, size in groups]
    kinds = "".join("K" if kept else "R" for kept, _ in groups)
    if kinds in ("R", "KR"):
        rows = x.reshape(-1, sizes[-1])
        return _rows_extreme(rows, np.arange(rows.shape[0]) * rows.shape[1], largest).reshape(out_shape)
    if kinds == "KRK" and sizes[0] >= 2:
        return _reduce_krk(x.reshape(sizes), largest).reshape(out_shape)
    if kinds == "RKR" and sizes[1] >= 2:
        return _reduce_rkr(x.reshape(sizes), largest).reshape(out_shape)
    kept_axes = [d for d in range(x.ndim) if d not in axes]
    moved = np.transpose(x, list(axes) + kept_axes).reshape((-1,) + tuple(x.shape[d] for d in kept_axes))
    return fold_extreme(moved, largest).reshape(out_shape)


class OrtReduceExtreme(ReferenceKernel):
    """ReduceMax / ReduceMin of float32/float64 holding NaN or -0.0 as ORT (ort_reduce_extreme);
    onnx.reference uses numpy, which returns NaN whenever the row holds one. Other inputs, and
    empty reductions, keep the reference."""

    largest = True

    def compute(self, ctx):
        x, attribute = ctx.input(0), self.info.attribute
        if x.dtype not in (np.float32, np.float64) or x.size == 0 or x.ndim == 0 or \
                not (np.isnan(x).any() or (np.signbit(x) & (x == 0)).any()):
            return super().compute(ctx)
        if self.info.node.since_version >= 18:
            given = ctx.input(1)
            axes = [] if given is None else [int(a) for a in np.asarray(given).reshape(-1)]
            if not axes and attribute("noop_with_empty_axes", 0):
                return super().compute(ctx)
        else:
            axes = list(attribute("axes") or [])
        if any(not -x.ndim <= a < x.ndim for a in axes):
            return super().compute(ctx)
        axes = sorted({a % x.ndim for a in axes}) or list(range(x.ndim))
        return ort_reduce_extreme(x, axes, bool(attribute("keepdims", 1)), self.largest)


@register_op_kernel("ReduceMax", provider=CPU)
class OrtReduceMax(OrtReduceExtreme):
    """ReduceMax as ORT (ort_reduce_extreme). ORT: core/providers/cpu/reduction/reduction_ops.cc."""


@register_op_kernel("ReduceMin", provider=CPU)
class OrtReduceMin(OrtReduceExtreme):
    """ReduceMin as ORT (ort_reduce_extreme). ORT: core/providers/cpu/reduction/reduction_ops.cc."""

    largest = False


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
        best = _rows_extreme(rows, np.arange(rows.shape[0]) * width, True)
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
def _broadcast_failure(op, a, b):
    """ORT's broadcast error for shapes a and b, naming the op and both shapes, or None when they
    broadcast. ORT: core/providers/cpu/math/element_wise_ops.h (BroadcastIterator::Append)."""
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
        a, b = ctx.input(0), ctx.input(1)
        op = self.info.node.op_type
        if a is not None and b is not None:
            why = _broadcast_failure(op, np.shape(a), np.shape(b))
            if why is None and op in ("Div", "Mod"):
                why = _integer_division_failure(op, np.asarray(a), np.asarray(b))
            if why:
                raise KernelFailure(why)
        return super().compute(ctx)


for _op in ("Add", "Sub", "Mul", "Div", "Mod", "Pow", "And", "Or", "Xor", "Equal", "Less", "Greater",
            "LessOrEqual", "GreaterOrEqual", "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"):
    register_op_kernel(_op, provider=CPU)(type(f"Ort{_op}", (OrtBinaryElementwise,), {
        "__doc__": f"{_op} with ORT's broadcast check (OrtBinaryElementwise); computed by onnx.reference.",
        "__module__": __name__}))

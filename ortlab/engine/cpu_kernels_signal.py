"""CPU kernels for the signal ops, DFT and STFT, computed as ORT 1.19.2 computes them: in the signal's own
type (float32 for float32), where onnx.reference computes in float64 (numpy's FFT) and differs by ~1e-6 of
max|y|, visible where the exact value is 0.

Found by tools/probe_reference_vs_ort.py; checked by tests/engine/test_engine_backend_cases.py (with the other
ORT-behaviour kernels of cpu_kernels.py) and tests/engine/test_engine_special_values.py.

ORT's dft.cc works on complex<T> in the signal's own type T: a radix-2 FFT for power-of-2
lengths, Bluestein's chirp-z transform (three radix-2 FFTs of length M >= 2n - 1) otherwise.
The functions below take (real, imag) arrays [..., n] and repeat its operations in its order,
vectorized over the leading axes: std::complex products are (ac - bd, ad + bc), each rounded in T.
"""
import numpy as np

from ortlab.engine.cpu_execution_provider import ReferenceKernel
from ortlab.engine.kernel_registry import CPU, register_op_kernel


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

"""LayerNormalization forward (+ mean, inv_std) and LayerNormalizationGrad, on [rows, cols] views.

Mirrors onnxruntime/contrib_ops/cuda/layer_norm.cc and
orttraining/orttraining/training_ops/cuda/nn/layer_norm.cc around their .cu launches.
"""
import numpy as np

from ortlab.cuda.kernels.launch_shapes import (F32, as_f32, dtype_refusal, flat_geometry, normalised_axis,
                                          row_geometry)
from ortlab.cuda.kernels.registration import MS, CudaOpError, CudaSource, register_cuda_op, register_source

SOURCE = register_source(CudaSource(
    "layer_norm", "layer_norm.cu", ("layer_norm", "layer_norm_grad_input", "layer_norm_grad_scale_bias"),
    ("onnxruntime/contrib_ops/cuda/layer_norm_impl.cu",
     "orttraining/orttraining/training_ops/cuda/nn/layer_norm_impl.cu")))


def _layer_norm_check(spec):
    if spec.attributes.get("stash_type", 1) != 1:
        return f"stash_type {spec.attributes['stash_type']}: the kernel keeps mean and inv_std in float (1) only"
    return dtype_refusal(spec, {0: F32, 1: F32, 2: F32})


def _rows_cols(shape, axis, what):
    axis = normalised_axis(axis, len(shape), what)
    rows = int(np.prod(shape[:axis], dtype=np.int64))
    return axis, rows, int(np.prod(shape[axis:], dtype=np.int64))


def _per_row(shape, axis):
    """Mean's and InvStdDev's shape: the leading axes, then ones (ORT: LayerNormalization's stat shape)."""
    return tuple(shape[:axis]) + (1,) * (len(shape) - axis)


def _check_size(array, cols, what):
    if array is not None and int(array.size) != cols:
        raise CudaOpError(f"LayerNormalization: {what} has {int(array.size)} elements, the normalized axes "
                          f"{cols}; it must match them (as ORT checks)")


@register_cuda_op("LayerNormalization", "", SOURCE, check=_layer_norm_check)
def layer_norm(call, x, scale, bias=None):
    """(y, mean, inv_std) over the axes from `axis` on: layer_norm on x as [rows, cols] (Welford's
    mean and variance, y = (x - mean) * inv_std * scale + bias); no bias adds zeros. ORT 1.19.2's CPU
    kernel takes var = E[x^2] - E[x]^2 in float, which cancels to NaN for rows far from zero relative to
    their spread ([30000, 30001, 30002]); the centred Welford sums here do not."""
    axis, rows, cols = _rows_cols(x.shape, call.attribute("axis", -1), "LayerNormalization")
    _check_size(scale, cols, "scale")
    _check_size(bias, cols, "bias")
    launcher = call.launcher(SOURCE.name)
    xp = launcher.xp
    y, mean, inv_std = xp.zeros(x.shape, xp.float32), xp.zeros(rows, xp.float32), xp.zeros(rows, xp.float32)
    bias = xp.zeros(cols, xp.float32) if bias is None else bias
    if rows and cols:
        grid, block = row_geometry(launcher, rows, cols)
        launcher("layer_norm", grid, block, as_f32(xp, x).reshape(rows, cols), as_f32(xp, scale).reshape(-1),
                 as_f32(xp, bias).reshape(-1), y.reshape(rows, cols), mean, inv_std, rows, cols,
                 float(call.attribute("epsilon", 1e-5)))
    stat = _per_row(x.shape, axis)
    return [y, mean.reshape(stat), inv_std.reshape(stat)]


def _layer_norm_grad_check(spec):
    return dtype_refusal(spec, {i: F32 for i in range(5)})


@register_cuda_op("LayerNormalizationGrad", MS, SOURCE, check=_layer_norm_grad_check)
def layer_norm_grad(call, dy, x, scale, mean, inv_std):
    """(dx, dscale, dbias) of LayerNormalization given its saved mean and inv_std, as ORT's gradient
    builder emits LayerNormalizationGrad (orttraining/orttraining/core/graph/gradient_builder.cc):
    layer_norm_grad_input (a block per row) and layer_norm_grad_scale_bias (a thread per column). Over one
    normalized element xhat is 0: dx = dscale = 0, dbias = sum dy, where ORT 1.19.2's CPU kernel refuses
    (orttraining/orttraining/training_ops/cpu/nn/layer_norm.cc: 'M != 1')."""
    _, rows, cols = _rows_cols(x.shape, call.attribute("axis", -1), "LayerNormalizationGrad")
    _check_size(scale, cols, "scale")
    if tuple(dy.shape) != tuple(x.shape) or int(mean.size) != rows or int(inv_std.size) != rows:
        raise CudaOpError(f"LayerNormalizationGrad: dy {tuple(dy.shape)}, X {tuple(x.shape)}, mean "
                          f"{tuple(mean.shape)}, inv_std {tuple(inv_std.shape)} do not fit {rows} rows")
    launcher = call.launcher(SOURCE.name)
    xp = launcher.xp
    dx, dscale, dbias = xp.zeros(x.shape, xp.float32), xp.zeros(cols, xp.float32), xp.zeros(cols, xp.float32)
    if rows and cols:
        views = (as_f32(xp, dy).reshape(rows, cols), as_f32(xp, x).reshape(rows, cols))
        stats = (as_f32(xp, mean).reshape(-1), as_f32(xp, inv_std).reshape(-1))
        grid, block = row_geometry(launcher, rows, cols)
        launcher("layer_norm_grad_input", grid, block, *views, as_f32(xp, scale).reshape(-1), *stats,
                 dx.reshape(rows, cols), rows, cols)
        grid, block = flat_geometry(launcher, cols)
        launcher("layer_norm_grad_scale_bias", grid, block, *views, *stats, dscale, dbias, rows, cols)
    return [dx, dscale.reshape(scale.shape), dbias.reshape(scale.shape)]

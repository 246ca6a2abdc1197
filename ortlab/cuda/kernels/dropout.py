"""Dropout (dropout.cu's own counter-based generator) and DropoutGrad (a given mask).

Mirrors onnxruntime/core/providers/cuda/nn/dropout.cc and
orttraining/orttraining/training_ops/cuda/nn/dropout_grad.cc around their .cu launches.
"""
import numpy as np

from ortlab.cuda.kernels.launch_shapes import F32, FLOATS, as_f32, dtype_refusal, flat_geometry
from ortlab.cuda.kernels.registration import MS, CudaOpError, CudaSource, register_cuda_op, register_source

SOURCE = register_source(CudaSource(
    "dropout", "dropout.cu", ("dropout", "dropout_grad"),
    ("onnxruntime/core/providers/cuda/nn/dropout_impl.cu",
     "orttraining/orttraining/training_ops/cuda/nn/dropout_grad_impl.cu")))


GOLDEN = 0x9E3779B97F4A7C15  # dropout.cu's hash step: seed + n * GOLDEN continues the stream n draws on
DEFAULT_SEED = 0x5EED


def _ratio(value, default=0.5):
    ratio = default if value is None else float(np.asarray(value).reshape(-1)[0])
    if not 0.0 <= ratio < 1.0:
        raise CudaOpError(f"Dropout ratio must be in [0, 1), got {ratio} (ORT's kernels refuse it too)")
    return ratio


def _dropout_check(spec):
    if spec.opset < 12:
        return "Dropout before opset 12 takes its ratio as an attribute; the kernel follows opset 12+ (ratio input)"
    return dtype_refusal(spec, {0: F32, 1: FLOATS, 2: ("bool",)})


@register_cuda_op("Dropout", "", SOURCE, check=_dropout_check)
def dropout(call, x, ratio=None, training_mode=None):
    """(y, mask): in training, mask = draw < 1 - ratio, y = x * mask / (1 - ratio); in inference y = x and
    the mask is all true (the kernel with ratio 0). The draws come from dropout.cu's counter-based hash,
    not ORT's Philox (curand's Philox4_32_10): the masks differ from ORT's, their statistics do not. Each
    node keeps its generator's offset in call.state, advanced by the elements drawn, as ORT's
    PhiloxGenerator advances its offset, so a second run draws a new mask."""
    training = bool(np.asarray(training_mode).reshape(-1)[0]) if training_mode is not None else False
    checked = _ratio(ratio)  # in either mode, as ORT's kernels check it (cpu/nn/dropout_op.h, cuda/nn/dropout.cc)
    ratio = checked if training else 0.0
    launcher = call.launcher(SOURCE.name)
    xp = launcher.xp
    n = int(x.size)
    seed = int(call.attribute("seed", DEFAULT_SEED))
    offset = call.state.get("offset", 0)
    call.state["offset"] = offset + n
    stream = (seed + offset * GOLDEN) % (1 << 64)
    y, mask = xp.zeros(x.shape, xp.float32), xp.zeros(x.shape, xp.bool_)
    if n:
        grid, block = flat_geometry(launcher, n)
        launcher("dropout", grid, block, as_f32(xp, x), y, mask, ratio, n, stream)
    return [y, mask]


def _dropout_grad_check(spec):
    return dtype_refusal(spec, {0: F32, 1: ("bool",), 2: FLOATS, 3: ("bool",)})


@register_cuda_op("DropoutGrad", MS, SOURCE, check=_dropout_grad_check)
def dropout_grad(call, dy, mask, ratio=None, training_mode=None):
    """dx = dy * mask / (1 - ratio) (ratio 0.5 when absent; dx = dy at ratio 0): dropout_grad. ORT's
    kernels ignore training_mode here, and so does this one."""
    ratio = _ratio(ratio)
    if tuple(dy.shape) != tuple(mask.shape):
        raise CudaOpError(f"DropoutGrad: dy {tuple(dy.shape)} and mask {tuple(mask.shape)} differ in shape")
    launcher = call.launcher(SOURCE.name)
    xp = launcher.xp
    dx = xp.zeros(dy.shape, xp.float32)
    if dy.size:
        grid, block = flat_geometry(launcher, int(dy.size))
        launcher("dropout_grad", grid, block, as_f32(xp, dy), xp.ascontiguousarray(mask), dx, ratio, int(dy.size))
    return [dx]

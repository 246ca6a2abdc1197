"""SoftmaxCrossEntropyLoss (reduction 'mean') and SoftmaxCrossEntropyLossGrad on [N, C] scores.

Mirrors onnxruntime/core/providers/cuda/loss/softmax_cross_entropy_loss.cc and
orttraining/orttraining/training_ops/cuda/loss/softmax_cross_entropy_loss.cc around their .cu launches.
"""
import numpy as np

from ortlab.cuda.kernels.launch_shapes import (F32, LABELS, as_f32, dtype_refusal, flat_geometry, row_geometry,
                                          whole_warps)
from ortlab.cuda.kernels.registration import MS, CudaOpError, CudaSource, register_cuda_op, register_source

SOURCE = register_source(CudaSource(
    "softmax_cross_entropy", "softmax_cross_entropy.cu",
    ("log_softmax_rows", "cross_entropy_terms", "cross_entropy_mean", "cross_entropy_grad"),
    ("onnxruntime/core/providers/cuda/loss/softmax_cross_entropy_loss_impl.cu",
     "orttraining/orttraining/training_ops/cuda/loss/softmax_cross_entropy_loss_impl.cu")))


# ignore_index absent: ORT 1.19.2's kernels ignore label -1 (the default of orttraining/orttraining/
# training_ops/cpu/loss/softmax_cross_entropy_loss.cc and cuda/loss/softmax_cross_entropy_loss_impl.cc)
DEFAULT_IGNORE = -1


def _sce_check(spec, weight_input):
    reduction = spec.attributes.get("reduction", "mean")
    reduction = reduction.decode() if isinstance(reduction, bytes) else reduction
    if reduction != "mean":
        return f"reduction {reduction!r}: softmax_cross_entropy.cu implements 'mean' only"
    if spec.dtype(weight_input) is not None:
        return "class weights are given: softmax_cross_entropy.cu weighs every sample 1 (or 0 when ignored)"
    logits = 0 if weight_input == 2 else 1
    if spec.rank(logits) != 2:
        return (f"the scores have rank {spec.rank(logits)}: the kernel takes [N, C] "
                "(ORT also takes [N, C, D1, ...], which would need a transpose here)")
    return None


def _labels(call, launcher, labels, n, classes):
    """Labels as int64 on the launcher's device, checked of shape (n,) and in [0, classes) or equal to
    ignore_index (-1 when the attribute is absent, as in ORT; the kernel reads log_prob[label] unchecked, as
    ORT's CUDA kernel does)."""
    ignore = int(call.attribute("ignore_index", DEFAULT_IGNORE))
    if tuple(labels.shape) != (n,):
        raise CudaOpError(f"SoftmaxCrossEntropyLoss: labels have shape {tuple(labels.shape)}; the scores [N, C] = "
                          f"{(n, classes)} take ({n},) (ORT refuses other shapes too)")
    host = np.asarray(launcher.to_numpy(labels)).reshape(-1)
    bad = host[((host < 0) | (host >= classes)) & (host != ignore)]
    if bad.size:
        raise CudaOpError(f"SoftmaxCrossEntropyLoss: label {int(bad[0])} is outside [0, {classes}) and is not "
                          f"ignore_index; labels name a class")
    return launcher.xp.ascontiguousarray(labels, dtype=launcher.xp.int64).reshape(-1), ignore


def _weight_sum(launcher, log_prob, labels, ignore):
    """(loss, weight_sum), each one element: cross_entropy_terms, then cross_entropy_mean in one block."""
    xp = launcher.xp
    n, classes = log_prob.shape
    term, weight = xp.zeros(n, xp.float32), xp.zeros(n, xp.float32)
    grid, block = flat_geometry(launcher, n)
    launcher("cross_entropy_terms", grid, block, log_prob, labels, term, weight, n, classes, ignore)
    loss, weight_sum = xp.zeros(1, xp.float32), xp.zeros(1, xp.float32)
    launcher("cross_entropy_mean", 1, whole_warps(n, 1024), term, weight, loss, weight_sum, n)
    return loss, weight_sum


def _loss_check(spec):
    return _sce_check(spec, 2) or dtype_refusal(spec, {0: F32, 1: LABELS})


def _loss_grad_check(spec):
    return _sce_check(spec, 3) or dtype_refusal(spec, {0: F32, 1: F32, 2: LABELS})


@register_cuda_op("SoftmaxCrossEntropyLoss", "", SOURCE, check=_loss_check)
def softmax_cross_entropy(call, scores, labels, weights=None):
    """(loss, log_prob): log_prob = log_softmax(scores) per row, loss = mean over the samples not ignored
    of -log_prob[i, label_i] (0 when all are ignored, as ORT's kernels give)."""
    launcher = call.launcher(SOURCE.name)
    xp = launcher.xp
    n, classes = scores.shape
    labels, ignore = _labels(call, launcher, labels, n, classes)
    log_prob = xp.zeros((n, classes), xp.float32)
    loss = xp.zeros(1, xp.float32)
    if n and classes:
        grid, block = row_geometry(launcher, n, classes)
        launcher("log_softmax_rows", grid, block, as_f32(xp, scores), log_prob, n, classes)
        loss, _ = _weight_sum(launcher, log_prob, labels, ignore)
    return [loss.reshape(()), log_prob]


@register_cuda_op("SoftmaxCrossEntropyLossGrad", MS, SOURCE, check=_loss_grad_check)
def softmax_cross_entropy_grad(call, dy, log_prob, labels, weights=None):
    """dscores[i, c] = dy * w_i / sum(w) * (exp(log_prob[i, c]) - (c == label_i)), w_i = 0 for an
    ignored sample: the weight sum by cross_entropy_terms + cross_entropy_mean, then cross_entropy_grad."""
    launcher = call.launcher(SOURCE.name)
    xp = launcher.xp
    n, classes = log_prob.shape
    if int(dy.size) != 1:
        raise CudaOpError(f"SoftmaxCrossEntropyLossGrad: dY has shape {tuple(dy.shape)}; reduction 'mean' "
                          "gives one loss, so dY is one value")
    labels, ignore = _labels(call, launcher, labels, n, classes)
    dscores = xp.zeros((n, classes), xp.float32)
    if n and classes:
        log_prob = as_f32(xp, log_prob)
        _, weight_sum = _weight_sum(launcher, log_prob, labels, ignore)
        grid, block = flat_geometry(launcher, n * classes)
        launcher("cross_entropy_grad", grid, block, as_f32(xp, dy).reshape(1), log_prob, labels, weight_sum,
                 dscores, n, classes, ignore)
    return [dscores]

"""The numpy maths of every op ortlab has a kernel for: one definition per op.

Each kernel's `reference` (the Kernel classes of ortlab.kernels.ops) and the onnx.reference ops
of ortlab.transformers.contrib_ops (Gelu, BiasGelu, BiasSoftmax, BiasDropout) call these, so the
maths of an op is written once. Plain numpy: importing this module loads neither torch nor
Triton. Attributes arrive checked by the kernel that calls (axes in range, a known reduction).
What ORT computes is in the files each kernel mirrors (onnxruntime/contrib_ops/cuda/,
onnxruntime/core/providers/cuda/, orttraining/orttraining/training_ops/cuda/).
"""
import math

import numpy as np

from ortlab.kernels.ops.rows import flatten_from, split_at, stats_shape

_erf = np.vectorize(math.erf, otypes=[np.float64])


# -- Gelu, BiasGelu, GeluGrad ------------------------------------------------------------
def gelu_reference(x):
    """gelu(x) = x * Phi(x), Phi(x) = (1 + erf(x / sqrt 2)) / 2 (the exact form, not tanh's)."""
    return (x * 0.5 * (1 + _erf(x / math.sqrt(2)))).astype(x.dtype)


def gelu_grad_reference(dy, x):
    """dx = dy * (Phi(x) + x * phi(x)), phi(x) = exp(-x^2 / 2) / sqrt(2 pi), in float64."""
    x64 = x.astype(np.float64)
    cdf = 0.5 * (1 + _erf(x64 / math.sqrt(2)))
    pdf = np.exp(-0.5 * x64 * x64) / math.sqrt(2 * math.pi)
    return (dy * (cdf + x64 * pdf)).astype(x.dtype)


# -- Softmax, SoftmaxGrad_13, BiasSoftmax ------------------------------------------------
def softmax_reference(x, axis=-1):
    """exp(x - max x) / sum exp(x - max x) along one axis (ONNX opset 13)."""
    e = np.exp(x - x.max(axis=axis, keepdims=True))
    return (e / e.sum(axis=axis, keepdims=True)).astype(x.dtype)


def softmax_grad_reference(dy, y, axis=-1):
    """dx = y * (dy - sum(dy * y)) along one axis."""
    dot = (dy * y).sum(axis=axis, keepdims=True)
    return (y * (dy - dot)).astype(y.dtype)


def bias_softmax_reference(x, bias, axis):
    """softmax(x + bias) over the dimensions from `axis` on, taken as one row (ORT's BiasSoftmax),
    in float64; bias broadcasts as numpy broadcasts it."""
    z = (x + bias).astype(np.float64)
    rows, cols = flatten_from(x.shape, axis)
    z = z.reshape(rows, cols)
    e = np.exp(z - z.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).reshape(x.shape).astype(x.dtype)


# -- Dropout, DropoutGrad ----------------------------------------------------------------
def draw_seed(seed):
    """The seed given, or one drawn from numpy's global generator (seeded by env.seed_everything)."""
    return int(np.random.randint(0, 2**31 - 1)) if seed is None else int(seed)


def dropout_reference(x, ratio=0.5, training=False, seed=None):
    """(y, keep): keep = uniform[0, 1) >= ratio from numpy's generator seeded by `seed` (see
    draw_seed), y = keep * x / (1 - ratio). Not training, or ratio 0: y = x, every element kept."""
    if not training or ratio == 0:
        return x.copy(), np.ones(x.shape, dtype=bool)
    keep = np.random.default_rng(draw_seed(seed)).random(x.shape) >= ratio
    return np.where(keep, x / (1 - ratio), 0).astype(x.dtype), keep


def dropout_grad_reference(dy, mask, ratio=0.5):
    """dx = mask * dy / (1 - ratio)."""
    return np.where(mask, dy / (1 - ratio), 0).astype(dy.dtype)


# -- LayerNormalization, LayerNormalizationGrad -----------------------------------------
def layer_norm_reference(x, scale, bias=None, axis=-1, epsilon=1e-5):
    """(Y, Mean, InvStdDev) over the dimensions from `axis` (>= 0) on, in float64; the statistics
    are float32 with X's leading dimensions and ones after (ONNX opset 17)."""
    rows, cols = flatten_from(x.shape, axis)
    x2 = x.reshape(rows, cols).astype(np.float64)
    mean = x2.mean(axis=1, keepdims=True)
    rstd = 1 / np.sqrt(((x2 - mean) ** 2).mean(axis=1, keepdims=True) + epsilon)
    y = (x2 - mean) * rstd * scale.reshape(-1) + (0 if bias is None else bias.reshape(-1))
    stats = stats_shape(x.shape, axis)
    return (y.reshape(x.shape).astype(x.dtype), mean.reshape(stats).astype(np.float32),
            rstd.reshape(stats).astype(np.float32))


def layer_norm_grad_reference(dy, x, scale, mean, rstd, axis=-1):
    """(dX, dScale, dBias) from the saved mean and inverse std, in float64:
    xhat = (x - mean) * rstd, g = dy * scale, dx = rstd * (g - mean(g) - xhat * mean(g * xhat)),
    dscale = sum over rows of dy * xhat, dbias = sum over rows of dy."""
    rows, cols = flatten_from(x.shape, axis)
    dy2, x2 = dy.reshape(rows, cols).astype(np.float64), x.reshape(rows, cols).astype(np.float64)
    mean, rstd = mean.reshape(rows, 1).astype(np.float64), rstd.reshape(rows, 1).astype(np.float64)
    xhat = (x2 - mean) * rstd
    g = dy2 * scale.reshape(-1)
    dx = rstd * (g - g.mean(axis=1, keepdims=True) - xhat * (g * xhat).mean(axis=1, keepdims=True))
    return (dx.reshape(x.shape).astype(x.dtype), (dy2 * xhat).sum(0).reshape(scale.shape).astype(x.dtype),
            dy2.sum(0).reshape(scale.shape).astype(x.dtype))


# -- ReduceSum ---------------------------------------------------------------------------
def reduce_sum_reference(data, axes, keepdims=1):
    """data summed over `axes` (a tuple of axes >= 0); no axes: data unchanged."""
    if not axes:
        return data.copy()
    return data.sum(axis=axes, keepdims=bool(keepdims)).astype(data.dtype)


# -- GatherGrad --------------------------------------------------------------------------
def gather_grad_reference(shape, indices, dy, axis=0):
    """dX = zeros(shape), then dX[..., indices[p], ...] += dY[..., p, ...] for every position p of
    indices (negative indices count from the end), summed in float64."""
    dims = [int(d) for d in shape]
    outer, gather_dim, inner = split_at(dims, axis)
    dx = np.zeros((outer, gather_dim, inner), dtype=np.float64)
    flat = np.where(indices < 0, indices + gather_dim, indices).reshape(-1)
    np.add.at(dx, (slice(None), flat), dy.reshape(outer, flat.size, inner))
    return dx.reshape(dims).astype(dy.dtype)


# -- SoftmaxCrossEntropyLoss, SoftmaxCrossEntropyLossGrad --------------------------------
def label_weights(n_classes, labels, weights, ignore_index):
    """(w[label] per position, 0 where label == ignore_index; the label with ignored ones set to 0)."""
    keep = labels != ignore_index
    safe = np.where(keep, labels, 0)
    w = np.ones(n_classes, np.float64) if weights is None else weights
    return np.where(keep, w[safe], 0).astype(np.float64), safe


def softmax_cross_entropy_reference(scores, labels, weights=None, reduction="mean", ignore_index=None):
    """(loss, log_prob) of scores (N, C, D...) against labels (N, D...), in float64:
    log_prob = log_softmax(scores) over axis 1, loss_i = -w[label_i] * log_prob[i, label_i],
    reduced by 'none', 'sum' or 'mean' (the sum over the sum of the w[label_i])."""
    x = np.moveaxis(scores.astype(np.float64), 1, -1)
    shifted = x - x.max(-1, keepdims=True)
    log_prob = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    w, safe = label_weights(x.shape[-1], labels, weights, ignore_index)
    loss = -w * np.take_along_axis(log_prob, safe[..., None], -1)[..., 0]
    out = {"none": loss, "sum": loss.sum(), "mean": loss.sum() / w.sum()}[reduction]
    return np.asarray(out, scores.dtype), np.moveaxis(log_prob, -1, 1).astype(scores.dtype)


def softmax_cross_entropy_grad_reference(dy, log_prob, labels, weights=None, reduction="mean",
                                         ignore_index=None):
    """d_logits = (exp(log_prob) - onehot(label)) * w[label] * dy, over sum w[label] for 'mean'."""
    lp = np.moveaxis(log_prob.astype(np.float64), 1, -1)
    w, safe = label_weights(lp.shape[-1], labels, weights, ignore_index)
    onehot = np.eye(lp.shape[-1])[safe]
    scale = w * dy / (w.sum() if reduction == "mean" else 1.0)
    grad = (np.exp(lp) - onehot) * np.asarray(scale)[..., None]
    return np.moveaxis(grad, -1, 1).astype(log_prob.dtype)

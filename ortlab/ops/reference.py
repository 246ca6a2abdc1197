"""The numpy maths of every op ortlab has a kernel for: one definition per op.

Each kernel's `reference` (the Kernel classes of ortlab.triton_kernels.ops) and the onnx.reference ops
of ortlab.ops.contrib_ops (every com.microsoft op of ortlab's graphs) call these, so the
maths of an op is written once. Plain numpy: importing this module loads neither torch nor
Triton. Attributes arrive checked by the kernel or op that calls (axes in range, a known reduction).
What ORT computes is in the files each kernel mirrors (onnxruntime/contrib_ops/cuda/,
onnxruntime/core/providers/cuda/, orttraining/orttraining/training_ops/cuda/) and, for the
functions of the last section, in ORT's CPU kernels (orttraining/orttraining/training_ops/cpu/,
onnxruntime/contrib_ops/cpu/).
"""
import math

import numpy as np

from ortlab.ops.rows import flatten_from, split_at, stats_shape

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


# -- The training ops ORT runs on CPU (orttraining/orttraining/training_ops/cpu/) --------------
# What the CPU kernels compute, for ortlab.ops.contrib_ops; each function names the
# kernel file it mirrors. Inputs arrive checked by the op that calls.
def reduce_to_shape(x, shape):
    """x summed over the axes that broadcasting stretched to get from `shape` to x.shape, in x's
    dtype and reshaped to `shape` (the Shape, BroadcastGradientArgs, ReduceSum, Reshape chain)."""
    shape = tuple(int(d) for d in shape)
    lead = x.ndim - len(shape)
    stretched = tuple(lead + i for i, d in enumerate(shape) if d == 1 and x.shape[lead + i] != 1)
    axes = tuple(range(lead)) + stretched
    return (x.sum(axis=axes) if axes else x).reshape(shape).astype(x.dtype)


def broadcast_gradient_args_reference(a_shape, b_shape):
    """(a_axes, b_axes): the axes of broadcast(A, B) that A and B were stretched along, int64,
    highest axis first, as orttraining/orttraining/training_ops/cpu/nn/broadcast_grad_args.cc
    walks them; shapes that cannot broadcast raise ValueError."""
    a, b = [int(d) for d in a_shape], [int(d) for d in b_shape]
    ndim = max(len(a), len(b))
    a_axes, b_axes = [], []
    for k in range(ndim - 1, -1, -1):
        i, j = k - (ndim - len(a)), k - (ndim - len(b))
        if i < 0:
            a_axes.append(k)
        elif j < 0:
            b_axes.append(k)
        elif a[i] != b[j]:
            if a[i] != 1 and b[j] != 1:
                raise ValueError(f"shapes {a} and {b} cannot broadcast")
            (a_axes if a[i] == 1 else b_axes).append(k)
    return np.array(a_axes, np.int64), np.array(b_axes, np.int64)


def div_grad_reference(dy, a, b):
    """(dA, dB) of A / B: dA = dY / B, dB = dY * (-A / (B * B)), each summed back to its input's
    shape (the function body of DivGrad, orttraining/orttraining/core/graph/training_op_defs.cc)."""
    da = reduce_to_shape(dy / b, a.shape)
    db = reduce_to_shape(dy * (-a / (b * b)), b.shape)
    return da.astype(dy.dtype), db.astype(dy.dtype)


def reduce_sum_training_reference(data, axes, keepdims=1, noop_with_empty_axes=0):
    """ReduceSum with the axes as an input (int64, negative ones count from the end); no axes:
    every axis, or data unchanged when noop_with_empty_axes
    (onnxruntime/core/providers/cpu/reduction/reduction_ops.cc, ReduceSumTraining)."""
    axes = tuple(sorted(int(a) % max(data.ndim, 1) for a in np.asarray(axes).reshape(-1)))
    if not axes:
        if noop_with_empty_axes:
            return data.copy()
        axes = tuple(range(data.ndim))
    return np.asarray(data.sum(axis=axes, keepdims=bool(keepdims)), data.dtype)


def relu_grad_reference(dy, x):
    """dX = dY where X > 0, else 0 (ReluGrad reads the forward input or output alike)."""
    return np.where(x > 0, dy, 0).astype(dy.dtype)


def sigmoid_grad_reference(dy, y):
    """dX = dY * Y * (1 - Y) from the forward output Y."""
    return (dy * y * (1 - y)).astype(dy.dtype)


def tanh_grad_reference(dy, y):
    """dX = dY * (1 - Y^2) from the forward output Y."""
    return (dy * (1 - y * y)).astype(dy.dtype)


def log_softmax_grad_reference(dy, y, axis=-1):
    """dX = dY - exp(Y) * sum(dY) along one axis, Y the forward output (log probabilities)."""
    return (dy - np.exp(y) * dy.sum(axis=axis, keepdims=True)).astype(y.dtype)


def scale_reference(x, scale, scale_down=0):
    """x times the single value of `scale`, or divided by it when scale_down, the factor taken in
    float32 as orttraining/orttraining/training_ops/cpu/math/scale.cc takes it."""
    s = np.float32(np.asarray(scale).reshape(-1)[0])
    factor = np.float32(1) / s if scale_down else s
    return (x * np.asarray(factor, x.dtype)).astype(x.dtype)


def slice_ranges(shape, starts, ends, axes=None, steps=None):
    """Per dimension of `shape`, the indices Slice(starts, ends, axes, steps) keeps, as ONNX's
    Slice clamps them (negative starts and ends count from the end, steps may be negative)."""
    ranges = [range(int(d)) for d in shape]
    axes = range(len(starts)) if axes is None else axes
    steps = [1] * len(starts) if steps is None else steps
    for start, end, axis, step in zip(starts, ends, axes, steps):
        dim, start, end, step = int(shape[int(axis)]), int(start), int(end), int(step)
        start, end = (start + dim if start < 0 else start), (end + dim if end < 0 else end)
        top = dim if step > 0 else dim - 1
        start, end = min(max(start, 0), top), min(max(end, 0 if step > 0 else -1), top)
        ranges[int(axis) % len(shape)] = range(start, end, step)
    return ranges


def slice_grad_reference(dy, shape, starts, ends, axes=None, steps=None):
    """dX = zeros(shape) with dY written where Slice took its elements
    (orttraining/orttraining/training_ops/cpu/tensor/slice_grad.cc)."""
    dx = np.zeros([int(d) for d in shape], dy.dtype)
    dx[np.ix_(*[np.array(r, np.int64) for r in slice_ranges(dx.shape, starts, ends, axes, steps)])] = dy
    return dx


def fused_matmul_reference(a, b, alpha=1.0, trans_a=0, trans_b=0, trans_batch_a=0, trans_batch_b=0):
    """alpha * A' @ B' where transBatch moves a leading dimension to the row position ([M, b..., K]
    -> [b..., M, K]) and trans swaps the last two; 1-D operands are never transposed
    (onnxruntime/contrib_ops/cpu/fused_matmul.cc, core/providers/cpu/math/matmul_helper.h)."""
    a = np.moveaxis(a, 0, -2) if trans_batch_a else a
    b = np.moveaxis(b, 0, -2) if trans_batch_b else b
    a = np.swapaxes(a, -1, -2) if trans_a and a.ndim > 1 else a
    b = np.swapaxes(b, -1, -2) if trans_b and b.ndim > 1 else b
    return np.asarray(np.float32(alpha) * np.matmul(a, b), a.dtype)


def _softplus(v):
    return np.where(v > 0, v + np.log1p(np.exp(-np.abs(v))), np.log1p(np.exp(v)))


# name -> (the activation's float parameters, none with a default, f(v, **params)), as
# onnxruntime/core/providers/cpu/activation/activations.cc creates them for FusedGemm.
GEMM_ACTIVATIONS = {
    "Relu": ((), lambda v: np.maximum(v, 0)),
    "Sigmoid": ((), lambda v: 1 / (1 + np.exp(-v))),
    "Tanh": ((), np.tanh),
    "Softsign": ((), lambda v: v / (1 + np.abs(v))),
    "Softplus": ((), _softplus),
    "LeakyRelu": (("alpha",), lambda v, alpha: np.where(v >= 0, v, alpha * v)),
    "Elu": (("alpha",), lambda v, alpha: np.where(v >= 0, v, alpha * (np.exp(v) - 1))),
    "ThresholdedRelu": (("alpha",), lambda v, alpha: np.where(v > alpha, v, 0)),
    "HardSigmoid": (("alpha", "beta"), lambda v, alpha, beta: np.clip(alpha * v + beta, 0, 1)),
    "Selu": (("alpha", "gamma"), lambda v, alpha, gamma: np.where(v > 0, gamma * v,
                                                                  gamma * (alpha * np.exp(v) - alpha))),
    "ParametricSoftplus": (("alpha", "beta"), lambda v, alpha, beta: alpha * _softplus(beta * v)),
    "ScaledTanh": (("alpha", "beta"), lambda v, alpha, beta: alpha * np.tanh(beta * v)),
}


def fused_gemm_reference(a, b, c=None, alpha=1.0, beta=1.0, trans_a=0, trans_b=0, activation="Relu",
                         params=None):
    """activation(alpha * A' @ B' + beta * C) in float64, `params` the activation's parameters
    ({"alpha": ...}; onnxruntime/contrib_ops/cpu/fused_gemm.cc on core/providers/cpu/math/gemm.h)."""
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    y = alpha * ((a64.T if trans_a else a64) @ (b64.T if trans_b else b64))
    if c is not None:
        y = y + beta * c.astype(np.float64)
    return GEMM_ACTIVATIONS[activation][1](y, **(params or {})).astype(a.dtype)


def softmax_cross_entropy_grad_ort(dy, log_prob, labels, weights=None, reduction="mean", ignore_index=-1):
    """SoftmaxCrossEntropyLossGrad as ORT's CPU kernel computes it
    (orttraining/orttraining/training_ops/cpu/loss/softmax_cross_entropy_loss.cc): ignore_index is
    -1 when the node gives none, and 'mean' divides by the kept labels' weight sum only when it is
    not 0 (all labels ignored: a zero gradient, not 0/0)."""
    w, _ = label_weights(log_prob.shape[1], labels, weights, ignore_index)
    if reduction == "mean" and w.sum() == 0:
        reduction = "sum"
    return softmax_cross_entropy_grad_reference(dy, log_prob, labels, weights, reduction, ignore_index)

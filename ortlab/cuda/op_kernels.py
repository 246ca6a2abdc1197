"""One CUDA op kernel per ONNX op: outputs = op(inputs) with ORT's shapes and dtypes, computed by the
CUDA C++ kernels of ortlab/cuda/kernels/*.cu on [rows, cols] views of the tensors.

What ORT's CUDA kernel classes do around their .cu launches (onnxruntime/core/providers/cuda/
reduction/reduction_ops.cc, cuda/nn/dropout.cc, contrib_ops/cuda/layer_norm.cc,
cuda/loss/softmax_cross_entropy_loss.cc and orttraining/orttraining/training_ops/cuda/
{nn/dropout_grad.cc, nn/layer_norm.cc, loss/softmax_cross_entropy_loss.cc, tensor/gather_grad.cc}):
read the attributes, check the inputs, flatten to the views the kernel takes, pick grid and block,
launch, and give the outputs their shapes. Each op is registered with

    check(spec) -> None or why not    what a partitioner asks before assigning a node: its attributes,
                                      input dtypes and ranks, constant inputs, opset (a NodeSpec)
    run(call, *inputs) -> outputs     the launches, through call.launcher(source) (launcher.py: the CPU
                                      runner, or CuPy on a GPU), on arrays of call.xp

An op that the .cu files do not cover (ReduceSum over leading axes, SoftmaxCrossEntropyLoss with
reduction 'sum' or class weights, float16 inputs...) is declined with the reason; run() raises
OrtlabError for inputs that check() could not see (a ratio out of range, a label outside the classes).
"""
from dataclasses import dataclass, field

import numpy as np

from ortlab.cuda.launcher import CpuLauncher
from ortlab.errors import OrtlabError

MS = "com.microsoft"


class CudaOpError(OrtlabError):
    """A CUDA op kernel refused its inputs or attributes (the message says which and why)."""


@dataclass(frozen=True)
class NodeSpec:
    """What a partitioner knows of a node before running it: attributes, each input's dtype name and
    rank (None where unknown or absent), the values of constant inputs ({index: array}), the opset."""

    attributes: dict
    dtypes: tuple = ()
    ranks: tuple = ()
    constants: dict = field(default_factory=dict)
    opset: int = 17

    def dtype(self, i):
        return self.dtypes[i] if i < len(self.dtypes) else None

    def rank(self, i):
        return self.ranks[i] if i < len(self.ranks) else None


@dataclass
class OpCall:
    """One op's run: the launchers by source (made on first use), the node's attributes, per-node state
    kept across runs (Dropout's generator offset) and options (GatherGrad's path)."""

    attributes: dict
    make_launcher: object = CpuLauncher
    state: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    launchers: dict = field(default_factory=dict)

    def launcher(self, source):
        if source not in self.launchers:
            self.launchers[source] = self.make_launcher(source)
        return self.launchers[source]

    def attribute(self, name, default=None):
        value = self.attributes.get(name, default)
        return value.decode() if isinstance(value, bytes) else value


@dataclass(frozen=True)
class CudaOp:
    """A registered op: its .cu source, check(spec) and run(call, *inputs)."""

    op_type: str
    domain: str
    source: str
    check: object
    run: object


OPS = {}
NOT_REGISTERED = "no CUDA C++ kernel in ortlab/cuda/kernels for this op"


def register_cuda_op(op_type, domain, source):
    """Decorator of `run(call, *inputs)`; its `check(spec)` is given as `run.check`."""
    def add(run):
        key = (op_type, domain)
        if key in OPS:
            raise OrtlabError(f"a CUDA op kernel for {domain or 'ai.onnx'}:{op_type} is already registered")
        OPS[key] = CudaOp(op_type, domain, source, run.check, run)
        return run
    return add


def registered(op_type, domain):
    """The CudaOp registered for (op_type, domain) ('' and 'ai.onnx' both name ONNX's domain), or None."""
    return OPS.get((op_type, "" if domain in (None, "", "ai.onnx") else domain))


def find(op_type, domain, spec):
    """(CudaOp, None) when a registered op accepts `spec`, else (None, why not)."""
    op = registered(op_type, domain)
    if op is None:
        return None, NOT_REGISTERED
    why = op.check(spec)
    return (None, why) if why else (op, None)


def run_op(op_type, domain, attributes, inputs, call=None):
    """The outputs of one op on numpy (or the launcher's) arrays, after the same check a partitioner makes."""
    op = registered(op_type, domain)
    if op is None:
        raise CudaOpError(f"no CUDA C++ kernel for {domain or 'ai.onnx'}:{op_type}; registered: {sorted(OPS)}")
    spec = NodeSpec(dict(attributes), tuple(None if a is None else str(np.asarray(a).dtype) for a in inputs),
                    tuple(None if a is None else np.ndim(a) for a in inputs),
                    {i: np.asarray(a) for i, a in enumerate(inputs) if a is not None})
    why = op.check(spec)
    if why:
        raise CudaOpError(f"the CUDA kernel for {op_type} declines these inputs: {why}")
    call = call or OpCall(dict(attributes))
    return list(op.run(call, *inputs))


# ---- shared pieces ------------------------------------------------------------------------------
F32 = ("float32",)


def _dtypes(spec, wanted):
    """Why not, when an input's dtype is not among wanted[i] (None: the input may be absent)."""
    for i, allowed in wanted.items():
        got = spec.dtype(i)
        if got is not None and got not in allowed:
            return (f"input {i} is {got}; the .cu kernel takes {' or '.join(allowed)} "
                    "(ORT's CUDA kernel also has float16/double/bfloat16 versions)")
    return None


def _round32(n, most):
    return int(min(most, max(32, -(-n // 32) * 32)))


def _row_geometry(launcher, rows, cols):
    """(grid, block) of a block-per-row kernel: whole warps up to the launcher's block, at most max_grid."""
    return max(1, min(rows, launcher.max_grid)), _round32(cols, launcher.block)


def _flat_geometry(launcher, n):
    """(grid, block) of a grid-stride elementwise kernel over n elements."""
    block = launcher.block
    return max(1, min(-(-n // block), launcher.max_grid)), block


def _f32(xp, a):
    return xp.ascontiguousarray(a, dtype=xp.float32)


def _axis(axis, rank, what):
    if not -rank <= axis < max(rank, 1):
        raise CudaOpError(f"{what}: axis {axis} is out of range for a rank-{rank} input")
    return axis + rank if axis < 0 else axis


# ---- ReduceSum ----------------------------------------------------------------------------------
def _reduce_axes(given, rank, attributes):
    """(sorted axes reduced, None) or (None, why): the trailing axes only (reduce_sum_last_axis over
    [rows, cols]); empty axes reduce all, or none with noop_with_empty_axes. rank None (unknown): only
    negative axes -k..-1 can be checked, and are returned as they are."""
    axes = given
    if axes is not None and np.ndim(axes) != 1:
        return None, (f"axes of shape {np.shape(axes)}: ORT takes a vector of axes ('An axes tensor must be a "
                      "vector tensor', core/providers/cpu/reduction/reduction_ops.cc)")
    if rank is None:
        negative = sorted({int(a) for a in np.reshape(axes, -1)}) if axes is not None and np.size(axes) else None
        if negative is None or negative != list(range(-len(negative), 0)):
            return None, ("the input's rank is unknown: the axes must be -k..-1 (the trailing axes counted from "
                          "the end) to be checked when partitioning")
        return negative, None
    if axes is None or np.size(axes) == 0:
        if attributes.get("noop_with_empty_axes", 0):
            return [], None
        return list(range(rank)), None
    axes = sorted({int(a) + rank if int(a) < 0 else int(a) for a in np.reshape(axes, -1)})
    if any(not 0 <= a < max(rank, 1) for a in axes):
        return None, f"axes {list(np.reshape(given, -1))} out of range for a rank-{rank} input"
    if axes != list(range(rank - len(axes), rank)):
        return None, (f"axes {axes} of a rank-{rank} input are not the trailing axes: reduce_sum.cu reduces the "
                      "last axes of a [rows, cols] view (ORT's CUDA ReduceSum, through cuDNN, reduces any axes)")
    return axes, None


def _reduce_sum_check(spec):
    if why := _dtypes(spec, {0: F32, 1: ("int64",)}):
        return why
    if spec.opset < 13:
        axes = spec.attributes.get("axes")
    elif spec.dtype(1) is None:
        axes = None
    elif 1 in spec.constants:
        axes = spec.constants[1]
    else:
        return ("axes is a runtime input, not a constant: the kernel reduces trailing axes only, which is "
                "checked when partitioning")
    return _reduce_axes(axes, spec.rank(0), spec.attributes)[1]


def reduce_sum(call, x, axes=None):
    """y = sum of x over its trailing `axes` (keepdims as the attribute says): reduce_sum_last_axis on
    x viewed as [rows, cols], cols the product of the reduced axes. No axes with noop_with_empty_axes give
    x, as ONNX says (ORT 1.19.2's CPU kernel fails when the axes input is left out)."""
    rank = x.ndim
    axes = call.attribute("axes") if axes is None else axes
    found, why = _reduce_axes(axes, rank, call.attributes)
    if why:
        raise CudaOpError(f"ReduceSum: {why}")
    lead = x.shape[:rank - len(found)]
    rows, cols = int(np.prod(lead, dtype=np.int64)), int(np.prod(x.shape[rank - len(found):], dtype=np.int64))
    launcher = call.launcher("reduce_sum")
    xp = launcher.xp
    y = xp.zeros(rows, xp.float32)
    if rows and cols:
        grid, block = _row_geometry(launcher, rows, cols)
        launcher("reduce_sum_last_axis", grid, block, _f32(xp, x).reshape(rows, cols), y, rows, cols)
    shape = lead + ((1,) * len(found) if call.attribute("keepdims", 1) else ())
    return [y.reshape(shape)]


reduce_sum.check = _reduce_sum_check
register_cuda_op("ReduceSum", "", "reduce_sum")(reduce_sum)


# ---- Dropout, DropoutGrad -----------------------------------------------------------------------
GOLDEN = 0x9E3779B97F4A7C15  # dropout.cu's hash step: seed + n * GOLDEN continues the stream n draws on
DEFAULT_SEED = 0x5EED
FLOATS = ("float16", "float32", "float64")


def _ratio(value, default=0.5):
    ratio = default if value is None else float(np.asarray(value).reshape(-1)[0])
    if not 0.0 <= ratio < 1.0:
        raise CudaOpError(f"Dropout ratio must be in [0, 1), got {ratio} (ORT's kernels refuse it too)")
    return ratio


def _dropout_check(spec):
    if spec.opset < 12:
        return "Dropout before opset 12 takes its ratio as an attribute; the kernel follows opset 12+ (ratio input)"
    return _dtypes(spec, {0: F32, 1: FLOATS, 2: ("bool",)})


def dropout(call, x, ratio=None, training_mode=None):
    """(y, mask): in training, mask = draw < 1 - ratio, y = x * mask / (1 - ratio); in inference y = x and
    the mask is all true (the kernel with ratio 0). The draws come from dropout.cu's counter-based hash,
    not ORT's Philox (curand's Philox4_32_10): the masks differ from ORT's, their statistics do not. Each
    node keeps its generator's offset in call.state, advanced by the elements drawn, as ORT's
    PhiloxGenerator advances its offset, so a second run draws a new mask."""
    training = bool(np.asarray(training_mode).reshape(-1)[0]) if training_mode is not None else False
    checked = _ratio(ratio)  # in either mode, as ORT's kernels check it (cpu/nn/dropout_op.h, cuda/nn/dropout.cc)
    ratio = checked if training else 0.0
    launcher = call.launcher("dropout")
    xp = launcher.xp
    n = int(x.size)
    seed = int(call.attribute("seed", DEFAULT_SEED))
    offset = call.state.get("offset", 0)
    call.state["offset"] = offset + n
    stream = (seed + offset * GOLDEN) % (1 << 64)
    y, mask = xp.zeros(x.shape, xp.float32), xp.zeros(x.shape, xp.bool_)
    if n:
        grid, block = _flat_geometry(launcher, n)
        launcher("dropout", grid, block, _f32(xp, x), y, mask, ratio, n, stream)
    return [y, mask]


dropout.check = _dropout_check
register_cuda_op("Dropout", "", "dropout")(dropout)


def _dropout_grad_check(spec):
    return _dtypes(spec, {0: F32, 1: ("bool",), 2: FLOATS, 3: ("bool",)})


def dropout_grad(call, dy, mask, ratio=None, training_mode=None):
    """dx = dy * mask / (1 - ratio) (ratio 0.5 when absent; dx = dy at ratio 0): dropout_grad. ORT's
    kernels ignore training_mode here, and so does this one."""
    ratio = _ratio(ratio)
    if tuple(dy.shape) != tuple(mask.shape):
        raise CudaOpError(f"DropoutGrad: dy {tuple(dy.shape)} and mask {tuple(mask.shape)} differ in shape")
    launcher = call.launcher("dropout")
    xp = launcher.xp
    dx = xp.zeros(dy.shape, xp.float32)
    if dy.size:
        grid, block = _flat_geometry(launcher, int(dy.size))
        launcher("dropout_grad", grid, block, _f32(xp, dy), xp.ascontiguousarray(mask), dx, ratio, int(dy.size))
    return [dx]


dropout_grad.check = _dropout_grad_check
register_cuda_op("DropoutGrad", MS, "dropout")(dropout_grad)


# ---- LayerNormalization, LayerNormalizationGrad ------------------------------------------------
def _layer_norm_check(spec):
    if spec.attributes.get("stash_type", 1) != 1:
        return f"stash_type {spec.attributes['stash_type']}: the kernel keeps mean and inv_std in float (1) only"
    return _dtypes(spec, {0: F32, 1: F32, 2: F32})


def _rows_cols(shape, axis, what):
    axis = _axis(axis, len(shape), what)
    rows = int(np.prod(shape[:axis], dtype=np.int64))
    return axis, rows, int(np.prod(shape[axis:], dtype=np.int64))


def _per_row(shape, axis):
    """Mean's and InvStdDev's shape: the leading axes, then ones (ORT: LayerNormalization's stat shape)."""
    return tuple(shape[:axis]) + (1,) * (len(shape) - axis)


def _check_size(array, cols, what):
    if array is not None and int(array.size) != cols:
        raise CudaOpError(f"LayerNormalization: {what} has {int(array.size)} elements, the normalized axes "
                          f"{cols}; it must match them (as ORT checks)")


def layer_norm(call, x, scale, bias=None):
    """(y, mean, inv_std) over the axes from `axis` on: layer_norm on x as [rows, cols] (Welford's
    mean and variance, y = (x - mean) * inv_std * scale + bias); no bias adds zeros. ORT 1.19.2's CPU
    kernel takes var = E[x^2] - E[x]^2 in float, which cancels to NaN for rows far from zero relative to
    their spread ([30000, 30001, 30002]); the centred Welford sums here do not."""
    axis, rows, cols = _rows_cols(x.shape, call.attribute("axis", -1), "LayerNormalization")
    _check_size(scale, cols, "scale")
    _check_size(bias, cols, "bias")
    launcher = call.launcher("layer_norm")
    xp = launcher.xp
    y, mean, inv_std = xp.zeros(x.shape, xp.float32), xp.zeros(rows, xp.float32), xp.zeros(rows, xp.float32)
    bias = xp.zeros(cols, xp.float32) if bias is None else bias
    if rows and cols:
        grid, block = _row_geometry(launcher, rows, cols)
        launcher("layer_norm", grid, block, _f32(xp, x).reshape(rows, cols), _f32(xp, scale).reshape(-1),
                 _f32(xp, bias).reshape(-1), y.reshape(rows, cols), mean, inv_std, rows, cols,
                 float(call.attribute("epsilon", 1e-5)))
    stat = _per_row(x.shape, axis)
    return [y, mean.reshape(stat), inv_std.reshape(stat)]


layer_norm.check = _layer_norm_check
register_cuda_op("LayerNormalization", "", "layer_norm")(layer_norm)


def _layer_norm_grad_check(spec):
    return _dtypes(spec, {i: F32 for i in range(5)})


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
    launcher = call.launcher("layer_norm")
    xp = launcher.xp
    dx, dscale, dbias = xp.zeros(x.shape, xp.float32), xp.zeros(cols, xp.float32), xp.zeros(cols, xp.float32)
    if rows and cols:
        views = (_f32(xp, dy).reshape(rows, cols), _f32(xp, x).reshape(rows, cols))
        stats = (_f32(xp, mean).reshape(-1), _f32(xp, inv_std).reshape(-1))
        grid, block = _row_geometry(launcher, rows, cols)
        launcher("layer_norm_grad_input", grid, block, *views, _f32(xp, scale).reshape(-1), *stats,
                 dx.reshape(rows, cols), rows, cols)
        grid, block = _flat_geometry(launcher, cols)
        launcher("layer_norm_grad_scale_bias", grid, block, *views, *stats, dscale, dbias, rows, cols)
    return [dx, dscale.reshape(scale.shape), dbias.reshape(scale.shape)]


layer_norm_grad.check = _layer_norm_grad_check
register_cuda_op("LayerNormalizationGrad", MS, "layer_norm")(layer_norm_grad)


# ---- SoftmaxCrossEntropyLoss and its Grad -------------------------------------------------------
# ignore_index absent: ORT 1.19.2's kernels ignore label -1 (the default of orttraining/orttraining/
# training_ops/cpu/loss/softmax_cross_entropy_loss.cc and cuda/loss/softmax_cross_entropy_loss_impl.cc)
DEFAULT_IGNORE = -1
LABELS = ("int32", "int64")


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
    grid, block = _flat_geometry(launcher, n)
    launcher("cross_entropy_terms", grid, block, log_prob, labels, term, weight, n, classes, ignore)
    loss, weight_sum = xp.zeros(1, xp.float32), xp.zeros(1, xp.float32)
    launcher("cross_entropy_mean", 1, _round32(n, 1024), term, weight, loss, weight_sum, n)
    return loss, weight_sum


def softmax_cross_entropy(call, scores, labels, weights=None):
    """(loss, log_prob): log_prob = log_softmax(scores) per row, loss = mean over the samples not ignored
    of -log_prob[i, label_i] (0 when all are ignored, as ORT's kernels give)."""
    launcher = call.launcher("softmax_cross_entropy")
    xp = launcher.xp
    n, classes = scores.shape
    labels, ignore = _labels(call, launcher, labels, n, classes)
    log_prob = xp.zeros((n, classes), xp.float32)
    loss = xp.zeros(1, xp.float32)
    if n and classes:
        grid, block = _row_geometry(launcher, n, classes)
        launcher("log_softmax_rows", grid, block, _f32(xp, scores), log_prob, n, classes)
        loss, _ = _weight_sum(launcher, log_prob, labels, ignore)
    return [loss.reshape(()), log_prob]


softmax_cross_entropy.check = lambda spec: (_sce_check(spec, 2)
                                            or _dtypes(spec, {0: F32, 1: LABELS}))
register_cuda_op("SoftmaxCrossEntropyLoss", "", "softmax_cross_entropy")(softmax_cross_entropy)


def softmax_cross_entropy_grad(call, dy, log_prob, labels, weights=None):
    """dscores[i, c] = dy * w_i / sum(w) * (exp(log_prob[i, c]) - (c == label_i)), w_i = 0 for an
    ignored sample: the weight sum by cross_entropy_terms + cross_entropy_mean, then cross_entropy_grad."""
    launcher = call.launcher("softmax_cross_entropy")
    xp = launcher.xp
    n, classes = log_prob.shape
    if int(dy.size) != 1:
        raise CudaOpError(f"SoftmaxCrossEntropyLossGrad: dY has shape {tuple(dy.shape)}; reduction 'mean' "
                          "gives one loss, so dY is one value")
    labels, ignore = _labels(call, launcher, labels, n, classes)
    dscores = xp.zeros((n, classes), xp.float32)
    if n and classes:
        log_prob = _f32(xp, log_prob)
        _, weight_sum = _weight_sum(launcher, log_prob, labels, ignore)
        grid, block = _flat_geometry(launcher, n * classes)
        launcher("cross_entropy_grad", grid, block, _f32(xp, dy).reshape(1), log_prob, labels, weight_sum,
                 dscores, n, classes, ignore)
    return [dscores]


softmax_cross_entropy_grad.check = lambda spec: (_sce_check(spec, 3)
                                                 or _dtypes(spec, {0: F32, 1: F32, 2: LABELS}))
register_cuda_op("SoftmaxCrossEntropyLossGrad", MS, "softmax_cross_entropy")(softmax_cross_entropy_grad)


# ---- GatherGrad ---------------------------------------------------------------------------------
PATHS = ("sorted", "atomic")


def _gather_grad_check(spec):
    return _dtypes(spec, {0: ("int64",), 1: LABELS, 2: F32})


def gather_grad(call, shape, indices, dy):
    """dx = zeros(shape); dx[..., indices[i], ...] += dy[..., i, ...] along `axis`. call.options["path"]:
    "sorted" (default, deterministic: ORT's CUDA GatherGrad always sorts, gather_grad_impl.cu) runs
    gather_grad_sort then gather_grad_sorted; "atomic" runs gather_grad_atomic (order-dependent sums)."""
    path = call.options.get("path", "sorted")
    if path not in PATHS:
        raise CudaOpError(f"GatherGrad path {path!r}: choose one of {PATHS}")
    shape = tuple(int(d) for d in np.asarray(shape).reshape(-1))
    axis = _axis(int(call.attribute("axis", 0)), len(shape), "GatherGrad")
    outer, gather_dim = int(np.prod(shape[:axis], dtype=np.int64)), shape[axis]
    inner, n = int(np.prod(shape[axis + 1:], dtype=np.int64)), int(indices.size)
    expected = shape[:axis] + tuple(indices.shape) + shape[axis + 1:]
    if tuple(dy.shape) != expected:
        raise CudaOpError(f"GatherGrad: dY has shape {tuple(dy.shape)}; shape {list(shape)}, axis {axis} and "
                          f"indices {tuple(indices.shape)} make it {expected}")
    launcher = call.launcher("gather_grad")
    xp = launcher.xp
    host = np.asarray(launcher.to_numpy(indices)).reshape(-1)
    if host.size and (host.min() < -gather_dim or host.max() >= gather_dim):
        raise CudaOpError(f"GatherGrad: an index is outside [-{gather_dim}, {gather_dim}) (axis {axis} has "
                          f"{gather_dim} entries)")
    flat = xp.ascontiguousarray(indices, dtype=xp.int64).reshape(-1)
    dx = xp.zeros(shape, xp.float32)
    total = outer * n * inner
    if total:
        dy = _f32(xp, dy)
        grid, block = _flat_geometry(launcher, total)
        if path == "atomic":
            launcher("gather_grad_atomic", grid, block, dy, flat, dx, outer, n, gather_dim, inner)
        else:
            sorted_index, sorted_position = xp.zeros(n, xp.int64), xp.zeros(n, xp.int64)
            launcher("gather_grad_sort", *_flat_geometry(launcher, n), flat, sorted_index, sorted_position, n,
                     gather_dim)
            launcher("gather_grad_sorted", grid, block, dy, sorted_index, sorted_position, dx, outer, n,
                     gather_dim, inner)
    return [dx]


gather_grad.check = _gather_grad_check
register_cuda_op("GatherGrad", MS, "gather_grad")(gather_grad)

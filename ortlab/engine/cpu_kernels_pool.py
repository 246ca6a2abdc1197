"""The CPU kernel for MaxPool, computed as ORT 1.19.2 computes it: ORT's pooled length with ceil_mode (a last
window that starts past the input is kept), and ORT's Indices output (its output size, values and indices),
where onnx.reference follows the opset-22 rule and gives other indices where windows overlap.

Found by tools/probe_reference_vs_ort.py; checked by tests/engine/test_engine_backend_cases.py (with the other
ORT-behaviour kernels of cpu_kernels.py).
"""
import numpy as np

from ortlab.engine.cpu_execution_provider import ReferenceKernel
from ortlab.engine.kernel_registry import CPU, register_op_kernel


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

"""BiasSoftmax, the Level 3 fused kernel: y = softmax(x + bias) in one pass.

Unfused, Add writes x + bias to memory and Softmax reads it back: 5 tensor-sized transfers
(read x, read bias, write sum, read sum, write y) where the fused kernel needs 3 (bias is
usually much smaller, so nearer 2). ORT has this kernel on CUDA and ROCm only; the
BiasSoftmaxFusion transformer (ortlab.transformers.bias_fusions) creates the node.

Semantics follow ORT: the softmax runs over all dimensions from `axis` on (element_count),
and the bias is broadcast either over the leading dimensions (is_inner_broadcast=0: bias row
= row % bias_rows) or over the dimensions between the batch and `axis` (is_inner_broadcast=1:
bias row = row // (rows / bias_rows)), as in attention masks of shape (B, 1, 1, S).
Mirrors onnxruntime/contrib_ops/cuda/math/bias_softmax.cc and bias_softmax_impl.cu.
"""
import numpy as np
import torch
from ortlab import env  # noqa: F401 - before triton: it sets TRITON_INTERPRET (no GPU), which Triton reads once
import triton.language as tl
import triton

from ortlab.onnx_defs import MS_DOMAIN
from ortlab.triton_kernels.executor import block_size, launch
from ortlab.triton_kernels.kernel_def import Arg, Kernel
from ortlab.ops.reference import bias_softmax_reference
from ortlab.ops.rows import flatten_from, normalize_axis
from ortlab.triton_kernels.registry import register_kernel


@triton.jit
def bias_softmax_kernel(x_ptr, bias_ptr, y_ptr, n_cols, bias_rows, rows_per_bias_row,
                        INNER: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    if INNER:
        bias_row = row // rows_per_bias_row
    else:
        bias_row = row % bias_rows
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    x += tl.load(bias_ptr + bias_row * n_cols + cols, mask=mask, other=0.0)
    e = tl.where(mask, tl.exp(x - tl.max(x, axis=0)), 0.0)
    tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)


@register_kernel
class BiasSoftmax(Kernel):
    """y = softmax(data + bias) over dims axis.. with ORT's two bias broadcasts (com.microsoft)."""

    op_type, domain = "BiasSoftmax", MS_DOMAIN
    inputs = (Arg("data"), Arg("bias"))
    outputs = (Arg("output"),)
    attributes = {"axis": 1, "is_inner_broadcast": 0}
    mirrors = "onnxruntime/contrib_ops/cuda/math/bias_softmax.cc"
    ort_cpu = False

    @classmethod
    def example(cls, rng, rows=3, cols=37):
        """data (2, rows, cols) and a bias (rows, cols) repeated over the leading dimension."""
        return [rng.standard_normal((2, rows, cols)).astype(np.float32),
                rng.standard_normal((rows, cols)).astype(np.float32)], {"axis": 2}

    def broadcast_ok(self, x_shape, bias_shape, axis):
        rank = len(x_shape)
        if len(bias_shape) > rank:
            return False
        b = (1,) * (rank - len(bias_shape)) + tuple(bias_shape)
        if b[axis:] != tuple(x_shape[axis:]):
            return False
        lead = b[:axis]
        if self.is_inner_broadcast:  # x's leading dims, then ones up to axis
            k = next((i for i, d in enumerate(lead) if d == 1), axis)
            return lead[:k] == tuple(x_shape[:k]) and all(d == 1 for d in lead[k:])
        k = next((i for i, d in enumerate(lead) if d != 1), axis)  # ones, then x's dims
        return lead[k:] == tuple(x_shape[k:axis])

    def check_shapes(self, x, bias):
        axis = normalize_axis(self.axis, x.ndim, self)
        kind = "inner" if self.is_inner_broadcast else "outer"
        self.expect(self.broadcast_ok(x.shape, bias.shape, axis),
                    f"input 1 'bias' {bias.shape} cannot be {kind}-broadcast to input 0 "
                    f"'data' {x.shape} with axis={axis}: is_inner_broadcast=0 wants bias = "
                    "ones + data's trailing dims, 1 wants data's leading dims + ones + data's "
                    "dims from axis")

    def reference(self, x, bias):
        return (bias_softmax_reference(x, bias, normalize_axis(self.axis, x.ndim, self)),)

    def compute(self, x, bias):
        axis = normalize_axis(self.axis, x.dim(), self)
        rows, cols = flatten_from(tuple(x.shape), axis)
        bias_rows = bias.numel() // cols
        y = torch.empty_like(x)
        launch(bias_softmax_kernel, rows, x.contiguous(), bias.contiguous(), y, cols, bias_rows,
               max(rows // bias_rows, 1), INNER=bool(self.is_inner_broadcast), BLOCK=block_size(cols))
        return (y,)

    def flops(self, x, bias):
        return 6 * np.asarray(x).size

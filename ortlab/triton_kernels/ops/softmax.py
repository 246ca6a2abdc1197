"""Softmax (opset 13) and SoftmaxGrad_13: one program per row, the whole row in one block.

  Softmax:        y  = exp(x - max x) / sum exp(x - max x)       along `axis`
  SoftmaxGrad_13: dx = y * (dy - sum(dy * y))                    along `axis`

Subtracting the row maximum keeps exp from overflowing; the masked lanes of the block load
-inf (for the max) and 0 (for the sums), so rows whose length is not a power of two work.
Mirrors onnxruntime/core/providers/cuda/math/softmax.cc with softmax_warpwise_impl.cuh and
orttraining/orttraining/training_ops/cuda/math/softmax_grad.cc.
"""
import numpy as np
import torch
from ortlab import env  # noqa: F401 - before triton: it sets TRITON_INTERPRET (no GPU), which Triton reads once
import triton.language as tl
import triton

from ortlab.onnx_defs import MS_DOMAIN
from ortlab.triton_kernels.executor import block_size, launch
from ortlab.triton_kernels.kernel_def import Arg, Kernel
from ortlab.ops.reference import softmax_grad_reference, softmax_reference
from ortlab.ops.rows import as_rows, from_rows, normalize_axis
from ortlab.triton_kernels.registry import register_kernel


@triton.jit
def softmax_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    e = tl.exp(x - tl.max(x, axis=0))
    e = tl.where(mask, e, 0.0)
    tl.store(y_ptr + row * n_cols + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def softmax_grad_kernel(dy_ptr, y_ptr, dx_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    dy = tl.load(dy_ptr + row * n_cols + cols, mask=mask, other=0.0)
    y = tl.load(y_ptr + row * n_cols + cols, mask=mask, other=0.0)
    dot = tl.sum(dy * y, axis=0)
    tl.store(dx_ptr + row * n_cols + cols, y * (dy - dot), mask=mask)


def row_softmax(x2d):
    """Softmax over the last axis of a contiguous 2-D tensor (one launch, one program per row)."""
    y = torch.empty_like(x2d)
    launch(softmax_kernel, x2d.shape[0], x2d, y, x2d.shape[1], BLOCK=block_size(x2d.shape[1]))
    return y


@register_kernel
class Softmax(Kernel):
    """y = softmax(x) along `axis` (ONNX opset 13 semantics: one axis, default -1)."""

    op_type = "Softmax"
    inputs = (Arg("input"),)
    outputs = (Arg("output"),)
    attributes = {"axis": -1}
    mirrors = "onnxruntime/core/providers/cuda/math/softmax.cc"

    def check_shapes(self, x):
        self.expect(x.ndim >= 1, "input 0 'input' must have rank 1 or more")
        normalize_axis(self.axis, x.ndim, self)

    def reference(self, x):
        return (softmax_reference(x, self.axis),)

    def compute(self, x):
        rows, layout = as_rows(x, normalize_axis(self.axis, x.dim(), self))
        return (from_rows(row_softmax(rows), layout),)

    def flops(self, x):
        return 5 * np.asarray(x).size  # max, subtract, exp, sum, divide


@register_kernel
class SoftmaxGrad_13(Kernel):
    """dX = Y * (dY - sum(dY * Y, axis)) (com.microsoft training op, opset-13 axis semantics)."""

    op_type, domain = "SoftmaxGrad_13", MS_DOMAIN
    inputs = (Arg("dY"), Arg("Y"))
    outputs = (Arg("dX"),)
    attributes = {"axis": -1}
    mirrors = "orttraining/orttraining/training_ops/cuda/math/softmax_grad.cc"

    def check_shapes(self, dy, y):
        self.expect(dy.shape == y.shape, f"input 0 'dY' {dy.shape} and input 1 'Y' {y.shape} "
                    "must have the same shape")
        self.expect(y.ndim >= 1, "inputs must have rank 1 or more")
        normalize_axis(self.axis, y.ndim, self)

    def reference(self, dy, y):
        return (softmax_grad_reference(dy, y, self.axis),)

    def compute(self, dy, y):
        axis = normalize_axis(self.axis, y.dim(), self)
        dy_rows, _ = as_rows(dy, axis)
        y_rows, layout = as_rows(y, axis)
        dx = torch.empty_like(y_rows)
        launch(softmax_grad_kernel, y_rows.shape[0], dy_rows, y_rows, dx, y_rows.shape[1],
               BLOCK=block_size(y_rows.shape[1]))
        return (from_rows(dx, layout),)

    def flops(self, dy, y):
        return 4 * np.asarray(y).size

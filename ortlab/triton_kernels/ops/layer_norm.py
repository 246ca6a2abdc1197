"""LayerNormalization and LayerNormalizationGrad, over the dimensions from `axis` on.

  forward:  mu = mean(x), rstd = 1 / sqrt(var(x) + eps), xhat = (x - mu) * rstd,
            y = xhat * scale + bias                 (saves mu and rstd for the backward)
  backward: g = dy * scale,
            dx = rstd * (g - mean(g) - xhat * mean(g * xhat))
            dscale = sum over rows of dy * xhat,  dbias = sum over rows of dy

The forward is one program per row. The parameter gradients are column sums over all rows,
done in two stages as ORT's CUDA kernel does: stage 1 gives each program a group of rows and
writes one partial sum per group; stage 2 sums the partials column by column. No atomics,
so the result is deterministic. Mirrors onnxruntime/contrib_ops/cuda/layer_norm.cc
(layer_norm_impl.cu) and orttraining/orttraining/training_ops/cuda/nn/layer_norm.cc
(layer_norm_impl.cu: cuComputePartGradGammaBeta, then cuComputeGradGammaBeta).
"""
import numpy as np
import torch
from ortlab import env  # noqa: F401 - before triton: it sets TRITON_INTERPRET (no GPU), which Triton reads once
import triton
import triton.language as tl

from ortlab.onnx_defs import MS_DOMAIN
from ortlab.triton_kernels.executor import block_size, launch
from ortlab.triton_kernels.kernel_def import Arg, Kernel
from ortlab.ops.reference import layer_norm_grad_reference, layer_norm_reference
from ortlab.ops.rows import flatten_from, normalize_axis, stats_shape
from ortlab.triton_kernels.registry import register_kernel

ROWS_PER_GROUP = 16


@triton.jit
def layer_norm_kernel(x_ptr, scale_ptr, bias_ptr, y_ptr, mean_ptr, rstd_ptr, n_cols, eps,
                      HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    mean = tl.sum(x, axis=0) / n_cols
    centered = tl.where(mask, x - mean, 0.0)
    rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
    y = centered * rstd * tl.load(scale_ptr + cols, mask=mask)
    if HAS_BIAS:
        y += tl.load(bias_ptr + cols, mask=mask)
    tl.store(y_ptr + row * n_cols + cols, y, mask=mask)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)


@triton.jit
def layer_norm_grad_dx_kernel(dy_ptr, x_ptr, scale_ptr, mean_ptr, rstd_ptr, dx_ptr,
                              part_dscale_ptr, part_dbias_ptr, n_rows, n_cols,
                              ROWS: tl.constexpr, BLOCK: tl.constexpr):
    group = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    scale = tl.load(scale_ptr + cols, mask=mask, other=0.0)
    part_dscale = tl.zeros([BLOCK], dtype=tl.float32)
    part_dbias = tl.zeros([BLOCK], dtype=tl.float32)
    for i in range(ROWS):
        row = group * ROWS + i
        if row < n_rows:
            dy = tl.load(dy_ptr + row * n_cols + cols, mask=mask, other=0.0)
            x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
            rstd = tl.load(rstd_ptr + row)
            xhat = tl.where(mask, (x - tl.load(mean_ptr + row)) * rstd, 0.0)
            g = dy * scale
            dx = rstd * (g - tl.sum(g, axis=0) / n_cols - xhat * (tl.sum(g * xhat, axis=0) / n_cols))
            tl.store(dx_ptr + row * n_cols + cols, dx, mask=mask)
            part_dscale += dy * xhat
            part_dbias += dy
    tl.store(part_dscale_ptr + group * n_cols + cols, part_dscale, mask=mask)
    tl.store(part_dbias_ptr + group * n_cols + cols, part_dbias, mask=mask)


@triton.jit
def column_sum_kernel(part_ptr, out_ptr, n_groups, n_cols, BLOCK: tl.constexpr):
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < n_cols
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for g in range(0, n_groups):
        acc += tl.load(part_ptr + g * n_cols + cols, mask=mask, other=0.0)
    tl.store(out_ptr + cols, acc, mask=mask)


@register_kernel
class LayerNormalization(Kernel):
    """Y = (X - mean) / sqrt(var + epsilon) * Scale + B over dims axis.. (ONNX opset 17)."""

    op_type = "LayerNormalization"
    inputs = (Arg("X"), Arg("Scale"), Arg("B", optional=True))
    outputs = (Arg("Y"), Arg("Mean", optional=True), Arg("InvStdDev", optional=True))
    attributes = {"axis": -1, "epsilon": 1e-5, "stash_type": 1}
    mirrors = "onnxruntime/contrib_ops/cuda/layer_norm.cc"

    def check_shapes(self, x, scale, bias):
        axis = normalize_axis(self.axis, x.ndim, self)
        self.expect(x.ndim >= 1, "input 0 'X' must have rank 1 or more")
        for i, name, p in ((1, "Scale", scale), (2, "B", bias)):
            self.expect(p is None or p.size == flatten_from(x.shape, axis)[1],
                        f"input {i} '{name}' must hold X.shape[{axis}:] = {x.shape[axis:]} "
                        f"elements, got shape {p.shape if p is not None else None}")

    @classmethod
    def example(cls, rng, rows=3, cols=37):
        return [rng.standard_normal(shape).astype(np.float32) for shape in ((rows, cols), cols, cols)], {}

    def reference(self, x, scale, bias=None):
        return layer_norm_reference(x, scale, bias, normalize_axis(self.axis, x.ndim, self), self.epsilon)

    def compute(self, x, scale, bias=None):
        axis = normalize_axis(self.axis, x.dim(), self)
        rows, cols = flatten_from(tuple(x.shape), axis)
        y = torch.empty_like(x)
        mean = torch.empty(stats_shape(tuple(x.shape), axis), dtype=torch.float32, device=x.device)
        rstd = torch.empty_like(mean)
        launch(layer_norm_kernel, rows, x.contiguous(), scale, scale if bias is None else bias, y,
               mean, rstd, cols, float(self.epsilon), HAS_BIAS=bias is not None,
               BLOCK=block_size(cols))
        return y, mean, rstd

    def flops(self, x, scale, bias=None):
        return 8 * np.asarray(x).size


@register_kernel
class LayerNormalizationGrad(Kernel):
    """dX, dScale, dBias of LayerNormalization from the saved mean and inverse std (com.microsoft)."""

    op_type, domain = "LayerNormalizationGrad", MS_DOMAIN
    inputs = (Arg("Y_grad"), Arg("X"), Arg("scale"), Arg("mean"), Arg("inv_std_var"))
    outputs = (Arg("X_grad"), Arg("scale_grad"), Arg("bias_grad"))
    attributes = {"axis": -1}
    mirrors = "orttraining/orttraining/training_ops/cuda/nn/layer_norm.cc"

    def check_shapes(self, dy, x, scale, mean, rstd):
        axis = normalize_axis(self.axis, x.ndim, self)
        rows, cols = flatten_from(x.shape, axis)
        self.expect(dy.shape == x.shape, f"input 0 'Y_grad' {dy.shape} must match input 1 'X' {x.shape}")
        self.expect(scale.size == cols, f"input 2 'scale' must hold {cols} elements "
                    f"(X.shape[{axis}:] = {x.shape[axis:]}), got shape {scale.shape}")
        for i, name, s in ((3, "mean", mean), (4, "inv_std_var", rstd)):
            self.expect(s.size == rows, f"input {i} '{name}' must hold one value per row "
                        f"({rows} = prod X.shape[:{axis}]), got shape {s.shape}")

    @classmethod
    def example(cls, rng, rows=3, cols=37):
        """dY and X (rows, cols), scale (cols,), and the mean and inverse std X's forward saves."""
        dy, x = (rng.standard_normal((rows, cols)).astype(np.float32) for _ in range(2))
        scale = rng.standard_normal(cols).astype(np.float32)
        _, mean, inv_std = layer_norm_reference(x, scale, axis=1)
        return [dy, x, scale, mean, inv_std], {}

    def reference(self, dy, x, scale, mean, rstd):
        return layer_norm_grad_reference(dy, x, scale, mean, rstd, normalize_axis(self.axis, x.ndim, self))

    def compute(self, dy, x, scale, mean, rstd):
        axis = normalize_axis(self.axis, x.dim(), self)
        rows, cols = flatten_from(tuple(x.shape), axis)
        groups = triton.cdiv(rows, ROWS_PER_GROUP)
        dx = torch.empty_like(x)
        part_dscale = torch.empty((groups, cols), dtype=torch.float32, device=x.device)
        part_dbias = torch.empty_like(part_dscale)
        launch(layer_norm_grad_dx_kernel, groups, dy.contiguous(), x.contiguous(), scale, mean, rstd,
               dx, part_dscale, part_dbias, rows, cols, ROWS=ROWS_PER_GROUP, BLOCK=block_size(cols))
        dscale, dbias = torch.empty_like(scale), torch.empty_like(scale)
        for part, out in ((part_dscale, dscale), (part_dbias, dbias)):
            launch(column_sum_kernel, triton.cdiv(cols, 128), part, out, groups, cols, BLOCK=128)
        return dx, dscale, dbias

    def flops(self, dy, x, *rest):
        return 12 * np.asarray(x).size

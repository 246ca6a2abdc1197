"""ReduceSum (opset 13) over any axes: move the reduced axes last, then one program per row.

  y[kept indices] = sum over the reduced axes of x

Each program walks its row in BLOCK-sized chunks, accumulating in a vector and summing the
vector once at the end (a tree reduction inside the block), so rows of any length work.
Mirrors onnxruntime/core/providers/cuda/reduction/reduction_ops.cc (which hands the work to
cuDNN or to its own reduction_functions.cu kernels).
"""
import numpy as np
import torch
from ortlab import env  # noqa: F401 - before triton: it sets TRITON_INTERPRET (no GPU), which Triton reads once
import triton
import triton.language as tl

from ortlab.triton_kernels.executor import block_size, launch
from ortlab.triton_kernels.kernel_def import INDEX, Arg, Kernel
from ortlab.ops.reference import reduce_sum_reference
from ortlab.triton_kernels.registry import register_kernel

MAX_BLOCK = 1024


@triton.jit
def row_sum_kernel(x_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=0.0)
    tl.store(y_ptr + row, tl.sum(acc, axis=0))


def row_sum(x2d):
    """Sum of each row of a contiguous 2-D float tensor: one launch, one program per row."""
    y = torch.empty(x2d.shape[0], dtype=x2d.dtype, device=x2d.device)
    if x2d.shape[1] == 0:
        return y.zero_()
    launch(row_sum_kernel, x2d.shape[0], x2d, y, x2d.shape[1],
           BLOCK=min(MAX_BLOCK, block_size(x2d.shape[1])))
    return y


@register_kernel
class ReduceSum(Kernel):
    """y = x summed over `axes` (an input since opset 13); absent or empty axes mean all axes,
    or none (y = x) with noop_with_empty_axes=1."""

    op_type = "ReduceSum"
    inputs = (Arg("data"), Arg("axes", INDEX, optional=True, ranks=(1,)))
    outputs = (Arg("reduced"),)
    attributes = {"keepdims": 1, "noop_with_empty_axes": 0}
    mirrors = "onnxruntime/core/providers/cuda/reduction/reduction_ops.cc"

    @classmethod
    def example(cls, rng, rows=3, cols=37):
        return [rng.standard_normal((rows, cols)).astype(np.float32), np.array([0], np.int64)], {}

    def reduced_axes(self, rank, axes):
        if axes is None or len(axes) == 0:
            return () if self.noop_with_empty_axes else tuple(range(rank))
        values = [int(a) for a in np.asarray(axes.cpu() if hasattr(axes, "cpu") else axes)]
        self.expect(all(-rank <= a < max(rank, 1) for a in values),
                    f"input 1 'axes' {values} is out of range for rank {rank}")
        normalized = sorted({a % max(rank, 1) for a in values})
        self.expect(len(normalized) == len(values), f"input 1 'axes' {values} repeats an axis")
        return tuple(normalized)

    def check_shapes(self, data, axes):
        self.reduced_axes(data.ndim, axes)

    def reference(self, data, axes=None):
        return (reduce_sum_reference(data, self.reduced_axes(data.ndim, axes), self.keepdims),)

    def compute(self, data, axes=None):
        reduced = self.reduced_axes(data.dim(), axes)
        if not reduced:
            return (data.clone(),)
        kept = [d for d in range(data.dim()) if d not in reduced]
        rows = data.permute(*kept, *reduced).contiguous()
        kept_shape = [data.shape[d] for d in kept]
        y = row_sum(rows.reshape(int(np.prod(kept_shape, dtype=np.int64)), -1))
        if self.keepdims:
            kept_shape = [1 if d in reduced else data.shape[d] for d in range(data.dim())]
        return (y.reshape(kept_shape),)

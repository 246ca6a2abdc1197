"""GatherGrad: the gradient of Gather, a scatter-add of dY rows into a zero tensor.

  dX = zeros(shape);  for every position p of indices:  dX[..., indices[p], ...] += dY[..., p, ...]

Viewed as dX (outer, G, inner) and dY (outer, I, inner): program (o, p) adds dY[o, p, :] into
dX[o, indices[p], :]. Two programs may hit the same row when an index repeats, so the adds
are atomic (`tl.atomic_add`); a float sum in arbitrary order is why ORT's CUDA GatherGrad
offers a deterministic sort-based path too. Mirrors
orttraining/orttraining/training_ops/cuda/tensor/gather_grad.cc and gather_grad_impl.cu.
"""
import numpy as np
import torch
from ortlab import env  # noqa: F401 - before triton: it sets TRITON_INTERPRET (no GPU), which Triton reads once
import triton
import triton.language as tl

from ortlab.onnx_defs import MS_DOMAIN
from ortlab.triton_kernels.executor import block_size, launch
from ortlab.triton_kernels.kernel_def import INDEX, Arg, Kernel
from ortlab.ops.reference import gather_grad_reference
from ortlab.ops.rows import normalize_axis, split_at
from ortlab.triton_kernels.registry import register_kernel

MAX_BLOCK = 1024


@triton.jit
def gather_grad_kernel(indices_ptr, dy_ptr, dx_ptr, n_indices, gather_dim, inner,
                       BLOCK: tl.constexpr):
    program = tl.program_id(0)
    outer, position = program // n_indices, program % n_indices
    index = tl.load(indices_ptr + position)
    index = tl.where(index < 0, index + gather_dim, index)
    for start in range(0, inner, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        mask = cols < inner
        dy = tl.load(dy_ptr + (outer * n_indices + position) * inner + cols, mask=mask, other=0.0)
        tl.atomic_add(dx_ptr + (outer * gather_dim + index) * inner + cols, dy, mask=mask)


@register_kernel
class GatherGrad(Kernel):
    """dX of Gather(X, indices, axis) from dY, given X's shape (com.microsoft training op)."""

    op_type, domain = "GatherGrad", MS_DOMAIN
    inputs = (Arg("shape", ("int64",), ranks=(1,)), Arg("indices", INDEX), Arg("dY"))
    outputs = (Arg("dX"),)
    attributes = {"axis": 0}
    mirrors = "orttraining/orttraining/training_ops/cuda/tensor/gather_grad.cc"

    @classmethod
    def example(cls, rng, rows=3, cols=37):
        """dY (rows, cols) scattered into dX (rows + 2, cols) at random rows (repeats likely)."""
        return [np.array([rows + 2, cols], np.int64), rng.integers(0, rows + 2, rows),
                rng.standard_normal((rows, cols)).astype(np.float32)], {}

    def layout(self, shape, indices):
        """(X's dims, axis, outer, gathered dim, number of indices, inner)."""
        shape = [int(d) for d in shape]
        axis = normalize_axis(self.axis, len(shape), self)
        outer, gather_dim, inner = split_at(shape, axis)
        return shape, axis, outer, gather_dim, int(np.asarray(indices).size), inner

    def check_shapes(self, shape, indices, dy):
        dims, axis, _, gather_dim, _, _ = self.layout(shape, indices)
        expected = tuple(dims[:axis]) + indices.shape + tuple(dims[axis + 1:])
        self.expect(dy.shape == expected, f"input 2 'dY' must have shape {expected} (shape with "
                    f"axis {axis} replaced by indices' shape), got {dy.shape}")
        bad = (indices < -gather_dim) | (indices >= gather_dim)
        self.expect(not bad.any(), f"input 1 'indices' holds {indices[bad][:3].tolist()} "
                    f"outside [-{gather_dim}, {gather_dim})")

    def reference(self, shape, indices, dy):
        return (gather_grad_reference(shape, indices, dy, normalize_axis(self.axis, len(shape), self)),)

    def compute(self, shape, indices, dy):
        dims, axis, outer, gather_dim, n, inner = self.layout(shape.cpu().numpy(), indices.cpu())
        dx = torch.zeros(dims, dtype=dy.dtype, device=dy.device)
        if outer * n * inner:
            launch(gather_grad_kernel, outer * n, indices.reshape(-1).contiguous(),
                   dy.contiguous(), dx, n, gather_dim, inner,
                   BLOCK=min(MAX_BLOCK, block_size(inner)))
        return (dx,)

    def flops(self, shape, indices, dy):
        return np.asarray(dy).size

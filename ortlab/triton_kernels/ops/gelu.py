"""BiasGelu and GeluGrad: elementwise kernels, one program per block of elements.

  BiasGelu:  y  = gelu(a + b),  gelu(x) = x * Phi(x),  Phi(x) = (1 + erf(x / sqrt 2)) / 2
  GeluGrad:  dx = dy * (Phi(x) + x * phi(x)),  phi(x) = exp(-x^2 / 2) / sqrt(2 pi)

Mirrors onnxruntime/contrib_ops/cuda/math/bias_gelu.cc (BiasGelu, bias broadcast over the
last dimension) and orttraining/orttraining/training_ops/cuda/activation/activations_grad.cc
with gelu_grad_impl_common.cuh (GeluGrad).
"""
import numpy as np
import torch
from ortlab import env  # noqa: F401 - before triton: it sets TRITON_INTERPRET (no GPU), which Triton reads once
import triton
import triton.language as tl

from ortlab.onnx_defs import MS_DOMAIN
from ortlab.triton_kernels.executor import launch
from ortlab.triton_kernels.kernel_def import Arg, Kernel
from ortlab.ops.reference import gelu_grad_reference, gelu_reference
from ortlab.triton_kernels.registry import register_kernel

BLOCK = 1024


@triton.jit
def bias_gelu_kernel(a_ptr, b_ptr, y_ptr, n, bias_size, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    x = tl.load(a_ptr + offsets, mask=mask) + tl.load(b_ptr + offsets % bias_size, mask=mask)
    y = x * 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
    tl.store(y_ptr + offsets, y, mask=mask)


@triton.jit
def gelu_grad_kernel(dy_ptr, x_ptr, dx_ptr, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    dy = tl.load(dy_ptr + offsets, mask=mask)
    x = tl.load(x_ptr + offsets, mask=mask)
    cdf = 0.5 * (1.0 + tl.math.erf(x * 0.7071067811865476))
    pdf = tl.exp(-0.5 * x * x) * 0.3989422804014327
    tl.store(dx_ptr + offsets, dy * (cdf + x * pdf), mask=mask)


@register_kernel
class BiasGelu(Kernel):
    """y = gelu(A + B), B a 1-D bias over A's last dimension (com.microsoft)."""

    op_type, domain = "BiasGelu", MS_DOMAIN
    inputs = (Arg("A"), Arg("B", ranks=(1,)))
    outputs = (Arg("C"),)
    mirrors = "onnxruntime/contrib_ops/cuda/math/bias_gelu.cc"

    @classmethod
    def example(cls, rng, rows=3, cols=37):
        return [rng.standard_normal((rows, cols)).astype(np.float32),
                rng.standard_normal(cols).astype(np.float32)], {}

    def check_shapes(self, a, b):
        self.expect(a.ndim >= 1 and b.shape[0] == a.shape[-1],
                    f"input 1 'B' must have A's last dimension ({a.shape[-1:]}), got {b.shape}")

    def reference(self, a, b):
        return (gelu_reference(a + b),)

    def compute(self, a, b):
        y = torch.empty_like(a)
        launch(bias_gelu_kernel, triton.cdiv(a.numel(), BLOCK), a, b, y, a.numel(), b.numel(),
               BLOCK=BLOCK)
        return (y,)

    def flops(self, a, b):
        return 10 * np.asarray(a).size  # add, scale, erf (~5), 1+, two multiplies


@register_kernel
class GeluGrad(Kernel):
    """dX = dY * gelu'(X) (com.microsoft, training op)."""

    op_type, domain = "GeluGrad", MS_DOMAIN
    inputs = (Arg("dY"), Arg("X"))
    outputs = (Arg("dX"),)
    mirrors = "orttraining/orttraining/training_ops/cuda/activation/activations_grad.cc"

    def check_shapes(self, dy, x):
        self.expect(dy.shape == x.shape, f"input 0 'dY' {dy.shape} and input 1 'X' {x.shape} "
                    "must have the same shape")

    def reference(self, dy, x):
        return (gelu_grad_reference(dy, x),)

    def compute(self, dy, x):
        dx = torch.empty_like(x)
        launch(gelu_grad_kernel, triton.cdiv(x.numel(), BLOCK), dy, x, dx, x.numel(), BLOCK=BLOCK)
        return (dx,)

    def flops(self, dy, x):
        return 14 * np.asarray(x).size

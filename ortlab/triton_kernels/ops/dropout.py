"""Dropout (opset 13) and DropoutGrad: elementwise, with a counter-based random generator.

  Dropout:     keep = rand(seed, i) >= ratio;  y = keep ? x / (1 - ratio) : 0;  mask = keep
  DropoutGrad: dx = mask ? dy / (1 - ratio) : 0

`tl.rand(seed, offsets)` is Philox, a counter-based generator: element i's number depends only
on (seed, i), so every program draws its own numbers with no shared state, and the same seed
gives the same mask on any grid (ORT's CUDA kernel uses Philox the same way, through curand).
In inference mode (training_mode false, the default) or with ratio 0, y = x and the mask is
all true. ORT's DropoutGrad applies the mask whatever training_mode says; so does this one.
Mirrors onnxruntime/core/providers/cuda/nn/dropout.cc, dropout_impl.cu and
orttraining/orttraining/training_ops/cuda/nn/dropout_grad.cc.
"""
import numpy as np
import torch
from ortlab import env  # noqa: F401 - before triton: it sets TRITON_INTERPRET (no GPU), which Triton reads once
import triton
import triton.language as tl

from ortlab.onnx_defs import MS_DOMAIN
from ortlab.triton_kernels.executor import launch
from ortlab.triton_kernels.kernel_def import Arg, Kernel
from ortlab.ops.reference import draw_seed, dropout_grad_reference, dropout_reference
from ortlab.triton_kernels.registry import register_kernel

BLOCK = 1024
RATIO = ("float32", "float64")
BOOL = ("bool",)


@triton.jit
def dropout_kernel(x_ptr, y_ptr, mask_ptr, n, ratio, seed, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < n
    x = tl.load(x_ptr + offsets, mask=in_range)
    keep = tl.rand(seed, offsets) >= ratio
    tl.store(y_ptr + offsets, tl.where(keep, x / (1.0 - ratio), 0.0), mask=in_range)
    tl.store(mask_ptr + offsets, keep, mask=in_range)


@triton.jit
def dropout_grad_kernel(dy_ptr, mask_ptr, dx_ptr, n, scale, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < n
    dy = tl.load(dy_ptr + offsets, mask=in_range)
    keep = tl.load(mask_ptr + offsets, mask=in_range) != 0
    tl.store(dx_ptr + offsets, tl.where(keep, dy * scale, 0.0), mask=in_range)


def scalar(value):
    """A Python number from a 0-d numpy array or tensor (ratio and training_mode are inputs)."""
    return value.item() if hasattr(value, "item") else value


def ratio_of(ratio):
    return 0.5 if ratio is None else float(scalar(ratio))


def is_training(training_mode):
    return False if training_mode is None else bool(scalar(training_mode))


class _RatioChecks(Kernel):
    def check_ratio(self, ratio):
        self.expect(ratio is None or 0.0 <= float(ratio) < 1.0,
                    f"input 'ratio' must be in [0, 1), got {None if ratio is None else float(ratio)}")


@register_kernel
class Dropout(_RatioChecks):
    """y = x * keep / (1 - ratio), keep ~ Bernoulli(1 - ratio), seeded by `seed`."""

    op_type = "Dropout"
    inputs = (Arg("data"), Arg("ratio", RATIO, optional=True, ranks=(0,)),
              Arg("training_mode", BOOL, optional=True, ranks=(0,)))
    outputs = (Arg("output"), Arg("mask", BOOL, optional=True))
    attributes = {"seed": None}
    mirrors = "onnxruntime/core/providers/cuda/nn/dropout.cc"
    random = True

    def check_shapes(self, data, ratio, training_mode):
        self.check_ratio(ratio)

    @classmethod
    def example(cls, rng, rows=3, cols=37):
        return [rng.standard_normal((rows, cols)).astype(np.float32), np.array(0.3, np.float32),
                np.array(True)], {"seed": 7}

    def reference(self, data, ratio=None, training_mode=None):
        return dropout_reference(data, ratio_of(ratio), is_training(training_mode), self.seed)

    def compute(self, data, ratio=None, training_mode=None):
        r = ratio_of(ratio)
        if not is_training(training_mode) or r == 0:
            return data.clone(), torch.ones(data.shape, dtype=torch.bool, device=data.device)
        y, keep = torch.empty_like(data), torch.empty(data.shape, dtype=torch.bool, device=data.device)
        launch(dropout_kernel, triton.cdiv(data.numel(), BLOCK), data, y, keep, data.numel(), r,
               self.next_seed(), BLOCK=BLOCK)
        return y, keep

    def next_seed(self):
        """The seed of this call: `seed` on the first, then a new one each call, so that a node kept by an EP
        draws a new mask every run and the same masks in every new session, as ORT's CUDA Dropout does (its
        PhiloxGenerator, made once from the seed, advances per run: onnxruntime/core/providers/cuda/nn/
        dropout.cc). No seed: one drawn from numpy's global generator each call."""
        if self.seed is None:
            return draw_seed(None)
        calls = getattr(self, "calls", 0)
        self.calls = calls + 1
        return int(self.seed) if calls == 0 else (int(self.seed) + calls * 0x9E3779B1) % (2**31 - 1)

    def invariant(self, inputs, outputs):
        data, ratio, training_mode = (list(inputs) + [None, None])[:3]
        y, keep = np.asarray(outputs[0]), np.asarray(outputs[1])
        r = ratio_of(ratio) if is_training(training_mode) else 0.0
        problems = []
        if not np.allclose(y, np.where(keep, data / (1 - r), 0), rtol=1e-6, atol=1e-6):
            problems.append("output != mask * data / (1 - ratio)")
        kept, n = keep.mean(), keep.size
        spread = 5 * np.sqrt(max(r * (1 - r), 1e-12) / n) + 1.0 / n
        if abs(kept - (1 - r)) > spread:
            problems.append(f"kept {kept:.3f} of the elements, expected {1 - r:.3f} +- {spread:.3f}")
        return problems


@register_kernel
class DropoutGrad(_RatioChecks):
    """dX = mask * dY / (1 - ratio) (com.microsoft training op)."""

    op_type, domain = "DropoutGrad", MS_DOMAIN
    inputs = (Arg("dy"), Arg("mask", BOOL), Arg("ratio", RATIO, optional=True, ranks=(0,)),
              Arg("training_mode", BOOL, optional=True, ranks=(0,)))
    outputs = (Arg("dx"),)
    mirrors = "orttraining/orttraining/training_ops/cuda/nn/dropout_grad.cc"

    def check_shapes(self, dy, mask, ratio, training_mode):
        self.expect(dy.shape == mask.shape, f"input 0 'dy' {dy.shape} and input 1 'mask' "
                    f"{mask.shape} must have the same shape")
        self.check_ratio(ratio)

    @classmethod
    def example(cls, rng, rows=3, cols=37):
        return [rng.standard_normal((rows, cols)).astype(np.float32), rng.random((rows, cols)) >= 0.3,
                np.array(0.3, np.float32)], {}

    def reference(self, dy, mask, ratio=None, training_mode=None):
        return (dropout_grad_reference(dy, mask, ratio_of(ratio)),)

    def compute(self, dy, mask, ratio=None, training_mode=None):
        dx = torch.empty_like(dy)
        launch(dropout_grad_kernel, triton.cdiv(dy.numel(), BLOCK), dy, mask, dx, dy.numel(),
               1.0 / (1.0 - ratio_of(ratio)), BLOCK=BLOCK)
        return (dx,)

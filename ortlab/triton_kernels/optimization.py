"""Level 3: the same ops written naively (one launch per pass, intermediates in memory) and
fused (one pass, intermediates in registers), and multi-tensor apply for optimizer steps.

Naive LayerNorm: mean pass, variance pass, normalize pass = 3 launches, x read 3 times.
Naive softmax: max pass, exp-sum pass, normalize pass = 3 launches, x read 3 times.
The fused kernels of ortlab.triton_kernels.ops (layer_norm.py, softmax.py) read x once and write y once.
Multi-tensor apply (apex's multi_tensor_apply behind ORT's FusedAdam,
orttraining/orttraining/python/training/optim/fused_adam.py and
orttraining/orttraining/training_ops/cuda/optimizer/): one launch updates every parameter,
where a plain loop launches once per tensor.
"""
import numpy as np
import torch
from ortlab import env  # noqa: F401 - before triton: it sets TRITON_INTERPRET (no GPU), which Triton reads once
import triton
import triton.language as tl

from ortlab.env import kernel_device
from ortlab.triton_kernels.executor import block_size, launch
from ortlab.triton_kernels.ops.gelu import gelu_grad_kernel
from ortlab.triton_kernels.ops.layer_norm import LayerNormalization
from ortlab.triton_kernels.ops.reduce_sum import row_sum
from ortlab.triton_kernels.ops.softmax import row_softmax
from ortlab.triton_kernels.roofline import bandwidth_rates, cuda_time_ms, wall_time_ms

BLOCK = 1024


@triton.jit
def row_max_kernel(x_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    x = tl.load(x_ptr + row * n_cols + cols, mask=cols < n_cols, other=-float("inf"))
    tl.store(out_ptr + row, tl.max(x, axis=0))


@triton.jit
def exp_sum_kernel(x_ptr, max_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=-float("inf"))
    tl.store(out_ptr + row, tl.sum(tl.where(mask, tl.exp(x - tl.load(max_ptr + row)), 0.0), axis=0))


@triton.jit
def softmax_normalize_kernel(x_ptr, max_ptr, sum_ptr, y_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask)
    y = tl.exp(x - tl.load(max_ptr + row)) / tl.load(sum_ptr + row)
    tl.store(y_ptr + row * n_cols + cols, y, mask=mask)


@triton.jit
def centered_square_sum_kernel(x_ptr, mean_ptr, out_ptr, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask, other=0.0)
    d = tl.where(mask, x - tl.load(mean_ptr + row), 0.0)
    tl.store(out_ptr + row, tl.sum(d * d, axis=0))


@triton.jit
def layer_norm_normalize_kernel(x_ptr, mean_ptr, var_ptr, scale_ptr, bias_ptr, y_ptr, n_cols,
                                eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    x = tl.load(x_ptr + row * n_cols + cols, mask=mask)
    rstd = 1.0 / tl.sqrt(tl.load(var_ptr + row) + eps)
    y = (x - tl.load(mean_ptr + row)) * rstd * tl.load(scale_ptr + cols, mask=mask) \
        + tl.load(bias_ptr + cols, mask=mask)
    tl.store(y_ptr + row * n_cols + cols, y, mask=mask)


def naive_softmax(x2d):
    """Softmax over rows in three launches: row max, sum of exp, normalize."""
    rows, cols = x2d.shape
    row_max, row_sum_ = (torch.empty(rows, dtype=x2d.dtype, device=x2d.device) for _ in range(2))
    y = torch.empty_like(x2d)
    b = block_size(cols)
    launch(row_max_kernel, rows, x2d, row_max, cols, BLOCK=b)
    launch(exp_sum_kernel, rows, x2d, row_max, row_sum_, cols, BLOCK=b)
    launch(softmax_normalize_kernel, rows, x2d, row_max, row_sum_, y, cols, BLOCK=b)
    return y


def naive_layer_norm(x2d, scale, bias, eps=1e-5):
    """LayerNorm over rows in three launches: mean (a row sum), variance, normalize."""
    rows, cols = x2d.shape
    mean = row_sum(x2d) / cols  # the division is a fourth (torch) launch: naive indeed
    var = torch.empty(rows, dtype=x2d.dtype, device=x2d.device)
    launch(centered_square_sum_kernel, rows, x2d, mean, var, cols, BLOCK=block_size(cols))
    var /= cols
    y = torch.empty_like(x2d)
    launch(layer_norm_normalize_kernel, rows, x2d, mean, var, scale, bias, y, cols, eps,
           BLOCK=block_size(cols))
    return y


def traffic(rows, cols, version, op, itemsize=4):
    """Analytic bytes moved by each version (row statistics are counted too)."""
    n, r = rows * cols * itemsize, rows * itemsize
    table = {
        ("softmax", "naive"): 3 * n + n + 6 * r,     # x read by each of 3 passes, y written, max/sum
        ("softmax", "fused"): 2 * n,                 # x read once, y written once
        ("layernorm", "naive"): 3 * n + n + 8 * r,   # x read 3 times, y written, mean/var traffic
        ("layernorm", "fused"): 2 * n + 2 * r,       # x read, y written, mean and rstd saved
    }
    return table[(op, version)]


def fusion_timings(shape, peaks, peaks_name="measured", on_gpu=None):
    """Naive, fused and torch's softmax and LayerNorm on a `shape` input: measured median ms, analytic
    MB moved, and the floor on the memory slope of `peaks` (named `peaks_name` in its column). On a
    GPU (CUDA events) also the achieved GB/s and its % of `peaks`' bandwidth; on CPU (Triton
    interpreted, torch native) those two read roofline.NA_ON_CPU: pass a datasheet GPU's peaks."""
    on_gpu = kernel_device() == "cuda" if on_gpu is None else on_gpu
    device = "cuda" if on_gpu else "cpu"
    x = torch.randn(*shape, device=device)
    scale, bias = torch.randn(shape[1], device=device), torch.randn(shape[1], device=device)
    ln = LayerNormalization()
    timer = cuda_time_ms if on_gpu else (lambda fn: wall_time_ms(fn, warmup=0, repeat=1))
    cases = [("softmax naive", lambda: naive_softmax(x), "naive", "softmax"),
             ("softmax fused", lambda: row_softmax(x), "fused", "softmax"),
             ("softmax torch", lambda: torch.softmax(x, -1), "fused", "softmax"),
             ("layernorm naive", lambda: naive_layer_norm(x, scale, bias), "naive", "layernorm"),
             ("layernorm fused", lambda: ln.compute(x, scale, bias), "fused", "layernorm"),
             ("layernorm torch", lambda: torch.nn.functional.layer_norm(x, shape[1:], scale, bias), "fused",
              "layernorm")]
    rows = []
    for name, fn, version, op in cases:
        ms = timer(fn)
        moved = traffic(*shape, version, op)
        achieved = bandwidth_rates(moved, ms, peaks["bandwidth"], on_gpu)
        rows.append({"kernel": name, "shape": tuple(shape), "median ms": round(ms, 3),
                     "MB moved": round(moved / 1e6, 3), **achieved,
                     f"floor (us, {peaks_name})": round(1e6 * moved / peaks["bandwidth"], 3),
                     "timed on": "GPU (CUDA events)" if on_gpu
                     else "CPU: Triton interpreted, torch native (not GPU figures)"})
    return rows


# -- multi-tensor apply: SGD with momentum over many parameter tensors --------------------
@triton.jit
def sgd_momentum_kernel(p_ptr, g_ptr, m_ptr, n, lr, momentum, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    m = momentum * tl.load(m_ptr + offsets, mask=mask) + tl.load(g_ptr + offsets, mask=mask)
    tl.store(m_ptr + offsets, m, mask=mask)
    tl.store(p_ptr + offsets, tl.load(p_ptr + offsets, mask=mask) - lr * m, mask=mask)


class FlatParameters:
    """Parameters, gradients and momenta as views into three flat buffers, so one launch can
    update them all (what multi_tensor_apply achieves with a table of pointers)."""

    def __init__(self, shapes, seed=0):
        gen = torch.Generator().manual_seed(seed)
        sizes = [int(np.prod(s)) for s in shapes]
        self.shapes, self.offsets = shapes, np.cumsum([0] + sizes)
        device = kernel_device()
        self.flat = {name: torch.randn(self.offsets[-1], generator=gen).to(device)
                     for name in ("param", "grad")}
        self.flat["momentum"] = torch.zeros_like(self.flat["param"])

    def views(self, name):
        return [self.flat[name][a:b].view(s) for a, b, s in
                zip(self.offsets[:-1], self.offsets[1:], self.shapes)]


def sgd_step_per_tensor(params, lr=0.1, momentum=0.9):
    """One launch per parameter tensor (a plain optimizer loop)."""
    for p, g, m in zip(params.views("param"), params.views("grad"), params.views("momentum")):
        launch(sgd_momentum_kernel, triton.cdiv(p.numel(), BLOCK), p, g, m, p.numel(), lr,
               momentum, BLOCK=BLOCK)


def sgd_step_multi_tensor(params, lr=0.1, momentum=0.9):
    """One launch for every parameter: the flat buffers hold them back to back."""
    n = params.flat["param"].numel()
    launch(sgd_momentum_kernel, triton.cdiv(n, BLOCK), params.flat["param"], params.flat["grad"],
           params.flat["momentum"], n, lr, momentum, BLOCK=BLOCK)


def block_sweep(n, blocks, timer=None):
    """For n elements and each BLOCK: programs launched, lanes masked off, share wasted, and
    (with a `timer(block) -> ms`, on a GPU) the measured time."""
    rows = []
    for block in blocks:
        programs = triton.cdiv(n, block)
        idle = programs * block - n
        row = {"BLOCK": block, "programs": programs, "masked lanes": idle,
               "lanes wasted %": round(100 * idle / (programs * block), 2)}
        if timer is not None:
            row["median ms"] = round(timer(block), 4)
        rows.append(row)
    return rows


def gelu_grad_timer(n):
    """A timer for block_sweep: GeluGrad's kernel on n elements with a given BLOCK (GPU)."""
    dy, x = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    dx = torch.empty_like(x)
    return lambda block: cuda_time_ms(
        lambda: gelu_grad_kernel[(triton.cdiv(n, block),)](dy, x, dx, n, BLOCK=block))


def autotune_gelu_grad(n, blocks=(256, 1024, 4096), warps=(4, 8)):
    """triton.autotune over BLOCK and num_warps for GeluGrad's kernel on n elements. Returns the
    winning config as a dict. It times each config with the GPU driver's benchmarker, which Triton
    3.2's interpreter lacks: on CPU the attempt fails, and the RuntimeError says so with Triton's own
    error."""
    device = kernel_device()
    configs = [triton.Config({"BLOCK": b}, num_warps=w) for b in blocks for w in warps]
    dy, x = torch.randn(n, device=device), torch.randn(n, device=device)
    dx = torch.empty_like(x)
    try:
        tuned = triton.autotune(configs=configs, key=["n"])(gelu_grad_kernel)
        tuned[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](dy, x, dx, n)
    except RuntimeError as error:
        if device == "cuda":
            raise
        raise RuntimeError(f"triton.autotune under the interpreter fails: {error} (it times each config with "
                           "the GPU driver's benchmarker); on CPU use block_sweep's analytic table") from None
    best = tuned.best_config
    return {"BLOCK": best.kwargs["BLOCK"], "num_warps": best.num_warps,
            "configs tried": len(configs)}

"""Exercises of the walkthrough L3_01_kernel_optimization: a fused kernel (SkipLayerNormalization: the residual Add
and LayerNorm in one Triton program per row, each input read once) and a warp-shuffle block reduction in CUDA C++.

'skip_layer_norm': the learner's Triton kernel runs here, in the learner's process, under Triton's interpreter
with every load and store bounds-checked and counted (ortlab.labs.l1_06's watched(), built on lab05's
bounds_checked); y and the element counts come back as data. 'block_sum': the learner's function returns the CUDA
C++ text of a __device__ function, which the judge puts in front of ROW_STATS (a kernel that calls it twice) and
runs on the CPU runner in a process of its own (ortlab.labs.cpu_runner, as lab10 does). The checks live in
ortlab.labs.judges.l3_01 and compare with ORT 1.19.2's own CPU kernels (com.microsoft SkipLayerNormalization:
onnxruntime/contrib_ops/cpu/skip_layer_norm.cc; ReduceSum and ReduceSumSquare); the reference answers are in
solutions/walkthroughs/L3_01_kernel_optimization.py, outside the package.
"""
import numpy as np

from ortlab.triton_kernels.executor import to_device, to_numpy
from ortlab.labs.checks import judge
from ortlab.labs.l1_06 import block_for, canonical, launchable, run_watched
from ortlab.labs.remote import learner, probe

# --- 'skip_layer_norm' -----------------------------------------------------------------------------------------
SKIP_SHAPES = ((4, 37), (3, 128), (2, 300))
EPSILON = 1e-5
TENSORS = ("x", "skip", "gamma", "beta", "y")  # the kernel's tensor arguments, in launch order


def skip_inputs(shape, seed=0):
    """(x, skip, gamma, beta) float32 for rows of shape[1]: x and skip normal (x's rows around 2), gamma and beta
    normal, one per column."""
    rows, cols = shape
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal(shape) + 2).astype(np.float32)
    skip = rng.standard_normal(shape).astype(np.float32)
    return x, skip, rng.standard_normal(cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32)


def skip_cases():
    """What the check of 'skip_layer_norm' launches, and the elements a fused kernel moves: one row per shape."""
    out = []
    for rows, cols in SKIP_SHAPES:
        block = block_for(cols)
        out.append({"x, skip, y shape": str((rows, cols)), "grid (programs)": rows, "BLOCK": block,
                    "masked lanes per program": block - cols,
                    "fused: loads of x, skip": 2 * rows * cols, "stores of y": rows * cols,
                    "Add then LayerNorm: loads of x, skip, s": 3 * rows * cols, "stores of s, y": 2 * rows * cols})
    return out


@probe
def run_skip_layer_norm(fn, shape):
    """The learner's kernel on skip_inputs(shape), one program per row, BLOCK = block_for(cols), epsilon EPSILON:
    {"y": y (NaN where never written), "loaded" / "stored": {tensor: elements}}, or a str saying where it went
    out of bounds."""
    import torch  # heavy: torch

    rows, cols = (int(d) for d in shape)
    x, skip, gamma, beta = (to_device(a) for a in skip_inputs((rows, cols)))
    y = torch.full((rows, cols), float("nan"), dtype=torch.float32, device=x.device)
    seen = run_watched(launchable(fn), rows, (x, skip, gamma, beta, y, cols, EPSILON), (rows, cols), block_for(cols))
    if isinstance(seen, str):
        return seen
    moved = canonical(seen, TENSORS)
    return {"y": to_numpy(y), "loaded": moved["loaded"], "stored": moved["stored"]}


def check_skip_layer_norm(kernel_fn):
    """Exercise 'skip_layer_norm': kernel_fn(x_ptr, skip_ptr, gamma_ptr, beta_ptr, y_ptr, n_cols, eps, BLOCK) writes
    LayerNorm(x + skip) * gamma + beta per row, reading x and skip once; checked against ORT's
    SkipLayerNormalization on SKIP_SHAPES."""
    judge("skip_layer_norm", "l3_01.skip_layer_norm", learner(kernel_fn))


# --- 'block_sum' -----------------------------------------------------------------------------------------------
ROW_STATS = ("row_stats", (("x", "const float", True), ("out", "float", True), ("cols", "int", False)))
ROW_STATS_SOURCE = r"""
// The check's kernel, put after your block_sum: one block per row, every thread writes what block_sum gave it.
extern "C" __global__ void row_stats(const float* x, float* out, int cols) {
  __shared__ float slots[32];  // one per warp: blockDim.x is a multiple of 32, at most 1024
  const int row = blockIdx.x, t = threadIdx.x;
  float s = 0.0f, q = 0.0f;
  for (int c = t; c < cols; c += blockDim.x) {
    const float v = x[row * cols + c];
    s += v;
    q += v * v;
  }
  const float total = block_sum(s, slots);    // the row's sum, in every thread
  const float squares = block_sum(q, slots);  // the same slots again: the row's sum of squares
  out[(2 * row) * blockDim.x + t] = total;
  out[(2 * row + 1) * blockDim.x + t] = squares;
}
"""
SEEN_STATS = ((2, 300, 128),)  # (rows, cols, threads per block): the notebook launches this one
HIDDEN_STATS = ((3, 1000, 256), (1, 50, 32), (4, 96, 64), (2, 2050, 1024))


def stats_input(rows, cols, seed=0):
    """x (rows, cols) float32, normal around 0.5."""
    return (np.random.default_rng(seed).standard_normal((rows, cols)) + 0.5).astype(np.float32)


def with_row_stats(block_sum_source):
    """The source the check compiles: the learner's block_sum, then ROW_STATS_SOURCE."""
    return f"{block_sum_source.rstrip()}\n{ROW_STATS_SOURCE}"


def check_block_sum(source_fn):
    """Exercise 'block_sum': source_fn() returns the CUDA C++ text of __device__ float block_sum(float v, float*
    slots), checked through ROW_STATS_SOURCE on the CPU runner (both thread orders) against ORT's ReduceSum and
    ReduceSumSquare."""
    judge("block_sum", "l3_01.block_sum", learner(source_fn))

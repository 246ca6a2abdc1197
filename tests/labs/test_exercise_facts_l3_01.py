"""L3_01's exercises. 'skip_layer_norm' is judged against ORT's SkipLayerNormalization and by the elements the
kernel loads and stores under Triton's interpreter: here ORT's output is numpy's LayerNorm of x + skip in float64
(and torch's), and the counting (ortlab.labs.l1_06.watched) gives ortlab's own one-pass softmax kernel exactly one
load of x and one store of y per element. 'block_sum' is judged against ORT's ReduceSum and ReduceSumSquare: here
they are numpy's, and the one race the notebook says the CPU runner cannot show (a second call writing the slots
before the first call's reads) indeed gives the right numbers in both thread orders there."""
import numpy as np
import pytest
import torch

from ortlab import env  # noqa: F401 - first: it sets TRITON_INTERPRET before Triton loads (no GPU)
from ortlab.triton_kernels.ops.softmax import softmax_kernel
from ortlab.labs import cpu_runner, l3_01
from ortlab.labs.judges.l3_01 import ort_row_stats, ort_skip_layer_norm
from ortlab.labs.l1_06 import block_for, canonical, run_watched


@pytest.mark.parametrize("shape", l3_01.SKIP_SHAPES)
def test_orts_skip_layer_norm_is_the_layer_norm_of_x_plus_skip(shape):
    x, skip, gamma, beta = l3_01.skip_inputs(shape)
    s = x.astype(np.float64) + skip
    normalized = (s - s.mean(axis=1, keepdims=True)) / np.sqrt(s.var(axis=1, keepdims=True) + l3_01.EPSILON)
    expected = normalized * gamma + beta
    got = ort_skip_layer_norm(x, skip, gamma, beta)
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5)
    by_torch = torch.nn.functional.layer_norm(torch.from_numpy(x + skip), (shape[1],), torch.from_numpy(gamma),
                                              torch.from_numpy(beta), eps=l3_01.EPSILON)
    np.testing.assert_allclose(got, by_torch.numpy(), rtol=1e-4, atol=1e-5)


def test_the_counting_sees_one_load_and_one_store_per_element_of_a_one_pass_kernel():
    rows, cols = 3, 37
    x = torch.randn(rows, cols)
    y = torch.empty_like(x)
    seen = run_watched(softmax_kernel, rows, (x, y, cols), (rows, cols), block_for(cols))
    moved = canonical(seen, ("x", "y"))
    assert moved["loaded"] == {"x": rows * cols} and moved["stored"] == {"y": rows * cols}
    torch.testing.assert_close(y, torch.softmax(x, dim=-1))


@pytest.mark.parametrize("rows, cols, block", l3_01.SEEN_STATS + l3_01.HIDDEN_STATS)
def test_orts_row_sums_and_sums_of_squares_are_numpys(rows, cols, block):
    x = l3_01.stats_input(rows, cols).astype(np.float64)
    sums, squares = ort_row_stats(l3_01.stats_input(rows, cols))
    np.testing.assert_allclose(sums, x.sum(axis=1), rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(squares, (x * x).sum(axis=1), rtol=1e-5, atol=1e-4)
    assert block % 32 == 0 and block <= 1024


NO_BARRIER_BEFORE_THE_WRITE = r"""
__device__ float block_sum(float v, float* slots) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  v = lane < warps ? slots[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}
"""


def test_the_race_the_notebook_says_the_cpu_runner_cannot_show_gives_the_right_numbers_there():
    rows, cols, block = 3, 1000, 256
    x = l3_01.stats_input(rows, cols)
    runs = [cpu_runner.Launch(rows, block, (x, np.full(2 * rows * block, np.nan, np.float32), cols), out=1,
                              schedule=schedule) for schedule in ("forward", "reverse")]
    forward, reverse = cpu_runner.launches(l3_01.with_row_stats(NO_BARRIER_BEFORE_THE_WRITE), "row_stats", runs, 120)
    np.testing.assert_array_equal(forward, reverse)
    sums, squares = ort_row_stats(x)
    got = forward.reshape(rows, 2, block)
    np.testing.assert_allclose(got[:, 0], np.repeat(sums[:, None], block, axis=1), rtol=1e-4)
    np.testing.assert_allclose(got[:, 1], np.repeat(squares[:, None], block, axis=1), rtol=1e-4)

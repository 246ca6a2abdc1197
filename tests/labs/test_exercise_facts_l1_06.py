"""L1_06's exercises are judged against ORT's own CPU kernels (Softmax-13 and com.microsoft GatherGrad, run as
one-node models). Here, independently of the judge: on every input the checks use, ORT's softmax is numpy's
in float64 (and torch's), rows far from 0 included; ORT's GatherGrad is numpy's unbuffered scatter-add
(np.add.at) and torch's index_add_; and the inputs hold what the notebook's tables say (rows near +80 and -120,
indices that repeat)."""
import numpy as np
import pytest
import torch

from ortlab.labs import l1_06
from ortlab.labs.judges.l1_06 import ort_gather_grad, ort_softmax


@pytest.mark.parametrize("shape", l1_06.SOFTMAX_SHAPES)
def test_orts_softmax_is_numpys_and_torchs(shape):
    x = l1_06.softmax_input(shape)
    x64 = x.astype(np.float64)
    e = np.exp(x64 - x64.max(axis=1, keepdims=True))
    expected = e / e.sum(axis=1, keepdims=True)
    got = ort_softmax(x)
    assert got.dtype == np.float32 and got.shape == shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(got, torch.softmax(torch.from_numpy(x), dim=-1).numpy(), rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("shape", l1_06.SOFTMAX_SHAPES)
def test_the_softmax_rows_lie_where_the_exercise_says(shape):
    x = l1_06.softmax_input(shape)
    with np.errstate(over="ignore"):
        assert np.isinf(np.exp(x[0])).any()  # exp alone overflows float32 in row 0 (above 88.7)
        assert (np.exp(x[1]) == 0).all()     # and underflows to 0 in all of row 1 (below -103)


@pytest.mark.parametrize("case", l1_06.GATHER_CASES, ids=lambda c: f"{c[0]}x{c[1]}")
def test_orts_gather_grad_is_a_scatter_add(case):
    shape, indices, dy = l1_06.gather_inputs(case)
    expected = np.zeros(tuple(shape), np.float64)
    np.add.at(expected, indices.reshape(-1), dy.reshape(indices.size, -1).astype(np.float64))
    got = ort_gather_grad(shape, indices, dy)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    by_torch = torch.zeros(tuple(int(d) for d in shape)).index_add_(
        0, torch.from_numpy(indices.reshape(-1)), torch.from_numpy(dy.reshape(indices.size, -1)))
    np.testing.assert_allclose(got, by_torch.numpy(), rtol=1e-6, atol=1e-6)
    assert len(np.unique(indices)) < indices.size  # every case repeats an index: a plain store loses a row

"""ORTModule 1.19.2 on a forward that takes a Python number: two of its bugs, pinned (L0_02 shows both).

ORTModule feeds a number to the graph as a tensor and keeps only its type in the input schema, so a new value
reuses the graph and a new type exports again. Against PyTorch's own loss for each call:
- on the default fast path, a float then an int (scale=2.0, then scale=1) gives the loss of scale=0: the int
  call reuses something stale, silently;
- with every check on (ORTMODULE_SKIPCHECK_POLICY=SKIP_CHECK_DISABLED), the second call with a float raises
  AttributeError: 'float' object has no attribute 'requires_grad'.
If a later ORT fixes either, this test fails and L0_02's section on numbers must be re-read.
"""
import warnings

import pytest
import torch

from ortlab.labs.l0_02 import NestedModel
from ortlab.ortmodule import driver as om


def _inputs():
    g = torch.Generator().manual_seed(0)
    x, p, q = (torch.randn(3, 4, generator=g) for _ in range(3))
    return x, (p, q)


def test_the_fast_path_gives_a_stale_loss_when_a_float_becomes_an_int():
    x, pair = _inputs()
    torch_loss = {s: float(NestedModel()(x, pair, scale=s)) for s in (2.0, 1, 0.0)}
    assert abs(torch_loss[1] - torch_loss[0.0]) > 0.5  # the two losses the bug confuses are far apart
    with om.ortmodule_env(), warnings.catch_warnings(), om.captured_logs():
        warnings.simplefilter("ignore")
        model = om.ortmodule(NestedModel(), "WARNING", False)
        first = float(model(x, pair, scale=2.0))
        then = float(model(x, pair, scale=1))
    assert first == pytest.approx(torch_loss[2.0], abs=1e-4)
    assert then == pytest.approx(torch_loss[0.0], abs=1e-4) and then != pytest.approx(torch_loss[1], abs=0.1)


def test_with_every_check_on_a_second_call_with_a_number_raises():
    x, pair = _inputs()
    with om.ortmodule_env(SKIPCHECK_POLICY="SKIP_CHECK_DISABLED"), warnings.catch_warnings(), om.captured_logs():
        warnings.simplefilter("ignore")
        model = om.ortmodule(NestedModel(), "WARNING", False)
        assert float(model(x, pair, scale=2.0)) == pytest.approx(float(NestedModel()(x, pair, scale=2.0)), abs=1e-4)
        with pytest.raises(AttributeError, match="'float' object has no attribute 'requires_grad'"):
            model(x, pair, scale=2.0)

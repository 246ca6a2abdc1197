"""Hardware facts of ortlab.cuda: TF32/BF16 rounding, Tensor Core instructions, #pragma unroll, datasheets.

Independent sources: torch's float32 -> bfloat16 conversion; for TF32 a rounding derived here from
the IEEE layout with Python's exact arithmetic (no bit tricks); the PTX that NVIDIA's NVRTC writes;
the CUDA core totals NVIDIA's datasheets print.
"""
import math
from fractions import Fraction

import numpy as np
import pytest
import torch

from ortlab.cuda import archs, instructions, precision
from ortlab.errors import OrtlabError


def reference_round(value, mantissa_bits, ties):
    """Round a finite float to `mantissa_bits` explicit mantissa bits with fp32's exponent range,
    exactly: the spacing of representable values near |value| is 2**(e - mantissa_bits) where
    2**e <= |value| < 2**(e+1), never finer than the subnormal spacing 2**(-126 - mantissa_bits)."""
    if value == 0:
        return value
    exact = Fraction(value)
    e = math.floor(math.log2(abs(value)))
    if Fraction(2) ** e > abs(exact):      # log2 rounding at a power of two
        e -= 1
    elif Fraction(2) ** (e + 1) <= abs(exact):
        e += 1
    spacing = Fraction(2) ** max(e - mantissa_bits, -126 - mantissa_bits)
    steps = exact / spacing
    low = math.floor(steps)
    rest = steps - low
    if ties == "truncate":
        n = math.trunc(steps)
    elif rest > Fraction(1, 2) or (rest == Fraction(1, 2) and (ties == "away" and exact > 0 or
                                                              ties == "even" and low % 2 == 1)):
        n = low + 1
    elif rest == Fraction(1, 2) and ties == "away" and exact < 0:
        n = low
    else:
        n = low
    result = n * spacing
    largest = (2 - Fraction(2) ** -mantissa_bits) * Fraction(2) ** 127
    if abs(result) > largest:
        return math.copysign(math.inf, value)
    return math.copysign(float(result), value)  # a value that rounds to zero keeps its sign


def samples():
    rng = np.random.default_rng(0)
    normal = rng.standard_normal(2000).astype(np.float32) * np.float32(1e3)
    # values exactly halfway between two TF32 (and BF16) neighbours, and one ulp either side
    base = rng.integers(0x00800000, 0x7F000000, 600, dtype=np.uint64)
    ties_tf32 = ((base & ~np.uint64(0x1FFF)) | np.uint64(0x1000)).astype(np.uint32)
    ties_bf16 = ((base & ~np.uint64(0xFFFF)) | np.uint64(0x8000)).astype(np.uint32)
    near = np.concatenate([ties_tf32 - 1, ties_tf32 + 1, ties_bf16 - 1, ties_bf16 + 1]).astype(np.uint32)
    bits = np.concatenate([ties_tf32, ties_bf16, near]).view(np.float32)
    special = np.array([0.0, -0.0, 1.0, -1.0, np.finfo(np.float32).max, -np.finfo(np.float32).max,
                        np.finfo(np.float32).tiny, 1e-40, -3e-42, 1.4e-45, 65504.0, 1 + 2.0 ** -11,
                        1 + 3 * 2.0 ** -11], dtype=np.float32)
    return np.concatenate([normal, bits, -bits, special]).astype(np.float32)


@pytest.mark.parametrize("ties", ["even", "away", "truncate"])
def test_tf32_rounding_matches_exact_arithmetic(ties):
    x = samples()
    got = precision.round_tf32(x, ties=ties)
    want = np.array([reference_round(float(v), 10, ties) for v in x], dtype=np.float32)
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_tf32_keeps_ten_mantissa_bits():
    got = precision.round_tf32(samples()).view(np.uint32)
    assert not (got & np.uint32(0x1FFF)).any()


def test_bf16_rounding_matches_torch():
    x = samples()
    got = precision.round_bf16(x)
    want = torch.tensor(x).to(torch.bfloat16).to(torch.float32).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


def test_bf16_rounding_matches_exact_arithmetic_with_ties_away():
    x = samples()
    want = np.array([reference_round(float(v), 7, "away") for v in x], dtype=np.float32)
    np.testing.assert_array_equal(precision.round_bf16(x, ties="away").view(np.uint32), want.view(np.uint32))


def test_nan_and_infinity_survive_rounding():
    x = np.array([np.nan, np.inf, -np.inf], dtype=np.float32)
    for rounding in (precision.round_tf32, precision.round_bf16):
        got = rounding(x)
        assert np.isnan(got[0]) and got[1] == np.inf and got[2] == -np.inf


def test_matmul_errors_follow_the_mantissa_widths():
    rng = np.random.default_rng(1)
    a = rng.standard_normal((64, 128)).astype(np.float32)
    b = rng.standard_normal((128, 32)).astype(np.float32)
    errors = precision.matmul_errors(a, b)
    assert errors["FP32"] < 1e-5 < errors["TF32"] < errors["BF16"] < 1e-2
    # FP16 has TF32's 10 mantissa bits; in FP16's range the two round alike
    assert errors["FP16"] == errors["TF32"]
    # torch: the same product from inputs rounded to bfloat16 by torch
    exact = a.astype(np.float64) @ b.astype(np.float64)
    a16, b16 = (torch.tensor(m).to(torch.bfloat16).double() for m in (a, b))
    torch_bf16 = (a16 @ b16).float().double().numpy()
    assert errors["BF16"] == pytest.approx(np.abs(torch_bf16 - exact).max() / np.abs(exact).max(), rel=1e-12)


@pytest.mark.parametrize("bad", [np.zeros(3, np.float64), "x", [None], np.zeros(2, np.complex64)])
def test_rounding_refuses_what_is_not_fp32(bad):
    with pytest.raises(OrtlabError):
        precision.round_tf32(bad)


def test_bad_options_are_refused():
    with pytest.raises(OrtlabError, match="ties must be"):
        precision.round_bf16(np.zeros(2, np.float32), ties="up")
    with pytest.raises(OrtlabError, match="two matrices"):
        precision.matmul_errors(np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32))
    with pytest.raises(OrtlabError, match="finite"):
        precision.matmul_errors(np.full((2, 2), np.nan, np.float32), np.zeros((2, 2), np.float32))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_wmma_kernel_has_tensor_core_instructions_and_the_fma_kernel_has_none(arch):
    from ortlab.cuda import compile
    wmma = compile(instructions.TENSOR_CORE_SOURCE, arch, instructions.tensor_core_options()).ptx
    fma = compile(instructions.FMA_SOURCE, arch).ptx
    assert "wmma.mma.sync.aligned" in wmma and ".tf32.tf32" in wmma
    assert instructions.mma_lines(wmma) and not instructions.mma_lines(fma)
    assert "mma" not in fma and "fma.rn.f32" in fma and "fma.rn.f32" not in wmma
    rows = instructions.tensor_cores_vs_fma(arch)
    assert [r["mma instructions"] > 0 for r in rows] == [True, False]


def test_pragma_unroll_removes_the_loop_branch_and_repeats_the_body():
    rolled, unrolled = instructions.unroll_table("sm_80")
    assert rolled["branches (bra)"] >= 1 and unrolled["branches (bra)"] == 0
    assert (rolled["fma.rn.f32"], unrolled["fma.rn.f32"]) == (1, 16)   # the source's 16 iterations
    assert unrolled["PTX lines"] > rolled["PTX lines"]


def test_datasheet_core_totals_are_the_datasheets():
    totals = {arch: archs.datasheet(arch).fp32_cores for arch in ("sm_60", "sm_70", "sm_80", "sm_90")}
    assert totals == {"sm_60": 3584, "sm_70": 5120, "sm_80": 6912, "sm_90": 16896}
    per_sm = {a: d.tensor_cores // d.sms for a, d in archs.DATASHEETS.items()}
    assert per_sm == {"sm_60": 0, "sm_70": 8, "sm_80": 4, "sm_90": 4}
    with pytest.raises(OrtlabError, match="no datasheet figures"):
        archs.datasheet("sm_75")
    assert all("datasheet" in d.source for d in archs.DATASHEETS.values())

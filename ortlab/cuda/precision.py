"""What a Tensor Core's input formats keep of an fp32 number, and what that costs a matmul.

IEEE fp32 is 1 sign bit, 8 exponent bits and 23 mantissa bits. The two 19- and 16-bit formats that
Ampere's Tensor Cores take keep fp32's 8-bit exponent (same range) and fewer mantissa bits:

    TF32: 10 mantissa bits (the low 13 of fp32's dropped), stored in a 32-bit register
    BF16:  7 mantissa bits (the low 16 dropped), stored in 16 bits

`round_tf32` / `round_bf16` return fp32 arrays that hold exactly the rounded values, rounded to
nearest with ties to even (IEEE's default, and what torch's `.to(torch.bfloat16)` does). PTX's
`cvt.rna.tf32.f32`, which `wmma::__float_to_tf32` emits, rounds ties away from zero instead
(`ties="away"`); a Tensor Core fed unconverted fp32 bits uses only the top 19 (`ties="truncate"`),
as the PTX ISA describes for .tf32 operands.

`matmul_errors(a, b)` compares C = A @ B computed with inputs in each format against float64, the
products accumulated in fp32 as Tensor Cores do (NVIDIA A100 Tensor Core GPU Architecture
whitepaper: TF32 and BF16 inputs, FP32 accumulation).
"""
import numpy as np

from ortlab.errors import OrtlabError

_MODES = ("even", "away", "truncate")


def _fp32(x, what):
    try:
        array = np.asarray(x)
    except Exception:  # noqa: BLE001 - any object numpy cannot read
        array = None
    if array is None or array.dtype.kind not in "fiu":
        raise OrtlabError(f"{what} takes an array of numbers (fp32), not {type(x).__name__}")
    if array.dtype != np.float32:
        raise OrtlabError(f"{what} rounds fp32 values; got {array.dtype}: pass np.asarray(x, dtype=np.float32)")
    return np.ascontiguousarray(array)


def _round_low_bits(x, dropped, ties, what):
    """fp32 `x` with its low `dropped` mantissa bits rounded away (bit arithmetic on the IEEE layout)."""
    if ties not in _MODES:
        raise OrtlabError(f"ties must be one of {_MODES}, got {ties!r}")
    x = _fp32(x, what)
    bits = x.view(np.uint32).astype(np.uint64)
    half = np.uint64(1 << (dropped - 1))
    mask = np.uint64((1 << dropped) - 1)
    if ties == "even":
        bits = bits + (half - np.uint64(1)) + ((bits >> np.uint64(dropped)) & np.uint64(1))
    elif ties == "away":
        bits = bits + half
    bits = (bits & ~mask & np.uint64(0xFFFFFFFF)).astype(np.uint32)
    # a carry out of the mantissa bumps the exponent: the IEEE layout makes that the right value,
    # up to infinity; NaN and infinity themselves keep their bits (a NaN must not round into inf)
    rounded = bits.view(np.float32)
    return np.where(np.isfinite(x), rounded, x).astype(np.float32)


def round_tf32(x, ties="even"):
    """fp32 -> the nearest TF32 value (10-bit mantissa), as an fp32 array."""
    return _round_low_bits(x, 13, ties, "round_tf32")


def round_bf16(x, ties="even"):
    """fp32 -> the nearest BF16 value (7-bit mantissa), as an fp32 array."""
    return _round_low_bits(x, 16, ties, "round_bf16")


def matmul_errors(a, b):
    """{format: max |C - C64| / max |C64|} for C = a @ b with inputs in fp32, TF32, BF16 and FP16,
    C64 the float64 product of the fp32 inputs. FP32 is numpy's float32 matmul (FP32 cores); for the
    Tensor Core formats the inputs are rounded, multiplied exactly and summed in float64, then the
    sum rounded once to fp32: the error is the inputs' rounding (a real Tensor Core also rounds each
    fp32 partial sum, an error of fp32's size, far below these)."""
    a, b = _fp32(a, "matmul_errors"), _fp32(b, "matmul_errors")
    if a.ndim != 2 or b.ndim != 2 or a.shape[1] != b.shape[0]:
        raise OrtlabError(f"matmul_errors takes two matrices (M, K) and (K, N), got {a.shape} and {b.shape}")
    if not (np.isfinite(a).all() and np.isfinite(b).all()):
        raise OrtlabError("matmul_errors takes finite inputs: drop NaN / inf first")
    exact = a.astype(np.float64) @ b.astype(np.float64)
    scale = np.abs(exact).max() or 1.0

    def through(rounding):
        product = rounding(a).astype(np.float64) @ rounding(b).astype(np.float64)
        return product.astype(np.float32)

    def fp16(x):
        return x.astype(np.float16).astype(np.float32)

    results = {"FP32": a @ b, "TF32": through(round_tf32), "BF16": through(round_bf16), "FP16": through(fp16)}
    return {name: float(np.abs(c.astype(np.float64) - exact).max() / scale) for name, c in results.items()}

"""The checks of lab10_cuda_kernel (run where the learner's code cannot reach them).

The learner's functions send back CUDA C++ text (and, for GeluGrad, a number of blocks); everything
else happens here: NVRTC + ptxas compile it for sm_80 and sm_90 (no spills allowed), g++ builds it for
the CPU runner, which launches it on the notebook's shapes and on shapes the notebook never shows
(one element, tails, one row, rows shorter than a block, many rows, other block sizes), every output
NaN-filled first. The reference is ORT 1.19.2's own CPU kernels (com.microsoft GeluGrad and
LayerNormalizationGrad), run as one-node models by ortlab.session.run_node. On a GPU the compiled
cubin runs too and is compared with ORT the same way.

The learner's text becomes native code on the CPU runner (g++), and native code can do anything in the
process that loads it (a constructor calling Python's C API could replace any function there). So the
build is loaded and launched only in a fresh process of its own (ortlab.labs.cpu_runner), which is sent the
inputs made here and sends back each launch's output array as data; that process holds no judge and no
reference, and this one decides. The source is also screened for host-side code (HOST_CODE), to tell a
learner who wrote some that a kernel is device code only: a screen of text is a message, not the defence.

Each usual mistake has its own message: an access past an array (no bounds check, the runner's
report), a barrier not every thread reaches, a result that changes with the order threads run
between barriers (a missing __syncthreads), sums that are wrong while the rest of the formula is
right (a wrong reduction), and elements no thread wrote (a grid too small, or a row not looped over).
"""
import re

import numpy as np

from ortlab.labs.checks import CheckFailed, call_learner, compare
from ortlab.labs import cpu_runner, lab10
from ortlab.labs.lab10 import (BLOCK, GELU, LN_GRAD, SEEN_LN, SEEN_N, check_signature, compiled,
                               gelu_inputs, grid_blocks, gpu_run, gpu_usable, layer_norm_inputs, nan_filled,
                               runner_message, source_text, unwritten)
from ortlab.labs.remote import function
from ortlab.session import run_node

HIDDEN_N = (1, 255, 257, 4097, 12345)
HIDDEN_LN = ((1, 33, 128), (37, 300, 64), (3, 1000, 256), (96, 64, 32), (5, 2, 128), (2, 2050, 256), (7, 515, 96))
GELU_TOL = {"rtol": 1e-5, "atol": 1e-5}
LN_TOL = {"rtol": 1e-4, "atol": 1e-4}
CHILD_TIMEOUT = 300.0  # seconds for the CPU runner's process to build and run all of one exercise's launches
# Host-side code has no place in a kernel's source, and is how native code would reach the process that
# loads it: attributes (constructors), inline assembly, includes, Python's C API, the loader and processes.
# A screen, not a sandbox: token pasting (##) and _Pragma are refused too, so that no name is built from parts.
HOST_CODE = re.compile(r"__attribute__|\b(?:asm|__asm__)\b|^\s*#\s*include\b|__CUDACC__|\b_?Py[A-Z_]\w*|##|"
                       r"\b_Pragma\b|\b(?:dlopen|dlsym|system|popen|fork|vfork|clone|posix_spawn\w*|execv\w*|"
                       r"execl\w*|syscall|ptrace|kill)\s*\(", re.M)


def ort_gelu_grad(dy, x):
    """ORT's CPU GeluGrad (com.microsoft) on (dy, x)."""
    return run_node("GeluGrad", [dy, x], domain="com.microsoft")[0]


def ort_layer_norm_dx(dy, x, scale, mean, inv_std):
    """ORT's CPU LayerNormalizationGrad (com.microsoft, axis -1): its first output, dX."""
    rows = x.shape[0]
    return run_node("LayerNormalizationGrad", [dy, x, scale, mean.reshape(rows, 1), inv_std.reshape(rows, 1)],
                    {"axis": -1}, domain="com.microsoft", outputs=3)[0]


def learner_source(remote, source_fn, what):
    """The learner's CUDA C++ text, from calling their function, screened for host-side code."""
    source = source_text(call_learner(function(remote, source_fn), what=what), what)
    found = HOST_CODE.search(source)
    if found:
        raise CheckFailed(f"the source holds host-side code ({found.group(0).strip()!r}): this lab grades a "
                          "kernel, device code only; remove it")
    return source


def prepared(source, kernel):
    """Check that a source has the lab's signature and compiles without spills (NVRTC + ptxas read it,
    nothing of it runs here)."""
    check_signature(source, kernel)
    compiled(source, kernel)


# --- the learner's native code runs in a process of its own -------------------------------------------
def on_cpu_runner(source, kernel, runs):
    """[dx, or the runner's message for the learner] for each cpu_runner.Launch, run in the runner's own
    process (ortlab.labs.cpu_runner), never in this one; CheckFailed when it cannot build or answer."""
    try:
        results = cpu_runner.launches(source, kernel[0], runs, CHILD_TIMEOUT, launch_timeout=lab10.TIMEOUT)
    except cpu_runner.BuildFailed as exc:
        raise CheckFailed(f"the CPU runner cannot build it: {str(exc)[:400]}") from None
    except cpu_runner.RunnerFailed as exc:
        raise CheckFailed(str(exc)) from None
    return [runner_message(r) if isinstance(r, str) else r for r in results]


def _answer(result, shape):
    """A runner's dx for one launch: a float32 array of `shape`, or CheckFailed with the runner's message."""
    if isinstance(result, str):
        raise CheckFailed(result)
    if not isinstance(result, np.ndarray) or result.dtype != np.float32 or result.shape != shape:
        raise CheckFailed("the CPU runner's process gave a malformed answer")
    return result


def _gelu_launches(source, blocks):
    """[dx, or the message of its failure] for each (n, number of blocks), on the notebook's inputs."""
    runs = []
    for n, count in blocks:
        dy, x = gelu_inputs(n)
        runs.append(cpu_runner.Launch(count, BLOCK, (dy, x, nan_filled(x), n), out=2))
    return on_cpu_runner(source, GELU, runs)


def _layer_norm_launches(source, cases):
    """[[dx thread 0 first, dx last thread first], or the message of the first failure] per case."""
    runs = []
    for rows, cols, block in cases:
        dy, x, scale, mean, inv_std = layer_norm_inputs(rows, cols)
        for schedule in ("forward", "reverse"):
            runs.append(cpu_runner.Launch(rows, block, (dy, x, scale, mean, inv_std, nan_filled(x), rows, cols),
                                          out=5, schedule=schedule))
    results = on_cpu_runner(source, LN_GRAD, runs)
    pairs = [results[k:k + 2] for k in range(0, len(results), 2)]
    return [next((r for r in pair if isinstance(r, str)), pair) for pair in pairs]


# --- exercise 1: GeluGrad ----------------------------------------------------------------------------
def gelu_grad(remote, source_fn, grid_fn):
    """Exercise 'gelu_grad': gelu_grad_source() is CUDA C++ for gelu_grad(dy, x, dx, n), launched on
    gelu_grad_grid(n) blocks of BLOCK threads; equal to ORT's GeluGrad on every n."""
    source = learner_source(remote, source_fn, "gelu_grad_source()")
    prepared(source, GELU)
    grid_fn = function(remote, grid_fn)
    blocks, grid_problem = [], None
    for n in SEEN_N + HIDDEN_N:  # the grids first (the learner's code), up to the first wrong one
        try:
            blocks.append((n, grid_blocks(grid_fn, n)))
        except CheckFailed as exc:
            grid_problem = exc
            break
    for (n, count), result in zip(blocks, _gelu_launches(source, blocks) if blocks else []):
        label = f"for n = {n}{' (a shape the notebook does not show)' if n not in SEEN_N else ''}"
        try:
            dx = _answer(result, (n,))
        except CheckFailed as exc:
            raise CheckFailed(f"{label}: {exc}") from None
        missing = unwritten(dx, f"the grid is too small: gelu_grad_grid({n}) = {count} block(s) of {BLOCK} "
                                f"threads = {count * BLOCK} threads; launch ceil(n / BLOCK) = "
                                f"{-(-n // BLOCK)} blocks (n // BLOCK drops the tail)")
        if missing:
            return f"{label}: {missing}"
        reason = compare(dx, ort_gelu_grad(*gelu_inputs(n)), what="dx", **GELU_TOL)
        if reason:
            return (f"{label}, compared with ORT's GeluGrad: {reason}. dx = dy * (Phi(x) + x * phi(x)), "
                    "Phi(x) = 0.5 * (1 + erff(x * M_SQRT1_2)), phi(x) = expf(-0.5 * x * x) / sqrt(2 pi)")
        if gpu_usable():
            reason = _gpu_gelu(source, count, n)
            if reason:
                return f"{label}, compiled on the GPU: {reason}"
    if grid_problem is not None:
        raise grid_problem
    return None


def _gpu_gelu(source, blocks, n):
    dy, x = gelu_inputs(n)
    dx = nan_filled(x)
    gpu_run(source, GELU, blocks, BLOCK, dy, x, dx, n)
    return compare(dx, ort_gelu_grad(dy, x), what="dx", **GELU_TOL)


# --- exercise 2: LayerNormalizationGrad's dX ---------------------------------------------------------
def layer_norm_grad(remote, source_fn):
    """Exercise 'layer_norm_grad': layer_norm_grad_source() is CUDA C++ for layer_norm_grad_dx(...), one
    block per row; equal to ORT's LayerNormalizationGrad dX on every shape and block size."""
    source = learner_source(remote, source_fn, "layer_norm_grad_source()")
    prepared(source, LN_GRAD)
    cases = SEEN_LN + HIDDEN_LN
    for (rows, cols, block), result in zip(cases, _layer_norm_launches(source, cases)):
        label = (f"for {rows} row(s) of {cols} with {block} threads per block"
                 f"{' (a shape the notebook does not show)' if (rows, cols, block) not in SEEN_LN else ''}")
        try:
            if isinstance(result, str) or not isinstance(result, list) or len(result) != 2:
                _answer(result, (rows, cols))
            reason = layer_norm_case(source, *(_answer(r, (rows, cols)) for r in result), rows, cols, block)
        except CheckFailed as exc:
            raise CheckFailed(f"{label}: {exc}") from None
        if reason:
            return f"{label}: {reason}"
    return None


def layer_norm_case(source, forward, reverse, rows, cols, block):
    """None, or what is wrong with the kernel's dx on one case, from its CPU-runner results in both thread
    orders (and, on a GPU, its compiled run)."""
    if not np.array_equal(forward, reverse, equal_nan=True):
        at = tuple(int(i) for i in np.argwhere(~((forward == reverse) | (np.isnan(forward) & np.isnan(reverse))))[0])
        return (f"a race: dx changes with the order the threads run between barriers (at index {at}: "
                f"{forward[at]!r} with thread 0 first, {reverse[at]!r} with the last thread first). A "
                "__syncthreads() is missing: between the writes to shared memory and the reads of them, and "
                "before shared memory is written again for the next sum")
    if np.isnan(forward).any():
        return unwritten(forward, _unwritten_hint(forward, block))
    inputs = layer_norm_inputs(rows, cols)
    expected = ort_layer_norm_dx(*inputs)
    reason = compare(forward, expected, what="dx", **LN_TOL)
    if reason:
        return _wrong_values(forward, inputs, reason)
    if gpu_usable():
        dx = nan_filled(inputs[1])
        gpu_run(source, LN_GRAD, rows, block, *inputs, dx, rows, cols)
        reason = compare(dx, expected, what="dx", **LN_TOL)
        if reason:
            return f"compiled on the GPU: {reason}"
    return None


def _unwritten_hint(dx, block):
    """Why elements of dx were left unwritten, from where they are."""
    missing = np.isnan(dx)
    if missing.all(axis=1).any() and not missing.all():
        return "whole rows were never written: block blockIdx.x handles row blockIdx.x (the grid has one block per row)"
    columns = np.argwhere(missing)[:, 1]
    if columns.min() >= block:
        return (f"columns from {block} (blockDim.x) on were never written: loop over the row, "
                "for (int c = threadIdx.x; c < cols; c += blockDim.x)")
    return "every element of the row must be written by some thread"


def _wrong_values(dx, inputs, reason):
    """A wrong reduction when dx has the formula's shape with other sums, else the plain comparison."""
    dy, x, scale, mean, inv_std = inputs
    cols = x.shape[1]
    g = (dy * scale).astype(np.float64)
    xhat = (x.astype(np.float64) - mean[:, None]) * inv_std[:, None]
    for r in range(x.shape[0]):
        if cols < 3:
            break
        # dx = inv_std * (g - a - xhat * b): read the learner's a and b back by least squares
        t = g[r] - dx[r].astype(np.float64) / inv_std[r]
        design = np.stack([np.ones(cols), xhat[r]], axis=1)
        (a, b), *_ = np.linalg.lstsq(design, t, rcond=None)
        fits = np.max(np.abs(design @ (a, b) - t)) <= 1e-3 * (1 + np.max(np.abs(g[r])))
        want_a, want_b = g[r].mean(), (g[r] * xhat[r]).mean()
        if fits and not (np.isclose(a, want_a, rtol=1e-3, atol=1e-4) and np.isclose(b, want_b, rtol=1e-3, atol=1e-4)):
            return (f"a wrong reduction: row {r}'s dx has the formula's form, but with mean(g) = {a:.6g} and "
                    f"mean(g * xhat) = {b:.6g} where they are {want_a:.6g} and {want_b:.6g} (g = dy * scale, "
                    "xhat = (x - mean) * inv_std). Every thread's partial sums must reach the block's total "
                    "(all warps, every column), and each mean divides by cols")
    return (f"compared with ORT's LayerNormalizationGrad: {reason}. dx = inv_std * (g - mean(g) - xhat * "
            "mean(g * xhat)), with g = dy * scale and xhat = (x - mean) * inv_std")

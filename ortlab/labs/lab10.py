"""Checks and helpers for lab10_cuda_kernel: GeluGrad and LayerNormalizationGrad's dX in CUDA C++.

The learner writes each kernel as CUDA C++ text, as ORT's CUDA kernels are written
(orttraining/orttraining/training_ops/cuda/activation/activations_grad_impl.cu,
orttraining/orttraining/training_ops/cuda/nn/layer_norm_grad_impl.cu). The text is data: the checks
(ortlab.labs.judges.lab10, which this module never imports) take it from the learner's function and
compile it themselves with NVRTC + ptxas for sm_80 and sm_90 (ortlab.cuda.compile), run it on the CPU
runner (ortlab.cuda.launch: bounds-checked, threads in a fixed order between barriers) on shapes the
notebook never shows, and compare with ORT 1.19.2's CPU kernels. Outputs are filled with NaN before each
launch, so an element no thread wrote stays NaN and is named. On a GPU the compiled cubin also runs
(ortlab.cuda.gpu); without one the checks say they took the CPU path.

This module holds the machinery both sides share (the kernels' signatures, the inputs, the launch with
its messages); the reference maths (ORT's kernels) lives only in the judges.
"""
import numpy as np

from ortlab import cuda
from ortlab.cuda import gpu
from ortlab.errors import OrtlabError
from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner
from ortlab.viz import Table

ARCHS = ("sm_80", "sm_90")
BLOCK = 256       # GeluGrad: threads per block (the learner's grid function picks the blocks)
LN_BLOCK = 128    # LayerNormalizationGrad: one block of LN_BLOCK threads per row (the checks vary it)
EPSILON = 1e-5
TIMEOUT = 20.0    # seconds one CPU-runner launch may take
GELU = ("gelu_grad", (("dy", "const float", True), ("x", "const float", True), ("dx", "float", True),
                      ("n", "int", False)))
LN_GRAD = ("layer_norm_grad_dx", (("dy", "const float", True), ("x", "const float", True),
                                  ("scale", "const float", True), ("mean", "const float", True),
                                  ("inv_std", "const float", True), ("dx", "float", True),
                                  ("rows", "int", False), ("cols", "int", False)))
SEEN_N = (1024, 1000)
SEEN_LN = ((4, 300, LN_BLOCK), (2, 1024, LN_BLOCK))  # (rows, cols, threads per block)


def signature(kernel):
    """The C++ signature the lab launches, e.g. 'gelu_grad(const float* dy, ..., int n)'."""
    name, params = kernel
    return f"{name}(" + ", ".join(f"{t}* {n}" if p else f"{t} {n}" for n, t, p in params) + ")"


def gelu_inputs(n, seed=0):
    """(dy, x): float32 vectors of n elements, x spread over [-9, 9]."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n).astype(np.float32), (rng.standard_normal(n) * 3).astype(np.float32)


def layer_norm_inputs(rows, cols, seed=0):
    """(dy, x, scale, mean, inv_std) for LayerNormalizationGrad over the last axis: mean and inv_std =
    1 / sqrt(var + epsilon) are the forward's saved statistics of x (float32, one per row)."""
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 2 + 1).astype(np.float32)
    scale = rng.standard_normal(cols).astype(np.float32)
    dy = rng.standard_normal((rows, cols)).astype(np.float32)
    x64 = x.astype(np.float64)
    mean = x64.mean(axis=1)
    inv_std = 1 / np.sqrt(x64.var(axis=1) + EPSILON)
    return dy, x, scale, mean.astype(np.float32), inv_std.astype(np.float32)


# --- compile, build, launch ---------------------------------------------------------------------------
def source_text(source, what):
    """The learner's source, or CheckFailed when it is not CUDA C++ text."""
    if not isinstance(source, str) or not source.strip():
        raise CheckFailed(f"{what} must return the kernel's CUDA C++ source as a str, not {type(source).__name__}")
    return source


def check_signature(source, kernel):
    """CheckFailed unless `source` defines the kernel with the lab's parameter list."""
    name, params = kernel
    try:
        found = cuda.cpu.parse_params(source, name)
    except OrtlabError as exc:
        raise CheckFailed(f"{exc}; the lab launches extern \"C\" __global__ void {signature(kernel)}") from None
    got = [(p.type, p.pointer) for p in found]
    if got != [(t, p) for _, t, p in params]:
        shown = ", ".join(f"{p.type}{'*' if p.pointer else ''} {p.name}" for p in found)
        raise CheckFailed(f"kernel {name}({shown}) does not take the lab's parameters: write "
                          f"extern \"C\" __global__ void {signature(kernel)}")


def compiled(source, kernel, archs=ARCHS):
    """{arch: KernelResources} of the kernel compiled by NVRTC + ptxas; CheckFailed on a compile error,
    a mangled name or a spill."""
    name = kernel[0]
    found = {}
    for arch in archs:
        try:
            result = _compile(source, arch)
        except cuda.CudaCompileError as exc:
            raise CheckFailed(f"NVRTC cannot compile it for {arch}: {str(exc)[:400]}") from None
        if result.kernels is None:
            raise CheckFailed(f"no resources for {arch}: {result.why_no_cubin}")
        if name not in result.kernels:
            raise CheckFailed(f"ptxas found no kernel named {name} (it found {sorted(result.kernels)}): declare it "
                              f"extern \"C\" __global__ so that C++ does not mangle its name")
        res = result.kernel(name)
        if res.spills or res.local_bytes:
            raise CheckFailed(f"on {arch} the kernel spills to local memory ({res.spill_stores} B stored, "
                              f"{res.spill_loads} B loaded, {res.local_bytes} B stack): keep per-thread arrays "
                              "out of it (use shared memory or registers)")
        found[arch] = res
    return found


def _compile(source, arch):
    try:
        return cuda.compile(source, arch)
    except cuda.CudaCompileError:
        raise
    except OrtlabError as exc:  # e.g. a NUL character in the text, or ptxas failing
        raise CheckFailed(f"it cannot be compiled for {arch}: {str(exc)[:400]}") from None


def cpu_build(source, kernel):
    """The CpuKernel of the learner's kernel; CheckFailed when g++ cannot build it for the CPU runner."""
    try:
        return cuda.cpu_kernel(source, kernel[0])
    except OrtlabError as exc:
        raise CheckFailed(f"the CPU runner cannot build it: {str(exc)[:400]}") from None


def runner_message(error):
    """What a failed CPU-runner launch means for the learner, one line."""
    text = str(error)
    if "is out of bounds for type" in text:  # a fixed-size array (shared or local), GCC's bounds check
        return (f"an index past a fixed-size array: {text.split('stopped: ', 1)[-1]}. The checks launch 32 to "
                "256 threads per block: size shared arrays for the largest block (or by blockDim.x)")
    if "has 0 elements)" in text:
        return (f"{text.split('stopped: ', 1)[-1]}: the lab launches with no dynamic shared memory "
                "(extern __shared__ arrays are empty); declare a fixed-size __shared__ array")
    if "is out of bounds" in text:
        return (f"no bounds check: {text.split('stopped: ', 1)[-1]}. A thread whose index is past the end must "
                "not read or write: guard the access with `if (i < n)` (or loop while c < cols)")
    if "waits at __syncthreads()" in text:
        return (f"a __syncthreads() that not every thread of the block reaches: {text.split('stopped: ', 1)[-1]}. "
                "Keep barriers outside `if`s that depend on the thread and before any early `return`")
    if "crashed the CPU runner" in text:
        return ("the kernel crashed the CPU runner: an access outside an array the runner cannot check, one reached "
                "through a pointer a __device__ function was given (e.g. a shared array sized for fewer threads "
                "than the block has: the checks launch 32 to 256), or local arrays too large for a thread's stack")
    if "did not finish within" in text:
        return f"the kernel never finished on the CPU runner ({text}): a loop whose index never reaches its end?"
    return f"the CPU runner stopped the kernel: {text[:400]}"


def launch_cpu(kernel, grid, block, *args, schedule="forward"):
    """Run the CpuKernel with `args` (their outputs already NaN-filled by the caller); CheckFailed with
    runner_message when the runner stops it."""
    try:
        cuda.launch(kernel, grid, block, *args, schedule=schedule, timeout=TIMEOUT)
    except OrtlabError as exc:
        raise CheckFailed(runner_message(exc)) from None


def nan_filled(like):
    """An output array of `like`'s shape, every element NaN (one left NaN was never written)."""
    return np.full(like.shape, np.nan, np.float32)


def grid_blocks(grid_fn, n):
    """The learner's grid for n elements, checked to be a positive int."""
    try:
        blocks = grid_fn(n)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:
        raise CheckFailed(f"gelu_grad_grid({n}) raised {type(exc).__name__}: {exc}") from None
    if isinstance(blocks, bool) or not isinstance(blocks, (int, np.integer)) or blocks < 1:
        raise CheckFailed(f"gelu_grad_grid({n}) returned {blocks!r}: return the number of blocks, an int >= 1")
    if blocks > -(-n // BLOCK) + 1024:
        raise CheckFailed(f"gelu_grad_grid({n}) returned {blocks} blocks of {BLOCK} threads for {n} elements: "
                          f"{-(-n // BLOCK)} cover them all")
    return int(blocks)


def run_gelu_grad(source, grid_fn, n, kernel=None, seed=0):
    """dx from the learner's GeluGrad kernel on the CPU runner for n elements (NaN where never written)."""
    kernel = kernel or cpu_build(source, GELU)
    dy, x = gelu_inputs(n, seed)
    dx = nan_filled(x)
    launch_cpu(kernel, grid_blocks(grid_fn, n), BLOCK, dy, x, dx, n)
    return dx


def run_layer_norm_grad(source, rows, cols, block=LN_BLOCK, kernel=None, schedule="forward", seed=0):
    """dx from the learner's kernel on the CPU runner: one block of `block` threads per row."""
    kernel = kernel or cpu_build(source, LN_GRAD)
    dy, x, scale, mean, inv_std = layer_norm_inputs(rows, cols, seed)
    dx = nan_filled(x)
    launch_cpu(kernel, rows, block, dy, x, scale, mean, inv_std, dx, rows, cols, schedule=schedule)
    return dx


def unwritten(out, what):
    """None when every element was written, else a message naming the first one left NaN."""
    missing = np.isnan(out)
    if not missing.any():
        return None
    first = tuple(int(i) for i in np.argwhere(missing)[0])
    return f"{int(missing.sum())} of {out.size} elements of dx were never written (the first at index {first}); {what}"


# --- the GPU path -------------------------------------------------------------------------------------
def gpu_usable():
    """True when a GPU is here and ortlab.cuda knows its architecture (so it can compile for it)."""
    return gpu.available() and gpu.device_arch() in cuda.ARCHS


def gpu_run(source, kernel, grid, block, *args):
    """Launch the kernel compiled for this GPU on it (outputs written in place); OrtlabError without one."""
    try:
        result = cuda.compile(source, gpu.device_arch())
        gpu.run(source, kernel[0], result.cubin, grid, block, *args)
    except OrtlabError as exc:
        raise CheckFailed(f"compiled for this GPU ({gpu.device_name()}), the launch failed: {exc}") from None


def where_it_ran():
    """'GPU: <name>' when kernels also run compiled here, else the CPU path's label."""
    if gpu_usable():
        return f"GPU: {gpu.device_name()} ({gpu.device_arch()}), compiled cubin"
    return "CPU path: no GPU here, the kernels ran on the CPU runner only (no compiled run, no timing)"


# --- what the notebook shows --------------------------------------------------------------------------
def resources_table(source, kernel, block):
    """One row per architecture: registers, shared memory, spills and occupancy at `block` threads."""
    rows = []
    for arch, res in compiled(source, kernel).items():
        occ = cuda.occupancy(res, block)
        rows.append({"arch": arch, "registers": res.registers, "shared B": res.shared_bytes,
                     "spills B": res.spills, f"blocks/SM at {block}": occ.blocks_per_sm,
                     "occupancy": f"{occ.occupancy:.0%}", "limited by": " and ".join(occ.limited_by)})
    return Table.from_dicts(rows)


def gpu_table(gelu_source, gelu_grid, ln_source):
    """Each kernel on the notebook's first shape: where it ran, and (on a GPU) whether the compiled run
    equals the CPU runner's bit for bit."""
    rows = []
    n, (r, c, b) = SEEN_N[1], SEEN_LN[0]
    cpu_dx = {"gelu_grad": run_gelu_grad(gelu_source, gelu_grid, n),
              "layer_norm_grad_dx": run_layer_norm_grad(ln_source, r, c, b)}
    for name, cpu in cpu_dx.items():
        row = {"kernel": name, "ran on": where_it_ran()}
        if gpu_usable():
            if name == "gelu_grad":
                dy, x = gelu_inputs(n)
                dx = nan_filled(x)
                gpu_run(gelu_source, GELU, gelu_grid(n), BLOCK, dy, x, dx, n)
            else:
                dy, x, scale, mean, inv_std = layer_norm_inputs(r, c)
                dx = nan_filled(x)
                gpu_run(ln_source, LN_GRAD, r, b, dy, x, scale, mean, inv_std, dx, r, c)
            row["max |GPU - CPU runner|"] = float(np.nanmax(np.abs(dx - cpu)))
        else:
            row["max |GPU - CPU runner|"] = "n/a (no GPU)"
        rows.append(row)
    return Table.from_dicts(rows)


# --- checks -------------------------------------------------------------------------------------------
def check_gelu_grad(source_fn, grid_fn):
    """Exercise 'gelu_grad': gelu_grad_source() is CUDA C++ for gelu_grad(dy, x, dx, n), launched on
    gelu_grad_grid(n) blocks of BLOCK threads."""
    judge("gelu_grad", "lab10.gelu_grad", learner(source_fn), learner(grid_fn))


def check_layer_norm_grad(source_fn):
    """Exercise 'layer_norm_grad': layer_norm_grad_source() is CUDA C++ for layer_norm_grad_dx(...),
    one block per row."""
    judge("layer_norm_grad", "lab10.layer_norm_grad", learner(source_fn))

"""Helpers of notebook L3_01's section "The same optimizations in CUDA C++": LayerNormalization's
forward written three ways (ortlab/cuda/kernels/layer_norm_versions.cu), each compiled by NVRTC + ptxas
(ortlab.cuda.compile), its occupancy computed (ortlab.cuda.occupancy), run on the CPU runner
(ortlab.cuda.launch) and compared with ORT 1.19.2's CPU LayerNormalization, and, on a GPU only, timed
(ortlab.cuda.gpu). ORT's own kernel is onnxruntime/contrib_ops/cuda/layer_norm_impl.cu (cuApplyLayerNorm).
Each function returns plain rows (or a figure) for the notebook.
"""
import numpy as np

from ortlab import cuda
from ortlab.cuda import gpu, kernels
from ortlab.cuda.kernels.layer_norm_versions import VERSIONS, grid
from ortlab.session import run_node

ARCHS = ("sm_80", "sm_90")
BLOCK_SIZES = (32, 128, 256, 768, 1024)
EPSILON = 1e-5


def source():
    """The CUDA C++ text of the three versions, after common.cuh (the warp and block sums they share)."""
    return kernels.source("layer_norm_versions")


def resource_rows(archs=ARCHS, block_sizes=BLOCK_SIZES):
    """One row per version and architecture: ptxas's registers, static shared memory and spills, and the
    occupancy (active warps / the SM's maximum) at each block size with the resource that limits it."""
    rows = []
    for arch in archs:
        result = cuda.compile(source(), arch)
        for label, name, _ in VERSIONS:
            res = result.kernel(name)
            row = {"version": label, "arch": arch, "registers": res.registers, "shared B": res.shared_bytes,
                   "spills B": res.spills}
            for block in block_sizes:
                occ = cuda.occupancy(res, block)
                row[f"{block} threads"] = f"{occ.occupancy:.0%} ({occ.limited_by[0]})"
            rows.append(row)
    return rows


def inputs(rows, cols, seed=0):
    """(x, scale, bias): float32, x with a mean far from 0 (a one-pass variance would lose digits)."""
    rng = np.random.default_rng(seed)
    return ((rng.standard_normal((rows, cols)) * 3 + 5).astype(np.float32),
            rng.standard_normal(cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32))


def ort_layer_norm(x, scale, bias):
    """ORT's CPU LayerNormalization (axis -1, epsilon EPSILON): Y."""
    return run_node("LayerNormalization", [x, scale, bias], {"axis": -1, "epsilon": EPSILON})[0]


def cpu_rows(shapes=((64, 300), (37, 301), (1, 1000)), block=128):
    """Each version on the CPU runner (outputs NaN-filled first) against ORT on each shape: the largest
    |difference|, elements never written, and whether it is within rtol = atol = 1e-4. cols % 4 == 0
    takes warp + float4's vector path, the other shapes its scalar loop."""
    built = cuda.cpu_kernels(source(), [name for _, name, _ in VERSIONS])
    rows = []
    for shape in shapes:
        x, scale, bias = inputs(*shape)
        expected = ort_layer_norm(x, scale, bias)
        for label, name, _ in VERSIONS:
            y = np.full_like(x, np.nan)
            cuda.launch(built[name], grid(name, shape[0], block), block, x, scale, bias, y, shape[0], shape[1],
                        EPSILON)
            rows.append({"shape": str(shape), "version": label, "launch": f"{grid(name, shape[0], block)} x {block}",
                         "never written": int(np.isnan(y).sum()),
                         "max |y - ORT|": f"{float(np.nanmax(np.abs(y - expected))):.1e}",
                         "equal to ORT": bool(np.allclose(y, expected, rtol=1e-4, atol=1e-4))})
    return rows


CONTRAST = "(a kernel needing 64 registers)"


def occupancy_sweep(arch, block_sizes=range(32, 1025, 32)):
    """{version: [occupancy at each block size]} on `arch`, and for contrast a kernel with 64 registers
    per thread and no shared memory, where the register file is the limit."""
    result = cuda.compile(source(), arch)
    sweep = {label: [cuda.occupancy(result.kernel(name), b).occupancy for b in block_sizes]
             for label, name, _ in VERSIONS}
    sweep[CONTRAST] = [cuda.occupancy({"registers": 64}, b, arch).occupancy for b in block_sizes]
    return sweep


def filling_rows(shape=(8192, 1024), block=256, archs=ARCHS):
    """What each version launches for `shape` at `block` threads: blocks and threads, and the share of the
    GPU's resident-thread slots (SMs x max threads per SM, datasheet SM counts) those threads can fill.
    Occupancy is per SM; a grid with fewer blocks than the SMs hold leaves SMs idle whatever it is."""
    rows = []
    for label, name, _ in VERSIONS:
        blocks = grid(name, shape[0], block)
        row = {"version": label, "blocks": blocks, "threads": blocks * block}
        for arch in archs:
            sheet, limits = cuda.archs.datasheet(arch), cuda.arch_limits(arch)
            slots = sheet.sms * limits.max_warps_per_sm * limits.warp_size
            row[f"of {sheet.gpu}'s {slots:,} thread slots"] = f"{min(1.0, blocks * block / slots):.0%}"
        rows.append(row)
    return rows


def plot_occupancy(archs=ARCHS, block_sizes=range(32, 1025, 32)):
    """Occupancy against threads per block, one panel per architecture, one line per version."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    fig, axes = plt.subplots(1, len(archs), figsize=(6 * len(archs), 3.5), sharey=True)
    for ax, arch in zip(np.atleast_1d(axes), archs):
        for (label, values), style in zip(occupancy_sweep(arch, block_sizes).items(), ("-o", "--s", ":d", "-.")):
            ax.plot(list(block_sizes), [100 * v for v in values], style, markersize=3, label=label)
        ax.set_title(f"{arch} ({cuda.arch_limits(arch).gpu})")
        ax.set_xlabel("threads per block")
        ax.set_xticks([128, 256, 384, 512, 640, 768, 896, 1024])
        ax.set_ylim(0, 105)
        ax.grid(alpha=0.3)
    np.atleast_1d(axes)[0].set_ylabel("occupancy (%)")
    np.atleast_1d(axes)[0].legend(loc="lower center", fontsize=8, ncol=2)
    fig.tight_layout()
    return fig


def gpu_rows(shape=(8192, 1024), block=256, repeats=50):
    """On a GPU: each version compiled for it, checked against ORT, and timed (mean of `repeats` launches
    between two CUDA events), with the GB/s of reading x once and writing y once. Without a GPU one row
    per version says that nothing was timed."""
    if not gpu.available():
        return [{"version": label, "timed": "no: no GPU here (CPU runner only, which has no timing model)"}
                for label, _, _ in VERSIONS]
    arch, text = gpu.device_arch(), source()
    cubin = cuda.compile(text, arch).cubin
    x, scale, bias = inputs(*shape)
    expected = ort_layer_norm(x, scale, bias)
    rows = []
    for label, name, _ in VERSIONS:
        y = np.full_like(x, np.nan)
        ms = gpu.run(text, name, cubin, grid(name, shape[0], block), block, x, scale, bias, y, shape[0], shape[1],
                     EPSILON, repeats=repeats)
        rows.append({"version": label, "GPU": gpu.device_name(), "shape": str(shape), "block": block,
                     "ms": round(ms, 4), "GB/s (x read once, y written once)": round(2 * x.nbytes / ms / 1e6, 1),
                     "equal to ORT": bool(np.allclose(y, expected, rtol=1e-4, atol=1e-4))})
    return rows

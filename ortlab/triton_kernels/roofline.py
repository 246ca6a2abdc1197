"""Bytes, FLOPs and the roofline: is a kernel limited by memory bandwidth or by arithmetic?

  time >= max(bytes / bandwidth, flops / peak_flops);  arithmetic intensity = flops / bytes.
  A kernel whose intensity is below the ridge point (peak_flops / bandwidth) is memory-bound.

Bytes are counted analytically as the least traffic the op needs (each input read once, each
output written once). On a GPU, `benchmark` times a kernel with CUDA events (warm-up, then the
median) and `measure_peaks` measures the machine's own ceilings (a large device-to-device copy,
a large matmul). On CPU Triton runs in its interpreter, where timings say nothing about a GPU:
the analytic figures and a datasheet GPU's roofline stand in. (ORT's own tool for this is
the profiler plus Nsight Compute; the roofline model is Williams et al. 2009.)
"""
import statistics
import time
from dataclasses import dataclass

import numpy as np
import torch

from ortlab.env import kernel_device
from ortlab.triton_kernels.executor import bind, to_device

# Datasheet figures (dense FP32 without tensor cores; HBM bandwidth), for the CPU path.
DATASHEET = {
    "H100 SXM (datasheet)": {"bandwidth": 3.35e12, "flops": 67e12},
    "A100 SXM 80GB (datasheet)": {"bandwidth": 2.039e12, "flops": 19.5e12},
}

# What a measured rate column holds on CPU, where Triton's interpreter (Python) does the timing: a
# GB/s or a share of a GPU's peak computed from it would read as a broken GPU (0.0), so it is not shown.
NA_ON_CPU = "n/a on CPU (interpreter)"
H100 = "H100 SXM (datasheet)"

# Where bytes travel, in bytes per second (datasheet figures, one direction).
LINKS = {"PCIe 4.0 x16 (host <-> GPU)": 32e9, "PCIe 5.0 x16 (host <-> GPU)": 64e9,
         "NVLink 4 (GPU <-> GPU)": 450e9, "H100 HBM3 (on the GPU)": 3.35e12}


def transfer_table(nbytes_list):
    """Time to move each size over each link, microseconds: why copies to the host hurt."""
    return [{"bytes": f"{n / 1e6:g} MB", **{link: round(1e6 * n / bw, 1) for link, bw in LINKS.items()}}
            for n in nbytes_list]


@dataclass
class Cost:
    op: str
    shapes: str
    bytes: int
    flops: int

    @property
    def intensity(self):
        return self.flops / self.bytes

    def bound(self, peaks):
        ridge = peaks["flops"] / peaks["bandwidth"]
        return "memory" if self.intensity < ridge else "compute"

    def floor_us(self, peaks):
        """The roofline's lower bound on the kernel's time, in microseconds."""
        return 1e6 * max(self.bytes / peaks["bandwidth"], self.flops / peaks["flops"])


def nbytes(arrays):
    return int(sum(np.asarray(a).nbytes for a in arrays if a is not None))


def cost(op_type, inputs, attributes=None, domain=""):
    """Analytic bytes (inputs read once + outputs written once) and FLOPs of one kernel call."""
    kernel, inputs = bind(op_type, inputs, domain, **(attributes or {}))
    outputs = kernel.reference(*inputs)
    shapes = " ".join(str(tuple(np.shape(a))) for a in inputs if a is not None)
    return Cost(op_type, shapes, nbytes(inputs) + nbytes(outputs), int(kernel.flops(*inputs)))


def cost_table(costs, peaks):
    """Rows for ortlab.viz.Table: bytes, FLOPs, intensity, bound and time floor on `peaks`."""
    return [{"op": c.op, "inputs": c.shapes, "MB moved": round(c.bytes / 1e6, 3),
             "MFLOP": round(c.flops / 1e6, 3), "FLOP/byte": round(c.intensity, 2),
             "bound": c.bound(peaks), "floor (us)": round(c.floor_us(peaks), 2)} for c in costs]


def cuda_time_ms(fn, warmup=5, repeat=20):
    """Median time of fn() in ms, measured with CUDA events after `warmup` calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def wall_time_ms(fn, warmup=1, repeat=3):
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(1e3 * (time.perf_counter() - start))
    return statistics.median(times)


def measure_peaks(copy_bytes=1 << 30, matmul_n=8192):
    """This GPU's ceilings: bandwidth of a device-to-device copy (read + write) and FP32 matmul
    FLOP/s. Raises on CPU, where there is no GPU to measure."""
    if kernel_device() != "cuda":
        raise RuntimeError("measure_peaks needs a CUDA GPU; on CPU use DATASHEET figures")
    src = torch.empty(copy_bytes // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = cuda_time_ms(lambda: dst.copy_(src))
    a = torch.randn(matmul_n, matmul_n, device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = False
    mm_ms = cuda_time_ms(lambda: a @ a, repeat=10)
    return {"bandwidth": 2 * copy_bytes / (copy_ms * 1e-3), "flops": 2 * matmul_n**3 / (mm_ms * 1e-3)}


def rates(nbytes, flops, ms, on_gpu):
    """Achieved GB/s and GFLOP/s of a kernel that moved `nbytes` and did `flops` in `ms`; on CPU
    (Triton's interpreter) NA_ON_CPU for both, since Python's time says nothing about a GPU."""
    if not on_gpu:
        return {"GB/s": NA_ON_CPU, "GFLOP/s": NA_ON_CPU}
    return {"GB/s": round(nbytes / (ms * 1e-3) / 1e9, 1), "GFLOP/s": round(flops / (ms * 1e-3) / 1e9, 1)}


def bandwidth_rates(nbytes, ms, peak_bytes_per_s, on_gpu, peak_label="% of peak"):
    """Achieved GB/s of a kernel that moved `nbytes` in `ms`, and its share of a peak bandwidth;
    NA_ON_CPU for both on CPU (Triton's interpreter)."""
    if not on_gpu:
        return {"GB/s": NA_ON_CPU, peak_label: NA_ON_CPU}
    gbs = nbytes / (ms * 1e-3) / 1e9
    return {"GB/s": round(gbs, 1), peak_label: round(100 * gbs * 1e9 / peak_bytes_per_s, 1)}


def benchmark(op_type, inputs, attributes=None, domain="", kernel_fn=None):
    """Median time of ortlab's kernel on device-resident inputs, its analytic bytes and FLOPs, and on
    a GPU the achieved GB/s and GFLOP/s. On CPU the time is the interpreter's: the rates read
    NA_ON_CPU and the roofline floor on an H100's datasheet figures stands beside it."""
    kernel, arrays = bind(op_type, inputs, domain, **(attributes or {}))
    tensors = [to_device(a) for a in arrays]
    fn = kernel_fn or (lambda: kernel.compute(*tensors))
    c = cost(op_type, arrays, attributes, domain)
    on_gpu = kernel_device() == "cuda"
    ms = cuda_time_ms(fn) if on_gpu else wall_time_ms(fn)
    row = {"op": op_type, "inputs": c.shapes, "MB moved": round(c.bytes / 1e6, 3), "MFLOP": round(c.flops / 1e6, 3),
           "median ms": round(ms, 4), **rates(c.bytes, c.flops, ms, on_gpu),
           "timed on": "GPU (CUDA events)" if on_gpu else "CPU interpreter: not a GPU figure"}
    if not on_gpu:
        row["floor on H100 (us, datasheet)"] = round(c.floor_us(DATASHEET[H100]), 3)
    return row


def roofline_plot(costs, peaks, achieved=None, title="roofline", ax=None):
    """Log-log roofline: the memory slope and the compute ceiling of `peaks`, each kernel at its
    intensity (at its floor on the roof, or at its measured FLOP/s when `achieved` gives them)."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    ax = ax or plt.subplots(figsize=(6.5, 4))[1]
    intensity = np.logspace(-2, 3, 200)
    ax.loglog(intensity, np.minimum(peaks["flops"], intensity * peaks["bandwidth"]) / 1e9,
              color="black", lw=1.5, label="roof")
    for c in costs:
        y = (achieved or {}).get(c.op, min(peaks["flops"], c.intensity * peaks["bandwidth"]))
        ax.scatter([c.intensity], [y / 1e9], zorder=3)
        ax.annotate(c.op, (c.intensity, y / 1e9), textcoords="offset points", xytext=(4, -10), fontsize=8)
    ax.axvline(peaks["flops"] / peaks["bandwidth"], ls=":", color="gray")
    ax.set(xlabel="arithmetic intensity (FLOP / byte)", ylabel="GFLOP/s", title=title)
    return ax


def copy_costs(nbytes=64 << 20):
    """On a GPU: host-to-device from pageable and from pinned memory, the pinned copy issued
    asynchronously on a side stream, and device-to-device, each timed with CUDA events. On CPU:
    a plain memory copy timed on the host (no GPU to copy to), labelled as such."""
    n = nbytes // 4
    if kernel_device() != "cuda":
        src, dst = torch.empty(n), torch.empty(n)
        ms = wall_time_ms(lambda: dst.copy_(src))
        return [{"copy": "host -> host (no GPU here)", "MB": nbytes / 1e6, "median ms": round(ms, 3),
                 "GB/s": round(nbytes / (ms * 1e-3) / 1e9, 1)}]
    pageable, pinned = torch.empty(n), torch.empty(n).pin_memory()
    device, other = torch.empty(n, device="cuda"), torch.empty(n, device="cuda")
    side = torch.cuda.Stream()

    def on_side_stream():
        with torch.cuda.stream(side):
            device.copy_(pinned, non_blocking=True)
        torch.cuda.current_stream().wait_stream(side)

    cases = {"host (pageable) -> GPU": lambda: device.copy_(pageable),
             "host (pinned) -> GPU": lambda: device.copy_(pinned, non_blocking=True),
             "host (pinned) -> GPU on a side stream": on_side_stream,
             "GPU -> GPU": lambda: other.copy_(device)}
    rows = []
    for name, fn in cases.items():
        ms = cuda_time_ms(fn)
        rows.append({"copy": name, "MB": nbytes / 1e6, "median ms": round(ms, 3),
                     "GB/s": round(nbytes / (ms * 1e-3) / 1e9, 1)})
    return rows

"""The seven parts of `python -m ortlab.benchmarks.gpu_check`, registered in order, with their time budgets
(together TOTAL_BUDGET_S = 7 minutes): device facts, Triton kernels and matmul throughput here; the CUDA
C++ parts in gpu_cuda.py, the runtime-API part in gpu_runtime.py, ortlab's engine on its two device EPs in
gpu_engine.py. Every import of torch, Triton, CuPy or cuda-bindings happens inside a part, so that a missing
package skips that part with its reason.

The engine part came last with a minute of its own (the total went from 6 to 7 minutes rather than taking
time from parts whose budgets no GPU run has measured yet): in its own process it compiles the five .cu
sources again (NVRTC, as the CUDA EP does on first use) and the Triton kernels its graphs need (Triton's
disk cache may hold some from the triton_kernels part), then runs 7 graphs x 2 EPs x 6 runs of a few
milliseconds; it stops starting sessions when less than gpu_engine.RESERVE_S of its minute is left and
records the rest as not run.
"""
import importlib.metadata
import shutil
import subprocess

from ortlab.benchmarks.gpu_cuda import part_cuda_kernels, part_occupancy, use_cuda_home
from ortlab.benchmarks.gpu_engine import part_engine_eps
from ortlab.benchmarks.gpu_registry import Part, Skip, dry_run_stop, register_part
from ortlab.benchmarks.gpu_runtime import part_runtime_api
from ortlab.cuda import nvrtc
from ortlab.cuda.archs import DATASHEETS

MATMUL_N = 8192


def _version(dist):
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(command):
    """First line of a command's output, or None when it is not installed or fails."""
    if shutil.which(command[0]) is None:
        return None
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    lines = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    return lines[-1] if done.returncode == 0 and lines else None


def _cuda_bindings_versions():
    """Driver and runtime API versions (e.g. 13000 -> '13.0') through cuda-bindings, or the import error."""
    try:
        from cuda.bindings import driver, runtime  # optional: cuda
    except ImportError as error:
        return {"cuda-bindings": f"not importable: {error}"}

    def as_text(result):
        error, value = result
        ok = int(getattr(error, "value", error)) == 0
        return f"{value // 1000}.{value % 1000 // 10}" if ok else f"error {error!r}"
    return {"CUDA driver API version (cudaDriverGetVersion)": as_text(runtime.cudaDriverGetVersion()),
            "CUDA runtime version (cudaRuntimeGetVersion)": as_text(runtime.cudaRuntimeGetVersion()),
            "cuDriverGetVersion": as_text(driver.cuDriverGetVersion())}


def part_device(context):
    """(a) What GPU this is: name, compute capability, SMs, memory, driver and runtime versions, packages."""
    import torch  # heavy: torch

    packages = {name: _version(name) for name in ("torch", "triton", "numpy", "onnx", "cupy-cuda13x", "cupy-cuda12x",
                                                  "cuda-bindings", "cuda-python")}
    dry_run_stop(context, "torch.cuda is asked about the device")
    if not torch.cuda.is_available():
        raise Skip("torch sees no CUDA GPU (torch.cuda.is_available() is False)")
    props = torch.cuda.get_device_properties(0)
    major, minor = torch.cuda.get_device_capability(0)
    versions = _cuda_bindings_versions()
    driver = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]) \
        or f"CUDA driver API {versions.get('CUDA driver API version (cudaDriverGetVersion)')}"
    facts = {"name": torch.cuda.get_device_name(0), "arch": f"sm_{major}{minor}",
             "compute capability": f"{major}.{minor}", "SMs": props.multi_processor_count,
             "memory GiB": round(props.total_memory / 2**30, 1),
             "L2 MiB": round(getattr(props, "L2_cache_size", 0) / 2**20, 1) or None,
             "driver": driver, "cuda runtime": torch.version.cuda, "torch CUDA build": torch.version.cuda,
             **versions, "nvcc": _run(["nvcc", "--version"]), "packages": packages}
    try:
        use_cuda_home()
        facts["NVRTC (ortlab.cuda)"] = ".".join(map(str, nvrtc.version()))
    except Exception as error:  # noqa: BLE001 - a fact that cannot be read is recorded as such
        facts["NVRTC (ortlab.cuda)"] = f"not loadable: {error}"
    return facts


def part_triton_kernels(context):
    """(c) Every Triton kernel compiled on the GPU against its numpy reference, then LayerNorm and softmax
    against the copy peak (ortlab.benchmarks.kernels' functions)."""
    from ortlab.benchmarks import kernels as bench  # heavy: torch and Triton, imported inside the part
    from ortlab.env import triton_mode  # heavy: ortlab.env imports torch
    from ortlab.triton_kernels.roofline import measure_peaks  # heavy: torch and Triton, imported inside the part

    if context.dry_run:
        rows = bench.check_all(2)
        dry_run_stop(context, f"the {len(rows)} kernels are compiled for the GPU (here they ran interpreted)")
    if triton_mode() != "compiled (cuda)":
        raise Skip(f"Triton would run {triton_mode()}: TRITON_INTERPRET=1 is set or torch sees no GPU")
    rows = bench.check_all(4096)
    peaks = measure_peaks()
    bandwidth = bench.bandwidth_rows([(16384, 1024), (8192, 4096), (4096, 8192)], peaks["bandwidth"])
    mismatches = [r["op"] for r in rows if not r["ok"]]
    return {"triton": triton_mode(), "rows": rows, "mismatches": mismatches,
            "checks": {"passed": len(rows) - len(mismatches), "total": len(rows)},
            "peak copy GB/s (measured)": round(peaks["bandwidth"] / 1e9, 1),
            "peak FP32 GFLOP/s (measured)": round(peaks["flops"] / 1e9, 1), "bandwidth": bandwidth}


def part_matmul(context, n=MATMUL_N):
    """(f) n x n x n matrix products in fp32, tf32 and bf16: TFLOP/s (CUDA events, median of 10 after 3
    warm-ups, random data) and the relative error of a 1024-sized product against fp64."""
    import torch  # heavy: torch

    from ortlab.triton_kernels.roofline import cuda_time_ms  # heavy: torch and Triton, imported inside the part

    dry_run_stop(context, "torch multiplies matrices on the GPU")
    if not torch.cuda.is_available():
        raise Skip("torch sees no CUDA GPU")
    major, minor = torch.cuda.get_device_capability(0)
    sheet = DATASHEETS.get(f"sm_{major}{minor}")
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(n, n, device="cuda", generator=generator)
    b = torch.randn(n, n, device="cuda", generator=generator)
    exact = (a[:1024].double() @ b[:, :1024].double())
    tf32_before = torch.backends.cuda.matmul.allow_tf32
    rows = []
    try:
        for name, dtype, tf32, peak in (("fp32", torch.float32, False, "fp32_tflops"),
                                        ("tf32", torch.float32, True, "tf32_tflops"),
                                        ("bf16", torch.bfloat16, False, "bf16_tflops")):
            torch.backends.cuda.matmul.allow_tf32 = tf32
            x, y = a.to(dtype), b.to(dtype)
            ms = cuda_time_ms(lambda: x @ y, warmup=3, repeat=10)
            small = (x[:1024] @ y[:, :1024]).double()
            error = float((small - exact).abs().max() / exact.abs().max())
            rows.append({"precision": name, "n": n, "median ms": round(ms, 3),
                         "TFLOP/s": round(2 * n**3 / (ms * 1e-3) / 1e12, 1),
                         "max rel. error vs fp64 (1024 rows)": f"{error:.1e}",
                         "datasheet TFLOP/s (dense)": getattr(sheet, peak) if sheet else None})
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32_before
    return {"rows": rows, "datasheet": sheet.source if sheet else "ortlab.cuda.archs has no datasheet for this arch"}


register_part(Part("device", "(a) device facts", part_device, 30))
register_part(Part("cuda_kernels", "(b) CUDA C++ kernels on the GPU vs numpy", part_cuda_kernels, 70))
register_part(Part("triton_kernels", "(c) Triton kernels compiled vs numpy, bandwidth", part_triton_kernels, 115))
register_part(Part("runtime_api", "(d) runtime calls: measured host waits vs ortlab.cuda.runtime", part_runtime_api,
                   40))
register_part(Part("occupancy", "(e) occupancy: driver vs ortlab.cuda.occupancy", part_occupancy, 45))
register_part(Part("matmul", "(f) fp32 / tf32 / bf16 matmul throughput", part_matmul, 60))
register_part(Part("engine_eps", "(g) ortlab's engine: CUDA EP and Triton EP sessions vs the CPU EP", part_engine_eps,
                   60))

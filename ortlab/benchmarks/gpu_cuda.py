"""The GPU check's CUDA C++ parts: ortlab/cuda/kernels/*.cu compiled for the device and run through
CuPy (ortlab.cuda.launcher.CupyLauncher, which the engine's CUDA EP uses on a GPU too) against numpy
(gpu_cuda_cases.py), and each kernel's occupancy from the driver against
`ortlab.cuda.occupancy`, the arithmetic of cudaOccupancyMaxActiveBlocksPerMultiprocessor
(cuda_occupancy.h) that ortlab models without a GPU.

Compiling: `ortlab.cuda.compile` (NVRTC, then ptxas, as on a CPU machine) for the device's arch; where
that fails (no libnvrtc found, an arch ortlab does not list), `nvcc -cubin -Xptxas -v` from the image.
"""
import os
import shutil

import numpy as np

from ortlab.benchmarks.gpu_cuda_cases import CASES, run_case
from ortlab.benchmarks.gpu_registry import Skip, dry_run_stop
from ortlab.cuda import compile as ortlab_compile
from ortlab.cuda import kernels
from ortlab.cuda.launcher import CupyLauncher
from ortlab.cuda.occupancy import occupancy
from ortlab.cuda.ptxas import compile_file, parse_resources

BLOCK_SIZES = (32, 64, 128, 256, 512, 1024)
DYNAMIC_SHARED = (0, 32 * 1024)
DRY_RUN_ARCH = "sm_90"


def device_arch():
    """`sm_XY` of GPU 0, read through torch."""
    import torch  # heavy: torch

    if not torch.cuda.is_available():
        raise Skip("torch sees no CUDA GPU")
    major, minor = torch.cuda.get_device_capability(0)
    return f"sm_{major}{minor}"


def compile_source(text, arch):
    """{arch, compiler, cubin, kernels: {name: KernelResources}, seconds} for CUDA C++ `text`."""
    try:
        result = ortlab_compile(text, arch)
        if result.cubin is None:
            raise RuntimeError(result.why_no_cubin)
        return {"arch": arch, "compiler": "ortlab.cuda.compile (NVRTC + ptxas)", "cubin": result.cubin,
                "kernels": dict(result.kernels), "seconds": round(result.nvrtc_seconds + result.ptxas_seconds, 3)}
    except Exception as error:  # noqa: BLE001 - the image's nvcc is the fallback, the reason is kept
        fallback = nvcc_compile(text, arch)
        return {**fallback, "why not ortlab.cuda.compile": f"{type(error).__name__}: {error}"}


def nvcc_compile(text, arch):
    """The same source through `nvcc -cubin -arch=<arch> -Xptxas -v`; resources from ptxas's report."""
    nvcc = shutil.which("nvcc") or ("/usr/local/cuda/bin/nvcc" if os.path.exists("/usr/local/cuda/bin/nvcc") else None)
    if nvcc is None:
        raise RuntimeError("neither ortlab.cuda.compile nor nvcc could compile: nvcc is not on PATH")
    done, image = compile_file(lambda source, cubin: [nvcc, "-cubin", f"-arch={arch}", "-Xptxas", "-v", source,
                                                      "-o", cubin], text, "kernel.cu", 120)
    if done.returncode != 0:
        raise RuntimeError(f"nvcc failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return {"arch": arch, "compiler": "nvcc", "cubin": image, "kernels": parse_resources(done.stdout + done.stderr),
            "seconds": None}


def use_cuda_home(home="/usr/local/cuda"):
    """Point NVRTC's and ptxas's search at the image's toolkit (CUDA_HOME, PATH) when it is there and
    unset: the GPU image's torch wheels may hold neither in the folders ortlab.cuda looks at first."""
    if os.path.isdir(home):
        os.environ.setdefault("CUDA_HOME", home)
        if os.path.join(home, "bin") not in os.environ.get("PATH", "").split(os.pathsep):
            os.environ["PATH"] = os.environ.get("PATH", "") + os.pathsep + os.path.join(home, "bin")


def compile_all(arch):
    """Every registered source compiled for `arch`: {source name: compile_source(...)}."""
    use_cuda_home()
    return {name: compile_source(kernels.source(name), arch) for name in kernels.SOURCES}


def uncovered_sources():
    """Registered sources that no KernelCase runs (compiled and counted in occupancy, not run)."""
    return sorted(set(kernels.SOURCES) - {case.source for case in CASES})


def part_cuda_kernels(context):
    """(b) Each kernel case compiled for this GPU and run on it, against its numpy reference."""
    arch = DRY_RUN_ARCH if context.dry_run else device_arch()
    compiled = compile_all(arch)
    sources = [{"source": name, "compiler": c["compiler"], "arch": c["arch"], "seconds": c["seconds"],
                **({"why not ortlab.cuda.compile": c["why not ortlab.cuda.compile"]}
                   if "why not ortlab.cuda.compile" in c else {}),
                "registers": {k: r.registers for k, r in c["kernels"].items()}} for name, c in compiled.items()]
    dry_run_stop(context, "CuPy loads the cubins and launches the kernels")
    rows = []
    for case in CASES:
        try:
            rows += run_case(case, CupyLauncher(case.source, compiled[case.source]["cubin"]), "large")
        except Exception as error:  # noqa: BLE001 - one case's failure is a row, the others still run
            rows.append({"case": case.name, "output": "-", "max abs diff": f"{type(error).__name__}: {error}",
                         "tolerance": "-", "ok": False})
    mismatches = [f"{r['case']}: {r['output']}" for r in rows if not r["ok"]]
    return {"arch": arch, "sources": sources, "rows": rows, "mismatches": mismatches,
            "compiled, not run (no case in gpu_cuda_cases.py)": uncovered_sources(),
            "checks": {"passed": len(rows) - len(mismatches), "total": len(rows)}}


# ---- occupancy: the driver against ortlab.cuda.occupancy ---------------------------------------
def compare_occupancy(resources, arch, driver_blocks, block_sizes=BLOCK_SIZES, dynamic_shared=DYNAMIC_SHARED):
    """Rows {kernel, block, dynamic shared, registers, ortlab, driver, equal, limited by} and the
    mismatches, for each kernel of `resources` ({name: KernelResources or dict with registers and
    shared_bytes}) at each block size and dynamic shared memory. `driver_blocks(name, block, dynamic)`
    is the driver's answer (cuOccupancyMaxActiveBlocksPerMultiprocessor), or None on a dry run."""
    rows = []
    for name, res in resources.items():
        registers = res["registers"] if isinstance(res, dict) else res.registers
        for block in block_sizes:
            for dynamic in dynamic_shared:
                try:
                    ours = occupancy(res, block, arch, dynamic_shared=dynamic)
                    mine, limited = ours.blocks_per_sm, " and ".join(ours.limited_by)
                except Exception as error:  # noqa: BLE001 - ortlab's refusal is part of the comparison
                    mine, limited = f"refused: {error}", "-"
                theirs = driver_blocks(name, block, dynamic) if driver_blocks else None
                rows.append({"kernel": name, "block": block, "dynamic shared": dynamic, "registers": registers,
                             "ortlab blocks/SM": mine, "driver blocks/SM": theirs,
                             "equal": None if theirs is None else theirs == mine, "limited by": limited})
    mismatches = [f"{r['kernel']} block {r['block']} dyn {r['dynamic shared']}: ortlab {r['ortlab blocks/SM']}, "
                  f"driver {r['driver blocks/SM']}" for r in rows if r["equal"] is False]
    return rows, mismatches


def checked(result, call):
    """cuda-bindings returns (error, *values): the values, or RuntimeError naming the call and the error."""
    error, *values = result
    if int(getattr(error, "value", error)) != 0:
        raise RuntimeError(f"{call} returned {error!r}")
    return values[0] if len(values) == 1 else tuple(values)


def driver_api():
    from cuda.bindings import driver  # optional: cuda

    return driver


class DriverModule:
    """A cubin loaded with cuModuleLoadData in the device's primary context (cuda-bindings' driver API)."""

    def __init__(self, cubin):
        self.driver = d = driver_api()
        checked(d.cuInit(0), "cuInit")
        device = checked(d.cuDeviceGet(0), "cuDeviceGet")
        self.context = checked(d.cuDevicePrimaryCtxRetain(device), "cuDevicePrimaryCtxRetain")
        checked(d.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        self.image = np.frombuffer(cubin, np.uint8).copy()
        self.module = checked(d.cuModuleLoadData(self.image.ctypes.data), "cuModuleLoadData")
        self.functions = {}

    def function(self, name):
        if name not in self.functions:
            self.functions[name] = checked(self.driver.cuModuleGetFunction(self.module, name.encode()),
                                            "cuModuleGetFunction")
        return self.functions[name]

    def blocks_per_sm(self, name, block, dynamic):
        return int(checked(self.driver.cuOccupancyMaxActiveBlocksPerMultiprocessor(
            self.function(name), block, dynamic), "cuOccupancyMaxActiveBlocksPerMultiprocessor"))

    def attribute(self, name, attribute):
        kind = getattr(self.driver.CUfunction_attribute, attribute)
        return int(checked(self.driver.cuFuncGetAttribute(kind, self.function(name)), "cuFuncGetAttribute"))


def part_occupancy(context):
    """(e) Blocks per SM from the driver against ortlab.cuda.occupancy, every kernel, several block sizes."""
    arch = DRY_RUN_ARCH if context.dry_run else device_arch()
    compiled = compile_all(arch)
    if context.dry_run:
        for c in compiled.values():
            compare_occupancy(c["kernels"], arch, None)
        dry_run_stop(context, "the driver loads the cubins and answers cuOccupancyMaxActiveBlocksPerMultiprocessor")
    rows, mismatches, registers = [], [], []
    for name, c in compiled.items():
        module = DriverModule(c["cubin"])
        for kernel, res in c["kernels"].items():
            registers.append({"kernel": kernel, "ptxas registers": res.registers,
                              "driver registers": module.attribute(kernel, "CU_FUNC_ATTRIBUTE_NUM_REGS"),
                              "ptxas static shared": res.shared_bytes,
                              "driver static shared": module.attribute(kernel, "CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES")})
        found, differ = compare_occupancy(c["kernels"], arch, module.blocks_per_sm)
        rows += found
        mismatches += differ
    mismatches += [f"{r['kernel']}: ptxas says {r['ptxas registers']} registers / {r['ptxas static shared']} B shared, "
                   f"the driver {r['driver registers']} / {r['driver static shared']}" for r in registers
                   if (r["ptxas registers"], r["ptxas static shared"]) != (r["driver registers"],
                                                                           r["driver static shared"])]
    return {"arch": arch, "driver call": "cuOccupancyMaxActiveBlocksPerMultiprocessor (what "
            "cudaOccupancyMaxActiveBlocksPerMultiprocessor calls)", "registers": registers, "rows": rows,
            "mismatches": mismatches, "checks": {"passed": len(rows) + len(registers) - len(mismatches),
                                                 "total": len(rows) + len(registers)}}

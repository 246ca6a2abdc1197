"""compile(source, arch): CUDA C++ -> PTX (NVRTC) -> cubin and per-kernel resources (ptxas), cached.

The two steps nvcc itself takes for device code: the front end and NVVM lower C++ to PTX for the
virtual architecture compute_XX, then ptxas assembles that PTX into SASS for the real GPU sm_XX and
allocates its registers. Only the second step knows how many registers a thread needs, so only it
can say whether a kernel spills or how many blocks fit on an SM (see `ortlab.cuda.occupancy`).

Results are cached in memory by (source, arch, options): a compile is a pure function of them.
"""
import time
from dataclasses import dataclass
from types import MappingProxyType

from ortlab.cuda import nvrtc, ptxas
from ortlab.cuda.archs import arch_limits
from ortlab.errors import OrtlabError

_ARCH_OPTIONS = ("-arch", "--gpu-architecture", "--gpu-name")
_CACHE = {}


@dataclass(frozen=True, eq=False)
class CompileResult:
    """What compiling one source for one architecture gave. `cubin` and `kernels` are None when
    ptxas is not installed (`why_no_cubin` says so); `kernels` maps each kernel's (mangled) name to
    its `KernelResources` (read-only: a result is shared by every caller through the cache)."""

    arch: str
    options: tuple
    ptx: str
    log: str                 # NVRTC's warnings ("" when there were none)
    cubin: bytes = None
    kernels: dict = None
    ptxas_report: str = ""
    nvrtc_seconds: float = 0.0
    ptxas_seconds: float = 0.0
    why_no_cubin: str = ""

    def __repr__(self):
        head = f"CompileResult({self.arch}, {len(self.ptx.splitlines())} PTX lines"
        if self.cubin is None:
            return head + f"; no cubin: {self.why_no_cubin})"
        kernels = "; ".join(repr(k) for k in self.kernels.values())
        return head + f", cubin {len(self.cubin)} B; {kernels})"

    def kernel(self, name=None):
        """The KernelResources of `name`, or of the only kernel when name is None."""
        if self.kernels is None:
            raise OrtlabError(f"no kernel resources without ptxas: {self.why_no_cubin}")
        if name is None and len(self.kernels) == 1:
            return next(iter(self.kernels.values()))
        if name in self.kernels:
            return self.kernels[name]
        raise OrtlabError(f"no kernel {name!r} in this source; its kernels are {sorted(self.kernels)} "
                          "(C++ names are mangled: declare the kernel extern \"C\" to keep its name)")


def _options(options):
    """A tuple of NVRTC option strings; one str is one option. The architecture is compile's own argument."""
    if isinstance(options, str):
        options = (options,)
    if options is None or not hasattr(options, "__iter__"):
        raise OrtlabError(f"options must be a list of NVRTC option strings, not {type(options).__name__}")
    options = tuple(options)
    for option in options:
        if not isinstance(option, str):
            raise OrtlabError(f"each option must be a str such as '-DBLOCK=256', got {option!r}")
        if option.split("=")[0] in _ARCH_OPTIONS:
            raise OrtlabError(f"option {option!r} sets the architecture: pass arch='sm_80' (etc.) instead")
    return options


def compile(source, arch="sm_80", options=(), ptxas_timeout=60.0):
    """CUDA C++ `source` -> CompileResult for GPU architecture `arch` ("sm_60", "sm_70", "sm_80",
    "sm_90", ...): PTX from NVRTC (compute_XX), then, where ptxas is installed, the cubin and each
    kernel's registers, shared/constant/local bytes and spills. Compile errors are a
    `CudaCompileError` with NVRTC's line, column and message. Cached by (source, arch, options)."""
    if not isinstance(source, str) or not source.strip():
        raise OrtlabError(f"source must be CUDA C++ text (a non-empty str), not {type(source).__name__}")
    if "\0" in source:
        raise OrtlabError("source holds a NUL character (\\0), which would cut it short: remove it")
    limits = arch_limits(arch)
    options = _options(options)
    key = (source, arch, options)
    if key not in _CACHE:
        _CACHE[key] = _compile(source, limits.name, options, ptxas_timeout)
    return _CACHE[key]


def _compile(source, arch, options, ptxas_timeout):
    start = time.perf_counter()
    ptx, log = nvrtc.compile_to_ptx(source, arch.replace("sm_", "compute_"), options)
    nvrtc_seconds = time.perf_counter() - start
    tool = ptxas.find_ptxas()
    if tool is None:
        return CompileResult(arch, options, ptx, log, nvrtc_seconds=nvrtc_seconds,
                             why_no_cubin="ptxas is not installed (pip install nvidia-cuda-nvcc-cu12)")
    start = time.perf_counter()
    cubin, report = ptxas.assemble(ptx, arch, timeout=ptxas_timeout, ptxas=tool)
    kernels = MappingProxyType(ptxas.parse_resources(report, ptx))
    return CompileResult(arch, options, ptx, log, cubin, kernels, report,
                         nvrtc_seconds, time.perf_counter() - start)


def clear_cache():
    """Forget every cached compile (the next call compiles again)."""
    _CACHE.clear()

"""PTX -> cubin (SASS for one GPU) with NVIDIA's assembler `ptxas`, and what `ptxas -v` reports.

`ptxas -v -arch=sm_80 kernel.ptx -o kernel.cubin` (from the `nvidia-cuda-nvcc-cu12` wheel; no GPU
needed) prints, for every kernel (an "entry function"):

    ptxas info    : Compiling entry function 'block_sum' for 'sm_80'
    ptxas info    : Function properties for block_sum
        0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
    ptxas info    : Used 12 registers, 1024 bytes smem, 372 bytes cmem[0]

`parse_resources` reads those lines into one `KernelResources` per kernel: registers per thread,
static shared memory per block, constant memory per bank (bank 0 holds the kernel's parameters),
the stack frame in local memory, and the bytes spilled to it. These are the numbers
`cudaFuncGetAttributes` returns on a GPU and the occupancy calculator takes.
"""
import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from ortlab.errors import OrtlabError

_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)' for '(?P<arch>sm_\w+)'")
_PROPERTIES = re.compile(r"Function properties for (?P<name>\S+)")
_FRAME = re.compile(r"(?P<stack>\d+) bytes stack frame, (?P<stores>\d+) bytes spill stores, "
                    r"(?P<loads>\d+) bytes spill loads")
_USED = re.compile(r"Used (?P<registers>\d+) registers(?P<rest>.*)")
_SMEM = re.compile(r"(\d+) bytes smem")
_CMEM = re.compile(r"(\d+) bytes cmem\[(\d+)\]")
_MAXNTID = re.compile(r"\.entry\s+(?P<name>[\w$]+)\s*\((?P<params>[^)]*)\)\s*(?P<directives>[^{]*)\{", re.S)


@dataclass(frozen=True)
class KernelResources:
    """One kernel's resources on one architecture, as `ptxas -v` and the PTX state them."""

    name: str
    arch: str
    registers: int                 # 32-bit registers per thread
    shared_bytes: int = 0          # static __shared__ memory per block
    constant_bytes: tuple = ()     # ((bank, bytes), ...); bank 0 holds the kernel's parameters
    local_bytes: int = 0           # stack frame per thread, in local (off-chip) memory
    spill_stores: int = 0          # bytes stored to local memory because registers ran out
    spill_loads: int = 0
    max_threads_per_block: int = None  # __launch_bounds__'s first argument (.maxntid), if given
    min_blocks_per_sm: int = None      # its second argument (.minnctapersm), if given

    @property
    def spills(self):
        return self.spill_stores + self.spill_loads

    def __repr__(self):
        constant = ", ".join(f"cmem[{bank}] {size} B" for bank, size in self.constant_bytes)
        bounds = f", launch bounds {self.max_threads_per_block}" if self.max_threads_per_block else ""
        return (f"<{self.name} on {self.arch}: {self.registers} registers, {self.shared_bytes} B shared, "
                f"{constant or 'no constant'}, {self.local_bytes} B stack, "
                f"spills {self.spill_stores} B stored / {self.spill_loads} B loaded{bounds}>")


def find_ptxas():
    """Path of ptxas: the one in the nvidia-cuda-nvcc-cu12 wheel, else one on PATH; None if neither."""
    try:
        import nvidia.cuda_nvcc  # optional: nvidia; a namespace package: one folder per wheel on the path
        for folder in nvidia.cuda_nvcc.__path__:
            path = os.path.join(folder, "bin", "ptxas")
            if os.access(path, os.X_OK):
                return path
    except ImportError:
        pass
    return shutil.which("ptxas")


def assemble(ptx, arch, timeout=60.0, ptxas=None):
    """(cubin bytes, ptxas's -v text) for `ptx` assembled for `arch` ("sm_80"), or OrtlabError with
    ptxas's own message when it refuses (too much shared memory, a PTX it does not know...)."""
    ptxas = ptxas or find_ptxas()
    if ptxas is None:
        raise OrtlabError("ptxas was not found: `pip install nvidia-cuda-nvcc-cu12==12.4.131` brings it")
    try:
        done, cubin = compile_file(lambda source, target: [ptxas, "-v", f"-arch={arch}", source, "-o", target],
                                   ptx, "kernel.ptx", timeout)
    except subprocess.TimeoutExpired:
        raise OrtlabError(f"ptxas took longer than {timeout} s for {arch}; pass a larger timeout "
                          "or a smaller kernel") from None
    report = done.stdout + done.stderr
    if done.returncode != 0:
        errors = [line.split(":", 1)[1].strip() for line in report.splitlines()
                  if line.startswith(("ptxas error", "ptxas fatal"))]
        raise OrtlabError(f"ptxas could not assemble the PTX for {arch}: "
                          + ("; ".join(errors) or report.strip() or f"exit {done.returncode}"))
    return cubin, report


def compile_file(argv, text, name, timeout):
    """(CompletedProcess, cubin bytes or None): `text` written to `name` in a temporary folder, then the
    command `argv(source path, cubin path)` (ptxas, nvcc -cubin) run on it, its output captured as text."""
    with tempfile.TemporaryDirectory(prefix="ortlab-cubin-") as work:
        source, target = os.path.join(work, name), os.path.join(work, "kernel.cubin")
        with open(source, "w") as f:
            f.write(text)
        done = subprocess.run(argv(source, target), capture_output=True, text=True, errors="replace",
                              timeout=timeout)
        if not os.path.exists(target):
            return done, None
        with open(target, "rb") as f:
            return done, f.read()


def launch_bounds(ptx):
    """{kernel: (max threads per block or None, min blocks per SM or None)} from PTX's .maxntid and
    .minnctapersm, which __launch_bounds__(MAX, MIN) writes."""
    bounds = {}
    for m in _MAXNTID.finditer(ptx):
        text = m["directives"]
        maxntid = re.search(r"\.maxntid\s+(\d+)(?:\s*,\s*(\d+))?(?:\s*,\s*(\d+))?", text)
        minblocks = re.search(r"\.minnctapersm\s+(\d+)", text)
        threads = None
        if maxntid:
            threads = 1
            for dim in maxntid.groups():
                threads *= int(dim or 1)
        bounds[m["name"]] = (threads, int(minblocks[1]) if minblocks else None)
    return bounds


def parse_resources(report, ptx=""):
    """`ptxas -v`'s report as {kernel name: KernelResources}, launch bounds read from `ptx`."""
    bounds = launch_bounds(ptx)
    kernels, current, frames = {}, None, {}
    lines = report.splitlines()
    for k, line in enumerate(lines):
        if m := _ENTRY.search(line):
            current = (m["name"], m["arch"])
        elif m := _PROPERTIES.search(line):
            frame = _FRAME.search(lines[k + 1]) if k + 1 < len(lines) else None
            if frame:
                frames[m["name"]] = frame
        elif (m := _USED.search(line)) and current:
            name, arch = current
            frame = frames.get(name)
            threads, blocks = bounds.get(name, (None, None))
            smem = _SMEM.search(m["rest"])
            kernels[name] = KernelResources(
                name, arch, int(m["registers"]),
                shared_bytes=int(smem[1]) if smem else 0,
                constant_bytes=tuple(sorted((int(bank), int(size)) for size, bank in _CMEM.findall(m["rest"]))),
                local_bytes=int(frame["stack"]) if frame else 0,
                spill_stores=int(frame["stores"]) if frame else 0,
                spill_loads=int(frame["loads"]) if frame else 0,
                max_threads_per_block=threads, min_blocks_per_sm=blocks)
            current = None
    return kernels

"""Per-architecture limits of an NVIDIA streaming multiprocessor (SM), as plain data.

Every number below is NVIDIA's, from two documents (nothing here was measured or guessed):

- the CUDA C++ Programming Guide, table "Technical Specifications per Compute Capability": threads,
  warps and blocks resident per SM, registers per SM / block / thread, shared memory per SM and the
  most one block may opt in to, and (CUDA 11+) the 1 KiB of shared memory the driver reserves per
  block from compute capability 8.0 on;
- the CUDA Occupancy Calculator (the spreadsheet, now `cuda_occupancy.h` in the toolkit and the
  calculator in Nsight Compute): the allocation granularities (registers are given to a warp in
  units of 256; shared memory in units of 256 bytes up to 7.x and 128 bytes from 8.0) and the number
  of register-file sub-partitions of an SM (2 on GP100, i.e. 6.0; 4 on the others listed here).

`ARCHS` maps the name that `ptxas -arch` and NVRTC's `--gpu-architecture` take to its `ArchLimits`.
Register a further architecture by adding a row (the same two documents give its numbers).

`DATASHEETS` holds a different kind of number: the headline figures of NVIDIA's product datasheets
(SM count, cores, bandwidth, peak TFLOPS) for P100, V100, A100 and H100, labelled as such.
"""
from dataclasses import dataclass

from ortlab.errors import OrtlabError

KIB = 1024


@dataclass(frozen=True)
class ArchLimits:
    """One compute capability's SM limits (NVIDIA's tables; see the module docstring)."""

    name: str                      # "sm_80"
    gpu: str                       # a data-centre GPU of this compute capability
    compute_capability: tuple      # (8, 0)
    max_threads_per_block: int
    max_threads_per_sm: int
    max_blocks_per_sm: int
    registers_per_sm: int          # 32-bit registers
    registers_per_block: int
    max_registers_per_thread: int  # the occupancy calculator's per-thread limit
    shared_per_sm: int             # bytes, with the largest shared-memory carveout
    shared_per_block: int          # bytes one block may use without opting in (48 KiB)
    shared_per_block_optin: int    # bytes one block may use after cudaFuncSetAttribute
    shared_reserved_per_block: int  # bytes the driver adds to every block (8.0 and newer)
    shared_granularity: int        # bytes: a block's shared memory is rounded up to this
    register_granularity: int      # registers: a warp's registers are rounded up to this
    sub_partitions: int            # register-file sub-partitions of one SM
    warp_size: int = 32

    @property
    def max_warps_per_sm(self):
        return self.max_threads_per_sm // self.warp_size


ARCHS = {
    a.name: a for a in (
        ArchLimits("sm_60", "P100", (6, 0), 1024, 2048, 32, 64 * KIB, 64 * KIB, 255,
                   64 * KIB, 48 * KIB, 48 * KIB, 0, 256, 256, 2),
        ArchLimits("sm_70", "V100", (7, 0), 1024, 2048, 32, 64 * KIB, 64 * KIB, 256,
                   96 * KIB, 48 * KIB, 96 * KIB, 0, 256, 256, 4),
        ArchLimits("sm_75", "T4", (7, 5), 1024, 1024, 16, 64 * KIB, 64 * KIB, 256,
                   64 * KIB, 48 * KIB, 64 * KIB, 0, 256, 256, 4),
        ArchLimits("sm_80", "A100", (8, 0), 1024, 2048, 32, 64 * KIB, 64 * KIB, 256,
                   164 * KIB, 48 * KIB, 163 * KIB, 1 * KIB, 128, 256, 4),
        ArchLimits("sm_86", "A10", (8, 6), 1024, 1536, 16, 64 * KIB, 64 * KIB, 256,
                   100 * KIB, 48 * KIB, 99 * KIB, 1 * KIB, 128, 256, 4),
        ArchLimits("sm_89", "L4", (8, 9), 1024, 1536, 24, 64 * KIB, 64 * KIB, 256,
                   100 * KIB, 48 * KIB, 99 * KIB, 1 * KIB, 128, 256, 4),
        ArchLimits("sm_90", "H100", (9, 0), 1024, 2048, 32, 64 * KIB, 64 * KIB, 256,
                   228 * KIB, 48 * KIB, 227 * KIB, 1 * KIB, 128, 256, 4),
    )
}


def arch_limits(arch):
    """The `ArchLimits` of `arch` ("sm_80"); an unknown name is an OrtlabError listing the known ones."""
    if isinstance(arch, str) and arch in ARCHS:
        return ARCHS[arch]
    known = ", ".join(f"{a.name} ({a.gpu})" for a in ARCHS.values())
    raise OrtlabError(f"unknown GPU architecture {arch!r}: ortlab.cuda knows {known}; "
                      "pass one of these names as arch")


# ---- datasheet figures ------------------------------------------------------------------------
@dataclass(frozen=True)
class Datasheet:
    """One data-centre GPU's headline figures, as NVIDIA's datasheet and architecture whitepaper print
    them (SXM form factor; TFLOPS dense, i.e. without 2:4 sparsity; None: the GPU has no such unit).
    These are marketing peak figures at boost clock, not measurements."""

    gpu: str
    arch: str
    architecture: str
    sms: int
    fp32_cores_per_sm: int
    tensor_cores: int               # 0: none (Pascal)
    memory: str
    bandwidth_gb_s: int
    fp32_tflops: float
    fp16_tensor_tflops: float       # None: no tensor cores
    tf32_tflops: float              # None: no TF32 (before Ampere)
    bf16_tflops: float              # None: no BF16 tensor math (before Ampere)
    source: str

    @property
    def fp32_cores(self):
        return self.sms * self.fp32_cores_per_sm


DATASHEETS = {
    d.arch: d for d in (
        Datasheet("P100", "sm_60", "Pascal", 56, 64, 0, "16 GB HBM2", 732, 10.6, None, None, None,
                  "NVIDIA Tesla P100 datasheet (SXM2); NVIDIA Tesla P100 whitepaper"),
        Datasheet("V100", "sm_70", "Volta", 80, 64, 640, "32 GB HBM2", 900, 15.7, 125.0, None, None,
                  "NVIDIA Tesla V100 GPU Accelerator datasheet (SXM2); NVIDIA Tesla V100 GPU Architecture whitepaper"),
        Datasheet("A100", "sm_80", "Ampere", 108, 64, 432, "80 GB HBM2e", 2039, 19.5, 312.0, 156.0, 312.0,
                  "NVIDIA A100 Tensor Core GPU datasheet (SXM4 80GB); NVIDIA A100 Tensor Core GPU Architecture "
                  "whitepaper"),
        Datasheet("H100", "sm_90", "Hopper", 132, 128, 528, "80 GB HBM3", 3350, 67.0, 989.5, 494.7, 989.5,
                  "NVIDIA H100 Tensor Core GPU datasheet (SXM5); NVIDIA H100 Tensor Core GPU Architecture "
                  "whitepaper"),
    )
}


def datasheet(arch):
    """The `Datasheet` of the data-centre GPU of `arch` (sm_60, sm_70, sm_80, sm_90)."""
    if isinstance(arch, str) and arch in DATASHEETS:
        return DATASHEETS[arch]
    raise OrtlabError(f"no datasheet figures for {arch!r}: ortlab.cuda has them for {sorted(DATASHEETS)}")


def datasheet_table():
    """One row per GPU of DATASHEETS, labelled as datasheet figures (dense TFLOPS, SXM parts)."""
    def figure(value):
        return "-" if value is None else f"{value:g}"
    return [{"GPU": d.gpu, "arch": d.arch, "SMs": d.sms, "FP32 cores/SM": d.fp32_cores_per_sm,
             "FP32 cores": d.fp32_cores, "tensor cores": d.tensor_cores or "-", "memory": d.memory,
             "GB/s": d.bandwidth_gb_s, "FP32 TFLOPS": figure(d.fp32_tflops),
             "FP16 tensor TFLOPS": figure(d.fp16_tensor_tflops), "TF32 TFLOPS": figure(d.tf32_tflops),
             "BF16 TFLOPS": figure(d.bf16_tflops)} for d in DATASHEETS.values()]

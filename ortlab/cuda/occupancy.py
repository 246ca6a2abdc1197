"""Occupancy: blocks per SM = min(thread limit, block limit, register limit, shared-memory limit).

The arithmetic of `cudaOccupancyMaxActiveBlocksPerMultiprocessor` (NVIDIA's occupancy calculator,
`cuda_occupancy.h`), with the default shared-memory carveout, for one kernel launched with
`block_size` threads per block (W = ceil(block_size / 32) warps):

    threads    floor(max warps per SM / W)
    blocks     the architecture's resident-block limit
    registers  a warp gets R = roundup(registers per thread * 32, 256) registers; each of the SM's
               P register-file sub-partitions holds floor(registers per SM / P / R) warps, so
               floor(P * that / W) blocks. A block whose R * roundup(W, P) exceeds the registers
               per block does not launch at all (0).
    shared     a block takes S = roundup(static + dynamic + reserved, granularity) bytes (reserved:
               1 KiB from compute capability 8.0 on), so floor(shared memory per SM / S) blocks

Occupancy is active warps / max warps per SM. The limits per architecture are `archs.ARCHS`.
tests/cuda/test_cuda_occupancy.py runs NVIDIA's own cuda_occupancy.h (from the nvidia-cuda-runtime-cu12
wheel) on a sweep of about 19000 launches over every architecture here, and compares each answer.
"""
from dataclasses import dataclass

from ortlab.cuda.archs import arch_limits
from ortlab.errors import OrtlabError

LIMITS = ("threads", "blocks", "registers", "shared memory")


@dataclass(frozen=True)
class Occupancy:
    """How many blocks of one kernel an SM holds at once, and which resource stops the next one."""

    arch: str
    block_size: int
    warps_per_block: int
    blocks_per_sm: int
    warps_per_sm: int
    max_warps_per_sm: int
    limits: tuple            # ((limit name, blocks it allows), ...) in LIMITS order
    limited_by: tuple        # the names whose limit equals blocks_per_sm (ties are all named)
    registers_per_block: int  # allocated, after the per-warp granularity
    shared_per_block: int     # allocated, after the reserve and the granularity
    needs_opt_in: bool        # more than 48 KiB of shared memory: cudaFuncSetAttribute first

    @property
    def occupancy(self):
        return self.warps_per_sm / self.max_warps_per_sm

    def __repr__(self):
        limits = ", ".join(f"{name} {'unlimited' if n is None else n}" for name, n in self.limits)
        return (f"<Occupancy on {self.arch}, {self.block_size} threads/block: {self.blocks_per_sm} blocks, "
                f"{self.warps_per_sm}/{self.max_warps_per_sm} warps ({self.occupancy:.1%}), limited by "
                f"{' and '.join(self.limited_by)}; blocks allowed by {limits}>")


def _read(resources, name, default=None):
    value = resources.get(name, default) if isinstance(resources, dict) else getattr(resources, name, default)
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise OrtlabError(f"resources' {name} must be a non-negative int, got {value!r}")
    return value


def _round_up(value, unit):
    return -(-value // unit) * unit


def _register_limit(limits, registers, warps, sub_partitions):
    """Blocks the register file allows (None: unlimited, 0: the block does not launch)."""
    per_warp = _round_up(registers * limits.warp_size, limits.register_granularity)
    if per_warp * _round_up(warps, sub_partitions) > limits.registers_per_block:
        return 0
    if per_warp * warps > limits.registers_per_block or registers > limits.max_registers_per_thread:
        return 0
    if per_warp == 0:
        return None
    warps_per_partition = limits.registers_per_sm // sub_partitions // per_warp
    return warps_per_partition * sub_partitions // warps


def occupancy(resources, block_size, arch=None, dynamic_shared=0):
    """Occupancy of a kernel with `resources` (a KernelResources from `compile`, or a dict with
    `registers` and optionally `shared_bytes`) launched with `block_size` threads per block and
    `dynamic_shared` bytes of dynamic shared memory on `arch` (default: the resources' own)."""
    arch = arch or getattr(resources, "arch", None) or (resources.get("arch") if isinstance(resources, dict) else None)
    limits = arch_limits(arch)
    if getattr(resources, "arch", limits.name) != limits.name:
        raise OrtlabError(f"these resources were compiled for {resources.arch}, not {limits.name}: registers "
                          f"differ between architectures, so compile for {limits.name} first")
    registers = _read(resources, "registers")
    if registers is None:
        raise OrtlabError("resources must give registers (per thread): a KernelResources from "
                          "ortlab.cuda.compile, or a dict such as {'registers': 32, 'shared_bytes': 0}")
    static = _read(resources, "shared_bytes", 0)
    bound = _read(resources, "max_threads_per_block")
    if (not isinstance(block_size, int) or isinstance(block_size, bool)
            or not 0 < block_size <= limits.max_threads_per_block):
        raise OrtlabError(f"block_size must be an int from 1 to {limits.max_threads_per_block} threads "
                          f"on {limits.name}, got {block_size!r}")
    if bound is not None and block_size > bound:
        raise OrtlabError(f"the kernel was compiled with __launch_bounds__({bound}): a launch with "
                          f"{block_size} threads per block fails; use at most {bound}")
    if not isinstance(dynamic_shared, int) or isinstance(dynamic_shared, bool) or dynamic_shared < 0:
        raise OrtlabError(f"dynamic_shared must be a non-negative int (bytes), got {dynamic_shared!r}")
    if static + dynamic_shared > limits.shared_per_block_optin:
        raise OrtlabError(f"{static + dynamic_shared} bytes of shared memory per block ({static} static + "
                          f"{dynamic_shared} dynamic) is more than {limits.name} ({limits.gpu}) gives one block: "
                          f"at most {limits.shared_per_block_optin} bytes")

    warps = -(-block_size // limits.warp_size)
    by_registers = _register_limit(limits, registers, warps, limits.sub_partitions)
    if limits.compute_capability == (6, 0) and by_registers != 0:
        # cudaOccMaxActiveBlocksPerMultiprocessor: on GP100 a block must also fit the register
        # check of GP10x (4 sub-partitions), or it does not launch
        if _register_limit(limits, registers, warps, 4) == 0:
            by_registers = 0
    shared = _round_up(static + dynamic_shared + limits.shared_reserved_per_block, limits.shared_granularity)
    counts = (limits.max_warps_per_sm // warps, limits.max_blocks_per_sm, by_registers,
              limits.shared_per_sm // shared if shared else None)
    blocks = min(n for n in counts if n is not None)
    return Occupancy(
        limits.name, block_size, warps, blocks, blocks * warps, limits.max_warps_per_sm,
        tuple(zip(LIMITS, counts)), tuple(name for name, n in zip(LIMITS, counts) if n == blocks),
        _round_up(registers * limits.warp_size, limits.register_granularity) * warps, shared,
        static + dynamic_shared > limits.shared_per_block)

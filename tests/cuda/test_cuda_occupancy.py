"""ortlab.cuda.occupancy against numbers derived by hand from NVIDIA's documents.

Each expected value is worked out in the comment above it from the rules NVIDIA publishes: the CUDA
C++ Programming Guide's "Technical Specifications per Compute Capability" (per-SM limits), the CUDA
Occupancy Calculator / cuda_occupancy.h (register allocation: 256 registers per warp unit, 4
register-file sub-partitions per SM, 2 on GP100; shared memory in 128-byte units from 8.0, 256
before; 1 KiB reserved per block from 8.0), and the worked example of the CUDA C++ Best Practices
Guide ("Calculating Occupancy"). Abbreviations: W warps per block, R registers allocated per warp,
S shared bytes allocated per block.
"""
import pytest

import ortlab.cuda as cuda
from ortlab.cuda.archs import ARCHS
from ortlab.errors import OrtlabError


def occ(registers, block_size, arch, shared=0, dynamic=0):
    return cuda.occupancy({"registers": registers, "shared_bytes": shared}, block_size, arch, dynamic)


def test_a100_32_registers_256_threads_is_full_occupancy():
    # sm_80: W = 256/32 = 8. Threads: 64 warps/SM / 8 = 8 blocks. Registers: R = 32*32 = 1024;
    # 65536/4 = 16384 per sub-partition / 1024 = 16 warps, x4 = 64 warps / 8 = 8 blocks.
    # Shared: S = roundup(0 + 1024 reserved, 128) = 1024; 167936 / 1024 = 164 blocks. Blocks: 32.
    # min = 8 blocks = 64 warps = 100%; threads and registers both stop the ninth block.
    o = occ(32, 256, "sm_80")
    assert (o.blocks_per_sm, o.warps_per_sm, o.occupancy) == (8, 64, 1.0)
    assert dict(o.limits) == {"threads": 8, "blocks": 32, "registers": 8, "shared memory": 164}
    assert o.limited_by == ("threads", "registers")
    assert (o.registers_per_block, o.shared_per_block) == (8 * 1024, 1024)


def test_a100_64_registers_halves_it():
    # R = 64*32 = 2048; 16384 / 2048 = 8 warps per sub-partition, x4 = 32 warps / 8 = 4 blocks:
    # 32 of 64 warps = 50%, limited by registers.
    o = occ(64, 256, "sm_80")
    assert (o.blocks_per_sm, o.warps_per_sm, o.occupancy, o.limited_by) == (4, 32, 0.5, ("registers",))


@pytest.mark.parametrize("block_size, blocks, percent", [(128, 12, 75.0), (320, 4, 62.5)])
def test_the_best_practices_guide_example_on_compute_capability_7_0(block_size, blocks, percent):
    # The Best Practices Guide: on 7.0, 37 registers per thread with 128-thread blocks gives 75%
    # with 12 active blocks; with 320-thread blocks only four fit, "63%".
    # By hand: R = roundup(37*32 = 1184, 256) = 1280; 16384 / 1280 = 12 warps per sub-partition,
    # 48 warps per SM. 128 threads: W = 4 -> 12 blocks, 48/64 = 75%. 320: W = 10 -> 4 blocks,
    # 40/64 = 62.5%.
    o = occ(37, block_size, "sm_70")
    assert (o.blocks_per_sm, o.occupancy * 100, o.limited_by) == (blocks, percent, ("registers",))


def test_register_allocation_granularity_costs_a_block():
    # 33 registers: 33*32 = 1056 registers per warp, allocated as roundup(1056, 256) = 1280.
    # 16384 / 1280 = 12 warps per sub-partition, 48 per SM, / 8 = 6 blocks (75%).
    # Without the granularity it would be 65536 / (33*256) = 7.75 -> 7 blocks.
    o = occ(33, 256, "sm_80")
    assert (o.blocks_per_sm, o.occupancy) == (6, 0.75)
    assert o.registers_per_block == 8 * 1280


def test_the_1kib_reserve_per_block_on_compute_capability_8_0():
    # 32 KiB static per block, 64 threads, 16 registers (threads allow 32 blocks, registers 64).
    # sm_80: S = 32768 + 1024 = 33792 (a multiple of 128); 167936 / 33792 = 4.97 -> 4 blocks;
    # without the reserve it would be 167936 / 32768 = 5.
    # sm_70 reserves nothing: S = 32768, 98304 / 32768 = 3 blocks.
    a100, v100 = occ(16, 64, "sm_80", shared=32768), occ(16, 64, "sm_70", shared=32768)
    assert (a100.blocks_per_sm, a100.shared_per_block, a100.limited_by) == (4, 33792, ("shared memory",))
    assert (v100.blocks_per_sm, v100.shared_per_block) == (3, 32768)


def test_shared_memory_granularity_is_256_bytes_on_volta():
    # sm_70, 14000 bytes, one warp per block, no registers (empty kernel): S = roundup(14000, 256)
    # = 14080; 98304 / 14080 = 6.98 -> 6 blocks (without rounding 98304 / 14000 = 7.02 -> 7).
    o = occ(0, 32, "sm_70", shared=14000)
    assert (o.blocks_per_sm, o.shared_per_block, dict(o.limits)["registers"]) == (6, 14080, None)


def test_gp100_has_two_register_sub_partitions():
    # 37 registers, 64 threads (W = 2), R = 1280. sm_60 (2 sub-partitions): 32768 / 1280 = 25
    # warps each, 50 per SM, 25 blocks (threads allow 32, blocks 32): 50/64 = 78.125%.
    # sm_70 (4 sub-partitions): 16384 / 1280 = 12 each, 48 per SM, 24 blocks: 75%.
    p100, v100 = occ(37, 64, "sm_60"), occ(37, 64, "sm_70")
    assert (p100.blocks_per_sm, p100.occupancy) == (25, 0.78125)
    assert (v100.blocks_per_sm, v100.occupancy) == (24, 0.75)


def test_a_block_that_needs_more_registers_than_an_sm_has_does_not_launch():
    # 1024 threads (W = 32) at 64 registers: R = 2048, 32 * 2048 = 65536 registers: fits, 1 block,
    # 50%. At 65 registers: R = roundup(2080, 256) = 2304, 32 * 2304 = 73728 > 65536: 0 blocks.
    assert (occ(64, 1024, "sm_80").blocks_per_sm, occ(64, 1024, "sm_80").occupancy) == (1, 0.5)
    o = occ(65, 1024, "sm_80")
    assert (o.blocks_per_sm, o.warps_per_sm, o.limited_by) == (0, 0, ("registers",))


def test_turing_and_hopper_limits():
    # sm_75 holds 1024 threads = 32 warps per SM: 256-thread blocks at 32 registers -> 4 blocks, 100%.
    t4 = occ(32, 256, "sm_75")
    assert (t4.blocks_per_sm, t4.warps_per_sm, t4.occupancy) == (4, 32, 1.0)
    # sm_90: the largest block allocation, 227 KiB + 1 KiB reserved = 228 KiB = all of an SM: 1 block.
    h100 = occ(32, 128, "sm_90", dynamic=227 * 1024)
    assert (h100.blocks_per_sm, h100.shared_per_block, h100.needs_opt_in) == (1, 228 * 1024, True)
    # 32 blocks of 32 threads: the block limit (32 per SM) stops them at 32 of 64 warps.
    small = occ(16, 32, "sm_90")
    assert (small.blocks_per_sm, small.occupancy, small.limited_by) == (32, 0.5, ("blocks",))


def test_limits_table_against_the_programming_guide():
    # max resident threads, blocks, shared memory per SM and per block (opt-in), in KiB
    expected = {"sm_60": (2048, 32, 64, 48), "sm_70": (2048, 32, 96, 96), "sm_75": (1024, 16, 64, 64),
                "sm_80": (2048, 32, 164, 163), "sm_86": (1536, 16, 100, 99), "sm_89": (1536, 24, 100, 99),
                "sm_90": (2048, 32, 228, 227)}
    got = {name: (a.max_threads_per_sm, a.max_blocks_per_sm, a.shared_per_sm // 1024,
                  a.shared_per_block_optin // 1024) for name, a in ARCHS.items()}
    assert got == expected
    assert all(a.registers_per_sm == 65536 and a.max_threads_per_block == 1024 for a in ARCHS.values())


def test_compiled_kernel_resources_feed_occupancy():
    source = r"""
    extern "C" __global__ void __launch_bounds__(256) scale(float* x, float a, int n) {
      __shared__ float tile[256];
      int i = blockIdx.x * 256 + threadIdx.x;
      tile[threadIdx.x] = i < n ? x[i] : 0.0f;
      __syncthreads();
      if (i < n) x[i] = a * tile[255 - threadIdx.x];
    }
    """
    k = cuda.compile(source, "sm_80").kernel("scale")
    # at most 32 registers and 1 KiB shared: 8 blocks of 256 threads fill the SM (see the first test)
    assert k.registers <= 32 and k.shared_bytes == 1024
    o = cuda.occupancy(k, 256)
    assert (o.arch, o.blocks_per_sm, o.occupancy) == ("sm_80", 8, 1.0)
    assert "limited by threads" in repr(o)
    with pytest.raises(OrtlabError, match=r"__launch_bounds__\(256\).*512 threads"):
        cuda.occupancy(k, 512)
    with pytest.raises(OrtlabError, match="compiled for sm_80, not sm_90"):
        cuda.occupancy(k, 256, "sm_90")


@pytest.mark.parametrize("block_size", [0, -32, 1025, 4096, 256.0, "256", True, None])
def test_bad_block_sizes(block_size):
    with pytest.raises(OrtlabError, match="block_size must be an int from 1 to 1024"):
        occ(32, block_size, "sm_80")


@pytest.mark.parametrize("arch, shared, dynamic", [
    ("sm_80", 163 * 1024 + 1, 0), ("sm_80", 100 * 1024, 64 * 1024), ("sm_60", 0, 48 * 1024 + 4),
    ("sm_90", 0, 228 * 1024),
])
def test_more_shared_memory_than_the_architecture_gives_a_block(arch, shared, dynamic):
    with pytest.raises(OrtlabError, match=f"more than {arch} .* gives one block"):
        occ(32, 256, arch, shared=shared, dynamic=dynamic)


@pytest.mark.parametrize("resources, message", [
    ({}, "resources must give registers"),
    ({"registers": -1}, "registers must be a non-negative int"),
    ({"registers": 32.0}, "registers must be a non-negative int"),
    ({"registers": 32, "shared_bytes": -4}, "shared_bytes must be a non-negative int"),
])
def test_bad_resources(resources, message):
    with pytest.raises(OrtlabError, match=message):
        cuda.occupancy(resources, 256, "sm_80")


@pytest.mark.parametrize("arch", ["sm_100", "sm_61", None, 80])
def test_unknown_architecture(arch):
    with pytest.raises(OrtlabError, match="unknown GPU architecture.*sm_80 \\(A100\\)"):
        occ(32, 256, arch)


def test_bad_dynamic_shared():
    with pytest.raises(OrtlabError, match="dynamic_shared must be a non-negative int"):
        occ(32, 256, "sm_80", dynamic=-1)


# NVIDIA's occupancy calculator itself: cuda_occupancy.h, header-only host C++, shipped in the
# nvidia-cuda-runtime-cu12 wheel that torch installs. A small g++ program runs its
# cudaOccMaxActiveBlocksPerMultiprocessor over a sweep of kernels; the device properties are the
# table's (checked against the Programming Guide above), every rule and granularity is the header's.
HARNESS = r"""
#include <cstdio>
#include <cuda_occupancy.h>
int main() {
  int major, minor, threads, max_threads_sm, optin, per_sm, reserved, regs, block;
  long shared;
  while (std::scanf("%d %d %d %d %d %d %d %d %d %ld", &major, &minor, &threads, &max_threads_sm, &optin,
                    &per_sm, &reserved, &regs, &block, &shared) == 10) {
    cudaOccDeviceProp p;
    p.computeMajor = major; p.computeMinor = minor; p.maxThreadsPerBlock = threads;
    p.maxThreadsPerMultiprocessor = max_threads_sm; p.regsPerBlock = 65536; p.regsPerMultiprocessor = 65536;
    p.warpSize = 32; p.sharedMemPerBlock = 48 * 1024; p.sharedMemPerMultiprocessor = per_sm; p.numSms = 1;
    p.sharedMemPerBlockOptin = optin; p.reservedSharedMemPerBlock = reserved;
    cudaOccFuncAttributes a;  // as cudaFuncGetAttributes gives them, after opting in to all shared memory
    a.maxThreadsPerBlock = threads; a.numRegs = regs; a.sharedSizeBytes = shared;
    a.shmemLimitConfig = FUNC_SHMEM_LIMIT_OPTIN; a.maxDynamicSharedSizeBytes = optin - shared;
    a.numBlockBarriers = 1;
    cudaOccDeviceState s;
    cudaOccResult r;
    int e = cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &a, &s, block, 0);
    std::printf("%d %d %u\n", e, r.activeBlocksPerMultiprocessor, r.limitingFactors);
  }
}
"""
FACTORS = {1: "threads", 2: "registers", 4: "shared memory", 8: "blocks"}  # OCC_LIMIT_WARPS, ...


def _nvidia_occupancy(cases, tmp_path):
    import subprocess

    import nvidia.cuda_runtime

    include = next(p for p in (f"{d}/include" for d in nvidia.cuda_runtime.__path__)
                   if (__import__("pathlib").Path(p) / "cuda_occupancy.h").exists())
    (tmp_path / "occ.cpp").write_text(HARNESS)
    subprocess.run(["g++", "-std=c++17", "-O1", "-I", include, "occ.cpp", "-o", "occ"], cwd=tmp_path, check=True)
    lines = []
    for arch, regs, block, shared in cases:
        a = ARCHS[arch]
        lines.append(f"{a.compute_capability[0]} {a.compute_capability[1]} {a.max_threads_per_block} "
                     f"{a.max_threads_per_sm} {a.shared_per_block_optin} {a.shared_per_sm} "
                     f"{a.shared_reserved_per_block} {regs} {block} {shared}")
    done = subprocess.run([str(tmp_path / "occ")], input="\n".join(lines), capture_output=True, text=True, check=True)
    return [tuple(int(v) for v in line.split()) for line in done.stdout.splitlines()]


def test_every_case_of_a_sweep_agrees_with_nvidias_cuda_occupancy_h(tmp_path):
    registers = (0, 8, 16, 24, 32, 33, 37, 40, 48, 56, 64, 65, 72, 80, 96, 128, 168, 255)
    blocks = (1, 32, 64, 96, 100, 128, 160, 192, 256, 320, 384, 512, 640, 768, 800, 1000, 1024)
    shared = (0, 1, 1024, 4000, 14000, 32768, 49152, 65536, 100000, 163 * 1024, 227 * 1024)
    cases = [(arch, r, b, s) for arch, a in ARCHS.items() for r in registers for b in blocks for s in shared
             if s <= a.shared_per_block_optin]
    theirs = _nvidia_occupancy(cases, tmp_path)
    assert len(theirs) == len(cases)
    differ = []
    for (arch, r, b, s), (error, n, factors) in zip(cases, theirs):
        assert error == 0, (arch, r, b, s)
        o = occ(r, b, arch, shared=s)
        named = tuple(name for bit, name in FACTORS.items() if factors & bit)
        if o.blocks_per_sm != n or (n and set(o.limited_by) != set(named)):
            differ.append(((arch, r, b, s), (o.blocks_per_sm, o.limited_by), (n, named)))
    assert not differ, f"{len(differ)} of {len(cases)} differ, e.g. {differ[:5]}"
    assert len(cases) > 15000

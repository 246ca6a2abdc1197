"""Which instructions a kernel becomes: Tensor Core `mma` against FP32-core `fma`, and `#pragma unroll`.

- `TENSOR_CORE_SOURCE` is one warp multiplying a 16x8 TF32 tile by an 8x16 one through WMMA
  (`nvcuda::wmma`, CUDA C++ Programming Guide, "Warp Matrix Functions"; TF32 from compute
  capability 8.0); `FMA_SOURCE` is the same product done by each thread with fp32 multiply-adds.
  `mma_lines(ptx)` lists the Tensor Core instructions of a PTX text (`wmma.*` and `mma.sync.*`,
  PTX ISA, "Warp Level Matrix Multiply-Accumulate Instructions").
  NVRTC finds `<mma.h>` in the nvidia-cuda-runtime wheel, but that header includes `crt/mma.h`,
  which ships in the nvidia-cuda-nvcc wheel: `tensor_core_options()` adds that folder.
- `UNROLL_SOURCE` has one loop of a fixed trip count; `unroll_table(arch)` compiles it with
  `#pragma unroll 1` (keep the loop) and `#pragma unroll` (unroll it fully) and counts, in each PTX,
  the branches, the fused multiply-adds and the lines, beside ptxas's registers
  (Programming Guide, "#pragma unroll").
"""
import os
import re

from ortlab.cuda.compiler import compile
from ortlab.errors import OrtlabError

TENSOR_CORE_SOURCE = r"""
#include <mma.h>
using namespace nvcuda;
// C[16x16] = A[16x8] @ B[8x16], one warp, TF32 inputs, FP32 accumulation
extern "C" __global__ void tf32_tile(const float* a, const float* b, float* c) {
  wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
  wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fb;
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> fc;
  wmma::fill_fragment(fc, 0.0f);
  wmma::load_matrix_sync(fa, a, 8);
  wmma::load_matrix_sync(fb, b, 16);
  for (int i = 0; i < fa.num_elements; ++i) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
  for (int i = 0; i < fb.num_elements; ++i) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
  wmma::mma_sync(fc, fa, fb, fc);
  wmma::store_matrix_sync(c, fc, 16, wmma::mem_row_major);
}
"""

FMA_SOURCE = r"""
// C[16x16] = A[16x8] @ B[8x16], one thread per output, FP32 multiply-adds
extern "C" __global__ void fp32_tile(const float* a, const float* b, float* c) {
  int row = threadIdx.x / 16, col = threadIdx.x % 16;
  float sum = 0.0f;
  for (int k = 0; k < 8; ++k) sum += a[row * 8 + k] * b[k * 16 + col];
  c[row * 16 + col] = sum;
}
"""

UNROLL_SOURCE = r"""
// each thread sums K strided elements; UNROLL is the pragma's argument (1: keep the loop)
extern "C" __global__ void strided_dot(const float* x, const float* w, float* out, int stride) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float sum = 0.0f;
  #pragma unroll UNROLL
  for (int k = 0; k < 16; ++k) sum += x[i + k * stride] * w[k];
  out[i] = sum;
}
"""

_MMA = re.compile(r"^\s*(wmma\.mma\S*|mma\.sync\S*|wgmma\.\S*)", re.M)


def tensor_core_options():
    """NVRTC options that let `#include <mma.h>` compile: the include folder of the nvidia-cuda-nvcc wheel
    (crt/mma.h). An OrtlabError says what to install when it is missing."""
    try:
        import nvidia.cuda_nvcc  # optional: nvidia
    except ImportError:
        nvidia = None
    folders = [] if nvidia is None else [os.path.join(f, "include") for f in nvidia.cuda_nvcc.__path__]
    for folder in folders:
        if os.path.isfile(os.path.join(folder, "crt", "mma.h")):
            return (f"--include-path={folder}",)
    raise OrtlabError("crt/mma.h was not found: `pip install nvidia-cuda-nvcc-cu12==12.4.131` brings the header "
                      "that <mma.h> includes")


def mma_lines(ptx):
    """The Tensor Core instructions of a PTX text: its `wmma.mma*`, `mma.sync*` and `wgmma*` opcodes."""
    if not isinstance(ptx, str):
        raise OrtlabError(f"mma_lines takes PTX text, not {type(ptx).__name__}")
    return _MMA.findall(ptx)


def fma_lines(ptx):
    """The fp32 fused multiply-add instructions of a PTX text (`fma.rn.f32`)."""
    return re.findall(r"^\s*(fma\.rn\.f32)\b", ptx, re.M)


def tensor_cores_vs_fma(arch="sm_80"):
    """One row per kernel: its Tensor Core and fp32-FMA instruction counts in PTX, the first Tensor
    Core instruction, and ptxas's registers (WMMA's TF32 needs sm_80 or newer)."""
    rows = []
    for name, source, options in (("tf32_tile (WMMA)", TENSOR_CORE_SOURCE, tensor_core_options()),
                                  ("fp32_tile (FMA)", FMA_SOURCE, ())):
        result = compile(source, arch, options)
        mma = mma_lines(result.ptx)
        rows.append({"kernel": name, "arch": arch, "mma instructions": len(mma),
                     "fma.rn.f32": len(fma_lines(result.ptx)), "first mma": mma[0] if mma else "-",
                     "registers": result.kernel().registers})
    return rows


def unroll_table(arch="sm_80"):
    """`UNROLL_SOURCE` with `#pragma unroll 1` and with `#pragma unroll` side by side: PTX branches
    (`bra`), fp32 FMAs, PTX lines and registers per thread."""
    rows = []
    for label, value in (("#pragma unroll 1", "1"), ("#pragma unroll", "")):
        result = compile(UNROLL_SOURCE, arch, (f"-DUNROLL={value}",))
        body = result.ptx.split(".entry", 1)[1]
        rows.append({"pragma": label, "arch": arch, "branches (bra)": len(re.findall(r"^\s*(?:@%p\d+\s+)?bra",
                                                                                      body, re.M)),
                     "fma.rn.f32": len(fma_lines(body)), "PTX lines": len(body.splitlines()),
                     "registers": result.kernel().registers})
    return rows

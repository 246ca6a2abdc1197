"""CUDA C++ sources that more than one test file compiles or runs."""

# A block reduction: 256 floats in shared memory, halved log2(256) = 8 times, one barrier per step
# (SYNC). -DUNROLL=1 keeps the loop rolled.
BLOCK_SUM_TEMPLATE = r"""
#ifndef UNROLL
#define UNROLL 256
#endif
#define BLOCK 256
extern "C" __global__ void __launch_bounds__(BLOCK) block_sum(const float* x, float* out, int n) {
  __shared__ float buf[BLOCK];
  int i = blockIdx.x * BLOCK + threadIdx.x;
  buf[threadIdx.x] = i < n ? x[i] : 0.0f;
  __syncthreads();
  #pragma unroll UNROLL
  for (int s = BLOCK / 2; s > 0; s >>= 1) {
    if (threadIdx.x < s) buf[threadIdx.x] += buf[threadIdx.x + s];
    SYNC
  }
  if (threadIdx.x == 0) out[blockIdx.x] = buf[0];
}
"""


def block_sum(sync="__syncthreads();"):
    """The block reduction with `sync` as the loop's barrier ("" forgets it: a race)."""
    return BLOCK_SUM_TEMPLATE.replace("SYNC", sync)

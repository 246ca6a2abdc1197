// common.cuh: the warp and block reductions ORT's CUDA kernels share, for every source of this folder.
// ORT's versions: onnxruntime/core/providers/cuda/cu_inc/common.cuh (WARP_SHFL_XOR, WARP_SHFL_DOWN)
// and onnxruntime/core/providers/cuda/reduction/reduction_functions.cu (warp, then block reductions).
// blockDim.x must be a multiple of 32 (a whole number of warps) and at most 1024.
#define ORTLAB_FULL_MASK 0xffffffffu
#define ORTLAB_INFINITY __int_as_float(0x7f800000)

__device__ __forceinline__ float warp_sum(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(ORTLAB_FULL_MASK, v, offset);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
  for (int offset = 16; offset > 0; offset /= 2) v = fmaxf(v, __shfl_xor_sync(ORTLAB_FULL_MASK, v, offset));
  return v;
}

// Every thread gets the sum of `v` over the block: each warp sums its lanes, lane 0 leaves the
// warp's sum in `partial`, then every warp sums the partials itself (no third barrier needed).
// The first barrier keeps a previous call's readers of `partial` ahead of this call's writers.
__device__ __forceinline__ float block_sum(float v, float (&partial)[32]) {
  v = warp_sum(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  return warp_sum(threadIdx.x % 32 < blockDim.x / 32 ? partial[threadIdx.x % 32] : 0.0f);
}

__device__ __forceinline__ float block_max(float v, float (&partial)[32]) {
  v = warp_max(v);
  __syncthreads();
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  return warp_max(threadIdx.x % 32 < blockDim.x / 32 ? partial[threadIdx.x % 32] : -ORTLAB_INFINITY);
}

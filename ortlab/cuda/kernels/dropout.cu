// Dropout and DropoutGrad, elementwise in grid-stride loops.
// DropoutGrad mirrors orttraining/orttraining/training_ops/cuda/nn/dropout_grad_impl.cu:
//   dx = dy * mask * (1 / (1 - ratio)), and dx = dy when ratio is 0 (the mask is not read: ORT's CUDA
//   and CPU kernels both copy dy then). ORT's CPU kernel (training_ops/cpu/nn/dropout_op.cc) divides
//   by 1 - ratio instead of multiplying by its reciprocal, so the two differ in the last bit.
// Dropout mirrors onnxruntime/core/providers/cuda/nn/dropout_impl.cu: an element is kept when a
// uniform draw in [0, 1) is below 1 - ratio; y = x * mask / (1 - ratio). ORT draws with curand's
// Philox4_32_10 (PhiloxGenerator); this source uses a counter-based hash of (seed, index) instead,
// so its masks are not ORT's: the same seed gives the same mask here, on any schedule.
extern "C" __global__ void dropout_grad(const float* dy, const bool* mask, float* dx, float ratio, long long n) {
  const float scale = 1.0f / (1.0f - ratio);
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x)
    dx[i] = ratio == 0.0f ? dy[i] : dy[i] * (mask[i] ? 1.0f : 0.0f) * scale;
}

// A uniform float in [0, 1) from 24 bits of splitmix64's finalizer applied to seed and index.
__device__ __forceinline__ float uniform01(unsigned long long seed, unsigned long long i) {
  unsigned long long z = seed + (i + 1ull) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  z ^= z >> 31;
  return (float)(z >> 40) * (1.0f / 16777216.0f);
}

extern "C" __global__ void dropout(const float* x, float* y, bool* mask, float ratio, long long n,
                                   unsigned long long seed) {
  const float keep = 1.0f - ratio, scale = 1.0f / keep;
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < n; i += (long long)gridDim.x * blockDim.x) {
    const bool kept = uniform01(seed, (unsigned long long)i) < keep;
    mask[i] = kept;
    y[i] = x[i] * (kept ? 1.0f : 0.0f) * scale;
  }
}

// LayerNormalization forward over the last axis of a [rows, cols] matrix, three times: the steps
// from a naive kernel to the shape of ORT's (onnxruntime/contrib_ops/cuda/layer_norm_impl.cu,
// cuApplyLayerNorm). Each computes mean = sum(x) / cols, var = sum((x - mean)^2) / cols (two passes
// over the row, centred, as a stable reference does), inv_std = rsqrt(var + epsilon) and
// y = (x - mean) * inv_std * scale + bias.
//
//   layer_norm_naive      one thread per row: a thread walks its whole row three times; neighbouring
//                         threads read addresses cols floats apart (uncoalesced), few threads in all
//   layer_norm_block_tree one block per row: threads stride over the row (coalesced), partial sums
//                         meet in a shared-memory tree, log2(blockDim) barriers per sum
//   layer_norm_warp_vec4  one block per row: float4 loads and stores when cols % 4 == 0 (a quarter of
//                         the load instructions), warp shuffles inside each warp and one shared slot
//                         per warp (common.cuh's block_sum: two barriers per sum)

#ifndef __CUDACC__  // the CPU runner (g++): NVRTC has float4 built in
struct alignas(16) float4 { float x, y, z, w; };
#endif

extern "C" __global__ void layer_norm_naive(const float* x, const float* scale, const float* bias, float* y,
                                            int rows, int cols, float epsilon) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= rows) return;
  const long long base = (long long)row * cols;
  float sum = 0.0f;
  for (int c = 0; c < cols; ++c) sum += x[base + c];
  const float mean = sum / cols;
  float squares = 0.0f;
  for (int c = 0; c < cols; ++c) {
    const float d = x[base + c] - mean;
    squares += d * d;
  }
  const float inv_std = rsqrtf(squares / cols + epsilon);
  for (int c = 0; c < cols; ++c) y[base + c] = (x[base + c] - mean) * inv_std * scale[c] + bias[c];
}

// The sum of v over the block, for every thread: a tree in shared memory over the next power of two
// of blockDim.x (any block size up to 1024).
__device__ float tree_sum(float v, float* buffer) {
  __syncthreads();  // the previous sum's readers of buffer[0] are done
  buffer[threadIdx.x] = v;
  __syncthreads();
  int width = 1;
  while (width < (int)blockDim.x) width *= 2;
  for (int half = width / 2; half > 0; half /= 2) {
    if ((int)threadIdx.x < half && threadIdx.x + half < blockDim.x) buffer[threadIdx.x] += buffer[threadIdx.x + half];
    __syncthreads();
  }
  return buffer[0];
}

extern "C" __global__ void layer_norm_block_tree(const float* x, const float* scale, const float* bias, float* y,
                                                 int rows, int cols, float epsilon) {
  __shared__ float buffer[1024];
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long base = (long long)row * cols;
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) sum += x[base + c];
    const float mean = tree_sum(sum, buffer) / cols;
    float squares = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      const float d = x[base + c] - mean;
      squares += d * d;
    }
    const float inv_std = rsqrtf(tree_sum(squares, buffer) / cols + epsilon);
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
      y[base + c] = (x[base + c] - mean) * inv_std * scale[c] + bias[c];
  }
}

__device__ __forceinline__ float4 load4(const float* p) { return *reinterpret_cast<const float4*>(p); }
__device__ __forceinline__ void store4(float* p, float4 v) { *reinterpret_cast<float4*>(p) = v; }

// blockDim.x must be a multiple of 32 (common.cuh's block_sum). The float4 path needs 16-byte aligned
// rows: cols % 4 == 0 and an aligned array (cudaMalloc's are); other rows take the scalar loop.
extern "C" __global__ void layer_norm_warp_vec4(const float* x, const float* scale, const float* bias, float* y,
                                                int rows, int cols, float epsilon) {
  __shared__ float partial[32];
  const int quads = cols % 4 == 0 ? cols / 4 : 0;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long base = (long long)row * cols;
    float sum = 0.0f;
    for (int k = threadIdx.x; k < quads; k += blockDim.x) {
      const float4 v = load4(&x[base + 4 * k]);
      sum += (v.x + v.y) + (v.z + v.w);
    }
    for (int c = 4 * quads + threadIdx.x; c < cols; c += blockDim.x) sum += x[base + c];
    const float mean = block_sum(sum, partial) / cols;
    float squares = 0.0f;
    for (int k = threadIdx.x; k < quads; k += blockDim.x) {
      const float4 v = load4(&x[base + 4 * k]);
      const float a = v.x - mean, b = v.y - mean, c = v.z - mean, d = v.w - mean;
      squares += (a * a + b * b) + (c * c + d * d);
    }
    for (int c = 4 * quads + threadIdx.x; c < cols; c += blockDim.x) {
      const float d = x[base + c] - mean;
      squares += d * d;
    }
    const float inv_std = rsqrtf(block_sum(squares, partial) / cols + epsilon);
    for (int k = threadIdx.x; k < quads; k += blockDim.x) {
      const float4 v = load4(&x[base + 4 * k]), s = load4(&scale[4 * k]), b = load4(&bias[4 * k]);
      float4 out;
      out.x = (v.x - mean) * inv_std * s.x + b.x;
      out.y = (v.y - mean) * inv_std * s.y + b.y;
      out.z = (v.z - mean) * inv_std * s.z + b.z;
      out.w = (v.w - mean) * inv_std * s.w + b.w;
      store4(&y[base + 4 * k], out);
    }
    for (int c = 4 * quads + threadIdx.x; c < cols; c += blockDim.x)
      y[base + c] = (x[base + c] - mean) * inv_std * scale[c] + bias[c];
  }
}

// LayerNormalization over the last axis of a [rows, cols] matrix, and its gradient.
//
// Forward mirrors onnxruntime/contrib_ops/cuda/layer_norm_impl.cu (cuApplyLayerNorm,
// cuWelfordMuSigma2): one row per block in a grid-stride loop; each thread runs Welford's online
// mean and variance over a strided slice of the row; warps merge their lanes' (count, mean, M2)
// by shuffles, lane 0 of each warp leaves its triple in shared memory and thread 0 merges those;
//   mean = M2-merged mean, inv_std = rsqrt(M2 / cols + epsilon), y = (x - mean) * inv_std * scale + bias.
//
// Backward mirrors orttraining/orttraining/training_ops/cuda/nn/layer_norm_impl.cu
// (cuComputeGradInput; cuComputePartGradGammaBeta + cuComputeGradGammaBeta), with xhat = (x - mean) * inv_std:
//   dx = inv_std * (g - mean_c(g) - xhat * mean_c(g * xhat)),  g = dy * scale   (block per row)
//   dscale[c] = sum_r dy * xhat,  dbias[c] = sum_r dy          (one thread per column, a plain
//   loop over the rows: deterministic, where ORT first sums tiles of rows in shared memory)

// Chan et al.'s merge of two (count, mean, M2) summaries.
__device__ __forceinline__ void welford_merge(float& count, float& mean, float& m2, float count_b, float mean_b,
                                              float m2_b) {
  const float total = count + count_b;
  if (total == 0.0f) return;
  const float delta = mean_b - mean, weight_b = count_b / total;
  mean += delta * weight_b;
  m2 += m2_b + delta * (delta * (count * weight_b));  // delta * delta alone overflows first (|delta| > 1.8e19)
  count = total;
}

extern "C" __global__ void layer_norm(const float* x, const float* scale, const float* bias, float* y, float* mean,
                                      float* inv_std, int rows, int cols, float epsilon) {
  __shared__ float s_count[32], s_mean[32], s_m2[32];
  __shared__ float s_row[2];  // the row's mean and inv_std, for every thread
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long base = (long long)row * cols;
    float count = 0.0f, mu = 0.0f, m2 = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {  // Welford's online update
      const float v = x[base + c];
      count += 1.0f;
      const float delta = v - mu;
      mu += delta / count;
      m2 += delta * (v - mu);
    }
    for (int offset = 16; offset > 0; offset /= 2) {
      const float count_b = __shfl_down_sync(ORTLAB_FULL_MASK, count, offset);
      const float mean_b = __shfl_down_sync(ORTLAB_FULL_MASK, mu, offset);
      const float m2_b = __shfl_down_sync(ORTLAB_FULL_MASK, m2, offset);
      welford_merge(count, mu, m2, count_b, mean_b, m2_b);
    }
    __syncthreads();  // the previous row's readers of s_row are done
    if (lane == 0) {
      s_count[warp] = count;
      s_mean[warp] = mu;
      s_m2[warp] = m2;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < (int)(blockDim.x / 32); ++w) welford_merge(count, mu, m2, s_count[w], s_mean[w], s_m2[w]);
      s_row[0] = mu;
      s_row[1] = rsqrtf(m2 / cols + epsilon);
      mean[row] = s_row[0];
      inv_std[row] = s_row[1];
    }
    __syncthreads();
    const float row_mean = s_row[0], row_inv_std = s_row[1];
    for (int c = threadIdx.x; c < cols; c += blockDim.x)
      y[base + c] = (x[base + c] - row_mean) * row_inv_std * scale[c] + bias[c];
  }
}

extern "C" __global__ void layer_norm_grad_input(const float* dy, const float* x, const float* scale,
                                                 const float* mean, const float* inv_std, float* dx, int rows,
                                                 int cols) {
  __shared__ float partial[32];
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long base = (long long)row * cols;
    const float mu = mean[row], rs = inv_std[row];
    float sum_g = 0.0f, sum_g_xhat = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      const float g = dy[base + c] * scale[c];
      sum_g += g;
      sum_g_xhat += g * (x[base + c] - mu) * rs;
    }
    const float mean_g = block_sum(sum_g, partial) / cols;
    const float mean_g_xhat = block_sum(sum_g_xhat, partial) / cols;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
      const float xhat = (x[base + c] - mu) * rs;
      dx[base + c] = rs * (dy[base + c] * scale[c] - mean_g - xhat * mean_g_xhat);
    }
  }
}

extern "C" __global__ void layer_norm_grad_scale_bias(const float* dy, const float* x, const float* mean,
                                                      const float* inv_std, float* dscale, float* dbias, int rows,
                                                      int cols) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < cols; c += gridDim.x * blockDim.x) {
    float sum_dy = 0.0f, sum_dy_xhat = 0.0f;
    for (int row = 0; row < rows; ++row) {
      const long long at = (long long)row * cols + c;
      sum_dy += dy[at];
      sum_dy_xhat += dy[at] * (x[at] - mean[row]) * inv_std[row];
    }
    dscale[c] = sum_dy_xhat;
    dbias[c] = sum_dy;
  }
}

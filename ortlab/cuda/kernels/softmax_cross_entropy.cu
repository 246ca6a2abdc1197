// SoftmaxCrossEntropyLoss (reduction "mean", no class weights) over [n, classes] logits, and its Grad.
// Mirrors onnxruntime/core/providers/cuda/loss/softmax_cross_entropy_loss_impl.cu and
// orttraining/orttraining/training_ops/cuda/loss/softmax_cross_entropy_loss_impl.cu: ORT first runs
// its log-softmax (onnxruntime/core/providers/cuda/math/softmax_impl.cu), then per sample
//   weight_i = (label_i == ignore_index ? 0 : 1),  term_i = -log_prob[i, label_i] * weight_i,
// then loss = sum_i term_i / sum_i weight_i (the normalize factor); the gradient is
//   dlogits[i, c] = dy * weight_i / sum_w * (exp(log_prob[i, c]) - (c == label_i)).
// When every sample is ignored (sum_w = 0) the loss and the gradient are 0, not 0 / 0, as ORT's kernels give.

// log_prob[r, c] = x[r, c] - max_c x[r, :] - log(sum_c exp(x[r, c] - max)): block per row.
extern "C" __global__ void log_softmax_rows(const float* x, float* log_prob, int rows, int cols) {
  __shared__ float partial[32];
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long base = (long long)row * cols;
    float m = -ORTLAB_INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) m = fmaxf(m, x[base + c]);
    m = block_max(m, partial);
    float s = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) s += expf(x[base + c] - m);
    const float log_sum = logf(block_sum(s, partial));
    for (int c = threadIdx.x; c < cols; c += blockDim.x) log_prob[base + c] = x[base + c] - m - log_sum;
  }
}

// One term and one weight per sample (grid-stride). A label outside [0, classes) that is not
// ignore_index reads outside log_prob (ORT's CUDA kernel assumes valid labels too).
extern "C" __global__ void cross_entropy_terms(const float* log_prob, const long long* label, float* term,
                                               float* weight, int n, int classes, long long ignore_index) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) {
    const bool ignored = label[i] == ignore_index;
    weight[i] = ignored ? 0.0f : 1.0f;
    term[i] = ignored ? 0.0f : -log_prob[(long long)i * classes + label[i]];
  }
}

// loss[0] = sum(term) / sum(weight) (0 when the sum of weights is 0), weight_sum[0] = sum(weight): one
// block, grid-stride over samples.
extern "C" __global__ void cross_entropy_mean(const float* term, const float* weight, float* loss, float* weight_sum,
                                              int n) {
  __shared__ float partial[32];
  float t = 0.0f, w = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) {
    t += term[i];
    w += weight[i];
  }
  t = block_sum(t, partial);
  w = block_sum(w, partial);
  if (threadIdx.x == 0) {
    loss[0] = w > 0.0f ? t / w : 0.0f;
    weight_sum[0] = w;
  }
}

extern "C" __global__ void cross_entropy_grad(const float* dy, const float* log_prob, const long long* label,
                                              const float* weight_sum, float* dlogits, int n, int classes,
                                              long long ignore_index) {
  const long long total = (long long)n * classes;
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total; k += (long long)gridDim.x * blockDim.x) {
    const long long i = k / classes, c = k % classes;
    const float w = label[i] == ignore_index ? 0.0f : 1.0f;
    dlogits[k] = w == 0.0f ? 0.0f : dy[0] * w / weight_sum[0] * (expf(log_prob[k]) - (c == label[i] ? 1.0f : 0.0f));
  }
}

// ReduceSum over the last axis of a [rows, cols] matrix: y[r] = sum_c x[r, cols].
// Mirrors onnxruntime/core/providers/cuda/reduction/reduction_functions.cu (reduce_matrix_columns:
// a grid-stride loop over rows, each thread accumulating a strided slice of the row, then a warp
// reduction by shuffles and a block reduction through shared memory).
extern "C" __global__ void reduce_sum_last_axis(const float* x, float* y, int rows, int cols) {
  __shared__ float partial[32];
  for (int row = blockIdx.x; row < rows; row += gridDim.x) {
    const long long base = (long long)row * cols;
    float v = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) v += x[base + c];
    v = block_sum(v, partial);
    if (threadIdx.x == 0) y[row] = v;
  }
}

// GatherGrad: dx = zeros(shape); dx[o, indices[i], j] += dy[o, i, j] for every (o, i, j), where
// o runs over the axes before `axis` (outer), i over the flattened indices and j over the axes
// after it (inner). A negative index counts from the end, as Gather's do.
// Mirrors orttraining/orttraining/training_ops/cuda/tensor/gather_grad_impl.cu, both of its paths:
//  - atomic: one thread per element of dy adds it into dx with atomicAdd; the order of the adds
//    into one element depends on the threads' timing, so float results vary in the last bits;
//  - deterministic: sort (index, position) pairs (ORT sorts with cub::DeviceRadixSort; here a
//    rank sort, each thread counting the pairs before its own: stable, O(n^2), for small inputs),
//    then one thread per run of equal indices sums its dy rows in position order and writes dx.

__device__ __forceinline__ long long wrapped(long long index, long long gather_dim) {
  return index < 0 ? index + gather_dim : index;
}

extern "C" __global__ void gather_grad_atomic(const float* dy, const long long* indices, float* dx, long long outer,
                                              long long num_indices, long long gather_dim, long long inner) {
  const long long total = outer * num_indices * inner;
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total; k += (long long)gridDim.x * blockDim.x) {
    const long long o = k / (num_indices * inner), i = k / inner % num_indices, j = k % inner;
    atomicAdd(&dx[(o * gather_dim + wrapped(indices[i], gather_dim)) * inner + j], dy[k]);
  }
}

// sorted_index[rank] = index, sorted_position[rank] = i: rank = number of pairs that sort before
// pair i (a smaller index, or the same index at an earlier position).
extern "C" __global__ void gather_grad_sort(const long long* indices, long long* sorted_index, long long* sorted_position,
                                            long long num_indices, long long gather_dim) {
  for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < num_indices; i += (long long)gridDim.x * blockDim.x) {
    const long long mine = wrapped(indices[i], gather_dim);
    long long rank = 0;
    for (long long k = 0; k < num_indices; ++k) {
      const long long other = wrapped(indices[k], gather_dim);
      rank += other < mine || (other == mine && k < i);
    }
    sorted_index[rank] = mine;
    sorted_position[rank] = i;
  }
}

// One thread per (o, first pair of a run of equal indices, j): dx = the run's dy summed in position
// order. Rows of dx that no index names are left as they are (the caller zeroes dx).
extern "C" __global__ void gather_grad_sorted(const float* dy, const long long* sorted_index,
                                              const long long* sorted_position, float* dx, long long outer,
                                              long long num_indices, long long gather_dim, long long inner) {
  const long long total = outer * num_indices * inner;
  for (long long k = blockIdx.x * (long long)blockDim.x + threadIdx.x; k < total; k += (long long)gridDim.x * blockDim.x) {
    const long long o = k / (num_indices * inner), p = k / inner % num_indices, j = k % inner;
    if (p > 0 && sorted_index[p] == sorted_index[p - 1]) continue;  // not the first of its run
    float sum = 0.0f;
    for (long long q = p; q < num_indices && sorted_index[q] == sorted_index[p]; ++q)
      sum += dy[(o * num_indices + sorted_position[q]) * inner + j];
    dx[(o * gather_dim + sorted_index[p]) * inner + j] = sum;
  }
}

"""Reference answers to the exercises of notebooks/L3_01_kernel_optimization.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "skip_layer_norm": '''
row = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
offsets = row * n_cols + cols
s = tl.load(x_ptr + offsets, mask=mask, other=0.0) + tl.load(skip_ptr + offsets, mask=mask, other=0.0)
mean = tl.sum(s, axis=0) / n_cols
centered = tl.where(mask, s - mean, 0.0)  # the masked lanes are no part of the row
rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
y = centered * rstd * tl.load(gamma_ptr + cols, mask=mask) + tl.load(beta_ptr + cols, mask=mask)
tl.store(y_ptr + offsets, y, mask=mask)  # s never left the registers
''',
    "block_sum": '''
return r"""
__device__ float block_sum(float v, float* slots) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  __syncthreads();  // the previous call's reads of slots are done
  if (lane == 0) slots[warp] = v;
  __syncthreads();  // every warp's sum is in slots
  v = lane < warps ? slots[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}
"""
''',
}

_LOADS = '''
row = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
offsets = row * n_cols + cols
s = tl.load(x_ptr + offsets, mask=mask, other=0.0) + tl.load(skip_ptr + offsets, mask=mask, other=0.0)
'''

MISTAKES = {
    "skip_layer_norm": [
        (_LOADS + '''
mean = tl.sum(s, axis=0) / n_cols
centered = s - mean
rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
y = centered * rstd * tl.load(gamma_ptr + cols, mask=mask) + tl.load(beta_ptr + cols, mask=mask)
tl.store(y_ptr + offsets, y, mask=mask)
''', "counts the 27 masked lanes"),
        (_LOADS + '''
mean = tl.sum(s, axis=0) / BLOCK
centered = tl.where(mask, s - mean, 0.0)
rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / BLOCK + eps)
y = centered * rstd * tl.load(gamma_ptr + cols, mask=mask) + tl.load(beta_ptr + cols, mask=mask)
tl.store(y_ptr + offsets, y, mask=mask)
''', "divided by BLOCK (64)"),
        (_LOADS + '''
mean = tl.sum(s, axis=0) / n_cols
centered = tl.where(mask, s - mean, 0.0)
rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / (n_cols - 1) + eps)
y = centered * rstd * tl.load(gamma_ptr + cols, mask=mask) + tl.load(beta_ptr + cols, mask=mask)
tl.store(y_ptr + offsets, y, mask=mask)
''', "n_cols - 1"),
        (_LOADS + '''
mean = tl.sum(s, axis=0) / n_cols
centered = tl.where(mask, s - mean, 0.0)
rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
again = tl.load(x_ptr + offsets, mask=mask, other=0.0) + tl.load(skip_ptr + offsets, mask=mask, other=0.0)
y = (again - mean) * rstd * tl.load(gamma_ptr + cols, mask=mask) + tl.load(beta_ptr + cols, mask=mask)
tl.store(y_ptr + offsets, y, mask=mask)
''', "read x 2 times"),
        ('''
row = tl.program_id(0)
cols = tl.arange(0, BLOCK)
mask = cols < n_cols
offsets = row * n_cols + cols
x = tl.load(x_ptr + offsets, mask=mask, other=0.0)
tl.store(y_ptr + offsets, x + tl.load(skip_ptr + offsets, mask=mask, other=0.0), mask=mask)
s = tl.load(y_ptr + offsets, mask=mask, other=0.0)
mean = tl.sum(s, axis=0) / n_cols
centered = tl.where(mask, s - mean, 0.0)
rstd = 1.0 / tl.sqrt(tl.sum(centered * centered, axis=0) / n_cols + eps)
y = centered * rstd * tl.load(gamma_ptr + cols, mask=mask) + tl.load(beta_ptr + cols, mask=mask)
tl.store(y_ptr + offsets, y, mask=mask)
''', "s went to memory and back"),
    ],
    "block_sum": [
        ('''
return r"""
__device__ float block_sum(float v, float* slots) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffff, v, offset);
  __syncthreads();
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  v = lane < warps ? slots[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffff, v, offset);
  return v;
}
"""
''', "leaves the sum in lane 0 only"),
        ('''
return r"""
__device__ float block_sum(float v, float* slots) {
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}
"""
''', "each thread got its warp's sum"),
        ('''
return r"""
__device__ float block_sum(float v, float* slots) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  __syncthreads();
  if (lane == 0) slots[warp] = v;
  v = lane < warps ? slots[lane] : 0.0f;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}
"""
''', "in its first call"),
        ('''
return r"""
__device__ float block_sum(float v, float* slots) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  __syncthreads();
  if (lane == 0) slots[warp] = v;
  __syncthreads();
  v = slots[lane];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  return v;
}
"""
''', "only slots[0] to slots["),
    ],
}

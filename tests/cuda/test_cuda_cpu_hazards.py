"""ortlab.cuda.cpu: kernels whose result on the CPU runner used to differ silently from a GPU's.

Each kernel is written as NVIDIA's samples and tutorials write it; each ends in the value numpy gives
or in an OrtlabError that says what, where and what to do.
"""
import numpy as np
import pytest

from ortlab.cuda import cpu
from ortlab.errors import OrtlabError

# "Optimizing Parallel Reduction in CUDA" (reduce #5) and the reduction sample before CUDA 9: the
# last warp adds through a volatile pointer with no barrier, relying on the warp's lock step.
WARP_SYNCHRONOUS = r"""
__device__ void warpReduce(volatile float* sdata, unsigned int tid) {
  sdata[tid] += sdata[tid + 32];
  sdata[tid] += sdata[tid + 16];
  sdata[tid] += sdata[tid + 8];
  sdata[tid] += sdata[tid + 4];
  sdata[tid] += sdata[tid + 2];
  sdata[tid] += sdata[tid + 1];
}

extern "C" __global__ void reduce5(const float* g_idata, float* g_odata, unsigned int n) {
  extern __shared__ float sdata[];
  unsigned int tid = threadIdx.x;
  unsigned int i = blockIdx.x * (blockDim.x * 2) + threadIdx.x;
  float mySum = (i < n) ? g_idata[i] : 0.0f;
  if (i + blockDim.x < n) mySum += g_idata[i + blockDim.x];
  sdata[tid] = mySum;
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 32; s >>= 1) {
    if (tid < s) sdata[tid] = mySum = mySum + sdata[tid + s];
    __syncthreads();
  }
  if (tid < 32) warpReduce(sdata, tid);
  if (tid == 0) g_odata[blockIdx.x] = sdata[0];
}
"""
# CUDA 9's form of the same step: read, __syncwarp(), write, __syncwarp()
WARP_SYNCWARP = WARP_SYNCHRONOUS.replace("""  sdata[tid] += sdata[tid + 32];
  sdata[tid] += sdata[tid + 16];
  sdata[tid] += sdata[tid + 8];
  sdata[tid] += sdata[tid + 4];
  sdata[tid] += sdata[tid + 2];
  sdata[tid] += sdata[tid + 1];""", """  for (unsigned int offset = 32; offset > 0; offset >>= 1) {
    float v = sdata[tid] + sdata[tid + offset];
    __syncwarp();
    sdata[tid] = v;
    __syncwarp();
  }""")


def block_sums(x, threads):
    per_block = 2 * threads
    padded = np.concatenate([x, np.zeros(-len(x) % per_block, x.dtype)]).astype(np.float64)
    return padded.reshape(-1, per_block).sum(axis=1)


@pytest.fixture(scope="module")
def reduce5():
    return cpu.cpu_kernel(WARP_SYNCHRONOUS, "reduce5")


def reduction_inputs(n=1000, threads=128):
    x = np.random.default_rng(4).standard_normal(n).astype(np.float32)
    return x, np.zeros(-(-n // (2 * threads)), np.float32)


def test_a_warp_synchronous_reduction_is_a_race_inside_a_warp_by_default(reduce5):
    x, out = reduction_inputs()
    with pytest.raises(OrtlabError, match=r"thread \(\d+, 0, 0\) of block \(0, 0, 0\): a race inside a warp on "
                                          r"shared memory .*racecheck.*: lane \d+ (reads|writes) sdata\[\d+\] at "
                                          r"kernel.cu line [3-8], which thread .* lane \d+ of the same warp, "
                                          r".*no __syncwarp\(\).*warps=\"lockstep\"") as error:
        cpu.launch(reduce5, len(out), 128, x, out, len(x), shared_bytes=128 * 4)
    assert not out.any()
    with pytest.raises(OrtlabError, match="a race inside a warp"):  # schedule_differences says so too
        cpu.schedule_differences(reduce5, len(out), 128, x, out, len(x), shared_bytes=128 * 4)
    assert "Volta" in str(error.value)


@pytest.mark.parametrize("schedule", ["forward", "reverse"])
def test_in_lock_step_the_warp_synchronous_reduction_sums_as_before_volta(reduce5, schedule):
    x, out = reduction_inputs()
    cpu.launch(reduce5, len(out), 128, x, out, len(x), shared_bytes=128 * 4, warps="lockstep", schedule=schedule)
    np.testing.assert_allclose(out, block_sums(x, 128), rtol=1e-5, atol=1e-5)


def test_with_syncwarp_between_its_steps_the_reduction_sums_in_either_mode():
    kernel = cpu.cpu_kernel(WARP_SYNCWARP, "reduce5")
    x, out = reduction_inputs(777, 64)
    for warps in cpu.WARPS:
        out[:] = 0
        cpu.launch(kernel, len(out), 64, x, out, len(x), shared_bytes=64 * 4, warps=warps)
        np.testing.assert_allclose(out, block_sums(x, 64), rtol=1e-5, atol=1e-5)
    assert cpu.schedule_differences(kernel, len(out), 64, x, out, len(x), shared_bytes=64 * 4) == []


def test_warps_takes_two_modes(reduce5):
    x, out = reduction_inputs()
    with pytest.raises(OrtlabError, match="warps must be 'independent'"):
        cpu.launch(reduce5, len(out), 128, x, out, len(x), shared_bytes=512, warps="volta")


DERIVED = {
    "offset": (r"""
extern "C" __global__ void fill_row(float* o, int n) {
  float* row = o + 64;
  row[threadIdx.x] = 7.0f;
}""", r"o\[64\] is out of bounds \(o has 64 elements\): written through a pointer at kernel.cu line 4"),
    "address-of": (r"""
extern "C" __global__ void copy_shifted(const float* a, float* o, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  float* q = &o[0];
  if (i < n) q[i + 40] = a[i];
}""", r"thread \(24, 0, 0\) of block \(0, 0, 0\): o\[64\] is out of bounds \(o has 64 elements\): written "
      r"through a pointer at kernel.cu line 5"),
    "device-function": (r"""
__device__ void put(float* p, int i, float v) { p[i] = v; }

extern "C" __global__ void scatter(const float* a, float* o, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) put(o, i + 40, a[i]);
}""", r"o\[64\] is out of bounds \(o has 64 elements\): written through a pointer at kernel.cu line 2"),
    "read-before": (r"""
extern "C" __global__ void shift(const float* a, float* o, int n) {
  int i = threadIdx.x;
  const float* before = a - 1;
  o[i] = before[i];
}""", r"thread \(0, 0, 0\) of block \(0, 0, 0\): a\[-1\] is out of bounds \(a has 64 elements\): read through a "
      r"pointer at kernel.cu line 5"),
}


@pytest.mark.parametrize("case", DERIVED, ids=list(DERIVED))
@pytest.mark.parametrize("timeout", [10.0, None])
def test_an_index_past_an_array_through_a_derived_pointer_stops_the_launch(case, timeout):
    source, message = DERIVED[case]
    name = source.split("void ")[-1].split("(")[0]
    kernel = cpu.cpu_kernel(source, name)
    a, o = np.arange(64, dtype=np.float32), np.zeros(64, np.float32)
    args = (o, 64) if len(kernel.params) == 2 else (a, o, 64)
    with pytest.raises(OrtlabError, match=message):
        cpu.launch(kernel, 1, 64, *args, timeout=timeout)
    assert not o.any() and np.array_equal(a, np.arange(64))  # neither array changed


def test_an_overflow_never_lands_in_the_callers_neighbouring_array():
    kernel = cpu.cpu_kernel(r"""
extern "C" __global__ void fill(float* a, float* b, int n) {
  float* p = &a[0];
  p[threadIdx.x] = 99.0f;
}""", "fill")
    memory = np.zeros(128, np.float32)  # a and b side by side, as numpy may place them
    a, b = memory[:64], memory[64:]
    with pytest.raises(OrtlabError, match=r"a\[64\] is out of bounds \(a has 64 elements\)"):
        cpu.launch(kernel, 1, 128, a, b, 64, timeout=None)
    assert not memory.any()


def test_an_index_past_a_shared_array_through_a_pointer_stops_the_launch():
    kernel = cpu.cpu_kernel(r"""
__device__ void store(float* buffer, float v) { buffer[threadIdx.x] = v; }

extern "C" __global__ void staged(const float* x, float* y) {
  __shared__ float buffer[128];
  store(buffer, x[threadIdx.x]);
  __syncthreads();
  y[threadIdx.x] = buffer[blockDim.x - 1 - threadIdx.x];
}""", "staged")
    x, y = np.arange(256, dtype=np.float32), np.zeros(256, np.float32)
    cpu.launch(kernel, 1, 128, x[:128].copy(), y[:128])
    np.testing.assert_array_equal(y[:128], x[:128][::-1])
    with pytest.raises(OrtlabError, match=r"thread \(128, 0, 0\) of block \(0, 0, 0\): buffer\[128\] is out of "
                                          r"bounds for type __shared__ buffer \(128 elements of 4 bytes\) \(written "
                                          r"through a pointer at kernel.cu line 2\)"):
        cpu.launch(kernel, 1, 256, x, y)


BOUNDED = r"""
#define BLOCK_SIZE 128
extern "C" __global__ void __launch_bounds__(BLOCK_SIZE, 4) scale(float* y, float a, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] *= a;
}
"""


def test_launch_bounds_refuse_a_larger_block_as_a_gpu_does():
    kernel = cpu.cpu_kernel(BOUNDED, "scale")
    assert kernel.max_threads == 128
    y = np.arange(300, dtype=np.float32)
    for block in (256, (16, 16), (128, 2)):
        with pytest.raises(OrtlabError, match=r"kernel scale is declared __launch_bounds__\(128\): a launch of 256 "
                                              r"threads per block .* is refused by a GPU .*too many resources "
                                              r"requested for launch.*at most 128 threads per block"):
            cpu.launch(kernel, 2, block, y, 2.0, 300)
    cpu.launch(kernel, 3, 128, y, 2.0, 300)
    np.testing.assert_array_equal(y, 2 * np.arange(300, dtype=np.float32))


def test_launch_bounds_written_before_global_and_without_them():
    kernel = cpu.cpu_kernel("extern \"C\" __launch_bounds__(64) __global__ void k(float* y) { y[threadIdx.x] = 1; }",
                            "k")
    assert kernel.max_threads == 64
    assert cpu.cpu_kernel("extern \"C\" __global__ void k(float* y) { y[threadIdx.x] = 1; }", "k").max_threads == 0
    assert cpu.launch_bounds("#define LB __launch_bounds__(32)\n__global__ void k(float* y) {}", "k") is None


CONST_CAST = {
    "const_cast": "const_cast<float*>(x)[i] = 2.0f * x[i];",
    "c-style": "((float*)x)[i] = 2.0f * x[i];",
    "address": "float* y = const_cast<float*>(&x[0]); y[i] = 2.0f * x[i];",
}


@pytest.mark.parametrize("write", CONST_CAST.values(), ids=list(CONST_CAST))
@pytest.mark.parametrize("timeout", [10.0, None])
def test_a_write_through_const_cast_lands_as_on_a_gpu(write, timeout):
    kernel = cpu.cpu_kernel(r"""
extern "C" __global__ void double_in_place(const float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) { WRITE }
}""".replace("WRITE", write), "double_in_place")
    x = np.arange(100, dtype=np.float32)
    cpu.launch(kernel, 4, 32, x, 100, timeout=timeout)
    np.testing.assert_array_equal(x, 2 * np.arange(100, dtype=np.float32))
    x.flags.writeable = False
    with pytest.raises(OrtlabError, match=r"thread \(0, 0, 0\) of block \(0, 0, 0\) wrote x, a const parameter, at "
                                          r"kernel.cu line 4 \(through const_cast\): on a GPU the write lands.*the "
                                          r"array passed for x is read-only"):
        cpu.launch(kernel, 4, 32, x, 100, timeout=timeout)
    np.testing.assert_array_equal(x, 2 * np.arange(100, dtype=np.float32))


# Each block sums its part into partial[]; block 0 then adds the partial sums without waiting for
# the other blocks (what threadFenceReduction's last-block counter is for): a race between blocks.
BETWEEN_BLOCKS = r"""
extern "C" __global__ void sum_blocks(const float* x, float* partial, float* total, int n) {
  __shared__ float sdata[128];
  unsigned int tid = threadIdx.x, i = blockIdx.x * blockDim.x + threadIdx.x;
  sdata[tid] = i < n ? x[i] : 0.0f;
  __syncthreads();
  for (unsigned int s = blockDim.x / 2; s > 0; s >>= 1) {
    if (tid < s) sdata[tid] += sdata[tid + s];
    __syncthreads();
  }
  if (tid == 0) partial[blockIdx.x] = sdata[0];
  if (blockIdx.x == 0 && tid == 0) {
    float t = 0.0f;
    for (unsigned int b = 0; b < gridDim.x; ++b) t += partial[b];
    total[0] = t;
  }
}
"""


def test_a_race_between_blocks_shows_between_the_two_schedules():
    kernel = cpu.cpu_kernel(BETWEEN_BLOCKS, "sum_blocks")
    x = np.arange(300, dtype=np.float32)  # integer-valued: every order of the sums is exact
    partial, total = np.zeros(3, np.float32), np.zeros(1, np.float32)
    assert cpu.schedule_differences(kernel, 3, 128, x, partial, total, 300) == ["total"]
    cpu.launch(kernel, 3, 128, x, partial, total, 300, schedule="reverse")  # block 0 last: it sees every sum
    np.testing.assert_array_equal(partial, np.concatenate([x, np.zeros(84, np.float32)]).reshape(3, 128).sum(1))
    assert total[0] == x.sum()


def test_blocks_that_only_add_atomically_are_no_race():
    kernel = cpu.cpu_kernel(r"""
extern "C" __global__ void histogram(const int* values, unsigned int* counts, int n) {
  __shared__ unsigned int local[16];
  if (threadIdx.x < 16) local[threadIdx.x] = 0;
  __syncthreads();
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicAdd(&local[values[i]], 1u);
  __syncthreads();
  if (threadIdx.x < 16) atomicAdd(&counts[threadIdx.x], local[threadIdx.x]);
}""", "histogram")
    values = np.random.default_rng(0).integers(0, 16, 1001).astype(np.int32)
    counts = np.zeros(16, np.uint32)
    for warps in cpu.WARPS:
        assert cpu.schedule_differences(kernel, 5, 64, values, counts, 1001, warps=warps) == []
    cpu.launch(kernel, 5, 64, values, counts, 1001)
    np.testing.assert_array_equal(counts, np.bincount(values, minlength=16))

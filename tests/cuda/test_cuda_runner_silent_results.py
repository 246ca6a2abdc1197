"""ortlab.cuda's CPU runner: no silent results (a wrong number with no error), with kernels of our own.

Five kinds of kernel once launched "successfully" on the CPU runner with a result a GPU does not give,
or a result the GPU gives only by luck. Each now ends in numpy's value or in an OrtlabError that says
what is wrong and what to do:

1. warp-synchronous code (the last warp of a block sum adding through a volatile pointer with no
   barrier, as reductions written before CUDA 9 did) is a race inside a warp, reported as
   compute-sanitizer's racecheck reports it (the lanes, the line, the shared array, the missing
   __syncwarp()); warps="lockstep" runs it as GPUs before Volta did and gets numpy's sum; the fixed
   forms (__syncwarp() between the steps, or shuffles) get numpy's sum by default;
2. an index past an array through a pointer derived from a parameter (o + 64, &o[0], a __device__
   function's float*) stops the launch and never lands in a neighbouring array;
3. __launch_bounds__(n) refuses a larger block, as a GPU does;
4. a write through const_cast on a const parameter lands, as on a GPU;
5. a race between blocks is named by schedule_differences (the reverse schedule runs the blocks last
   to first), and so is a read-modify-write that loses updates when threads run at once, which no
   order of one thread after another shows (`counter[0] += 1` by two blocks, two warps, or the lanes
   of a warp); a __syncthreads() or __syncwarp() between the updates orders them.
"""
import re

import numpy as np
import pytest

from ortlab.cuda import cpu
from ortlab.errors import OrtlabError

# --- 1. the last warp of a block sum, written for GPUs whose warps moved in lock step ---------------
LAST_WARP = r"""
__device__ void fold_last_warp(volatile float* acc, unsigned lane) {
  acc[lane] = acc[lane] + acc[lane + 32];
  acc[lane] = acc[lane] + acc[lane + 16];
  acc[lane] = acc[lane] + acc[lane + 8];
  acc[lane] = acc[lane] + acc[lane + 4];
  acc[lane] = acc[lane] + acc[lane + 2];
  acc[lane] = acc[lane] + acc[lane + 1];
}

extern "C" __global__ void tile_sums(const float* values, float* sums, int count) {
  __shared__ float acc[128];
  unsigned lane = threadIdx.x;
  int at = blockIdx.x * 128 + lane;
  acc[lane] = at < count ? values[at] : 0.0f;
  __syncthreads();
  if (lane < 64) acc[lane] = acc[lane] + acc[lane + 64];
  __syncthreads();
  if (lane < 32) fold_last_warp(acc, lane);
  if (lane == 0) sums[blockIdx.x] = acc[0];
}
"""
FIRST_STEP_LINE = 3  # acc[lane] = acc[lane] + acc[lane + 32]
LAST_STEP_LINE = 8
# the same fold as CUDA 9 asks for it: every lane reads, the warp meets, every lane writes, it meets again
WITH_SYNCWARP = LAST_WARP.replace(LAST_WARP[LAST_WARP.index("  acc[lane] = acc[lane] + acc[lane + 32];"):
                                            LAST_WARP.index("}\n\nextern")], """\
  for (unsigned half = 32; half >= 1; half /= 2) {
    float mine = acc[lane] + acc[lane + half];
    __syncwarp();
    acc[lane] = mine;
    __syncwarp();
  }
""")
# or no shared memory at all in the last step: each lane hands its value down with a shuffle
WITH_SHUFFLES = r"""
extern "C" __global__ void tile_sums(const float* values, float* sums, int count) {
  __shared__ float acc[128];
  unsigned lane = threadIdx.x;
  int at = blockIdx.x * 128 + lane;
  acc[lane] = at < count ? values[at] : 0.0f;
  __syncthreads();
  if (lane < 64) acc[lane] = acc[lane] + acc[lane + 64];
  __syncthreads();
  if (lane < 32) {
    float v = acc[lane] + acc[lane + 32];
    for (int half = 16; half >= 1; half /= 2) v += __shfl_down_sync(0xffffffffu, v, half);
    if (lane == 0) sums[blockIdx.x] = v;
  }
}
"""


def tiles(n=1000, seed=7):
    values = np.random.default_rng(seed).standard_normal(n).astype(np.float32)
    expected = np.concatenate([values, np.zeros(-n % 128, np.float32)]).astype(np.float64).reshape(-1, 128).sum(1)
    return values, np.zeros(len(expected), np.float32), expected


@pytest.fixture(scope="module")
def last_warp():
    return cpu.cpu_kernel(LAST_WARP, "tile_sums")


@pytest.mark.parametrize("timeout", [10.0, None])
def test_the_volatile_last_warp_sum_is_reported_as_racecheck_reports_it(last_warp, timeout):
    values, sums, _ = tiles()
    with pytest.raises(OrtlabError) as error:
        cpu.launch(last_warp, len(sums), 128, values, sums, len(values), timeout=timeout)
    text = str(error.value)
    assert "kernel tile_sums stopped: thread (" in text and "of block (0, 0, 0)" in text
    assert "a race inside a warp on shared memory" in text and "racecheck" in text
    lines = "|".join(str(k) for k in range(FIRST_STEP_LINE, LAST_STEP_LINE + 1))
    # the two lanes, the lines, the shared array and the missing __syncwarp()
    pattern = (rf"lane (\d+) (reads|writes) acc\[\d+\] at kernel.cu line ({lines}), which thread \(\d+, 0, 0\), "
               rf"lane (\d+) of the same warp, (read|wrote) at kernel.cu line ({lines}), with no __syncwarp\(\)")
    found = re.search(pattern, text)
    assert found, text
    assert found[1] != found[4]  # two different lanes
    assert "__syncwarp()" in text and "__shfl_down_sync" in text and 'warps="lockstep"' in text
    assert "Volta" in text
    assert not sums.any()  # no half-summed result is handed back


@pytest.mark.parametrize("schedule", ["forward", "reverse"])
def test_in_lock_step_the_volatile_last_warp_sum_is_numpys(last_warp, schedule):
    values, sums, expected = tiles()
    cpu.launch(last_warp, len(sums), 128, values, sums, len(values), warps="lockstep", schedule=schedule)
    np.testing.assert_allclose(sums, expected, rtol=1e-5, atol=1e-5)


def test_in_lock_step_the_volatile_last_warp_sum_is_no_race(last_warp):
    values, sums, _ = tiles(300)
    assert cpu.schedule_differences(last_warp, len(sums), 128, values, sums, len(values), warps="lockstep") == []


def test_lock_step_is_the_pre_volta_model_and_the_modes_are_named(last_warp):
    assert "before Volta" in cpu.launch.__doc__ and "lockstep" in cpu.launch.__doc__
    assert cpu.WARPS == ("independent", "lockstep")
    values, sums, _ = tiles()
    with pytest.raises(OrtlabError, match=r"warps must be 'independent' \(GPUs since Volta\) or 'lockstep' "
                                          r"\(before Volta\), got True"):
        cpu.launch(last_warp, len(sums), 128, values, sums, len(values), warps=True)


@pytest.mark.parametrize("source", [WITH_SYNCWARP, WITH_SHUFFLES], ids=["syncwarp", "shuffles"])
def test_the_fixed_last_warp_sums_are_numpys_by_default(source):
    kernel = cpu.cpu_kernel(source, "tile_sums")
    values, sums, expected = tiles()
    cpu.launch(kernel, len(sums), 128, values, sums, len(values))
    np.testing.assert_allclose(sums, expected, rtol=1e-5, atol=1e-5)
    assert cpu.schedule_differences(kernel, len(sums), 128, values, sums, len(values)) == []


def test_the_last_warp_sum_through_plain_accesses_is_a_race_schedule_differences_names():
    kernel = cpu.cpu_kernel(LAST_WARP.replace("volatile float* acc", "float* acc"), "tile_sums")
    values, sums, _ = tiles()
    assert cpu.schedule_differences(kernel, len(sums), 128, values, sums, len(values)) == ["sums"]


# --- 2. an index past an array through a pointer derived from a parameter ---------------------------
DERIVED = {
    "offset": (r"""
extern "C" __global__ void mark(float* o, float* other, int n) {
  float* row = o + 64;
  row[threadIdx.x] = 7.0f;
}""", 0, 4, "written"),
    "address-of": (r"""
extern "C" __global__ void mark(float* o, float* other, int n) {
  int i = threadIdx.x;
  float* q = &o[0];
  q[i + 40] = 3.0f;
}""", 24, 5, "written"),
    "device-function": (r"""
__device__ void put(float* p, int i, float v) {
  p[i] = v;
}

extern "C" __global__ void mark(float* o, float* other, int n) {
  put(o, threadIdx.x + n, 2.0f);
}""", 0, 3, "written"),
    "read-past": (r"""
extern "C" __global__ void mark(float* o, float* other, int n) {
  const float* tail = &o[n - 8];
  other[threadIdx.x] = tail[threadIdx.x];
}""", 8, 4, "read"),
}


@pytest.mark.parametrize("case", DERIVED, ids=list(DERIVED))
@pytest.mark.parametrize("timeout", [10.0, None])
def test_an_index_past_a_derived_pointer_stops_the_launch_and_lands_nowhere(case, timeout):
    source, thread, line, how = DERIVED[case]
    kernel = cpu.cpu_kernel(source, "mark")
    o, other = np.zeros(64, np.float32), np.zeros(64, np.float32)
    with pytest.raises(OrtlabError, match=rf"kernel mark stopped: thread \({thread}, 0, 0\) of block \(0, 0, 0\): "
                                          rf"o\[64\] is out of bounds \(o has 64 elements\): {how} through a "
                                          rf"pointer at kernel.cu line {line}"):
        cpu.launch(kernel, 1, 32, o, other, 64, timeout=timeout)
    assert not o.any() and not other.any()  # neither the array nor its neighbour changed


@pytest.mark.parametrize("timeout", [10.0, None])
def test_an_index_far_past_its_array_stops_the_launch_without_naming_the_wrong_array(timeout):
    kernel = cpu.cpu_kernel(r"""
extern "C" __global__ void mark(float* o, float* other, int n) {
  float* q = &o[0];
  q[threadIdx.x * 40000000 + 5] = 1.0f;
}""", "mark")
    o, other = np.zeros(64, np.float32), np.zeros(64, np.float32)
    with pytest.raises(OrtlabError, match=r"thread \(1, 0, 0\) of block \(0, 0, 0\): an address \d+ bytes (before|past "
                                          r"the end of) .*, the nearest array, is out of bounds of every array of "
                                          r"the launch: written through a pointer at kernel.cu line 4") as error:
        cpu.launch(kernel, 1, 32, o, other, 64, timeout=timeout)
    assert "[" not in str(error.value).split("block (0, 0, 0):")[1]  # no index of an array it never indexed
    assert o.sum() == 0 and not other.any()


def test_inside_its_array_a_derived_pointer_writes_what_numpy_expects():
    kernel = cpu.cpu_kernel(DERIVED["address-of"][0].replace("i + 40", "i + 32"), "mark")
    o, other = np.zeros(64, np.float32), np.zeros(64, np.float32)
    cpu.launch(kernel, 1, 32, o, other, 64)
    np.testing.assert_array_equal(o, np.r_[np.zeros(32), np.full(32, 3.0)].astype(np.float32))


# --- 3. __launch_bounds__ ----------------------------------------------------------------------------
BOUNDED = r"""
#define MAX_THREADS 128
extern "C" __global__ void __launch_bounds__(MAX_THREADS, 2) twice(const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x * blockDim.y + threadIdx.y * blockDim.x + threadIdx.x;
  if (i < n) y[i] = 2.0f * x[i];
}
"""


@pytest.mark.parametrize("block", [256, (16, 16), (128, 2)], ids=["256", "16x16", "128x2"])
def test_a_block_larger_than_launch_bounds_is_refused_as_a_gpu_refuses_it(block):
    kernel = cpu.cpu_kernel(BOUNDED, "twice")
    assert kernel.max_threads == 128
    x, y = np.arange(512, dtype=np.float32), np.zeros(512, np.float32)
    with pytest.raises(OrtlabError, match=r"kernel twice is declared __launch_bounds__\(128\): a launch of 256 "
                                          r"threads per block .* refused by a GPU \('too many resources requested "
                                          r"for launch'\); launch at most 128 threads per block"):
        cpu.launch(kernel, 2, block, x, y, 512)
    assert not y.any()


def test_a_block_within_launch_bounds_runs():
    kernel = cpu.cpu_kernel(BOUNDED, "twice")
    x, y = np.arange(512, dtype=np.float32), np.zeros(512, np.float32)
    cpu.launch(kernel, 4, 128, x, y, 512)
    np.testing.assert_array_equal(y, 2 * x)


# --- 4. const_cast -------------------------------------------------------------------------------------
CONST_WRITES = {
    "const_cast": r"""
extern "C" __global__ void scale_in_place(const float* x, float* seen, float k) {
  float* w = const_cast<float*>(x);
  w[threadIdx.x] = k * x[threadIdx.x];
  seen[threadIdx.x] = x[threadIdx.x];
}""",
    "device-function": r"""
__device__ void scale_at(const float* p, int i, float k) { const_cast<float*>(p)[i] *= k; }
extern "C" __global__ void scale_in_place(const float* x, float* seen, float k) {
  scale_at(x, threadIdx.x, k);
  seen[threadIdx.x] = x[threadIdx.x];
}""",
    "c-style-cast": r"""
extern "C" __global__ void scale_in_place(const float* __restrict__ x, float* seen, float k) {
  ((float*)x)[threadIdx.x] = k * x[threadIdx.x];
  seen[threadIdx.x] = x[threadIdx.x];
}""",
}


@pytest.mark.parametrize("case", CONST_WRITES, ids=list(CONST_WRITES))
@pytest.mark.parametrize("timeout", [10.0, None])
def test_a_write_through_const_cast_lands_as_on_a_gpu(case, timeout):
    kernel = cpu.cpu_kernel(CONST_WRITES[case], "scale_in_place")
    x = np.linspace(-1, 1, 32).astype(np.float32)
    expected = x * np.float32(3)
    seen = np.zeros(32, np.float32)
    cpu.launch(kernel, 1, 32, x, seen, 3.0, timeout=timeout)
    np.testing.assert_array_equal(x, expected)
    np.testing.assert_array_equal(seen, expected)


def test_a_write_through_const_cast_into_a_read_only_array_is_refused():
    kernel = cpu.cpu_kernel(CONST_WRITES["const_cast"], "scale_in_place")
    x = np.ones(32, np.float32)
    x.flags.writeable = False
    with pytest.raises(OrtlabError, match=r"wrote x, a const parameter, at kernel.cu line 4 \(through const_cast\)"
                                          r".*pass a writable array"):
        cpu.launch(kernel, 1, 32, x, np.zeros(32, np.float32), 3.0)


# --- 5. races between blocks ---------------------------------------------------------------------------
NEIGHBOURS = r"""
extern "C" __global__ void publish_and_peek(float* board, float* peeked) {
  if (threadIdx.x == 0) {
    board[blockIdx.x] = blockIdx.x + 1.0f;
    peeked[blockIdx.x] = blockIdx.x + 1 < gridDim.x ? board[blockIdx.x + 1] : -1.0f;
  }
}
"""


def test_a_block_reading_what_another_block_writes_is_a_race():
    kernel = cpu.cpu_kernel(NEIGHBOURS, "publish_and_peek")
    board, peeked = np.zeros(4, np.float32), np.zeros(4, np.float32)
    assert cpu.schedule_differences(kernel, 4, 32, board, peeked) == ["peeked"]
    assert not peeked.any()
    for schedule, expected in (("forward", [0, 0, 0, -1]), ("reverse", [2, 3, 4, -1])):
        cpu.launch(kernel, 4, 32, board, peeked, schedule=schedule)
        np.testing.assert_array_equal(peeked, expected)


COUNTERS = {
    # one thread of each block adds to one counter: whatever order the blocks run in, the sum is the
    # same on the CPU runner; on a GPU two blocks read the same old value and one addition is lost
    "between-blocks": (r"""
extern "C" __global__ void count(float* counter) {
  if (threadIdx.x == 0) counter[0] = counter[0] + 1.0f;
}""", 8, 32),
    # every lane of one warp adds: on a GPU the lanes read together, and the warp adds one, not 32
    "inside-a-warp": (r"""
extern "C" __global__ void count(float* counter) {
  counter[0] += 1.0f;
}""", 1, 32),
}


@pytest.mark.parametrize("case", COUNTERS, ids=list(COUNTERS))
def test_a_lost_update_that_no_thread_order_shows_is_a_race(case):
    source, blocks, threads = COUNTERS[case]
    kernel = cpu.cpu_kernel(source, "count")
    assert cpu.schedule_differences(kernel, blocks, threads, np.zeros(1, np.float32)) == ["counter"]
    atomic = cpu.cpu_kernel(source.replace("counter[0] = counter[0] + 1.0f", "atomicAdd(&counter[0], 1.0f)")
                            .replace("counter[0] += 1.0f", "atomicAdd(counter, 1.0f)"), "count")
    counter = np.zeros(1, np.float32)
    assert cpu.schedule_differences(atomic, blocks, threads, counter) == []
    cpu.launch(atomic, blocks, threads, counter)
    assert counter[0] == (blocks if case == "between-blocks" else threads)


def test_a_lost_update_between_warps_of_a_block_is_a_race_and_a_barrier_orders_it():
    racy = cpu.cpu_kernel(r"""
extern "C" __global__ void per_warp(float* counter) {
  if (threadIdx.x % 32 == 0) counter[0] += 1.0f;
}""", "per_warp")
    assert cpu.schedule_differences(racy, 1, 128, np.zeros(1, np.float32)) == ["counter"]
    # one warp adds, __syncthreads(), another warp adds: ordered, so no update is lost
    ordered = cpu.cpu_kernel(r"""
extern "C" __global__ void per_warp(float* counter) {
  if (threadIdx.x == 0) counter[0] += 1.0f;
  __syncthreads();
  if (threadIdx.x == 32) counter[0] += 1.0f;
}""", "per_warp")
    counter = np.zeros(1, np.float32)
    assert cpu.schedule_differences(ordered, 1, 64, counter) == []
    cpu.launch(ordered, 1, 64, counter)
    assert counter[0] == 2


def test_lanes_that_meet_at_syncwarp_between_their_updates_lose_none():
    kernel = cpu.cpu_kernel(r"""
extern "C" __global__ void in_turn(float* total) {
  for (int lane = 0; lane < 32; ++lane) {
    if (threadIdx.x == lane) total[0] += lane;
    __syncwarp();
  }
}""", "in_turn")
    total = np.zeros(1, np.float32)
    assert cpu.schedule_differences(kernel, 1, 32, total) == []
    cpu.launch(kernel, 1, 32, total)
    assert total[0] == sum(range(32))


def test_blocks_that_write_disjoint_parts_and_read_shared_inputs_are_no_race():
    kernel = cpu.cpu_kernel(r"""
extern "C" __global__ void axpy(const float* a, const float* x, float* y, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = a[0] * x[i] + y[i];
}""", "axpy")
    a, x, y = np.array([2.0], np.float32), np.arange(100, dtype=np.float32), np.ones(100, np.float32)
    assert cpu.schedule_differences(kernel, 4, 32, a, x, y, 100) == []
    cpu.launch(kernel, 4, 32, a, x, y, 100)
    np.testing.assert_array_equal(y, 2 * np.arange(100) + 1)

"""ortlab.cuda.cpu: CUDA C++ kernels run on the CPU, checked against numpy.

The kernels are ordinary CUDA C++ (NVRTC compiles the same text, see the last test); results are
compared with numpy on integer-valued float32 data, so every sum is exact in any order.
"""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cuda_sources
import processes

import ortlab.cuda as cuda
from ortlab.cuda import cpu
from ortlab.errors import OrtlabError

GOOD = cuda_sources.block_sum()
RACY = cuda_sources.block_sum("")  # the barrier inside the loop forgotten

TRANSPOSE = r"""
extern "C" __global__ void transpose(const float* a, float* t, int rows, int cols) {
  __shared__ float tile[16][17];
  int c = blockIdx.x * 16 + threadIdx.x, r = blockIdx.y * 16 + threadIdx.y;
  if (r < rows && c < cols) tile[threadIdx.y][threadIdx.x] = a[r * cols + c];
  __syncthreads();
  int tc = blockIdx.y * 16 + threadIdx.x, tr = blockIdx.x * 16 + threadIdx.y;
  if (tr < cols && tc < rows) t[tr * rows + tc] = tile[threadIdx.x][threadIdx.y];
}
"""

HISTOGRAM = r"""
extern "C" __global__ void histogram(const int* values, unsigned int* counts, int n) {
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
    atomicAdd(&counts[values[i]], 1u);
}
"""

REVERSE = r"""
extern "C" __global__ void reverse(float* y) {
  extern __shared__ float s[];
  s[threadIdx.x] = y[threadIdx.x];
  __syncthreads();
  y[threadIdx.x] = s[blockDim.x - 1 - threadIdx.x];
}
"""


@pytest.fixture(scope="module")
def block_sum():
    return cpu.cpu_kernel(GOOD, "block_sum")


def test_block_reduction_matches_numpy_and_the_schedule_does_not_matter(block_sum):
    x = np.arange(1000, dtype=np.float32)
    out = np.zeros(4, np.float32)
    cpu.launch(block_sum, 4, 256, x, out, 1000)
    padded = np.concatenate([x, np.zeros(24, np.float32)])
    np.testing.assert_array_equal(out, padded.reshape(4, 256).sum(axis=1))
    assert cpu.schedule_differences(block_sum, 4, 256, x, out, 1000) == []
    again = np.zeros(4, np.float32)
    cpu.launch(block_sum, 4, 256, x, again, 1000, schedule="reverse")
    np.testing.assert_array_equal(again, out)


def test_a_forgotten_barrier_is_a_race_the_two_schedules_show():
    racy = cpu.cpu_kernel(RACY, "block_sum")
    x = np.arange(512, dtype=np.float32)
    out = np.zeros(2, np.float32)
    assert cpu.schedule_differences(racy, 2, 256, x, out, 512) == ["out"]
    assert not out.any()  # schedule_differences works on copies


def test_an_index_past_a_pointer_parameters_array_stops_the_launch(block_sum):
    x, out = np.arange(1000, dtype=np.float32), np.zeros(4, np.float32)
    with pytest.raises(OrtlabError, match=r"thread \(0, 0, 0\) of block \(4, 0, 0\): out\[4\] is out of bounds "
                                          r"\(out has 4 elements\)"):
        cpu.launch(block_sum, 5, 256, x, out, 1000)


def test_an_index_past_a_shared_array_names_the_source_line():
    source = GOOD.replace("buf[threadIdx.x] += buf[threadIdx.x + s]", "buf[threadIdx.x] += buf[threadIdx.x + 2 * s]")
    line = source.splitlines().index(next(text for text in source.splitlines() if "2 * s" in text)) + 1
    kernel = cpu.cpu_kernel(source, "block_sum")
    # s = 128: thread 0, which runs first, reads buf[0 + 2 * 128] = buf[256] of a float[256]
    with pytest.raises(OrtlabError, match=rf"thread \(0, 0, 0\) of block \(0, 0, 0\): kernel.cu line {line}, "
                                          rf"column \d+: index 256 is out of bounds "
                                          r"for type 'float \[256\]'"):
        cpu.launch(kernel, 1, 256, np.ones(256, np.float32), np.zeros(1, np.float32), 256)


def test_a_thread_that_returns_before_a_barrier_is_reported():
    source = r"""
    extern "C" __global__ void early(float* y, int n) {
      if (threadIdx.x >= n) return;
      __syncthreads();
      y[threadIdx.x] = 1.0f;
    }
    """
    kernel = cpu.cpu_kernel(source, "early")
    with pytest.raises(OrtlabError, match=r"thread 63 returned while thread 0 waits at __syncthreads\(\) number 1"):
        cpu.launch(kernel, 1, 64, np.zeros(64, np.float32), 10)
    y = np.zeros(64, np.float32)
    cpu.launch(kernel, 1, 64, y, 64)  # every thread reaches the barrier: fine
    assert (y == 1).all()


def test_two_dimensional_blocks_transpose_like_numpy():
    kernel = cpu.cpu_kernel(TRANSPOSE, "transpose")
    a = np.arange(40 * 23, dtype=np.float32).reshape(40, 23)
    t = np.zeros((23, 40), np.float32)
    cpu.launch(kernel, (2, 3), (16, 16), a, t, 40, 23)
    np.testing.assert_array_equal(t, a.T)


def test_atomics_build_a_histogram_like_bincount():
    kernel = cpu.cpu_kernel(HISTOGRAM, "histogram")
    values = np.random.default_rng(0).integers(0, 10, size=1000).astype(np.int32)
    counts = np.zeros(10, np.uint32)
    cpu.launch(kernel, 3, 128, values, counts, values.size)
    np.testing.assert_array_equal(counts, np.bincount(values, minlength=10))


def test_dynamic_shared_memory_is_sized_by_the_launch_and_checked():
    kernel = cpu.cpu_kernel(REVERSE, "reverse")
    y = np.arange(64, dtype=np.float32)
    cpu.launch(kernel, 1, 64, y, shared_bytes=64 * 4)
    np.testing.assert_array_equal(y, np.arange(64, dtype=np.float32)[::-1])
    with pytest.raises(OrtlabError, match=r"s\[32\] is out of bounds \(s has 32 elements\)"):
        cpu.launch(kernel, 1, 64, y, shared_bytes=32 * 4)
    for wrong in (10**7, -4, 1.5, True):  # 227 KiB is the most a block may have on any architecture
        with pytest.raises(OrtlabError, match=r"shared_bytes \(dynamic shared memory\) must be .* got"):
            cpu.launch(kernel, 1, 64, y, shared_bytes=wrong)


def test_the_same_source_compiles_for_the_gpu():
    for source in (GOOD, TRANSPOSE, HISTOGRAM, REVERSE):
        assert ".target sm_80" in cuda.compile(source, "sm_80").ptx


@pytest.mark.parametrize("args, message", [
    ((np.zeros(4, np.float64), np.zeros(1, np.float32), 4), "takes float32, got float64"),
    ((np.zeros(4, np.float32), np.zeros(1, np.float32)), "takes 3 arguments, got 2"),
    ((np.zeros(4, np.float32), [0.0], 4), "takes a numpy array, got list"),
    ((np.zeros(4, np.float32), np.zeros(1, np.float32), 2**40), "cannot hold"),
    ((np.zeros(4, np.float32), np.zeros(1, np.float32), 2**70), "cannot hold"),
    ((np.zeros(4, np.float32), np.zeros(1, np.float32), 2.5), "cannot hold"),
    ((np.zeros(4, np.float32), np.zeros(1, np.float32), np.int32(4).reshape(1)), "takes a number"),
    ((np.zeros(8, np.float32)[::2], np.zeros(1, np.float32), 4), "C-contiguous"),
])
def test_bad_arguments(block_sum, args, message):
    with pytest.raises(OrtlabError, match=message):
        cpu.launch(block_sum, 1, 256, *args)


def test_float_scalars_round_but_do_not_overflow():
    kernel = cpu.cpu_kernel(r"""
    extern "C" __global__ void fill(float* y, float v) { y[threadIdx.x] = v; }
    """, "fill")
    y = np.zeros(2, np.float32)
    cpu.launch(kernel, 1, 2, y, 0.1)  # rounded to float32, as CUDA would receive it
    assert (y == np.float32(0.1)).all()
    with pytest.raises(OrtlabError, match="cannot hold 1e\\+40"):
        cpu.launch(kernel, 1, 2, y, 1e40)


def test_a_read_only_array_for_a_written_parameter(block_sum):
    out = np.zeros(1, np.float32)
    out.flags.writeable = False
    with pytest.raises(OrtlabError, match="out .* is written by the kernel but the array is read-only"):
        cpu.launch(block_sum, 1, 256, np.zeros(4, np.float32), out, 4)
    x = np.zeros(4, np.float32)
    x.flags.writeable = False  # a const float* may be read-only
    cpu.launch(block_sum, 1, 256, x, np.zeros(1, np.float32), 4)


@pytest.mark.parametrize("grid, block, message", [
    (1, 1025, "exceeds CUDA's limits"), (1, (32, 32, 2), "at most 1024"), (0, 256, "grid must be a positive int"),
    (1, (0, 1), "block must be"), (1.0, 256, "grid must be"), (1, (1, 1, 1, 1), "block must be"),
    ((1, 70000), 32, "exceeds CUDA's limits"),
])
def test_bad_launch_shapes(block_sum, grid, block, message):
    with pytest.raises(OrtlabError, match=message):
        cpu.launch(block_sum, grid, block, np.zeros(4, np.float32), np.zeros(1, np.float32), 4)


def test_a_declaration_before_the_definition():
    source = r"""
    __global__ void twice(float* y);
    __global__ void twice(float* y) { y[threadIdx.x] *= 2.0f; }
    """
    y = np.arange(8, dtype=np.float32)
    cpu.launch(cpu.cpu_kernel(source, "twice"), 1, 8, y)
    np.testing.assert_array_equal(y, 2 * np.arange(8, dtype=np.float32))


def test_bad_kernels():
    with pytest.raises(OrtlabError, match=r"no __global__ kernel named 'sum'.*\['block_sum'\]"):
        cpu.cpu_kernel(GOOD, "sum")
    with pytest.raises(OrtlabError, match="one-level pointers"):
        cpu.cpu_kernel('extern "C" __global__ void f(float** p) { }', "f")
    with pytest.raises(OrtlabError, match="one-level pointers"):
        cpu.cpu_kernel('extern "C" __global__ void f(float2* p) { }', "f")
    with pytest.raises(OrtlabError, match="g\\+\\+ could not compile the kernel"):
        cpu.cpu_kernel('extern "C" __global__ void f(float* p) { p[0] = undefined_name; }', "f")
    with pytest.raises(OrtlabError, match="takes a CpuKernel"):
        cpu.launch(GOOD, 1, 256)
    with pytest.raises(OrtlabError, match="schedule must be"):
        cpu.launch(cpu.cpu_kernel(REVERSE, "reverse"), 1, 4, np.zeros(4, np.float32), schedule="random")


def test_a_kernel_that_never_returns_is_stopped_after_the_timeout():
    kernel = cpu.cpu_kernel(r"""
    extern "C" __global__ void spin(float* y) { y[threadIdx.x] = 1.0f; while (true) {} }
    """, "spin")
    y = np.zeros(4, np.float32)
    with pytest.raises(OrtlabError, match=r"kernel spin did not finish within 0.5 s and was stopped"):
        cpu.launch(kernel, 1, 4, y, timeout=0.5)
    assert not y.any()  # a stopped launch writes nothing back
    with pytest.raises(OrtlabError, match="timeout must be a number of seconds"):
        cpu.launch(kernel, 1, 4, y, timeout=0)


def test_a_kernel_that_crashes_the_runner_is_an_error_not_a_crash():
    # 400 KB of locals in one thread: past the 128 KiB stack the runner gives each thread
    kernel = cpu.cpu_kernel(r"""
    extern "C" __global__ void deep(float* y) {
      float a[100000];
      for (int i = 0; i < 100000; ++i) a[i] = i;
      y[0] = a[99999];
    }
    """, "deep")
    with pytest.raises(OrtlabError, match=r"kernel deep crashed the CPU runner's worker process \(SIG"):
        cpu.launch(kernel, 1, 1, np.zeros(1, np.float32))


def test_without_a_timeout_the_launch_runs_in_this_process(block_sum):
    x, out = np.arange(512, dtype=np.float32), np.zeros(2, np.float32)
    cpu.launch(block_sum, 2, 256, x, out, 512, timeout=None)
    np.testing.assert_array_equal(out, x.reshape(2, 256).sum(axis=1))


# Warp operations. Expected values follow the CUDA C++ Programming Guide's definitions (section
# "Warp Shuffle Functions"), written here in numpy: lanes in groups of `width`; shfl reads lane
# srcLane modulo width of the group; up/down read lane -/+ delta and keep their own value past the
# group's edge; xor reads lane ^ laneMask and keeps its own value when that lies in a later group.
LANES = r"""
extern "C" __global__ void lanes(const int* x, int* down, int* up, int* xr, int* idx, unsigned* bal, int width) {
  int t = threadIdx.x;
  int v = x[t];
  down[t] = __shfl_down_sync(0xffffffff, v, 3, width);
  up[t] = __shfl_up_sync(0xffffffff, v, 2, width);
  xr[t] = __shfl_xor_sync(0xffffffff, v, 5, width);
  idx[t] = __shfl_sync(0xffffffff, v, 7, width);
  bal[t] = __ballot_sync(0xffffffff, v % 3 == 0);
}
"""


def guide_shuffles(x, width):
    lane = np.arange(x.size) % 32
    warp = np.arange(x.size) // 32 * 32
    group = lane // width * width
    down = np.where(lane - group + 3 < width, lane + 3, lane)
    up = np.where(lane - group >= 2, lane - 2, lane)
    xr = np.where((lane ^ 5) >= group + width, lane, lane ^ 5)
    idx = group + 7 % width
    bits = (x % 3 == 0).reshape(-1, 32) * (1 << np.arange(32, dtype=np.uint64))
    ballot = np.repeat(bits.sum(axis=1), 32).astype(np.uint32)
    return [x[warp + down], x[warp + up], x[warp + xr], x[warp + idx], ballot]


@pytest.mark.parametrize("width", [32, 8, 4, 1])
def test_warp_shuffles_follow_the_programming_guide(width):
    kernel = cpu.cpu_kernel(LANES, "lanes")
    x = np.random.default_rng(width).integers(-1000, 1000, size=64).astype(np.int32)
    outs = [np.zeros(64, np.int32) for _ in range(4)] + [np.zeros(64, np.uint32)]
    cpu.launch(kernel, 1, 64, x, *outs, width)
    for got, expected in zip(outs, guide_shuffles(x, width)):
        np.testing.assert_array_equal(got, expected)


# A block sum the way ORT's CUDA reductions do it: a warp reduction by __shfl_xor_sync, one
# partial per warp in shared memory, then the first warp reduces the partials.
WARP_SUM = r"""
extern "C" __global__ void warp_sum(const float* x, float* out, int n) {
  __shared__ float partial[32];
  float v = 0.0f;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[blockIdx.x * n + i];
  for (int offset = 16; offset > 0; offset /= 2) v += __shfl_xor_sync(0xffffffff, v, offset);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.0f;
    for (int offset = 16; offset > 0; offset /= 2) v += __shfl_down_sync(0xffffffff, v, offset);
    if (threadIdx.x == 0) out[blockIdx.x] = v;
  }
}
"""


def test_a_warp_shuffle_reduction_matches_numpy_in_both_schedules():
    kernel = cpu.cpu_kernel(WARP_SUM, "warp_sum")
    x = np.random.default_rng(0).integers(-50, 50, size=(3, 1000)).astype(np.float32)  # exact sums
    out = np.zeros(3, np.float32)
    cpu.launch(kernel, 3, 128, x, out, 1000)
    np.testing.assert_array_equal(out, x.sum(axis=1))
    assert cpu.schedule_differences(kernel, 3, 128, x, out, 1000) == []
    ptx = cuda.compile(WARP_SUM, "sm_80").ptx
    assert "shfl.sync.bfly" in ptx and "shfl.sync.down" in ptx


@pytest.mark.parametrize("body, block, message", [
    ("if (threadIdx.x < 16) y[threadIdx.x] = __shfl_xor_sync(0xffffffff, 1.0f, 1);", 32,
     r"waits at __shfl_xor_sync while thread 31 of its warp has returned"),
    ("y[threadIdx.x] = __shfl_xor_sync(0x0000ffff, 1.0f, 1);", 32, r"mask 0x0000ffff, which leaves out lanes"),
    ("y[threadIdx.x] = __shfl_xor_sync(0xffffffff, 1.0f, 16);", 48,
     r"thread \(32, 0, 0\) .*lane 0 reads lane 16, which is not a thread of this block"),
    ("y[threadIdx.x] = threadIdx.x % 2 ? __shfl_xor_sync(0xffffffff, 1.0f, 1) : "
     "__shfl_down_sync(0xffffffff, 1.0f, 1);", 32, r"a warp's threads must meet at the same operation"),
    ("y[threadIdx.x] = __shfl_down_sync(0xffffffff, 1.0f, 1, 12);", 32, r"width 12: width must be a power of 2"),
])
def test_warp_operations_the_runner_does_not_model_are_refused(body, block, message):
    kernel = cpu.cpu_kernel(f'extern "C" __global__ void w(float* y) {{ {body} }}', "w")
    with pytest.raises(OrtlabError, match=message):
        cpu.launch(kernel, 1, block, np.zeros(block, np.float32))


def test_printf_in_a_kernel_reaches_stdout_from_the_worker_process():
    # a process of its own: the worker writes to the stdout its parent had when it was forked
    script = textwrap.dedent(r"""
        import numpy as np
        from ortlab.cuda import cpu
        kernel = cpu.cpu_kernel(
            'extern "C" __global__ void hello(int* y) '
            '{ if (threadIdx.x == 1) printf("hello from thread %d\\n", threadIdx.x); }',
            "hello")
        cpu.launch(kernel, 1, 2, np.zeros(1, np.int32))
        print("done", flush=True)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "hello from thread 1\ndone\n"


def test_cpu_kernels_builds_several_kernels_of_one_source_once():
    source = TRANSPOSE + HISTOGRAM
    built = cpu.cpu_kernels(source, ["transpose", "histogram"])
    assert built["transpose"].library is built["histogram"].library
    a = np.arange(20 * 18, dtype=np.float32).reshape(20, 18)
    t = np.zeros((18, 20), np.float32)
    cpu.launch(built["transpose"], (2, 2), (16, 16), a, t, 20, 18)
    np.testing.assert_array_equal(t, a.T)
    values, counts = np.array([1, 1, 3], np.int32), np.zeros(4, np.uint32)
    cpu.launch(built["histogram"], 1, 32, values, counts, 3)
    np.testing.assert_array_equal(counts, [0, 2, 0, 1])
    with pytest.raises(OrtlabError, match="list of kernel names"):
        cpu.cpu_kernels(source, "transpose")
    with pytest.raises(OrtlabError, match="at least one kernel name"):
        cpu.cpu_kernels(source, [])
    with pytest.raises(OrtlabError, match="no __global__ kernel named 'scan'"):
        cpu.cpu_kernels(source, ["transpose", "scan"])


def test_after_a_stopped_launch_the_next_one_runs_in_a_fresh_worker(block_sum):
    spin = cpu.cpu_kernel(r"""
    extern "C" __global__ void spin(float* y) { while (true) {} }
    """, "spin")
    with pytest.raises(OrtlabError, match="did not finish within 0.2 s"):
        cpu.launch(spin, 1, 1, np.zeros(1, np.float32), timeout=0.2)
    x, out = np.arange(512, dtype=np.float32), np.zeros(2, np.float32)
    cpu.launch(block_sum, 2, 256, x, out, 512)
    np.testing.assert_array_equal(out, x.reshape(2, 256).sum(axis=1))


def test_an_interrupt_while_a_kernel_spins_stops_the_worker_too():
    # Ctrl-C in a notebook while `while (true) {}` runs: the worker must not keep spinning
    script = textwrap.dedent(r"""
        import os, signal, threading
        import numpy as np
        from ortlab.cuda import cpu
        spin = cpu.cpu_kernel('extern "C" __global__ void spin(float* y) { while (true) {} }', "spin")
        signal.signal(signal.SIGINT, signal.default_int_handler)  # as a notebook's kernel has it, even when
        # this process was started with SIGINT ignored (a job sent to the background)
        main = threading.main_thread().ident  # Ctrl-C reaches the main thread, which waits on the worker
        threading.Timer(0.5, lambda: signal.pthread_kill(main, signal.SIGINT)).start()
        try:
            cpu.launch(spin, 1, 1, np.zeros(1, np.float32), timeout=60)
        except KeyboardInterrupt:
            pass
        try:
            os.waitpid(-1, os.WNOHANG)
            print("a child is left")
        except ChildProcessError:
            print("no child left")
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "no child left"


def test_stop_worker_leaves_no_child_process(block_sum):
    x, out = np.arange(256, dtype=np.float32), np.zeros(1, np.float32)
    cpu.launch(block_sum, 1, 256, x, out, 256)  # a timed launch: runs in the worker
    assert cpu._WORKER is not None and cpu._WORKER.alive()
    worker = cpu._WORKER.pid
    cpu.stop_worker()
    with pytest.raises(ChildProcessError):  # reaped: the worker is not even a zombie
        os.waitpid(worker, os.WNOHANG)
    assert worker not in processes.children()  # (another test's leftover child is not looked at)
    cpu.launch(block_sum, 1, 256, x, out, 256)  # the next launch starts a new one
    assert out[0] == x.sum()

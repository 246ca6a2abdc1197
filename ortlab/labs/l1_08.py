"""Exercises of the walkthrough L1_08_cuda_cpp: the host code that overlaps copies with kernels (the runtime
API's streams and events, on ortlab.cuda.runtime's model), and a block reduction with two bugs to find and fix
(run on the CPU runner).

'overlap': the learner's function drives a `RecordingDevice` (runtime.Device, every copy and launch logged with
the buffers it touched), made here in the learner's process; the log comes back as data and
ortlab.labs.judges.l1_08 checks it: each chunk's copy in, kernel and copy out in that order in time, the host
back only when the results are there, and the copies overlapping the kernels. 'row_sum_fix': the learner's
function returns CUDA C++ text; the judge compiles it with NVRTC + ptxas, builds and launches it on the CPU
runner in a process of its own (ortlab.labs.cpu_runner, as lab10 does) in both thread orders, and compares with
ORT's ReduceSum. The reference answers are in solutions/walkthroughs/L1_08_cuda_cpp.py, outside the package.
"""
import numpy as np

from ortlab.cuda.runtime import Device
from ortlab.labs.checks import judge
from ortlab.labs.remote import learner, probe

# --- 'overlap': four chunks through the GPU, on the runtime model --------------------------------------------
CHUNKS = 4
COPY_IN, KERNEL, COPY_OUT = 2.0, 3.0, 1.0  # model ms
TARGET = 14.0                              # all done by then (two streams, chunk by chunk, reach it)
MIB = 1 << 20


class RecordingDevice(Device):
    """runtime.Device that also logs each copy and kernel launch: {"call", "name", "stream", "dst", "src",
    "duration", "start", "end"} (dst / src: the pointers' indices; None for a kernel)."""

    def __init__(self):
        super().__init__()
        self.calls = []

    def _log(self, call, name, stream, dst, src, duration, end):
        lane = self._stream(stream).name if call != "cudaMemcpy" else self.streams[0].name
        self.calls.append({"call": call, "name": name, "stream": lane, "dst": dst, "src": src,
                           "duration": float(duration), "start": float(end) - float(duration), "end": float(end)})

    def memcpy(self, dst, src, duration):
        end = super().memcpy(dst, src, duration)
        if end is not None:
            self._log("cudaMemcpy", "", None, dst.index, src.index, duration, end)
        return end

    def memcpy_async(self, dst, src, duration, stream=None):
        end = super().memcpy_async(dst, src, duration, stream)
        if end is not None:
            self._log("cudaMemcpyAsync", "", stream, dst.index, src.index, duration, end)
        return end

    def launch(self, name, duration, stream=None, args=()):
        end = super().launch(name, duration, stream, args)
        self._log("launch", str(name), stream, None, None, duration, end)
        return end


def overlap_setup():
    """(device, host_in, buffers, host_out): a fresh RecordingDevice, CHUNKS pinned input buffers, CHUNKS
    device buffers and CHUNKS pinned output buffers (1 MiB each)."""
    device = RecordingDevice()
    host_in = [device.malloc_host(MIB) for _ in range(CHUNKS)]
    buffers = [device.malloc(MIB) for _ in range(CHUNKS)]
    host_out = [device.malloc_host(MIB) for _ in range(CHUNKS)]
    return device, host_in, buffers, host_out


@probe
def pipeline_log(fn):
    """The learner's fn(device, host_in, buffers, host_out) on overlap_setup(): {"calls": the device's log,
    "returned_at": the host's time when fn returned, "pointers": {"host_in", "buffers", "host_out": indices}}."""
    device, host_in, buffers, host_out = overlap_setup()
    fn(device, list(host_in), list(buffers), list(host_out))
    return {"calls": device.calls, "returned_at": float(device.host_now),
            "pointers": {"host_in": [p.index for p in host_in], "buffers": [p.index for p in buffers],
                         "host_out": [p.index for p in host_out]}}


def check_overlap(fn):
    """Exercise 'overlap': fn(device, host_in, buffers, host_out) streams CHUNKS chunks through the device (copy
    in, kernel f"kernel {i}", copy out), checked on the runtime model's timeline."""
    judge("overlap", "l1_08.overlap", learner(fn))


# --- 'row_sum_fix': a block reduction with two bugs ----------------------------------------------------------
ROW_SUM = ("row_sum", (("x", "const float", True), ("out", "float", True), ("cols", "int", False)))
BUGGY_ROW_SUM = r"""
extern "C" __global__ void row_sum(const float* x, float* out, int cols) {
  __shared__ float partial[256];          // one slot per thread (the checks launch at most 256)
  int row = blockIdx.x, t = threadIdx.x;  // one block per row
  float s = 0.0f;
  for (int c = t; c < cols; c += blockDim.x) s += x[row * cols + c];
  partial[t] = s;
  for (int k = blockDim.x / 2; k > 0; k /= 2) {  // the tree: half the threads add the other half's slots
    if (t < k) {
      partial[t] += partial[t + k];
      __syncthreads();
    }
  }
  if (t == 0) out[row] = partial[0];
}
"""
SEEN_ROWS = ((4, 300, 128),)  # (rows, cols, threads per block): the notebook launches this one
HIDDEN_ROWS = ((3, 1000, 256), (5, 7, 64), (2, 64, 32), (1, 513, 128))


def row_sum_input(rows, cols, seed=0):
    """x (rows, cols) float32, normal around 1 (so that a row's sum is far from 0)."""
    return (np.random.default_rng(seed).standard_normal((rows, cols)) + 1).astype(np.float32)


def check_row_sum_fix(source_fn):
    """Exercise 'row_sum_fix': source_fn() returns BUGGY_ROW_SUM fixed, checked on the CPU runner (both thread
    orders) against ORT's ReduceSum over each row."""
    judge("row_sum_fix", "l1_08.row_sum_fix", learner(source_fn))

"""Helpers of notebook L1_08 (CUDA C++, the way ORT's kernels are written): each returns plain rows
or a `runtime.Device` whose timeline the notebook draws. The machinery lives in ortlab.cuda
(compile, occupancy, the CPU runner, runtime.py, precision.py, instructions.py)."""
import contextlib
import ctypes
import os
import tempfile
import time

import numpy as np

from ortlab import cuda
from ortlab.cuda import kernels, precision
from ortlab.cuda.runtime import Device
from ortlab.errors import OrtlabError
from ortlab.memory.caching_allocator import CachingAllocator

GENERATIONS = ("sm_60", "sm_70", "sm_80", "sm_90")
MIB = 1 << 20


# ---- 1. hardware ---------------------------------------------------------------------------------
def registers_by_arch(source="layer_norm", archs=GENERATIONS):
    """One row per kernel of a registered ORT-style source: ptxas's registers per thread for each arch."""
    results = {arch: cuda.compile(kernels.source(source), arch) for arch in archs}
    return [{"kernel": name, **{arch: results[arch].kernel(name).registers for arch in archs}}
            for name in kernels.SOURCES[source].kernels]


def first_compile_error(source, arch, options=()):
    """The first error NVRTC reports for `source` on `arch` ("" when it compiles)."""
    try:
        cuda.compile(source, arch, options)
    except cuda.CudaCompileError as error:
        return str(error).split("; ")[0]
    return ""


def rounding_rows(values):
    """Each fp32 value beside its TF32 and BF16 roundings (round to nearest, ties to even)."""
    x = np.asarray(values, dtype=np.float32)
    tf32, bf16 = precision.round_tf32(x), precision.round_bf16(x)
    return [{"fp32": f"{a:.9g}", "bits": f"{a.view(np.uint32):032b}", "TF32": f"{t:.9g}", "BF16": f"{b:.9g}"}
            for a, t, b in zip(x, tf32, bf16)]


def matmul_accuracy(m=256, k=1024, n=256, seed=0):
    """Rows of matmul_errors for random normal inputs (M, K) @ (K, N)."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    return [{"inputs": name, "mantissa bits": bits, "max |C - C64| / max |C64|": f"{error:.1e}"}
            for (name, error), bits in zip(precision.matmul_errors(a, b).items(), (23, 10, 7, 10))]


def tf32_matmul(a, b):
    """(C, path) for C = a @ b with TF32 Tensor Core math: on a GPU, torch with allow_tf32; without
    one, the CPU path rounds the inputs as `__float_to_tf32` does (ties away) and sums in float64."""
    import torch  # heavy: torch
    if torch.cuda.is_available():
        previous = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            c = (torch.from_numpy(a).cuda() @ torch.from_numpy(b).cuda()).cpu().numpy()
        finally:
            torch.backends.cuda.matmul.allow_tf32 = previous
        return c, f"GPU: {torch.cuda.get_device_name()} (torch, allow_tf32=True)"
    ra, rb = precision.round_tf32(a, ties="away"), precision.round_tf32(b, ties="away")
    return (ra.astype(np.float64) @ rb.astype(np.float64)).astype(np.float32), "CPU path: TF32 rounding modelled"


# ---- 2. programming model on the CPU runner ------------------------------------------------------
WHERE_AM_I = r"""
extern "C" __global__ void where_am_i(int* block, int* thread, int* warp, int* lane, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  block[i] = blockIdx.x; thread[i] = threadIdx.x; warp[i] = threadIdx.x / warpSize; lane[i] = threadIdx.x % warpSize;
}
"""


def where_am_i(n, grid, block, every=1):
    """Which block, thread, warp and lane computed each element i (every `every`-th row)."""
    out = [np.full(n, -1, np.int32) for _ in range(4)]
    cuda.launch(cuda.cpu_kernel(WHERE_AM_I, "where_am_i"), grid, block, *out, n)
    return [{"i": i, "blockIdx.x": int(out[0][i]), "threadIdx.x": int(out[1][i]), "warp": int(out[2][i]),
             "lane": int(out[3][i])} for i in range(0, n, every)]


def layer_norm_vs_ort(rows=8, cols=300, seed=0):
    """ORT-style layer_norm.cu run on the CPU runner against ORT's LayerNormalization: max |difference|."""
    from ortlab.session import run_node  # lazy: ortlab.session imports onnxruntime (2 s)
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((rows, cols)) * 3 + 5).astype(np.float32)
    scale, bias = rng.standard_normal(cols).astype(np.float32), rng.standard_normal(cols).astype(np.float32)
    y, mean, inv_std = np.zeros_like(x), np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    kernel = cuda.cpu_kernels(kernels.source("layer_norm"), ["layer_norm"])["layer_norm"]
    cuda.launch(kernel, 4, 128, x, scale, bias, y, mean, inv_std, rows, cols, 1e-5)
    ort_y = run_node("LayerNormalization", [x, scale, bias], {"axis": -1, "epsilon": 1e-5})[0]
    return float(np.abs(y - ort_y).max())


# ---- 3. the runtime API on the model -------------------------------------------------------------
def allocation_step(device, allocate, release, layers=4, kernel=1.0, launch_cost=0.3):
    """One training step: forward allocates an activation per layer and launches its kernel, backward
    launches a kernel per layer and frees the activation; the host spends `launch_cost` per launch."""
    held = []
    for layer in range(layers):
        held.append(allocate(device, (layer + 1) * 3 * MIB))
        device.host_work(launch_cost, "launch")
        device.launch(f"fwd{layer}", kernel)
    for layer in reversed(range(layers)):
        device.host_work(launch_cost, "launch")
        device.launch(f"bwd{layer}", kernel)
        release(device, held.pop())


def allocator_comparison(steps=3):
    """(device with cudaMalloc/cudaFree per tensor, device behind PyTorch's caching allocator, rows):
    the caching allocator (ortlab.memory.caching_allocator) calls cudaMalloc only when no cached
    block fits, and never cudaFree during training."""
    raw = Device()
    for _ in range(steps):
        allocation_step(raw, lambda d, size: d.malloc(size), lambda d, p: d.free(p))
    cached, allocator = Device(), CachingAllocator()

    def allocate(device, size):
        before = allocator.memory_stats()["segment.all.allocated"]
        address = allocator.malloc(size)
        if allocator.memory_stats()["segment.all.allocated"] > before:
            device.malloc(size)   # a new segment: the one real cudaMalloc
        return address

    for _ in range(steps):
        allocation_step(cached, allocate, lambda d, address: allocator.free(address))
    raw.device_synchronize()
    cached.device_synchronize()
    rows = [{**summary(name, d), **{call: len([i for i in d.lane("host") if i.name == call])
                                    for call in ("cudaMalloc", "cudaFree")}}
            for name, d in (("cudaMalloc/cudaFree per tensor", raw), ("caching allocator", cached))]
    return raw, cached, rows


def summary(name, device):
    """A row: how often and how long the host was blocked, how long the GPU was idle, when all was done."""
    end = max([device.host_now] + [i.end for i in device.intervals])
    busy = _union([(i.start, i.end) for i in device.intervals if i.lane != "host"])
    return {"case": name, "host blocked (times)": len(device.host_blocked()), "host blocked (model ms)": round(
        sum(i.end - i.start for i in device.host_blocked()), 3), "GPU idle (model ms)": round(end - busy, 3),
        "all done at (model ms)": round(end, 3)}


def _union(spans):
    total, reach = 0.0, -np.inf
    for start, end in sorted(spans):
        if end > reach:
            total += end - max(start, reach)
            reach = end
    return total


def copy_pipeline(kind, chunks=3, prepare=1.5, copy=2.0, kernel=3.0):
    """The host prepares chunk i, copies it to the device and launches kernel i on it, streams
    alternating. kind: "cudaMemcpy", "cudaMemcpyAsync pageable" or "cudaMemcpyAsync pinned"."""
    if kind not in ("cudaMemcpy", "cudaMemcpyAsync pageable", "cudaMemcpyAsync pinned"):
        raise OrtlabError(f"unknown copy kind {kind!r}")
    device = Device()
    streams = [device.create_stream("A"), device.create_stream("B")]
    host = device.malloc_host(MIB) if kind.endswith("pinned") else device.host_malloc(MIB)
    buffers = [device.malloc(MIB) for _ in range(chunks)]
    for i in range(chunks):
        stream = streams[i % 2]
        device.host_work(prepare, f"prepare {i}")
        if kind == "cudaMemcpy":
            device.memcpy(buffers[i], host, copy)
        else:
            device.memcpy_async(buffers[i], host, copy, stream)
        device.launch(f"kernel{i}", kernel, stream, args=(buffers[i],))
    device.device_synchronize()
    return device


def memset_case(asynchronous):
    """A long kernel on stream A; a buffer for stream B's kernel is zeroed by cudaMemset (legacy default
    stream) or cudaMemsetAsync(B)."""
    device = Device()
    a, b = device.create_stream("A"), device.create_stream("B")
    x = device.malloc(MIB)
    device.launch("long kernel", 8, a)
    if asynchronous:
        device.memset_async(x, 1, b)
    else:
        device.memset(x, 1)
    device.launch("uses x", 2, b, args=(x,))
    device.device_synchronize()
    return device


def sync_case(whole_device):
    """Stream A computes what the host needs (2 ms), stream B runs a long kernel (9 ms); the host then
    prepares the next batch (3 ms). cudaStreamSynchronize(A) or cudaDeviceSynchronize."""
    device = Device()
    a, b = device.create_stream("A"), device.create_stream("B")
    device.launch("needed by host", 2, a)
    device.launch("long kernel", 9, b)
    device.device_synchronize() if whole_device else device.stream_synchronize(a)
    device.host_work(3, "next batch")
    return device


def event_case(wait):
    """A producer on stream A, a consumer on stream B; with `wait`, B waits for A's event
    (cudaEventRecord + cudaStreamWaitEvent); without it, the consumer may read before the producer wrote."""
    device = Device()
    a, b = device.create_stream("A"), device.create_stream("B")
    produced = device.create_event("produced")
    device.launch("producer", 4, a)
    device.event_record(produced, a)
    device.launch("more A work", 3, a)
    if wait:
        device.stream_wait_event(b, produced)
    device.launch("consumer", 2, b)
    device.device_synchronize()
    return device


def timed_with_events():
    """cudaEventRecord around two kernels, cudaEventSynchronize, cudaEventElapsedTime."""
    device = Device()
    s = device.create_stream("S")
    start, stop = device.create_event("start"), device.create_event("stop")
    device.launch("earlier", 1.5, s)
    device.event_record(start, s)
    device.launch("k1", 2.25, s)
    device.launch("k2", 0.5, s)
    device.event_record(stop, s)
    device.event_synchronize(stop)
    return device, device.event_elapsed_time(start, stop)


def loss_every_step(sync_each_step, steps=4, launch_cost=0.5, kernel=2.0):
    """A training loop that reads the loss (`loss.item()`: a D2H cudaMemcpy that waits) every step, or
    only at the end."""
    device = Device()
    host, loss = device.host_malloc(4), device.malloc(4)
    for step in range(steps):
        for part in ("fwd", "bwd", "opt"):
            device.host_work(launch_cost, "launch")
            device.launch(f"{part}{step}", kernel)
        if sync_each_step:
            device.memcpy(host, loss, 0.1)
    device.memcpy(host, loss, 0.1)
    return device


def launch_blocking_case(blocking):
    """Two streams, two kernels each, with and without CUDA_LAUNCH_BLOCKING=1."""
    device = Device(launch_blocking=blocking)
    a, b = device.create_stream("A"), device.create_stream("B")
    for k in range(2):
        device.launch(f"a{k}", 3, a)
        device.launch(f"b{k}", 2, b)
    device.device_synchronize()
    return device


# ---- 4. preprocessing on the CPU -----------------------------------------------------------------
def _collate(samples):
    """Pad variable-length token lists to the longest and build the attention mask (on the CPU)."""
    import torch  # heavy: torch
    longest = max(len(s) for s in samples)
    ids = torch.zeros(len(samples), longest, dtype=torch.int64)
    for row, sample in enumerate(samples):
        ids[row, :len(sample)] = torch.as_tensor(sample)
    total = 0
    for sample in samples:         # stands in for tokenization: pure Python work per token
        for token in sample:
            total = (total * 31 + token) % 1000003
    return ids, ids != 0, total


class _Texts:
    def __init__(self, count, seed):
        rng = np.random.default_rng(seed)
        self.samples = [rng.integers(1, 30000, int(rng.integers(2000, 8000))).tolist() for _ in range(count)]

    def __len__(self):
        return len(self.samples)

    def __getitem__(self, index):
        return self.samples[index]


def collation(num_workers, count=256, batch=16, seed=0):
    """(seconds, batches) for one pass of a DataLoader with `num_workers` worker processes collating."""
    import torch  # heavy: torch
    loader = torch.utils.data.DataLoader(_Texts(count, seed), batch_size=batch, collate_fn=_collate,
                                         num_workers=num_workers)
    start = time.perf_counter()
    batches = list(loader)
    return time.perf_counter() - start, batches


def same_batches(first, second):
    """True when two passes gave the same batches in the same order."""
    return len(first) == len(second) and all(
        torch_equal(a[0], b[0]) and a[2] == b[2] for a, b in zip(first, second))


def torch_equal(a, b):
    return a.shape == b.shape and bool((a == b).all())


# ---- 5. debugging --------------------------------------------------------------------------------
def printf_output(source, name, grid, block, *args):
    """What a kernel's printf writes, run in this process on the CPU runner, read back from stdout's
    file descriptor (a notebook shows Python's output, not the C library's)."""
    kernel = cuda.cpu_kernel(source, name)
    libc = ctypes.CDLL(None)
    with tempfile.TemporaryFile(mode="w+b") as captured, _stdout_to(captured.fileno(), libc):
        cuda.launch(kernel, grid, block, *args, timeout=None)
        libc.fflush(None)
        captured.flush()
        captured.seek(0)
        return captured.read().decode()


@contextlib.contextmanager
def _stdout_to(fd, libc):
    libc.fflush(None)
    saved = os.dup(1)
    os.dup2(fd, 1)
    try:
        yield
    finally:
        libc.fflush(None)
        os.dup2(saved, 1)
        os.close(saved)


def launch_error(source, name, grid, block, *args, **options):
    """The OrtlabError message a CPU-runner launch ends with ("" when it succeeds)."""
    try:
        cuda.launch(cuda.cpu_kernel(source, name), grid, block, *args, **options)
    except OrtlabError as error:
        return str(error)
    return ""


def occupancy_rows(source="layer_norm", kernel="layer_norm", arch="sm_80", block_sizes=(64, 128, 256, 512, 1024),
                   dynamic_shared=0):
    """Occupancy of one ORT-style kernel for several block sizes (and `dynamic_shared` bytes per block)."""
    resources = cuda.compile(kernels.source(source), arch).kernel(kernel)
    rows = []
    for size in block_sizes:
        o = cuda.occupancy(resources, size, dynamic_shared=dynamic_shared)
        rows.append({"block": size, "registers": resources.registers, "dynamic shared (B)": dynamic_shared,
                     "blocks/SM": o.blocks_per_sm,
                     "warps/SM": f"{o.warps_per_sm}/{o.max_warps_per_sm}", "occupancy": f"{o.occupancy:.0%}",
                     "limited by": ", ".join(o.limited_by)})
    return rows

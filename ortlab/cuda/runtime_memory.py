"""The memory calls of `runtime.Device`: cudaMalloc / cudaMallocHost / cudaFree, cudaMemcpy(Async),
cudaMemset(Async), with the host-synchronization rules of the CUDA Runtime API reference ("API
synchronization behavior") and the CUDA C++ Programming Guide ("Implicit Synchronization", "Stream
Ordered Memory Allocator"). A mixin: the timeline itself (streams, `_enqueue`, `_block_host`) is
runtime.Device's; see runtime.py's docstring for what is and is not modelled.
"""
from dataclasses import dataclass

from ortlab.errors import OrtlabError


@dataclass(frozen=True)
class Pointer:
    """An allocation: kind is "device" (cudaMalloc), "pinned" (cudaMallocHost) or "pageable" (malloc)."""

    index: int
    kind: str
    size: int


class MemoryCalls:
    """Allocation, copies and memsets of one Device (mixed into runtime.Device)."""

    def _pointer(self, pointer, what):
        if not isinstance(pointer, Pointer) or pointer.index >= len(self._pointers) \
                or self._pointers[pointer.index] is not pointer:
            raise OrtlabError(f"{what}: {pointer!r} is not a pointer of this Device; allocate with "
                              "malloc(), malloc_host() or host_malloc()")
        if pointer.index in self._freed:
            raise OrtlabError(f"{what}: pointer #{pointer.index} ({pointer.kind}) was already freed; on a GPU "
                              "this is a use-after-free (cudaErrorIllegalAddress or silent corruption): "
                              "allocate a new buffer, or free it only after its last use")
        return pointer

    def _allocate(self, kind, size):
        if isinstance(size, bool) or not isinstance(size, int) or size <= 0:
            raise OrtlabError(f"size must be a positive int (bytes), got {size!r}")
        pointer = Pointer(len(self._pointers), kind, size)
        self._pointers.append(pointer)
        return pointer

    def malloc(self, size, duration=0.0):
        """cudaMalloc: the GPU synchronizes across all streams, so the host waits for every queued
        piece of work before the allocation (Programming Guide, "Stream Ordered Memory Allocator" and
        "Implicit Synchronization": a device memory allocation). A caching allocator (PyTorch's, ORT's
        BFCArena) calls it rarely for this reason."""
        duration = self._duration(duration, "malloc")
        self._block_host(self._device_idle(), "cudaMalloc")
        self.host_work(duration, "cudaMalloc")
        return self._allocate("device", size)

    def malloc_host(self, size, duration=0.0):
        """cudaMallocHost: page-locked (pinned) host memory; like cudaMalloc, an implicit device-wide
        synchronization (Programming Guide, "Implicit Synchronization": a page-locked host memory allocation)."""
        duration = self._duration(duration, "malloc_host")
        self._block_host(self._device_idle(), "cudaMallocHost")
        self.host_work(duration, "cudaMallocHost")
        return self._allocate("pinned", size)

    def host_malloc(self, size):
        """malloc / new / a numpy array: pageable host memory; no CUDA call, no synchronization."""
        return self._allocate("pageable", size)

    def free(self, pointer, duration=0.0):
        """cudaFree (cudaFreeHost for pinned memory): the host waits until the device is idle
        (Programming Guide, "Stream Ordered Memory Allocator": cudaMalloc and cudaFree synchronize
        across all executing streams). Freeing twice is an error here."""
        duration = self._duration(duration, "free")
        pointer = self._pointer(pointer, "free")
        if pointer.kind == "pageable":
            raise OrtlabError("free: this pointer is pageable host memory (host_malloc); cudaFree takes device "
                              "memory and cudaFreeHost pinned memory; let Python free host arrays")
        call = "cudaFree" if pointer.kind == "device" else "cudaFreeHost"
        self._block_host(self._device_idle(), call)
        self.host_work(duration, call)
        self._freed.add(pointer.index)

    def _direction(self, dst, src, what):
        dst, src = self._pointer(dst, what), self._pointer(src, what)
        side = {"device": "D", "pinned": "H", "pageable": "H"}
        direction = f"{side[src.kind]}2{side[dst.kind]}"
        pageable = "pageable" in (dst.kind, src.kind) and direction != "H2H"
        return direction, pageable

    def memcpy(self, dst, src, duration):
        """cudaMemcpy: issued to the legacy default stream. To or from host memory the host waits
        for the copy (Runtime API, "API synchronization behavior": pageable H2D returns once staged,
        pinned H2D and any D2H return when done); device to device it does not; host to host is a host copy."""
        duration = self._duration(duration, "memcpy")
        direction, _ = self._direction(dst, src, "memcpy")
        if direction == "H2H":
            return self.host_work(duration, "cudaMemcpy H2H")
        end = self._enqueue(self.streams[0], f"cudaMemcpy {direction}", duration,
                            None if direction == "D2D" else direction)
        if direction != "D2D":
            self._block_host(end, f"cudaMemcpy {direction}")
        return end

    def memcpy_async(self, dst, src, duration, stream=None):
        """cudaMemcpyAsync: queued on `stream`. Between device and pinned memory the host goes on at
        once and the copy can overlap kernels of other streams; with pageable memory the driver
        stages it through pinned memory and the host waits (Runtime API, "API synchronization
        behavior"; Programming Guide, "Overlap of Data Transfer and Kernel Execution": page-locked memory)."""
        stream, duration = self._stream(stream), self._duration(duration, "memcpy_async")
        direction, pageable = self._direction(dst, src, "memcpy_async")
        if direction == "H2H":
            return self.host_work(duration, "cudaMemcpyAsync H2H")
        end = self._enqueue(stream, f"cudaMemcpyAsync {direction}" + (" (pageable)" if pageable else ""),
                            duration, None if direction == "D2D" else direction)
        if pageable:
            self._block_host(end, f"cudaMemcpyAsync {direction} from pageable memory")
        return end

    def _memset_target(self, pointer, what):
        pointer = self._pointer(pointer, what)
        if pointer.kind == "pageable":
            raise OrtlabError(f"{what}: cudaMemset takes device (or pinned) memory, not pageable host memory; "
                              "fill a host array with numpy (a.fill(0)) instead")
        return pointer

    def memset(self, pointer, duration):
        """cudaMemset: issued to the legacy default stream, so it waits for (and holds back) every
        blocking stream, yet it returns to the host at once for device memory (Runtime API, "API
        synchronization behavior": Memset); for pinned host memory the host waits."""
        duration = self._duration(duration, "memset")
        pointer = self._memset_target(pointer, "memset")
        end = self._enqueue(self.streams[0], "cudaMemset", duration)
        if pointer.kind == "pinned":
            self._block_host(end, "cudaMemset of pinned memory")
        return end

    def memset_async(self, pointer, duration, stream=None):
        """cudaMemsetAsync: queued on `stream` only; always asynchronous to the host (Runtime API,
        "API synchronization behavior": Memset)."""
        stream, duration = self._stream(stream), self._duration(duration, "memset_async")
        self._memset_target(pointer, "memset_async")
        return self._enqueue(stream, "cudaMemsetAsync", duration)

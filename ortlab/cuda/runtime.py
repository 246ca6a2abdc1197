"""The CUDA runtime API's ordering rules, executed: which work may overlap, and when the host waits.

A plain-data model of one GPU driven by one host thread. Every call takes a duration in model
milliseconds (the caller says how long a kernel or a copy takes; nothing is measured) and places the
work on a timeline by the rules NVIDIA documents in the CUDA C++ Programming Guide (sections
"Asynchronous Concurrent Execution", "Streams", "Default Stream", "Implicit Synchronization",
"Events", "Stream Ordered Memory Allocator") and in the CUDA Runtime API reference (sections "API
synchronization behavior" and "Stream synchronization behavior"):

- work in one stream runs in issue order; work in different streams may overlap;
- the legacy default stream (stream 0, the NULL stream) waits for all earlier work of every blocking
  stream, and every blocking stream waits for all earlier work of the legacy default stream; streams
  created with cudaStreamNonBlocking are exempt;
- a kernel launch, a cudaMemcpyAsync between device memory and pinned host memory and every
  cudaMemset(Async) of device memory return to the host at once; cudaMemcpy to or from the host, a
  cudaMemcpyAsync from or to pageable memory (staged through a pinned buffer by the driver),
  cudaMalloc, cudaFree, cudaMallocHost and the synchronize calls make the host wait;
- cudaStreamWaitEvent makes later work of a stream wait for the work an event captured;
- with CUDA_LAUNCH_BLOCKING=1 (`Device(launch_blocking=True)`) every kernel launch is synchronous.

`Device.intervals` lists what ran where: `Interval(lane, name, start, end)` with lane "host" (host
work, and the stretches the host was blocked, named "blocked: <call>") or a stream's name; the
plot is `ortlab.cuda.runtime_plot.plot_timeline(device)`. The memory calls (cudaMalloc, cudaFree,
cudaMemcpy(Async), cudaMemset(Async)) are in runtime_memory.py.

What the model does not model: bandwidth (a copy takes the duration it is given, however many
copies run), contention between concurrent kernels for SMs (any number of kernels overlap), the
device's limit on concurrent kernels, the cost of API calls on the host (zero unless `host_work`
is called), per-thread default streams (--default-stream per-thread), stream priorities,
graphs, unified memory, multiple devices, and real timing: every number is the caller's. A cudaMemcpy
from pageable memory is modelled as blocking the host until the copy ends (the driver returns once
the last chunk is staged, a little earlier). Two copies in one direction never overlap (one copy
engine per direction, as on data-centre GPUs); a device-to-device copy runs like a kernel.
"""
import math
import numbers
from dataclasses import dataclass

from ortlab.cuda.runtime_memory import MemoryCalls, Pointer  # noqa: F401 - Pointer is part of this API
from ortlab.errors import OrtlabError

HOST = "host"


@dataclass(frozen=True)
class Interval:
    """What occupied one lane ("host" or a stream's name) from `start` to `end` (model ms)."""

    lane: str
    name: str
    start: float
    end: float


@dataclass(frozen=True)
class Stream:
    """A stream handle: index 0 is the legacy default stream."""

    index: int
    name: str
    blocking: bool = True


@dataclass(frozen=True)
class Event:
    index: int
    name: str


class Device(MemoryCalls):
    """One GPU and the host thread that drives it; every method is one runtime call (see its docstring)."""

    def __init__(self, launch_blocking=False):
        self.launch_blocking = bool(launch_blocking)
        self.host_now = 0.0
        self.intervals = []
        self.markers = []                     # (lane, event name, time) of each event_record
        self.streams = [Stream(0, "stream 0 (legacy default)")]
        self._ready = {0: 0.0}                # when each stream's issued work ends
        self._engines = {"H2D": 0.0, "D2H": 0.0}
        self._events = []
        self._event_times = {}
        self._pointers = []
        self._freed = set()

    # ---- checks -------------------------------------------------------------------------------
    def _stream(self, stream):
        if stream is None or (type(stream) is int and stream == 0):
            return self.streams[0]
        if isinstance(stream, Stream) and stream.index < len(self.streams) and self.streams[stream.index] is stream:
            return stream
        raise OrtlabError(f"unknown stream {stream!r}: pass a Stream this Device's create_stream() returned, "
                          "or 0 / None for the legacy default stream")

    def _duration(self, duration, what):
        if isinstance(duration, bool) or not isinstance(duration, numbers.Real) or not math.isfinite(duration) \
                or duration < 0:
            raise OrtlabError(f"{what}: duration must be a finite number of model milliseconds >= 0, "
                              f"got {duration!r}")
        return float(duration)

    def _event(self, event, what):
        if not isinstance(event, Event) or event.index >= len(self._events) or self._events[event.index] is not event:
            raise OrtlabError(f"{what}: {event!r} is not an event of this Device; create it with create_event()")
        return event

    # ---- the timeline -------------------------------------------------------------------------
    def _block_host(self, until, call):
        """The host waits until `until` (recorded as a "blocked" interval on the host lane)."""
        if until > self.host_now:
            self.intervals.append(Interval(HOST, f"blocked: {call}", self.host_now, until))
            self.host_now = until

    def _start(self, stream, engine=None):
        """Earliest start of work issued now on `stream`: after the host issued it, after the stream's
        earlier work, after the legacy stream's rules, and after the copy engine is free."""
        start = max(self.host_now, self._ready[stream.index])
        if stream.index == 0:
            start = max([start] + [self._ready[s.index] for s in self.streams if s.blocking])
        elif stream.blocking:
            start = max(start, self._ready[0])
        if engine:
            start = max(start, self._engines[engine])
        return start

    def _enqueue(self, stream, name, duration, engine=None):
        start = self._start(stream, engine)
        end = start + duration
        self._ready[stream.index] = end
        if engine:
            self._engines[engine] = end
        self.intervals.append(Interval(stream.name, name, start, end))
        return end

    def _device_idle(self):
        return max(self._ready.values())

    # ---- streams, host work -------------------------------------------------------------------
    def create_stream(self, name=None, non_blocking=False):
        """cudaStreamCreate / cudaStreamCreateWithFlags(cudaStreamNonBlocking). A blocking stream (the
        default) synchronizes with the legacy default stream; a non-blocking one does not
        (Programming Guide, "Default Stream"; Runtime API, "Stream synchronization behavior")."""
        index = len(self.streams)
        stream = Stream(index, str(name) if name is not None else f"stream {index}", not non_blocking)
        if stream.name == HOST:
            raise OrtlabError(f"a stream cannot be named {HOST!r}: that is the host's lane; choose another name")
        if any(s.name == stream.name for s in self.streams):
            raise OrtlabError(f"a stream named {stream.name!r} exists already: give each stream its own name")
        self.streams.append(stream)
        self._ready[index] = self.host_now
        return stream

    def host_work(self, duration, name="host work"):
        """Host code between runtime calls (e.g. preparing the next batch): the host is busy, the GPU
        goes on with what was queued (Programming Guide, "Concurrent Execution between Host and Device")."""
        duration = self._duration(duration, "host_work")
        self.intervals.append(Interval(HOST, name, self.host_now, self.host_now + duration))
        self.host_now += duration

    # ---- kernels ------------------------------------------------------------------------------
    def launch(self, name, duration, stream=None, args=()):
        """kernel<<<grid, block, 0, stream>>>(args): asynchronous; runs after the stream's earlier work
        (Programming Guide, "Asynchronous Concurrent Execution"). Under CUDA_LAUNCH_BLOCKING=1 the host
        waits for it (Programming Guide, "CUDA Environment Variables"). `args` may list the Pointers
        the kernel uses, which must not be freed."""
        stream, duration = self._stream(stream), self._duration(duration, f"launch {name}")
        for pointer in args:
            self._pointer(pointer, f"launch {name}")
        end = self._enqueue(stream, str(name), duration)
        if self.launch_blocking:
            self._block_host(end, f"{name} (CUDA_LAUNCH_BLOCKING=1)")
        return end

    # ---- synchronization and events -----------------------------------------------------------
    def stream_synchronize(self, stream=None):
        """cudaStreamSynchronize: the host waits for the work issued so far to this one stream."""
        stream = self._stream(stream)
        self._block_host(self._ready[stream.index], f"cudaStreamSynchronize({stream.name})")

    def device_synchronize(self):
        """cudaDeviceSynchronize: the host waits for all work issued so far to every stream."""
        self._block_host(self._device_idle(), "cudaDeviceSynchronize")

    def create_event(self, name=None):
        """cudaEventCreate: an event, not yet recorded."""
        event = Event(len(self._events), str(name) if name is not None else f"event {len(self._events)}")
        self._events.append(event)
        return event

    def event_record(self, event, stream=None):
        """cudaEventRecord: the event captures all work issued so far to `stream` (for the legacy
        default stream, also all earlier work of the blocking streams); it completes when that work
        does (Programming Guide, "Events"). Recording again replaces the earlier capture."""
        event, stream = self._event(event, "event_record"), self._stream(stream)
        time = self._start(stream)
        self._event_times[event.index] = time
        self.markers.append((stream.name, event.name, time))
        return time

    def stream_wait_event(self, stream, event, allow_unrecorded=False):
        """cudaStreamWaitEvent: work issued to `stream` after this call waits until `event`
        completes; the host does not wait. An event never recorded counts as complete in CUDA (the
        wait does nothing), which is almost always a bug, so it is an error here unless
        `allow_unrecorded=True` models CUDA exactly."""
        event, stream = self._event(event, "stream_wait_event"), self._stream(stream)
        if event.index not in self._event_times:
            if allow_unrecorded:
                return
            raise OrtlabError(f"stream_wait_event: {event.name!r} was never recorded; CUDA treats an unrecorded "
                              "event as complete, so the wait would do nothing: call event_record(event, stream) "
                              "on the producing stream first (or pass allow_unrecorded=True to model CUDA's no-op)")
        self._ready[stream.index] = max(self._ready[stream.index], self._event_times[event.index])

    def event_synchronize(self, event):
        """cudaEventSynchronize: the host waits until the event completes."""
        event = self._event(event, "event_synchronize")
        self._block_host(self._event_times.get(event.index, self.host_now), f"cudaEventSynchronize({event.name})")

    def event_elapsed_time(self, start, end):
        """cudaEventElapsedTime: milliseconds between two recorded, completed events (here: the
        modelled span). Before they complete CUDA returns cudaErrorNotReady; so does this model."""
        start, end = self._event(start, "event_elapsed_time"), self._event(end, "event_elapsed_time")
        for event in (start, end):
            if event.index not in self._event_times:
                raise OrtlabError(f"event_elapsed_time: {event.name!r} was never recorded "
                                  "(cudaErrorInvalidResourceHandle): record both events first")
            if self._event_times[event.index] > self.host_now:
                raise OrtlabError(f"event_elapsed_time: {event.name!r} has not completed yet (cudaErrorNotReady): "
                                  "call event_synchronize(event) first")
        return self._event_times[end.index] - self._event_times[start.index]

    # ---- reading the result -------------------------------------------------------------------
    def lane(self, name):
        """The intervals of one lane, in start order."""
        return sorted((i for i in self.intervals if i.lane == name), key=lambda i: (i.start, i.end))

    def host_blocked(self):
        """The stretches the host waited: Intervals of the host lane named "blocked: <call>"."""
        return [i for i in self.lane(HOST) if i.name.startswith("blocked: ")]

    def table(self):
        """One row per interval (lane, name, start, end), in start order."""
        return [{"lane": i.lane, "work": i.name, "start": round(i.start, 3), "end": round(i.end, 3)}
                for i in sorted(self.intervals, key=lambda i: (i.start, i.lane != HOST, i.lane))]

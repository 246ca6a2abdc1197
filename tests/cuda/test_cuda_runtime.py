"""ortlab.cuda.runtime: the CUDA runtime API's ordering rules, as NVIDIA documents them.

Each expected start, end and host wait below follows from a sentence of the CUDA C++ Programming
Guide ("Asynchronous Concurrent Execution", "Default Stream", "Implicit Synchronization", "Events",
"Stream Ordered Memory Allocator") or of the CUDA Runtime API reference ("API synchronization
behavior", "Stream synchronization behavior"), worked out by hand from the durations given; none
was copied from the model's output.
"""
import math

import pytest

from ortlab.cuda.runtime import HOST, Device, Interval
from ortlab.cuda.runtime_plot import plot_timeline, plot_timelines
from ortlab.errors import OrtlabError


def spans(device, lane):
    return [(i.name, i.start, i.end) for i in device.lane(lane)]


def test_kernels_on_two_created_streams_overlap():
    d = Device()
    a, b = d.create_stream("A"), d.create_stream("B")
    d.launch("k1", 5, a)
    d.launch("k2", 3, b)
    assert spans(d, "A") == [("k1", 0, 5)] and spans(d, "B") == [("k2", 0, 3)]
    assert d.host_now == 0 and d.host_blocked() == []  # launches are asynchronous


def test_work_in_one_stream_runs_in_issue_order():
    d = Device()
    a = d.create_stream("A")
    d.launch("k1", 5, a)
    d.launch("k2", 3, a)
    assert spans(d, "A") == [("k1", 0, 5), ("k2", 5, 8)]


def test_legacy_default_stream_serializes_with_blocking_streams():
    d = Device()
    a, b = d.create_stream("A"), d.create_stream("B")
    d.launch("k1", 5, a)
    d.launch("k0", 2)          # legacy default stream: waits for all blocking streams' earlier work
    d.launch("k2", 3, b)       # a blocking stream: waits for the default stream's earlier work
    assert spans(d, d.streams[0].name) == [("k0", 5, 7)]
    assert spans(d, "B") == [("k2", 7, 10)]


def test_non_blocking_stream_does_not_synchronize_with_the_legacy_default_stream():
    d = Device()
    a = d.create_stream("A", non_blocking=True)
    d.launch("k1", 5, a)
    d.launch("k0", 2)
    d.launch("k2", 3, a)
    assert spans(d, d.streams[0].name) == [("k0", 0, 2)]
    assert spans(d, "A") == [("k1", 0, 5), ("k2", 5, 8)]


def test_stream_wait_event_makes_later_work_wait_for_the_recorded_work():
    d = Device()
    a, b = d.create_stream("A"), d.create_stream("B")
    e = d.create_event("produced")
    d.launch("producer", 4, a)
    d.event_record(e, a)
    d.launch("after", 6, a)    # issued after the record: not captured by the event
    d.launch("early", 1, b)    # issued before the wait: does not wait
    d.stream_wait_event(b, e)
    d.launch("consumer", 2, b)
    assert spans(d, "B") == [("early", 0, 1), ("consumer", 4, 6)]
    assert d.host_now == 0     # the host never waited


def test_an_event_never_recorded_is_an_error_unless_cudas_no_op_is_asked_for():
    d = Device()
    b = d.create_stream("B")
    e = d.create_event("never")
    with pytest.raises(OrtlabError, match="never recorded.*treats an unrecorded event as complete"):
        d.stream_wait_event(b, e)
    d.stream_wait_event(b, e, allow_unrecorded=True)   # CUDA: returns, no wait
    d.launch("k", 1, b)
    assert spans(d, "B") == [("k", 0, 1)]


def test_memcpy_blocks_the_host_and_pinned_memcpy_async_does_not():
    d = Device()
    s = d.create_stream("S")
    dev, pageable, pinned = d.malloc(1024), d.host_malloc(1024), d.malloc_host(1024)
    d.memcpy(dev, pageable, 3)                  # cudaMemcpy H2D: the host waits
    assert d.host_now == 3 and d.host_blocked()[-1] == Interval(HOST, "blocked: cudaMemcpy H2D", 0, 3)
    d.memcpy_async(dev, pinned, 4, s)           # pinned: asynchronous
    assert d.host_now == 3
    d.memcpy_async(pageable, dev, 2, s)         # pageable D2H: staged, the host waits
    assert d.host_now == 9
    assert spans(d, "S") == [("cudaMemcpyAsync H2D", 3, 7), ("cudaMemcpyAsync D2H (pageable)", 7, 9)]


def test_pinned_async_copy_overlaps_a_kernel_on_another_stream_and_copies_share_an_engine():
    d = Device()
    a, b, c = d.create_stream("A"), d.create_stream("B"), d.create_stream("C")
    dev, pinned = d.malloc(64), d.malloc_host(64)
    d.launch("k", 10, a)
    d.memcpy_async(dev, pinned, 4, b)
    d.memcpy_async(dev, pinned, 4, c)           # same direction: one copy engine, after the first
    d.memcpy_async(pinned, dev, 4, c)           # the other direction's engine, but after C's H2D
    assert spans(d, "B") == [("cudaMemcpyAsync H2D", 0, 4)]
    assert spans(d, "C") == [("cudaMemcpyAsync H2D", 4, 8), ("cudaMemcpyAsync D2H", 8, 12)]


def test_device_to_device_memcpy_does_not_block_the_host():
    d = Device()
    x, y = d.malloc(8), d.malloc(8)
    d.memcpy(y, x, 5)
    assert d.host_now == 0 and spans(d, d.streams[0].name) == [("cudaMemcpy D2D", 0, 5)]


def test_malloc_and_free_wait_for_the_whole_device():
    d = Device()
    a, b = d.create_stream("A"), d.create_stream("B")
    d.launch("k1", 5, a)
    d.launch("k2", 8, b)
    x = d.malloc(256)                           # the host waits for both streams
    assert d.host_now == 8 and d.host_blocked() == [Interval(HOST, "blocked: cudaMalloc", 0, 8)]
    d.launch("k3", 4, a, args=(x,))
    d.free(x)
    assert d.host_now == 12
    with pytest.raises(OrtlabError, match="already freed"):
        d.launch("k4", 1, a, args=(x,))
    with pytest.raises(OrtlabError, match="already freed"):
        d.free(x)


def test_memset_goes_to_the_legacy_stream_without_blocking_the_host_and_memset_async_stays_on_its_stream():
    d = Device()
    a = d.create_stream("A")
    x = d.malloc(64)
    d.launch("k", 5, a)
    d.memset(x, 1)              # legacy default stream: after A's kernel; host not blocked
    assert d.host_now == 0 and spans(d, d.streams[0].name) == [("cudaMemset", 5, 6)]
    d2 = Device()
    a2, b2 = d2.create_stream("A"), d2.create_stream("B")
    y = d2.malloc(64)
    d2.launch("k", 5, a2)
    d2.memset_async(y, 1, b2)   # its own stream: overlaps A's kernel
    assert spans(d2, "B") == [("cudaMemsetAsync", 0, 1)] and d2.host_now == 0


def test_stream_synchronize_waits_for_one_stream_device_synchronize_for_all():
    d = Device()
    a, b = d.create_stream("A"), d.create_stream("B")
    d.launch("short", 2, a)
    d.launch("long", 9, b)
    d.stream_synchronize(a)
    assert d.host_now == 2
    d.device_synchronize()
    assert d.host_now == 9
    assert [i.name for i in d.host_blocked()] == ["blocked: cudaStreamSynchronize(A)",
                                                   "blocked: cudaDeviceSynchronize"]


def test_host_work_overlaps_queued_kernels():
    d = Device()
    d.launch("k", 5)
    d.host_work(3, "prepare batch")
    d.device_synchronize()
    assert d.host_blocked() == [Interval(HOST, "blocked: cudaDeviceSynchronize", 3, 5)]


def test_elapsed_time_between_events_is_the_span_they_bracket():
    d = Device()
    s = d.create_stream("S")
    start, stop = d.create_event("start"), d.create_event("stop")
    d.launch("warm-up", 1.5, s)
    d.event_record(start, s)
    d.launch("k1", 2.25, s)
    d.launch("k2", 0.5, s)
    d.event_record(stop, s)
    with pytest.raises(OrtlabError, match="cudaErrorNotReady"):
        d.event_elapsed_time(start, stop)
    d.event_synchronize(stop)
    assert d.host_now == 4.25
    assert d.event_elapsed_time(start, stop) == 2.75


def test_cuda_launch_blocking_makes_every_launch_synchronous():
    d, blocking = Device(), Device(launch_blocking=True)
    for device in (d, blocking):
        a, b = device.create_stream("A"), device.create_stream("B")
        device.launch("k1", 5, a)
        device.launch("k2", 3, b)
    assert spans(d, "B") == [("k2", 0, 3)] and d.host_now == 0
    assert spans(blocking, "B") == [("k2", 5, 8)] and blocking.host_now == 8


def test_numpy_numbers_are_durations():
    import numpy as np
    d = Device()
    d.launch("k", np.float32(1.5))
    assert spans(d, d.streams[0].name) == [("k", 0, 1.5)]


@pytest.mark.parametrize("duration", [-1, math.nan, math.inf, "3", True, None])
def test_bad_durations_are_refused(duration):
    with pytest.raises(OrtlabError, match="duration must be a finite number"):
        Device().launch("k", duration)


def test_hostile_handles_are_refused():
    d, other = Device(), Device()
    foreign = other.create_stream("X")
    with pytest.raises(OrtlabError, match="unknown stream"):
        d.launch("k", 1, foreign)
    with pytest.raises(OrtlabError, match="unknown stream"):
        d.launch("k", 1, 7)
    with pytest.raises(OrtlabError, match="not an event of this Device"):
        d.event_record(other.create_event(), 0)
    with pytest.raises(OrtlabError, match="not a pointer of this Device"):
        d.free(other.malloc(8))
    d.malloc(8)       # equal by value to other's first pointer, yet not this device's allocation
    with pytest.raises(OrtlabError, match="not a pointer of this Device"):
        d.free(other._pointers[0])
    with pytest.raises(OrtlabError, match="unknown stream"):
        d.launch("k", 1, False)
    with pytest.raises(OrtlabError, match="size must be a positive int"):
        d.malloc(0)
    with pytest.raises(OrtlabError, match="pageable"):
        d.memset(d.host_malloc(8), 1)
    with pytest.raises(OrtlabError, match="pageable host memory"):
        d.free(d.host_malloc(8))
    with pytest.raises(OrtlabError, match="the host's lane"):
        d.create_stream("host")
    d.create_stream("A")
    with pytest.raises(OrtlabError, match="exists already"):
        d.create_stream("A")
    with pytest.raises(OrtlabError, match="was never recorded"):
        d.event_elapsed_time(d.create_event(), d.create_event())


def test_plot_timeline_draws_every_lane():
    import matplotlib
    matplotlib.use("Agg")
    d = Device()
    a = d.create_stream("A")
    d.launch("k", 2, a)
    d.device_synchronize()
    figure = plot_timeline(d, show=False)
    labels = [t.get_text() for t in figure.axes[0].get_yticklabels()]
    assert labels == ["A", d.streams[0].name, HOST]
    with pytest.raises(OrtlabError, match="takes an ortlab.cuda.runtime.Device"):
        plot_timeline([])
    with pytest.raises(OrtlabError, match="list of \\(title, ortlab.cuda.runtime.Device\\) pairs"):
        plot_timelines([d])
    figure = plot_timelines([("one", d), ("two", Device())], show=False)
    assert [a.get_title() for a in figure.axes] == ["one", "two"]


def test_an_event_recorded_on_the_legacy_stream_captures_the_blocking_streams_work():
    d = Device()
    a, b = d.create_stream("A"), d.create_stream("B")
    e = d.create_event("all")
    d.launch("k1", 6, a)
    d.event_record(e, 0)        # legacy default stream: waits for A's earlier work
    d.stream_wait_event(b, e)
    d.launch("k2", 1, b)
    assert spans(d, "B") == [("k2", 6, 7)]


def test_recording_an_event_again_replaces_the_earlier_capture():
    d = Device()
    a, b = d.create_stream("A"), d.create_stream("B")
    e = d.create_event("e")
    d.launch("k1", 2, a)
    d.event_record(e, a)
    d.launch("k2", 5, a)
    d.event_record(e, a)        # now captures k2 too
    d.stream_wait_event(b, e)
    d.launch("k3", 1, b)
    assert spans(d, "B") == [("k3", 7, 8)]


def test_memset_of_pinned_memory_and_host_to_host_copies_block_the_host():
    d = Device()
    pinned, pageable = d.malloc_host(16), d.host_malloc(16)
    d.memset(pinned, 2)
    assert d.host_now == 2
    d.memcpy(pageable, pinned, 3)
    assert d.host_now == 5 and d.lane(HOST)[-1].name == "cudaMemcpy H2H"

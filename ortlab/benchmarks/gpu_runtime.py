"""The GPU check's runtime-API part: which CUDA runtime calls make the host wait, measured, beside the
answer of `ortlab.cuda.runtime.Device` (the model of the Programming Guide's and the Runtime API
reference's ordering rules).

Each scenario queues a busy kernel of about BUSY_MS on the legacy default stream (torch.cuda._sleep,
torch's default stream being stream 0), then times one runtime call on the host (time.perf_counter):
a call that returns only after the busy kernel took about BUSY_MS, one that returns at once took
microseconds. The same steps run on the model; `agree` says whether both wait. Each call is also
timed on an idle GPU (cudaMalloc + cudaFree against the caching allocator, cudaMemcpy against
cudaMemcpyAsync from pageable and pinned memory, memset against memsetAsync). The calls go through
cuda-bindings' runtime API (cudaMalloc, cudaMemcpy...), the caching allocator through torch. A
timeline of one pipelined step (H2D copy, kernel, D2H copy, host work, synchronize) is measured
(host lane: perf_counter; stream lane: cudaEventRecord before and after each operation) and replayed
on the model with the measured durations, in the rows format of `Device.table()`.
"""
import statistics
import time

import numpy as np

from ortlab.benchmarks.gpu_cuda import checked
from ortlab.benchmarks.gpu_registry import dry_run_stop
from ortlab.cuda.runtime import Device

BUSY_MS = 20.0
NBYTES = 32 << 20
REPEAT = 3
STREAM0 = "stream 0 (legacy default)"


class CudaRuntime:
    """The runtime calls the scenarios make, through cuda-bindings (and torch for the busy kernel,
    the caching allocator and host work). Buffers: device `dev`, `dev2`; host `pinned`, `pageable`."""

    def __init__(self, nbytes=NBYTES):
        import torch  # heavy: torch
        from cuda.bindings import runtime  # optional: cuda

        self.torch, self.rt, self.nbytes = torch, runtime, nbytes
        torch.zeros(1, device="cuda")
        torch.cuda.synchronize()
        self.kinds = {"H2D": runtime.cudaMemcpyKind.cudaMemcpyHostToDevice,
                      "D2H": runtime.cudaMemcpyKind.cudaMemcpyDeviceToHost,
                      "D2D": runtime.cudaMemcpyKind.cudaMemcpyDeviceToDevice}
        self.dev, self.dev2 = self.call("cudaMalloc", nbytes), self.call("cudaMalloc", nbytes)
        self.pinned = self.call("cudaMallocHost", nbytes)
        self.host_array = np.ones(nbytes, np.uint8)
        self.pageable = self.host_array.ctypes.data
        self.cycles_per_ms = self._calibrate()

    def call(self, name, *args):
        """cudaXxx(*args) through cuda-bindings: its values (None when it returns only the error)."""
        value = checked(getattr(self.rt, name)(*args), name)
        return None if isinstance(value, tuple) and not value else value

    def _calibrate(self):
        torch = self.torch
        cycles = 2_000_000
        for _ in range(2):  # the second run after the clocks have risen
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            end.synchronize()
            ms = start.elapsed_time(end)
        return cycles / ms

    def busy(self, ms=BUSY_MS):
        """A kernel spinning about `ms` on torch's current stream (the legacy default stream)."""
        self.torch.cuda._sleep(int(ms * self.cycles_per_ms))

    def synchronize(self):
        self.call("cudaDeviceSynchronize")

    def host_work(self, ms):
        end = time.perf_counter() + ms / 1e3
        while time.perf_counter() < end:
            pass

    def buffer(self, side):
        return {"device": self.dev, "device2": self.dev2, "pinned": self.pinned, "pageable": self.pageable}[side]

    def copy(self, dst, src, asynchronous):
        kind = self.kinds[("H" if src in ("pinned", "pageable") else "D") + "2"
                          + ("H" if dst in ("pinned", "pageable") else "D")]
        args = (self.buffer(dst), self.buffer(src), self.nbytes, kind)
        self.call("cudaMemcpyAsync", *args, 0) if asynchronous else self.call("cudaMemcpy", *args)

    def close(self):
        self.synchronize()
        for pointer in (self.dev, self.dev2):
            self.call("cudaFree", pointer)
        self.call("cudaFreeHost", self.pinned)


def _scenario(name, measure, model, before=None, after_busy=False):
    """One row: `measure(api)` is timed; `before(api)` runs first, before the busy kernel; with
    `after_busy` the event is recorded after the busy kernel (in the model too)."""
    return {"call": name, "measure": measure, "model": model, "before": before, "after_busy": after_busy}


def scenarios():
    """The rows of compare_waits: each a runtime call measured and modelled."""
    def malloc_free(api):
        api.call("cudaFree", api.call("cudaMalloc", api.nbytes))

    def copy(dst, src, asynchronous):
        return lambda api: api.copy(dst, src, asynchronous)

    def model_copy(dst, src, asynchronous):
        def run(d, p):
            (d.memcpy_async if asynchronous else d.memcpy)(p[dst], p[src], 0.0)
        return run

    rows = [
        _scenario("kernel launch", lambda api: api.busy(0.01), lambda d, p: d.launch("kernel", 0.0)),
        _scenario("cudaMalloc + cudaFree", malloc_free,
                  lambda d, p: d.free(d.malloc(NBYTES))),
        _scenario("torch.empty from the caching allocator (a cached block: no runtime call)",
                  lambda api: api.torch.empty(api.nbytes // 4, device="cuda"), lambda d, p: None,
                  before=lambda api: api.torch.empty(api.nbytes // 4, device="cuda")),
        _scenario("torch.empty after torch.cuda.empty_cache() (cudaMalloc)",
                  lambda api: api.torch.empty(api.nbytes // 4 + 1, device="cuda"), lambda d, p: d.malloc(NBYTES),
                  before=lambda api: api.torch.cuda.empty_cache()),
    ]
    for asynchronous in (False, True):
        call = "cudaMemcpyAsync" if asynchronous else "cudaMemcpy"
        for dst, src, what in (("device", "pageable", "H2D from pageable"), ("device", "pinned", "H2D from pinned"),
                               ("pageable", "device", "D2H to pageable"), ("pinned", "device", "D2H to pinned"),
                               ("device2", "device", "D2D")):
            rows.append(_scenario(f"{call} {what}", copy(dst, src, asynchronous), model_copy(dst, src, asynchronous)))
    rows += [
        _scenario("cudaMemset (device memory)", lambda api: api.call("cudaMemset", api.dev, 0, api.nbytes),
                  lambda d, p: d.memset(p["device"], 0.0)),
        _scenario("cudaMemsetAsync (device memory)", lambda api: api.call("cudaMemsetAsync", api.dev, 0, api.nbytes, 0),
                  lambda d, p: d.memset_async(p["device"], 0.0)),
        _scenario("cudaStreamSynchronize(0)", lambda api: api.call("cudaStreamSynchronize", 0),
                  lambda d, p: d.stream_synchronize()),
        _scenario("cudaDeviceSynchronize", lambda api: api.call("cudaDeviceSynchronize"),
                  lambda d, p: d.device_synchronize()),
        _scenario("cudaEventRecord", lambda api: api.call("cudaEventRecord", api.event, 0),
                  lambda d, p: d.event_record(p["event"])),
        _scenario("cudaEventSynchronize (event recorded after the busy kernel)",
                  lambda api: api.call("cudaEventSynchronize", api.event), lambda d, p: d.event_synchronize(p["event"]),
                  after_busy=True),
    ]
    return rows


def model_wait_ms(scenario, busy_ms=BUSY_MS):
    """How long the host waits in the model for the scenario's call, after a busy kernel of `busy_ms`."""
    d = Device()
    p = {"device": d.malloc(NBYTES), "device2": d.malloc(NBYTES), "pinned": d.malloc_host(NBYTES),
         "pageable": d.host_malloc(NBYTES), "event": d.create_event("event")}
    d.launch("busy kernel", busy_ms)
    if scenario["after_busy"]:
        d.event_record(p["event"])
    before = d.host_now
    scenario["model"](d, p)
    return d.host_now - before


def time_call(api, scenario, busy_ms=None):
    """One issue of the scenario's call on the real GPU: (host ms until it returns, ms until its work is
    done: the call, then cudaDeviceSynchronize), after its set-up and a busy kernel of `busy_ms` (None: idle)."""
    api.synchronize()
    if scenario["before"] is not None:
        scenario["before"](api)
        api.synchronize()
    if busy_ms is not None:
        api.busy(busy_ms)
    if scenario["after_busy"]:
        api.call("cudaEventRecord", api.event, 0)
    start = time.perf_counter()
    scenario["measure"](api)
    returned = (time.perf_counter() - start) * 1e3
    api.synchronize()
    return returned, (time.perf_counter() - start) * 1e3


def measure_wait_ms(api, scenario, busy_ms=BUSY_MS, repeat=REPEAT):
    """Median host time (ms) of the scenario's call issued after a busy kernel of `busy_ms`."""
    return statistics.median(time_call(api, scenario, busy_ms)[0] for _ in range(repeat))


def idle_costs(api, repeat=5):
    """Each scenario's call on an idle GPU: median host ms until it returns, and until its work is done
    (the call, then cudaDeviceSynchronize); GB/s of the copies by the second (NBYTES per call)."""
    rows = []
    for scenario in scenarios():
        try:
            returns, done = zip(*[time_call(api, scenario) for _ in range(repeat)])
        except Exception as error:  # noqa: BLE001 - one call's failure is a row, the others still run
            rows.append({"call": scenario["call"], "error": f"{type(error).__name__}: {error}"})
            continue
        ms = statistics.median(done)
        copy = "Memcpy" in scenario["call"]
        rows.append({"call": scenario["call"], "returns after ms": round(statistics.median(returns), 4),
                     "done after ms": round(ms, 4), "GB/s": round(NBYTES / (ms * 1e-3) / 1e9, 1) if copy else None})
    return rows


def compare_waits(api, busy_ms=BUSY_MS):
    """Rows {call, host ms (measured), host waited, model waits ms, model says host waits, agree}."""
    rows = []
    for scenario in scenarios():
        model_ms = model_wait_ms(scenario, busy_ms)
        row = {"call": scenario["call"], "busy kernel ms": busy_ms}
        try:
            measured = None if api is None else measure_wait_ms(api, scenario, busy_ms)
        except Exception as error:  # noqa: BLE001 - one call's failure is a row, the others still run
            measured, row["error"] = None, f"{type(error).__name__}: {error}"
        waited = None if measured is None else measured >= busy_ms / 2
        model_waits = model_ms >= busy_ms / 2
        rows.append({**row, "host ms (measured)": None if measured is None else round(measured, 3),
                     "host waited": waited, "model: host waits ms": round(model_ms, 3),
                     "model says host waits": model_waits, "agree": None if waited is None else waited == model_waits})
    return rows


def model_timeline(steps):
    """The model's rows (Device.table()) for `steps`: [(what, ms)] with what in STEP_KINDS."""
    d = Device()
    dev, pinned = d.malloc(NBYTES), d.malloc_host(NBYTES)
    start = len(d.intervals)
    for what, ms in steps:
        {"cudaMemcpyAsync H2D": lambda: d.memcpy_async(dev, pinned, ms),
         "busy kernel": lambda: d.launch("busy kernel", ms),
         "cudaMemcpyAsync D2H": lambda: d.memcpy_async(pinned, dev, ms),
         "host work": lambda: d.host_work(ms, "host work"),
         "cudaStreamSynchronize": lambda: d.stream_synchronize()}[what]()
    d.intervals = d.intervals[start:]
    return [r for r in d.table() if r["end"] > r["start"]]


def measured_timeline(api, kernel_ms=5.0, host_ms=2.0):
    """One pipelined step measured: host intervals (perf_counter) and stream-0 intervals (events)."""
    torch = api.torch
    api.synchronize()
    events = [torch.cuda.Event(enable_timing=True) for _ in range(4)]
    rows, spans = [], []
    t0 = time.perf_counter()
    events[0].record()

    def host(name, fn):
        begin = time.perf_counter()
        fn()
        rows.append({"lane": "host", "work": name, "start": round((begin - t0) * 1e3, 3),
                     "end": round((time.perf_counter() - t0) * 1e3, 3)})

    for k, (name, fn) in enumerate((("cudaMemcpyAsync H2D", lambda: api.copy("device", "pinned", True)),
                                    ("busy kernel", lambda: api.busy(kernel_ms)),
                                    ("cudaMemcpyAsync D2H", lambda: api.copy("pinned", "device", True)))):
        host(f"{name} (call)", fn)
        events[k + 1].record()
        spans.append(name)
    host("host work", lambda: api.host_work(host_ms))
    host("cudaStreamSynchronize (call)", lambda: api.call("cudaStreamSynchronize", 0))
    for k, name in enumerate(spans):
        rows.append({"lane": STREAM0, "work": name, "start": round(events[0].elapsed_time(events[k]), 3),
                     "end": round(events[0].elapsed_time(events[k + 1]), 3)})
    gpu = {r["work"]: r["end"] - r["start"] for r in rows if r["lane"] == STREAM0}
    steps = [(name, gpu[name]) for name in spans] + [("host work", host_ms), ("cudaStreamSynchronize", 0.0)]
    return sorted(rows, key=lambda r: (r["start"], r["lane"] != "host")), steps


def part_runtime_api(context):
    """(d) Runtime calls after a busy kernel: measured host waits against the model's, and a timeline."""
    if context.dry_run:
        rows = compare_waits(None)
        model_timeline([("cudaMemcpyAsync H2D", 1.0), ("busy kernel", 5.0), ("cudaMemcpyAsync D2H", 1.0),
                        ("host work", 2.0), ("cudaStreamSynchronize", 0.0)])
        dry_run_stop(context, f"the {len(rows)} runtime calls are measured")
    api = CudaRuntime()
    try:
        api.event = api.call("cudaEventCreate")
        rows = compare_waits(api)
        idle = idle_costs(api)
        measured, steps = measured_timeline(api)
        modelled = model_timeline(steps)
        start, end = api.torch.cuda.Event(enable_timing=True), api.torch.cuda.Event(enable_timing=True)
        start.record()
        api.busy()
        end.record()
        end.synchronize()
        elapsed = start.elapsed_time(end)
    finally:
        api.close()
    differ = [r["call"] for r in rows if r["agree"] is False]
    return {"nbytes per copy": NBYTES, "busy kernel": "torch.cuda._sleep on the legacy default stream",
            "cycles per ms": round(api.cycles_per_ms), "rows": rows, "mismatches": differ,
            "idle GPU: cost of each call": idle,
            "checks": {"passed": sum(r["agree"] is True for r in rows), "total": len(rows)},
            "cudaEventElapsedTime across a busy kernel of 20 ms asked (ms)": round(elapsed, 3),
            "timeline (measured)": measured, "timeline (model, measured durations)": modelled}

"""`python -m ortlab.benchmarks.gpu_check`'s CPU side, without a GPU: the record, part isolation and time
budgets, reading records back, the occupancy comparison fed a fake driver, the CUDA kernel cases
on the CPU runner against numpy, the runtime-API harness on a fake runtime, and a dry run that never
imports onnxruntime (absent on the GPU machines). Records written here are synthetic, in tmp_path.
"""
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from ortlab.benchmarks import gpu_check, gpu_cuda, gpu_record, gpu_runtime
from ortlab.benchmarks.gpu_cuda_cases import CASES, compare, run_case, splitmix_uniform
from ortlab.benchmarks.gpu_registry import PARTS, Context, Part, Skip
from repo_paths import ROOT



# ---- parts: isolation and budgets -------------------------------------------------------------
def _ok(context):
    return {"value": np.float32(1.5), "count": np.int64(3), "array": np.arange(3), "pair": (1, 2)}


def _raises(context):
    raise ValueError("first line\nthe last line says what went wrong")


def _skips(context):
    raise Skip("no GPU here")


def _import_fails(context):
    import ortlab_module_that_does_not_exist  # noqa: F401


def _hangs(context):
    time.sleep(60)


def _crashes(context):
    os._exit(3)


def test_a_part_that_raises_is_recorded_as_failed_and_the_others_still_run():
    parts = [Part("a", "A", _raises, 20), Part("b", "B", _ok, 20), Part("c", "C", _skips, 20),
             Part("d", "D", _import_fails, 20), Part("e", "E", _crashes, 20)]
    entries = gpu_check.run_parts(parts, Context())
    assert [e["status"] for e in entries.values()] == ["failed", "ok", "skipped", "skipped", "failed"]
    assert entries["a"]["error"] == "ValueError: first line ... the last line says what went wrong"
    assert "Traceback" in entries["a"]["traceback"]
    assert entries["b"]["result"] == {"value": 1.5, "count": 3, "array": [0, 1, 2], "pair": [1, 2]}
    assert entries["c"]["reason"] == "no GPU here"
    assert entries["d"]["reason"].startswith("import failed: ModuleNotFoundError")
    assert entries["e"]["error"] == "its process died without an answer (exit code 3)"
    assert json.loads(json.dumps(entries)) == entries


def test_a_part_past_its_budget_is_killed_and_later_parts_share_what_is_left():
    start = time.monotonic()
    entries = gpu_check.run_parts([Part("slow", "S", _hangs, 1.5), Part("next", "N", _ok, 20)], Context())
    assert time.monotonic() - start < 20
    assert entries["slow"]["status"] == "failed"
    assert entries["slow"]["error"].startswith("timed out: still running after its budget of 1.5 s")
    assert entries["next"]["status"] == "ok"
    # the run's total budget caps each part: the third part finds none left
    entries = gpu_check.run_parts([Part("x", "X", _ok, 20), Part("slow", "S", _hangs, 100), Part("y", "Y", _ok, 20)],
                                  Context(), total_budget_s=2.0)
    assert entries["slow"]["budget_s"] <= 2.0 and entries["slow"]["status"] == "failed"
    assert entries["y"] == {"title": "Y", "status": "skipped", "reason": "no time left in the run's total budget",
                            "budget_s": 0}


def test_the_registered_parts_fit_seven_minutes_in_order():
    assert list(PARTS) == ["device", "cuda_kernels", "triton_kernels", "runtime_api", "occupancy", "matmul",
                           "engine_eps"]
    assert sum(p.budget_s for p in PARTS.values()) <= gpu_check.TOTAL_BUDGET_S == 420


# ---- the record --------------------------------------------------------------------------------
def _record(date, gpu="Synthetic GPU (test)", dry_run=False, parts=None):
    parts = parts or {"device": {"title": "(a) device facts", "status": "ok", "seconds": 1.0,
                                 "result": {"name": gpu, "arch": "sm_90", "driver": "1.2.3", "cuda runtime": "13.0"}}}
    return gpu_check.build_record(parts, dry_run, now=__import__("datetime").datetime.fromisoformat(date))


def test_record_schema_and_file_name(tmp_path):
    record = _record("2026-11-28T01:02:03+00:00", gpu="NVIDIA H100 80GB HBM3")
    assert {k: record[k] for k in ("format", "date", "gpu", "arch", "driver", "cuda_runtime", "dry_run")} == {
        "format": 1, "date": "2026-11-28T01:02:03Z", "gpu": "NVIDIA H100 80GB HBM3", "arch": "sm_90",
        "driver": "1.2.3", "cuda_runtime": "13.0", "dry_run": False}
    first, second = gpu_check.write_record(record, tmp_path), gpu_check.write_record(record, tmp_path)
    assert (first.name, second.name) == ("2026-11-28_NVIDIA-H100-80GB-HBM3.json",
                                         "2026-11-28_NVIDIA-H100-80GB-HBM3_2.json")
    assert json.loads(first.read_text()) == record
    assert gpu_check.file_name("2026-11-28T00:00:00Z", "a/b c:(d)") == "2026-11-28_a-b-c-d.json"
    assert gpu_check.file_name("2026-11-28T00:00:00Z", None) == "2026-11-28_unknown-gpu.json"
    failed_device = gpu_check.build_record({"device": {"status": "failed", "error": "x"}}, False)
    assert failed_device["gpu"] is None and failed_device["parts"]["device"]["status"] == "failed"


def test_latest_is_the_newest_by_date_not_by_file_name(tmp_path):
    assert gpu_record.latest(tmp_path / "missing") is None
    assert gpu_record.latest(tmp_path) is None
    for name, date, dry in (("2026-12-01_z.json", "2026-11-01T00:00:00+00:00", False),
                            ("2026-01-01_a.json", "2026-11-20T10:00:00+00:00", False),
                            ("2026-01-02_a.json", "2026-11-20T09:59:59+00:00", False),
                            ("2026-01-03_dry.json", "2026-12-31T00:00:00+00:00", True)):
        (tmp_path / name).write_text(json.dumps(_record(date, dry_run=dry)))
    no_gpu = gpu_check.build_record({"device": {"status": "skipped", "reason": "no GPU"}}, False,
                                    now=__import__("datetime").datetime.fromisoformat("2027-01-01T00:00:00+00:00"))
    (tmp_path / "2027-01-01_unknown-gpu.json").write_text(json.dumps(no_gpu))
    (tmp_path / "broken.json").write_text("{ not json")
    (tmp_path / "other.json").write_text(json.dumps({"something": "else"}))
    assert gpu_record.latest(tmp_path)["date"] == "2026-11-20T10:00:00Z"


def test_rendering_with_and_without_a_record():
    assert gpu_record.summary(None) == gpu_record.NO_RECORD == \
        "no GPU record yet: run `make gpu-check` on a GPU machine"
    assert repr(gpu_record.table(None, "matmul")) == gpu_record.NO_RECORD
    parts = {"device": {"title": "(a) device facts", "status": "ok", "seconds": 1.0,
                        "result": {"name": "Synthetic GPU", "arch": "sm_90", "driver": "1.2.3", "SMs": 2}},
             "matmul": {"title": "(f) matmul", "status": "ok", "seconds": 2.0,
                        "result": {"rows": [{"precision": "fp32", "TFLOP/s": 1.0}]}},
             "occupancy": {"title": "(e) occupancy", "status": "ok", "seconds": 2.0,
                           "result": {"rows": [], "checks": {"passed": 1, "total": 2}, "mismatches": ["k block 32"]}},
             "runtime_api": {"title": "(d) runtime", "status": "failed", "error": "RuntimeError: boom"},
             "triton_kernels": {"title": "(c) triton", "status": "skipped", "reason": "import failed: triton"}}
    record = _record("2026-11-28T01:02:03+00:00", gpu="Synthetic GPU", parts=parts)
    text = gpu_record.summary(record)
    assert text.splitlines()[0] == "measured on Synthetic GPU (sm_90), 2026-11-28T01:02:03Z"
    assert "(e) occupancy: ok (2 s), 1 of 2 agree\n      differs: k block 32" in text
    assert "(d) runtime: FAILED: RuntimeError: boom" in text
    assert "(c) triton: skipped: import failed: triton" in text
    matmul = repr(gpu_record.table(record, "matmul")).splitlines()
    assert matmul[0] == "(f) matmul: measured on Synthetic GPU (sm_90), 2026-11-28T01:02:03Z"
    assert matmul[1].split() == ["precision", "TFLOP/s"] and matmul[3].split() == ["fp32", "1.0"]
    assert "SMs" in repr(gpu_record.table(record, "device"))
    assert repr(gpu_record.table(record, "runtime_api")).endswith("; failed: RuntimeError: boom")
    assert "<i>" in gpu_record.table(record, "matmul")._repr_html_()
    with pytest.raises(KeyError, match="no part 'nope'"):
        gpu_record.table(record, "nope")
    dry = _record("2026-11-28T01:02:03+00:00", dry_run=True)
    assert gpu_record.label(dry).endswith("[dry run: no device calls]")


# ---- occupancy: the comparison, fed a fake driver ----------------------------------------------
def test_occupancy_comparison_with_a_fake_driver_answer():
    """32 registers, no shared memory, 256 threads on sm_90 (NVIDIA's limits: 64 warps, 64 Ki registers
    in 4 sub-partitions, 32 blocks per SM): 8 warps per block, 1024 registers per warp, so 8 blocks by
    threads and by registers. The fake driver answers 8 there and, planted, 5 at 128 threads."""
    asked = []

    def driver(name, block, dynamic):
        asked.append((name, block, dynamic))
        return {256: 8, 128: 5}[block]

    rows, mismatches = gpu_cuda.compare_occupancy({"k": {"registers": 32, "shared_bytes": 0}}, "sm_90", driver,
                                                  block_sizes=(128, 256), dynamic_shared=(0,))
    assert asked == [("k", 128, 0), ("k", 256, 0)]
    assert [(r["block"], r["ortlab blocks/SM"], r["driver blocks/SM"], r["equal"]) for r in rows] == [
        (128, 16, 5, False), (256, 8, 8, True)]
    assert mismatches == ["k block 128 dyn 0: ortlab 16, driver 5"]
    rows, mismatches = gpu_cuda.compare_occupancy({"k": {"registers": 32}}, "sm_90", None, block_sizes=(64,),
                                                  dynamic_shared=(0,))
    assert rows[0]["equal"] is None and mismatches == []


def test_cuda_bindings_errors_name_the_call():
    assert gpu_cuda.checked((0, 7), "cuX") == 7
    assert gpu_cuda.checked((0, 1, 2), "cuX") == (1, 2)
    assert gpu_cuda.checked((0,), "cuX") == ()
    with pytest.raises(RuntimeError, match="cuModuleLoadData returned 200"):
        gpu_cuda.checked((200, None), "cuModuleLoadData")


# ---- the CUDA kernel cases: the CPU runner against the same numpy references --------------------
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_each_kernel_case_on_the_cpu_runner_matches_numpy(case):
    import ortlab.cuda as cuda
    from ortlab.cuda import kernels

    built = cuda.cpu_kernels(kernels.source(case.source), kernels.SOURCES[case.source].kernels)
    rows = run_case(case, lambda k, g, b, *a: cuda.launch(built[k], g, b, *a), "small")
    assert rows and all(r["ok"] for r in rows), rows


def test_the_cases_launch_every_kernel_of_their_sources_and_the_others_are_reported():
    from ortlab.benchmarks.gpu_cuda_cases import SIZES
    from ortlab.cuda import kernels

    launched = set()
    for case in CASES:
        arrays = case.inputs(np.random.default_rng(0), SIZES["small"])
        case.run(lambda name, *args: launched.add(name), arrays, SIZES["small"])
    covered = {case.source for case in CASES}
    assert launched == {k for name in covered for k in kernels.SOURCES[name].kernels}
    assert {"reduce_sum", "dropout", "layer_norm", "softmax_cross_entropy", "gather_grad"} <= covered
    assert gpu_cuda.uncovered_sources() == sorted(set(kernels.SOURCES) - covered)


def test_compare_flags_a_wrong_output():
    case = CASES[0]
    rows = compare(case, {"y": np.array([1.0, 2.0 + 1e-3])}, {"y": np.array([1.0, 2.0])})
    assert rows[0]["ok"] is False and rows[0]["max abs diff"] == pytest.approx(1e-3)
    assert compare(case, {"y": np.zeros(3)}, {"y": np.zeros(2)})[0]["ok"] is False


def test_splitmix_uniform_matches_the_hash_in_plain_python():
    mask = (1 << 64) - 1

    def uniform(seed, i):
        z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & mask
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & mask
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & mask
        z ^= z >> 31
        return (z >> 40) / 16777216.0
    got = splitmix_uniform(1234, 1000)
    assert got.dtype == np.float32
    assert got.tolist() == [uniform(1234, i) for i in range(1000)]


# ---- the runtime-API harness on a fake runtime ---------------------------------------------------
class FakeRuntime:
    """Host-side stand-in: a 'busy kernel' ends `ms` later; the calls listed in WAITS sleep until it does."""

    WAITS = {"cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaMalloc"}

    def __init__(self):
        self.busy_until, self.nbytes, self.event, self.dev = 0.0, 64, object(), 0
        self.torch = type("torch", (), {"empty": staticmethod(lambda *a, **k: None),
                                        "cuda": type("cuda", (), {"empty_cache": staticmethod(lambda: None)})})

    def busy(self, ms=20.0):
        self.busy_until = time.perf_counter() + ms / 1e3

    def _wait(self):
        time.sleep(max(0.0, self.busy_until - time.perf_counter()))

    def call(self, name, *args):
        if name in self.WAITS:
            self._wait()

    def copy(self, dst, src, asynchronous):
        if not asynchronous:
            self._wait()

    def synchronize(self):
        self._wait()


def test_runtime_harness_measures_host_waits_and_sets_them_beside_the_model():
    rows = {r["call"]: r for r in gpu_runtime.compare_waits(FakeRuntime(), busy_ms=30.0)}
    assert len(rows) == len(gpu_runtime.scenarios()) == 20
    assert not any("error" in r for r in rows.values())
    sync = rows["cudaDeviceSynchronize"]
    assert sync["host waited"] and sync["model says host waits"] and sync["agree"]
    assert sync["host ms (measured)"] >= 15
    launch = rows["kernel launch"]
    assert launch["host waited"] is False and launch["model says host waits"] is False and launch["agree"]
    # the fake runtime's cudaMemcpyAsync from pageable memory returns at once; the model says it waits
    pageable = rows["cudaMemcpyAsync H2D from pageable"]
    assert (pageable["host waited"], pageable["model says host waits"], pageable["agree"]) == (False, True, False)


def test_idle_costs_time_each_call_until_it_returns_and_until_its_work_is_done():
    rows = {r["call"]: r for r in gpu_runtime.idle_costs(FakeRuntime(), repeat=2)}
    assert len(rows) == 20 and not any("error" in r for r in rows.values())
    assert rows["cudaMemcpy H2D from pinned"]["GB/s"] > 0 and rows["cudaMemset (device memory)"]["GB/s"] is None
    assert all(r["done after ms"] >= r["returns after ms"] for r in rows.values())


def test_the_model_side_follows_the_runtime_api_synchronization_rules():
    """CUDA Runtime API reference, "API synchronization behavior": cudaMemcpy to/from the host and the
    synchronize calls wait; kernel launches, cudaMemcpyAsync with pinned memory and cudaMemsetAsync do not."""
    rows = {r["call"]: r for r in gpu_runtime.compare_waits(None)}
    assert all(r["host ms (measured)"] is None and r["agree"] is None for r in rows.values())
    waits = {call for call, r in rows.items() if r["model says host waits"]}
    for call in ("cudaMalloc + cudaFree", "cudaMemcpy H2D from pageable", "cudaMemcpy D2H to pinned",
                 "cudaStreamSynchronize(0)", "cudaDeviceSynchronize",
                 "cudaEventSynchronize (event recorded after the busy kernel)"):
        assert call in waits
    for call in ("kernel launch", "cudaMemcpyAsync H2D from pinned", "cudaMemcpyAsync D2H to pinned",
                 "cudaMemsetAsync (device memory)", "cudaEventRecord", "cudaMemcpy D2D",
                 "torch.empty from the caching allocator (a cached block: no runtime call)"):
        assert call not in waits


def test_model_timeline_replays_measured_durations():
    """H2D, kernel and D2H queue one after another on stream 0 while the host works 2 ms, then the
    host waits in cudaStreamSynchronize until the D2H copy ends at 1 + 5 + 1 = 7 ms."""
    rows = gpu_runtime.model_timeline([("cudaMemcpyAsync H2D", 1.0), ("busy kernel", 5.0),
                                       ("cudaMemcpyAsync D2H", 1.0), ("host work", 2.0),
                                       ("cudaStreamSynchronize", 0.0)])
    assert sorted(rows, key=lambda r: (r["start"], r["work"])) == [
        {"lane": gpu_runtime.STREAM0, "work": "cudaMemcpyAsync H2D", "start": 0.0, "end": 1.0},
        {"lane": "host", "work": "host work", "start": 0.0, "end": 2.0},
        {"lane": gpu_runtime.STREAM0, "work": "busy kernel", "start": 1.0, "end": 6.0},
        {"lane": "host", "work": "blocked: cudaStreamSynchronize(stream 0 (legacy default))", "start": 2.0,
         "end": 7.0},
        {"lane": gpu_runtime.STREAM0, "work": "cudaMemcpyAsync D2H", "start": 6.0, "end": 7.0}]


# ---- the whole script, dry, with onnxruntime blocked ---------------------------------------------
# A script's first lines that make any import of onnxruntime fail, and log it to $ORTLAB_TEST_IMPORT_LOG
BLOCK_ONNXRUNTIME = """
import json, os, runpy, sys
class Block:
    def find_spec(self, name, path=None, target=None):
        if name == "onnxruntime" or name.startswith("onnxruntime."):
            with open(os.environ["ORTLAB_TEST_IMPORT_LOG"], "a") as log:
                log.write(name + "\\n")
            raise ImportError("onnxruntime is blocked: the GPU machines have none")
sys.meta_path.insert(0, Block())
sys.modules.pop("onnxruntime", None)
"""
BLOCKER = BLOCK_ONNXRUNTIME + """sys.argv = ["gpu_check", "--dry-run", "--out", sys.argv[1]]
runpy.run_module("ortlab.benchmarks.gpu_check", run_name="__main__")
"""


def test_a_dry_run_never_imports_onnxruntime(tmp_path):
    log = tmp_path / "imports.log"
    log.write_text("")
    env = {**os.environ, "ORTLAB_TEST_IMPORT_LOG": str(log), "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", BLOCKER, str(tmp_path / "out")], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert log.read_text() == ""
    (path,) = (tmp_path / "out").glob("*.json")
    record = json.loads(path.read_text())
    assert record["dry_run"] is True and record["gpu"] is None
    assert list(record["parts"]) == list(PARTS)
    for name, entry in record["parts"].items():
        assert entry["status"] == "skipped" and entry["reason"].startswith("dry run: CPU side done"), (name, entry)
    assert "[dry run: no device calls]" in done.stdout


# ---- the GPU parts' plumbing, with the device replaced ------------------------------------------
def _fake_cupy():
    """A stand-in for CuPy whose 'device' arrays are numpy copies and whose kernels run on ortlab's
    CPU runner; each scalar must arrive as the numpy type of its parameter, as CuPy needs it."""
    import types

    import ortlab.cuda as cuda
    from ortlab.cuda import kernels
    from ortlab.cuda.cpu import parse_params

    class RawModule:
        def __init__(self, path):
            self.source = Path(path).stem
            assert Path(path).read_bytes() == b"cubin of " + self.source.encode()

        def get_function(self, name):
            text = kernels.source(self.source)
            built = cuda.cpu_kernels(text, kernels.SOURCES[self.source].kernels)

            def kernel(grid, block, args):
                for param, arg in zip(parse_params(text, name), args):
                    assert type(arg) is (np.ndarray if param.pointer else param.dtype), (name, param, arg)
                cuda.launch(built[name], grid[0], block[0], *args)
            return kernel

    fake = types.ModuleType("cupy")
    fake.asarray = lambda a: np.array(a, copy=True)
    fake.asnumpy = lambda d: np.array(d, copy=True)
    fake.RawModule = RawModule
    fake.cuda = types.SimpleNamespace(Device=lambda: types.SimpleNamespace(synchronize=lambda: None))
    return fake


def test_the_cuda_kernels_part_end_to_end_with_cupy_replaced_by_the_cpu_runner(monkeypatch):
    from ortlab.benchmarks import gpu_cuda_cases

    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy())
    monkeypatch.setitem(gpu_cuda_cases.SIZES, "large", gpu_cuda_cases.SIZES["small"])
    monkeypatch.setattr(gpu_cuda, "device_arch", lambda: "sm_90")
    real_compile = gpu_cuda.compile_all
    monkeypatch.setattr(gpu_cuda, "compile_all", lambda arch: {
        name: {**c, "cubin": b"cubin of " + name.encode()} for name, c in real_compile(arch).items()})
    result = gpu_cuda.part_cuda_kernels(Context())
    assert result["mismatches"] == [] and result["checks"]["passed"] == result["checks"]["total"] == 18
    assert {s["source"] for s in result["sources"]} >= {case.source for case in CASES}
    assert all(s["compiler"] == "ortlab.cuda.compile (NVRTC + ptxas)" for s in result["sources"])


def test_the_occupancy_part_with_a_fake_driver_module(monkeypatch):
    """The fake driver answers 1 block per SM everywhere and reports ptxas's registers plus one for
    `reduce_sum_last_axis`: every row where ortlab says otherwise, and that kernel, are mismatches."""
    class FakeModule:
        def __init__(self, cubin):
            self.cubin = cubin

        def blocks_per_sm(self, name, block, dynamic):
            return 1

        def attribute(self, name, attribute):
            from ortlab.cuda import compile as ortlab_compile
            from ortlab.cuda import kernels

            source = next(s for s, e in kernels.SOURCES.items() if name in e.kernels)
            res = ortlab_compile(kernels.source(source), "sm_90").kernels[name]
            extra = 1 if name == "reduce_sum_last_axis" and attribute.endswith("NUM_REGS") else 0
            return (res.registers if attribute.endswith("NUM_REGS") else res.shared_bytes) + extra

    monkeypatch.setattr(gpu_cuda, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(gpu_cuda, "DriverModule", FakeModule)
    result = gpu_cuda.part_occupancy(Context())
    differing_rows = [r for r in result["rows"] if r["ortlab blocks/SM"] != 1]
    assert differing_rows and all(r["equal"] is False for r in differing_rows)
    assert len(result["mismatches"]) == len(differing_rows) + 1
    assert result["mismatches"][-1].startswith("reduce_sum_last_axis: ptxas says")
    assert result["checks"]["total"] == len(result["rows"]) + len(result["registers"])


def test_a_run_that_finds_no_gpu_writes_nothing_to_gpu_records(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(gpu_check, "RECORDS", tmp_path)
    record = gpu_check.main(["--parts", "device"])
    assert record["gpu"] is None and record["parts"]["device"]["status"] == "skipped"
    assert list(tmp_path.iterdir()) == []
    assert "record: not written to gpu_records/ (no GPU was found)" in capsys.readouterr().out
    with pytest.raises(SystemExit, match=r"unknown part\(s\) \['gpu'\]"):
        gpu_check.main(["--parts", "device,gpu"])

"""`python -m ortlab.benchmarks.gpu_check [--out DIR]`: every GPU check of ortlab in one run, one JSON record.

Made for a lent GPU machine (NVIDIA's CUDA image: torch, Triton, CuPy, cuda-bindings, nvcc; no
onnxruntime, so nothing here imports it). Seven parts, in this order, each in its own process
(forked before any CUDA call, killed when its time budget runs out) so that one failing, hanging
or crashing part does not stop the others:

    device          device facts: name, compute capability, SMs, driver and runtime versions
    cuda_kernels    every ortlab/cuda/kernels/*.cu kernel compiled for the device's arch (ortlab.cuda's
                    NVRTC + ptxas, else nvcc) and run through CuPy, against numpy references
    triton_kernels  the Triton kernels compiled (not interpreted) against their numpy references, and
                    LayerNorm / softmax against the copy peak (ortlab.benchmarks.kernels)
    runtime_api     which runtime calls make the host wait, measured, beside ortlab.cuda.runtime's model
    occupancy       the driver's cuOccupancyMaxActiveBlocksPerMultiprocessor against ortlab.cuda.occupancy
    matmul          fp32, tf32 and bf16 matrix products through torch, TFLOP/s and error against fp64
    engine_eps      ortlab's InferenceSession on small training graphs covering every op of its CUDA EP,
                    run by the CUDA EP and by the Triton EP against the CPU EP alone: which EP ran each
                    node, the Memcpy nodes, each output's error, the time per run (ortlab.benchmarks.gpu_engine)

A part ends "ok" (its result, with any `mismatches` between the GPU and ortlab's reference or
model, and what it could `not run`), "failed" (the error's last line, and the traceback) or "skipped"
(why: an import that failed, or `--dry-run`). The record goes to `gpu_records/<date>_<gpu>.json` (or
`--out DIR`; a run that found no GPU writes only there); a summary is printed. `--dry-run` runs each
part's CPU side (imports, inputs, references, models) and stops before the first device call; its record
is marked `dry_run` and is written only where `--out` says.
"""
import argparse
import dataclasses
import datetime
import json
import multiprocessing
import platform
import re
import time
import traceback
from pathlib import Path

from ortlab.benchmarks import gpu_parts  # noqa: F401 - registers the seven parts, in order
from ortlab.benchmarks.gpu_record import summary
from ortlab.benchmarks.gpu_registry import PARTS, Context, Skip

RECORDS = Path(__file__).resolve().parents[2] / "gpu_records"
FORMAT = 1
TOTAL_BUDGET_S = 420.0  # the parts' budgets (gpu_parts.py says why 7 minutes)


def _jsonable(value):
    """`value` through JSON and back: numpy scalars and arrays, tuples and other objects become plain data."""
    def default(obj):
        if hasattr(obj, "item") and getattr(obj, "ndim", None) == 0:
            return obj.item()
        if hasattr(obj, "tolist"):
            return obj.tolist()
        return str(obj)
    return json.loads(json.dumps(value, default=default))


def _error_line(error):
    text = f"{type(error).__name__}: {error}".strip()
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"


def _outcome(part, context):
    """Run one part in this process: (status, payload) where payload is the result, the reason or the error."""
    try:
        result = _jsonable(part.run(context) or {})
    except Skip as why:
        return "skipped", {"reason": str(why)}
    except ImportError as error:
        return "skipped", {"reason": f"import failed: {_error_line(error)}"}
    except BaseException as error:  # noqa: BLE001 - a part's failure is recorded, never raised
        return "failed", {"error": _error_line(error), "traceback": traceback.format_exc()[-4000:]}
    return "ok", {"result": result}


def _child(part, context, connection):
    status, payload = _outcome(part, context)
    try:
        connection.send((status, json.dumps(payload, default=str)))
    finally:
        connection.close()


def run_part(part, context, budget_s):
    """Run `part` in a forked process given `budget_s` seconds: the record entry
    {status, seconds, budget_s, result | reason | error}. A part still running at its budget is killed
    and recorded as failed; so is one whose process dies (a crash in native code)."""
    if budget_s <= 0:
        return {"status": "skipped", "reason": "no time left in the run's total budget", "budget_s": 0}
    fork = multiprocessing.get_context("fork")
    receive, send = fork.Pipe(duplex=False)
    start = time.monotonic()
    context = dataclasses.replace(context, deadline=start + budget_s)
    process = fork.Process(target=_child, args=(part, context, send))  # not daemonic: a part may fork
    process.start()
    send.close()
    answer = None
    if receive.poll(budget_s):
        try:
            answer = receive.recv()
        except EOFError:
            answer = None
    process.join(timeout=max(0.0, budget_s - (time.monotonic() - start)) + 5)
    if process.is_alive():
        process.kill()
        process.join()
    seconds = round(time.monotonic() - start, 2)
    entry = {"seconds": seconds, "budget_s": budget_s}
    if answer is not None:
        status, payload = answer
        return {"status": status, **json.loads(payload), **entry}
    if seconds >= budget_s:
        return {"status": "failed", "error": f"timed out: still running after its budget of {budget_s:g} s, "
                                             "killed", **entry}
    return {"status": "failed", "error": f"its process died without an answer (exit code {process.exitcode})",
            **entry}


def run_parts(parts, context, total_budget_s=TOTAL_BUDGET_S, runner=run_part, on_done=None):
    """Each part in turn, given min(its budget, what is left of `total_budget_s`): {name: entry}.
    `on_done(name, entry)` is called after each part (the command line prints a progress line)."""
    start, entries = time.monotonic(), {}
    for part in parts:
        left = total_budget_s - (time.monotonic() - start)
        entries[part.name] = {"title": part.title, **runner(part, context, round(min(part.budget_s, left), 1))}
        if on_done:
            on_done(part.name, entries[part.name])
    return entries


def _progress(name, entry):
    why = entry.get("reason") or entry.get("error") or ""
    print(f"[gpu-check] {name}: {entry['status']} in {entry.get('seconds', 0):g} s {why}".rstrip(), flush=True)


def file_name(date, gpu):
    """`<date>_<gpu>.json` with the GPU's name reduced to letters, digits, '.', '_' and '-'."""
    safe = re.sub(r"[^A-Za-z0-9._-]+", "-", gpu or "unknown-gpu").strip("-.") or "unknown-gpu"
    return f"{date[:10]}_{safe}.json"


def build_record(entries, dry_run, now=None):
    """The record: GPU, driver and date on top (from the device part), then every part's entry."""
    now = now or datetime.datetime.now(datetime.timezone.utc)
    facts = entries.get("device", {}).get("result", {})
    return {"format": FORMAT, "what": "ortlab gpu-check record (python -m ortlab.benchmarks.gpu_check)",
            "date": now.strftime("%Y-%m-%dT%H:%M:%SZ"), "dry_run": bool(dry_run),
            "gpu": facts.get("name"), "arch": facts.get("arch"), "driver": facts.get("driver"),
            "cuda_runtime": facts.get("cuda runtime"),
            "host": {"python": platform.python_version(), "machine": platform.machine()},
            "parts": entries}


def write_record(record, folder):
    """Write `record` into `folder` as `<date>_<gpu>.json` (a further run that day: `_2`, `_3`...)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / file_name(record["date"], record["gpu"])
    n = 2
    while path.exists():
        path = folder / file_name(record["date"], record["gpu"]).replace(".json", f"_{n}.json")
        n += 1
    path.write_text(json.dumps(record, indent=1) + "\n")
    return path


def _select(names):
    if not names:
        return list(PARTS.values())
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if n not in PARTS]
    if unknown:
        raise SystemExit(f"unknown part(s) {unknown}; the parts are {list(PARTS)}")
    return [PARTS[n] for n in wanted]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", help=f"folder for the record (default {RECORDS})")
    parser.add_argument("--dry-run", action="store_true",
                        help="every part's CPU side, no device call; the record is written only with --out")
    parser.add_argument("--parts", help=f"comma-separated subset of {list(PARTS)}")
    parser.add_argument("--budget", type=float, default=TOTAL_BUDGET_S, help="total seconds for all parts")
    args = parser.parse_args(argv)
    entries = run_parts(_select(args.parts), Context(dry_run=args.dry_run), args.budget, on_done=_progress)
    record = build_record(entries, args.dry_run)
    path = None
    if args.out or (record["gpu"] and not args.dry_run):
        path = write_record(record, args.out or RECORDS)
    print(summary(record))
    print(f"record: {path}" if path else "record: not written to gpu_records/ "
          + ("(a dry run)" if args.dry_run else "(no GPU was found)") + "; --out DIR writes it anyway")
    return record


if __name__ == "__main__":
    main()

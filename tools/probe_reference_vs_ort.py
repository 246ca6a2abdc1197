"""Probe where onnx.reference and ONNX Runtime's CPU execution provider disagree on ONNX's node tests.

Runs every backend node test case shipped with the onnx package
(``onnx/backend/test/data/node/<case>``) through ONNX Runtime (CPUExecutionProvider, graph
optimisations off) and through ``onnx.reference.ReferenceEvaluator``, compares the two and the
stored expected outputs, and writes ``results.json`` (one row per case) and ``summary.md`` (counts
per class, the differing cases grouped by op with the reason) to the output folder.

    .venv/bin/python tools/probe_reference_vs_ort.py [--out DIR] [--ops Op1,Op2] [--cases PATTERN]

ORT prints its kernel errors (severity 3) on stderr as it goes; each is also recorded in results.json.

Classes: ``agree``, ``differ``, ``ort_fails``, ``ref_fails``, ``both_fail``, ``skipped_domain`` (an op
from a domain other than ai.onnx / ai.onnx.ml), ``skipped_nontensor`` (a sequence or optional
input/output), ``slow`` (a backend took more than 5 s), ``timeout`` (the case was killed).
Cases ORT refuses for their opset (22 is newer than ORT 1.19.2's 21, or no kernel for the node's
version) are retried with the model stamped opset 21, else 20, where no op's attributes or inputs
differ; that retry is reported apart (``retry``) and does not change the class.

Cases run one at a time in a worker process (niced by 10, one ORT thread) that is restarted when
a case overruns its hard limit. ORT's Python binding has no numpy type for bfloat16, float8 or
int4: such inputs are given to ORT as initializers and such outputs read from the OrtValue's raw
buffer.

The cases and their values (probe_cases.py) and the summary with its explanations (probe_summary.py) are
modules of their own beside this one.
"""
from __future__ import annotations

import argparse
import glob
import json
import multiprocessing as mp
import os
import sys
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:  # its sibling modules, also when a test loads this file by its path
    sys.path.insert(0, HERE)

from probe_cases import (  # noqa: E402 (its siblings, found through the path just set)
    ATOL, ORT_MAX_OPSET, RTOL, SPECIAL_TYPES, ai_onnx_opset, case_ops, compare, declared_type, foreign_domains,
    group_op, list_cases, node_test_dir, non_tensor_values, stored_array, type_name, value_from_array,
    value_from_ortvalue, value_from_stored)
from probe_cases import natural  # noqa: E402,F401 (tests/engine/test_engine_backend_cases.py reads it here)
from probe_summary import write_summary  # noqa: E402

SOFT_LIMIT_S = 5.0     # a backend slower than this marks the case `slow`
HARD_LIMIT_S = 30.0    # the worker is killed when one case takes longer than this


# ----------------------------------------------------------------------------------------------
# Running one case (in the worker)
# ----------------------------------------------------------------------------------------------

def load_case_data(case_dir: str, model):
    """Return (inputs, expected) of test_data_set_0: lists of (name, TensorProto, declared type)."""
    import onnx
    data = os.path.join(case_dir, "test_data_set_0")
    init_names = {i.name for i in model.graph.initializer}
    in_names = [i.name for i in model.graph.input if i.name not in init_names]
    inputs, expected = [], []
    for i in range(len(glob.glob(os.path.join(data, "input_*.pb")))):
        t = onnx.load_tensor(os.path.join(data, f"input_{i}.pb"))
        inputs.append((in_names[i], t, declared_type(model, in_names[i]) or t.data_type))
    for i in range(len(glob.glob(os.path.join(data, "output_*.pb")))):
        name = model.graph.output[i].name
        t = onnx.load_tensor(os.path.join(data, f"output_{i}.pb"))
        expected.append((name, t, declared_type(model, name) or t.data_type))
    return inputs, expected


def short_error(exc: BaseException) -> str:
    """Return an exception's type and first meaningful line, at most 300 characters."""
    text = " ".join(t.strip() for t in str(exc).splitlines() if t.strip())
    return f"{type(exc).__name__}: {text}"[:400]


def ort_model_bytes(model, inputs) -> tuple[bytes, list]:
    """Return the model for ORT, special-typed inputs moved into initializers, and the remaining feeds."""
    import onnx
    special = [(n, t, e) for n, t, e in inputs if e in SPECIAL_TYPES]
    if not special:
        return model.SerializeToString(), inputs
    m = onnx.ModelProto()
    m.CopyFrom(model)
    names = {n for n, _, _ in special}
    kept = [i for i in m.graph.input if i.name not in names]
    del m.graph.input[:]
    m.graph.input.extend(kept)
    for name, tensor, elem in special:
        t = m.graph.initializer.add()
        t.CopyFrom(tensor)                  # raw bits; the stored type may be UINT16 for bfloat16
        t.name = name
        t.data_type = elem
    return m.SerializeToString(), [x for x in inputs if x[0] not in names]


def run_ort(model, inputs) -> list:
    """Run a model with ORT's CPU EP, optimisations off, one thread; return (elem, values) per output."""
    import onnxruntime as ort
    from onnx import numpy_helper
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    model_bytes, feeds = ort_model_bytes(model, inputs)
    sess = ort.InferenceSession(model_bytes, so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    if not any(declared_type(model, n) in SPECIAL_TYPES for n in names):
        outs = sess.run(names, {n: numpy_helper.to_array(t) for n, t, _ in feeds})
        return [value_from_array(o) for o in outs]
    ort_feeds = {n: ort.OrtValue.ortvalue_from_numpy(numpy_helper.to_array(t)) for n, t, _ in feeds}
    outs = sess.run_with_ort_values(names, ort_feeds)
    return [value_from_ortvalue(o) for o in outs]


def run_ref(model, inputs) -> list:
    """Run a model with onnx.reference.ReferenceEvaluator; return (elem, values) per output."""
    from onnx.reference import ReferenceEvaluator
    sess = ReferenceEvaluator(model)
    outs = sess.run(None, {n: stored_array(t, e) for n, t, e in inputs})
    return [value_from_array(o) for o in outs]


def timed(fn, *args):
    """Return (result, error string or None, seconds) of calling fn(*args)."""
    start = time.perf_counter()
    try:
        res, err = fn(*args), None
    except Exception as exc:  # noqa: BLE001 - every backend failure is data here
        res, err = None, short_error(exc)
    return res, err, time.perf_counter() - start


def output_rows(names, ort_vals, ref_vals, expected) -> list[dict]:
    """Return one comparison row per output: ORT vs reference, and each against the stored output."""
    rows = []
    for i, name in enumerate(names):
        exp = expected[i] if i < len(expected) else None
        o, r = ort_vals[i], ref_vals[i]
        cmp = compare(o, r)
        rows.append({
            "name": name, "ort_type": type_name(o[0]), "ref_type": type_name(r[0]),
            "ort_shape": list(o[1].shape), "ref_shape": list(getattr(r[1], "shape", ())),
            "expected_type": type_name(exp[0]) if exp else None, **cmp,
            "ort_matches_expected": compare(o, exp)["close"] if exp else None,
            "ref_matches_expected": compare(r, exp)["close"] if exp else None,
            "examples": mismatch_examples(o, r, exp) if not cmp["close"] else []})
    return rows


def mismatch_examples(o, r, exp, count: int = 4) -> list[dict]:
    """Return up to `count` flat positions where ORT and the reference differ, with the three values."""
    import numpy as np
    vo, vr = np.asarray(o[1]), np.asarray(r[1])
    if vo.shape != vr.shape:
        return []
    fo, fr = vo.ravel().tolist(), vr.ravel().tolist()
    ve = np.asarray(exp[1]) if exp is not None else None
    fe = ve.ravel().tolist() if ve is not None and ve.shape == vo.shape else None
    out = []
    for i, (a, b) in enumerate(zip(fo, fr)):
        same = a == b or (isinstance(a, float) and isinstance(b, float) and a != a and b != b)
        if not same and not (isinstance(a, float) and abs(a - b) <= ATOL + RTOL * abs(b)):
            out.append({"index": i, "ort": repr(a), "ref": repr(b), "expected": repr(fe[i]) if fe else None})
            if len(out) == count:
                break
    return out


def who_matches(rows: list[dict]) -> str:
    """Return which backend equals the stored expected outputs: ort, ref, both or neither."""
    ort_ok = all(r["ort_matches_expected"] for r in rows)
    ref_ok = all(r["ref_matches_expected"] for r in rows)
    return {(True, True): "both", (True, False): "ort", (False, True): "ref"}.get((ort_ok, ref_ok), "neither")


def classify(ort_err, ref_err, rows) -> str:
    """Return the class of a case from the two backends' errors and the output comparison."""
    if ort_err and ref_err:
        return "both_fail"
    if ort_err:
        return "ort_fails"
    if ref_err:
        return "ref_fails"
    return "agree" if all(r["close"] for r in rows) else "differ"


def downgrade(model, target: int):
    """Return a copy of a model stamped ai.onnx opset `target`, or None when an op's signature differs there.

    Only the types an op accepts may differ between its definition at the model's opset and at
    `target` (e.g. opset 22 added bfloat16 to many float ops; QLinearMatMul-21 added float16 scales).
    """
    import onnx
    from onnx import defs
    opset = ai_onnx_opset(model)
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        try:
            new = defs.get_schema(node.op_type, opset, "").since_version
            old = defs.get_schema(node.op_type, target, "").since_version
        except Exception:  # noqa: BLE001 - an op unknown at the target opset
            return None
        if new != old and not only_types_changed(node.op_type, old, new):
            return None
    m = onnx.ModelProto()
    m.CopyFrom(model)
    for o in m.opset_import:
        if o.domain in ("", "ai.onnx"):
            o.version = target
    return m


def only_types_changed(op: str, old: int, new: int) -> bool:
    """Return whether an op's schema at `new` has the attributes and inputs of the one at `old`."""
    from onnx import defs
    a, b = defs.get_schema(op, old, ""), defs.get_schema(op, new, "")
    same_attrs = {k: (v.type, v.required) for k, v in a.attributes.items()} == \
        {k: (v.type, v.required) for k, v in b.attributes.items()}
    same_io = [i.name for i in a.inputs] == [i.name for i in b.inputs] and \
        [o.name for o in a.outputs] == [o.name for o in b.outputs]
    return same_attrs and same_io


def probe_case(case_dir: str) -> dict:
    """Run one case through both backends and return its result row."""
    import onnx
    model = onnx.load(os.path.join(case_dir, "model.onnx"))
    row = {"case": os.path.basename(case_dir), "op": group_op(model), "ops": case_ops(model),
           "opset": ai_onnx_opset(model), "nodes": len(model.graph.node)}
    if foreign_domains(model):
        return {**row, "class": "skipped_domain", "note": ",".join(foreign_domains(model))}
    if non_tensor_values(model):
        return {**row, "class": "skipped_nontensor", "note": ",".join(non_tensor_values(model))}
    inputs, expected_protos = load_case_data(case_dir, model)
    expected = [value_from_stored(t, e) for _, t, e in expected_protos]
    ort_vals, ort_err, ort_s = timed(run_ort, model, inputs)
    ref_vals, ref_err, ref_s = timed(run_ref, model, inputs)
    row.update(ort_error=ort_err, ref_error=ref_err, ort_s=round(ort_s, 3), ref_s=round(ref_s, 3),
               input_types=[type_name(e) for _, _, e in inputs])
    if max(ort_s, ref_s) > SOFT_LIMIT_S:
        return {**row, "class": "slow"}
    rows = []
    if not ort_err and not ref_err:
        if len(ort_vals) != len(ref_vals):
            ref_err = f"ref returned {len(ref_vals)} outputs, ORT {len(ort_vals)}"
        else:
            rows = output_rows([o.name for o in model.graph.output], ort_vals, ref_vals, expected)
    row.update({"class": classify(ort_err, ref_err, rows), "outputs": rows})
    if rows:
        row["expected_matches"] = who_matches(rows)
    elif ref_vals is None and ort_vals is not None and expected:
        row["ort_matches_expected"] = all(compare(o, e)["close"] for o, e in zip(ort_vals, expected))
    if should_retry(row):
        row["retry"] = retry_lower_opset(model, inputs, ref_vals, ref_err, expected)
    return row


def should_retry(row: dict) -> bool:
    """Return whether ORT failed for its opset: opset newer than 21, or no kernel for the node's version."""
    err = row.get("ort_error") or ""
    return bool(err) and (row["opset"] > ORT_MAX_OPSET or "Version mismatch" in err
                          or "Could not find an implementation" in err)


def retry_lower_opset(model, inputs, ref_vals, ref_err, expected) -> dict:
    """Run ORT again on the model stamped opset 21 (then 20) and compare with the reference's outputs."""
    last_err = None
    for target in (ORT_MAX_OPSET, ORT_MAX_OPSET - 1):
        lower = downgrade(model, target) if target < ai_onnx_opset(model) else None
        if lower is None:
            continue
        ort_vals, last_err, _ = timed(run_ort, lower, inputs)
        if last_err:
            continue
        rows = []
        if not ref_err and len(ort_vals) == len(ref_vals):
            rows = output_rows([o.name for o in model.graph.output], ort_vals, ref_vals, expected)
        out = {"class": classify(None, ref_err, rows), "opset": target, "outputs": rows}
        if rows:
            out["expected_matches"] = who_matches(rows)
        return out
    return {"class": "ort_fails", "ort_error": last_err,
            "note": "no lower opset (21, 20) with the same op definitions runs in ORT"}


def worker(conn) -> None:
    """Probe the case folders received on a pipe, one at a time, sending back each result row."""
    import warnings
    import onnx.reference  # noqa: F401 - imported before the first case so that it is not timed
    import onnxruntime  # noqa: F401
    warnings.filterwarnings("ignore")
    while True:
        case_dir = conn.recv()
        if case_dir is None:
            return
        try:
            conn.send(probe_case(case_dir))
        except Exception as exc:  # noqa: BLE001 - a harness failure is recorded, not fatal
            conn.send({"case": os.path.basename(case_dir), "class": "harness_error",
                       "note": short_error(exc)})


# ----------------------------------------------------------------------------------------------
# Driving the worker
# ----------------------------------------------------------------------------------------------

class Worker:
    """A worker process that probes cases, restarted after a case overruns the hard limit."""

    def __init__(self):
        self.ctx = mp.get_context("spawn")
        self.proc = None
        self.conn = None

    def start(self) -> None:
        """Start a fresh worker process."""
        self.conn, child = self.ctx.Pipe()
        self.proc = self.ctx.Process(target=worker, args=(child,), daemon=True)
        self.proc.start()

    def probe(self, case_dir: str) -> dict:
        """Return the result row of one case, or a `timeout` row after killing the worker."""
        if self.proc is None or not self.proc.is_alive():
            self.start()
        self.conn.send(case_dir)
        if self.conn.poll(HARD_LIMIT_S):
            try:
                return self.conn.recv()
            except EOFError:
                self.proc = None
                return {"case": os.path.basename(case_dir), "class": "harness_error", "note": "worker died"}
        self.proc.kill()
        self.proc.join()
        self.proc = None
        return {"case": os.path.basename(case_dir), "class": "timeout",
                "note": f"killed after {HARD_LIMIT_S:.0f} s"}

    def stop(self) -> None:
        """Stop the worker process."""
        if self.proc is not None and self.proc.is_alive():
            self.conn.send(None)
            self.proc.join(5)
            if self.proc.is_alive():
                self.proc.kill()


def select_cases(case_dirs: list[str], ops: list[str] | None) -> list[str]:
    """Return the case folders whose model uses one of the given op types (all when ops is None)."""
    if not ops:
        return case_dirs
    import onnx
    wanted = set(ops)
    keep = []
    for d in case_dirs:
        model = onnx.load(os.path.join(d, "model.onnx"), load_external_data=False)
        if wanted & {n.op_type for n in model.graph.node}:
            keep.append(d)
    return keep


def fill_op_for_killed(rows: list[dict]) -> None:
    """Give rows written by the driver (timeouts, harness errors) their op from the model."""
    import onnx
    root = node_test_dir()
    for row in rows:
        if "op" not in row:
            model = onnx.load(os.path.join(root, row["case"], "model.onnx"))
            row.update(op=group_op(model), ops=case_ops(model), opset=ai_onnx_opset(model))



def main(argv=None) -> int:
    """Probe the selected cases and write results.json and summary.md."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="/tmp/probe_ref_ort", help="output folder (default /tmp/probe_ref_ort)")
    ap.add_argument("--ops", default="", help="comma-separated op types: only cases using one of them")
    ap.add_argument("--cases", default="", help="glob on case names, e.g. 'test_cast_*'")
    args = ap.parse_args(argv)
    try:
        os.nice(10)
    except OSError:
        pass
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    ops = [o.strip() for o in args.ops.split(",") if o.strip()] or None
    case_dirs = select_cases(list_cases(args.cases or None), ops)
    os.makedirs(args.out, exist_ok=True)
    start = time.perf_counter()
    w, rows = Worker(), []
    try:
        for i, d in enumerate(case_dirs):
            rows.append(w.probe(d))
            if (i + 1) % 100 == 0:
                print(f"{i + 1}/{len(case_dirs)} cases, {time.perf_counter() - start:.0f} s", flush=True)
    finally:
        w.stop()
    fill_op_for_killed(rows)
    seconds = time.perf_counter() - start
    with open(os.path.join(args.out, "results.json"), "w") as fh:
        json.dump(rows, fh, indent=1, default=str)
    write_summary(rows, os.path.join(args.out, "summary.md"), seconds)
    print(", ".join(f"{k} {v}" for k, v in Counter(r["class"] for r in rows).most_common()))
    print(f"wrote {args.out}/results.json and summary.md in {seconds:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""compare(model): a learner's own model through ortlab and through ORT 1.19.2, side by side, one row per
check: the optimized graph at each level, the gradient graph, the engine's outputs, the memory block.

Each check reuses the package that mirrors ORT: ortlab.transformers (GraphTransformerManager, next to
the graph ORT writes to SessionOptions.optimized_model_filepath and the "GraphTransformer X modified: 1"
lines graph_transformer.cc logs), ortlab.gradients (build_gradient_graph next to ORT's
gradient_graph_builder.cc through ort_gradient_graph), ortlab.engine.InferenceSession next to ORT's
InferenceSession, and ortlab.memory.plan next to the block ORT asks its arena for (bfc_arena.cc's
"Extending BFCArena" line). A top-floor tool: nothing in ortlab imports it.

    python -m ortlab compare MODEL.onnx [--loss NAME --x NAMES] [--dim NAME=N ...] [--json FILE]

Exit code: 0 when every check agrees (or is skipped, with its reason), 1 on any disagreement, 2 on
bad input.
"""
import json
import re
import tempfile
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import helper

from ortlab.errors import OrtlabError, as_names
from ortlab.ir import GraphError, load_model

AGREE, DIFFER, SKIPPED, INFO = "agree", "DIFFER", "skipped", "info"
ORT_LEVELS = (("basic", 1), ("extended", 2), ("all", 2))  # ORT's level, ortlab's closest one
DEFAULT_DIM = 2          # a dim_param's size unless the caller names one
INT_RANGE = (0, 2)       # generated integer feeds: 0 or 1, a valid index on any axis of size >= 2
TOLERANCE = 1e-4         # |a - b| <= TOLERANCE * (1 + |b|): float32 reordering, not a wrong result
FIRST_REGION = 1 << 20   # BFCArena's first region: a block that fits is never logged


class CompareError(OrtlabError):
    """compare() was given something it cannot compare; the message says what to give instead."""


@dataclass
class Row:
    """One check: what was compared, whether the two sides agree, and how they differ (or why skipped)."""

    check: str
    status: str
    detail: str


@dataclass
class Report:
    """compare()'s rows, what it generated, and the exit code they mean."""

    rows: list
    generated: str

    @property
    def exit_code(self):
        """0 when no row differs, else 1 (ORT and ortlab disagree somewhere)."""
        return 1 if any(r.status == DIFFER for r in self.rows) else 0

    def table(self):
        from ortlab.viz import Table
        return Table(("check", "status", "detail"), [(r.check, r.status, r.detail) for r in self.rows])

    def statuses(self):
        """The checks and their status only: what stays the same on every machine (no float values)."""
        from ortlab.viz import Table
        return Table(("check", "status"), [(r.check, r.status) for r in self.rows])

    def differences(self):
        """The rows that differ, with how (a Table; empty when ortlab and ORT agree everywhere)."""
        from ortlab.viz import Table
        return Table(("check", "how they differ"), [(r.check, r.detail) for r in self.rows if r.status == DIFFER])

    def to_json(self):
        return json.dumps({"rows": [asdict(r) for r in self.rows], "generated": self.generated,
                           "exit_code": self.exit_code}, indent=2)

    def __repr__(self):
        return f"{self.table()!r}\n{self.generated}"


# --- inputs ------------------------------------------------------------------------------------

def load(model):
    """An onnx.ModelProto from a ModelProto or a path, checked; a clear CompareError otherwise."""
    if isinstance(model, onnx.ModelProto):
        return model
    if not isinstance(model, (str, Path)):
        raise CompareError(f"compare() takes an onnx.ModelProto or a path to a .onnx file, not "
                           f"{type(model).__name__}")
    try:
        loaded = load_model(model)
    except GraphError as exc:  # a missing file, a folder, not a model, missing external data
        raise CompareError(str(exc)) from None
    if not loaded.graph.node:
        raise CompareError(f"{model} holds no graph nodes: is it an ONNX model?")
    return loaded


def check_ort_loads(model):
    """ORT 1.19.2 must load the model (optimizations off): else there is nothing to compare with."""
    from ortlab import session

    try:
        session.create(model, session.session_options("disable"), ["CPUExecutionProvider"])
    except OrtlabError as exc:
        raise CompareError(f"ORT 1.19.2 cannot load this model, so there is nothing to compare with: "
                           f"{_why(exc)}") from None


def check_gradient_names(model, loss, x):
    """loss must be a graph output, every x an initializer (the weights a learner trains)."""
    if loss is None and x is None:
        return None, None
    if loss is None or x is None:
        raise CompareError("the gradient check needs both a loss (--loss NAME) and the x's (--x NAMES)")
    if not isinstance(loss, str):
        raise CompareError(f"loss must be a value name (str), not {type(loss).__name__}")
    xs = [n.strip() for n in x.split(",")] if isinstance(x, str) else as_names(x, "x", CompareError)
    outputs = [o.name for o in model.graph.output]
    if loss not in outputs:
        raise CompareError(f"the loss {loss!r} is not an output of the graph; its outputs are {outputs}")
    inits = {t.name for t in model.graph.initializer}
    bad = [n for n in xs if n not in inits]
    if bad or not xs:
        raise CompareError(f"x {bad[0] if bad else ''!r} is not an initializer of the graph; initializers: "
                           f"{sorted(inits)[:10]}")
    return loss, xs


def generate_feeds(model, dims=None, seed=0):
    """Seeded feeds for the graph inputs that are not initializers: floats standard normal, integers in
    [0, 2), bools random; a dim_param (or unknown dim) takes dims[name] or 2. Returns (feeds, note)."""
    dims = dict(dims or {})
    rng = np.random.default_rng(seed)
    inits = {t.name for t in model.graph.initializer}
    feeds, chosen = {}, {}
    for vi in model.graph.input:
        if vi.name in inits:
            continue
        if not vi.type.HasField("tensor_type"):
            raise CompareError(f"input {vi.name!r} is not a tensor; compare() generates tensor feeds only")
        shape = []
        for d in vi.type.tensor_type.shape.dim:
            if d.HasField("dim_value"):
                shape.append(d.dim_value)
            else:
                key = d.dim_param or f"{vi.name}[{len(shape)}]"
                shape.append(int(dims.get(key, DEFAULT_DIM)))
                chosen[key] = shape[-1]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        if np.issubdtype(dtype, np.floating):
            feeds[vi.name] = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            feeds[vi.name] = rng.integers(0, 2, shape).astype(bool)
        else:
            feeds[vi.name] = rng.integers(*INT_RANGE, shape).astype(dtype)
    listed = ", ".join(f"{n} {a.dtype}{list(a.shape)}" for n, a in feeds.items())
    note = "generated feeds (seeded; floats normal, integers 0 or 1): " + (listed or "none")
    if chosen:
        note += "; dynamic dims chosen: " + ", ".join(f"{k}={v}" for k, v in chosen.items())
    return feeds, note


def _max_diff(a, b):
    """(largest |a - b|, within tolerance) for two arrays; shapes or dtypes that differ never agree."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return float("inf"), False
    if a.size == 0:
        return 0.0, True
    if not np.issubdtype(a.dtype, np.number):
        return (0.0, True) if np.array_equal(a, b) else (float("inf"), False)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    same_nan = np.isnan(a64) == np.isnan(b64)
    gap = np.abs(np.where(np.isnan(a64), 0, a64) - np.where(np.isnan(b64), 0, b64))
    ok = bool(same_nan.all() and np.all(gap <= TOLERANCE * (1 + np.abs(np.nan_to_num(b64)))))
    return float(gap.max()), ok


def _why(exc):
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__


# --- 1. the optimized graph ----------------------------------------------------------------------

def ort_optimized(model, level):
    """ORT's optimized graph at `level` ('basic', 'extended', 'all') on the CPU EP, and the transformers
    that logged "modified: 1" while making it (graph_transformer.cc, verbose)."""
    from ortlab import session

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "optimized.onnx"
        lines = session.initialization_log(model, 0, ["CPUExecutionProvider"], level=level,
                                           optimized_model_filepath=str(path))
        optimized = onnx.load(str(path))
    fired = Counter(m.group(1) for line in lines if (m := re.search(r"GraphTransformer (\S+) modified: 1", line)))
    return optimized, fired


def ortlab_optimized(model, level):
    """ortlab's optimized graph at `level` (1, 2), the rules and transformers that fired, and the
    reasons its rules declined ({reason: count}, last step)."""
    from ortlab.transformers.manager import GraphTransformerManager

    manager = GraphTransformerManager.from_registry(level, providers=["CPUExecutionProvider"])
    optimized = manager.optimize(model)
    fired = {k: v for k, v in manager.fire_counts().items() if v}
    declined = Counter(f"{r[0]}: {r[2]}" for r in manager.declined().rows)
    return optimized, fired, declined


def _op_counts(model):
    from ortlab.walkthroughs.graph_transformers import op_counts
    return op_counts(model)


def graph_rows(model):
    """One row per ORT level: op counts of ortlab's level next to ORT's, what fired, why rules declined."""
    rows = []
    for ort_level, level in ORT_LEVELS:
        check = f"graph: ORT {ort_level} vs ortlab level {level}"
        try:
            theirs, ort_fired = ort_optimized(model, ort_level)
        except OrtlabError as exc:
            rows.append(Row(check, DIFFER, f"ORT cannot optimize it: {_why(exc)}"))
            continue
        try:
            ours, our_fired, declined = ortlab_optimized(model, level)
        except OrtlabError as exc:
            rows.append(Row(check, DIFFER, f"ortlab cannot optimize it: {_why(exc)}"))
            continue
        a, b = _op_counts(ours), _op_counts(theirs)
        diff = [f"{op} {a.get(op, 0)} vs {b.get(op, 0)}" for op in sorted(set(a) | set(b))
                if a.get(op, 0) != b.get(op, 0)]
        detail = [f"same op counts ({len(ours.graph.node)} nodes)" if not diff else
                  f"op counts ortlab vs ORT: {'; '.join(diff)}",
                  "ortlab fired: " + (", ".join(f"{k} x{v}" for k, v in our_fired.items()) or "none"),
                  "ORT fired: " + (", ".join(f"{k} x{v}" for k, v in ort_fired.items()) or "none")]
        if declined:
            detail.append("ortlab declined: " + "; ".join(f"{k}" + (f" (x{v})" if v > 1 else "")
                                                          for k, v in list(declined.items())[:6]))
        rows.append(Row(check, DIFFER if diff else AGREE, " | ".join(detail)))
    return rows


# --- 2. gradients --------------------------------------------------------------------------------

def gradient_rows(model, loss, xs, feeds):
    """ortlab's gradient graph next to ORT's: gradient node counts, then max |difference| per x when ORT
    runs both on the same feeds."""
    from ortlab.walkthroughs.per_op_gradients import gradient_nodes
    from ortlab.gradients.graph_builder import build_gradient_graph
    from ortlab.gradients.ort import ort_gradient_graph
    from ortlab.session import run_model

    check = f"gradients of {loss}"
    try:
        theirs = ort_gradient_graph(model, xs, loss)
    except OrtlabError as exc:
        theirs = exc
    try:
        ours = build_gradient_graph(model, xs, loss)
    except OrtlabError as exc:
        ours = exc
    if isinstance(ours, Exception) or isinstance(theirs, Exception):
        if isinstance(ours, Exception) and isinstance(theirs, Exception):
            return [Row(check, AGREE, f"both refuse: ortlab: {_why(ours)} | ORT: {_why(theirs)}")]
        who, exc = ("ortlab", ours) if isinstance(ours, Exception) else ("ORT", theirs)
        return [Row(check, DIFFER, f"only {who} refuses: {_why(exc)}")]
    n_ours, n_theirs = len(gradient_nodes(ours, model)), len(gradient_nodes(theirs, model))
    rows = [Row(f"{check}: graph", INFO, f"gradient nodes: ortlab {n_ours}, ORT {n_theirs} (counts differ by "
                                          "builder design; values below decide)")]
    try:
        a, b = run_model(ours, feeds), run_model(theirs, feeds)
    except OrtlabError as exc:
        return rows + [Row(f"{check}: values", DIFFER, f"a gradient graph does not run in ORT: {_why(exc)}")]
    for x in xs:
        name = f"{x}_grad"
        if name not in a or name not in b:
            rows.append(Row(f"{check}: d/d{x}", DIFFER, f"{name} missing from {'ortlab' if name not in a else 'ORT'}"))
            continue
        gap, ok = _max_diff(a[name], b[name])
        rows.append(Row(f"{check}: d/d{x}", AGREE if ok else DIFFER, f"max |ortlab - ORT| = {gap:.2g}"))
    return rows


# --- 3. the engine -------------------------------------------------------------------------------

def engine_rows(model, feeds):
    """ortlab.engine.InferenceSession's outputs next to ORT's InferenceSession's, same feeds."""
    from ortlab.engine import InferenceSession
    from ortlab.session import run_model

    try:
        theirs = run_model(model, feeds)
    except OrtlabError as exc:
        return [Row("engine outputs", DIFFER, f"ORT cannot run it: {_why(exc)}")]
    try:
        session = InferenceSession(model)
        names = [o.name for o in model.graph.output]
        ours = dict(zip(names, session.run(names, feeds)))
    except OrtlabError as exc:
        return [Row("engine outputs", DIFFER, f"ortlab's engine cannot run it: {_why(exc)}")]
    rows = []
    for name, ref in theirs.items():
        gap, ok = _max_diff(ours[name], ref)
        rows.append(Row(f"engine output {name}", AGREE if ok else DIFFER,
                        f"max |engine - ORT| = {gap:.2g}, shape {list(np.shape(ref))} {np.asarray(ref).dtype}"))
    return rows


# --- 4. memory -----------------------------------------------------------------------------------

def memory_rows(model, feeds):
    """ortlab.memory.plan's memory-pattern block next to the one ORT logs requesting on its first run."""
    from ortlab.memory import plan
    from ortlab.walkthroughs.memory_recompute import ort_block

    check = "memory block"
    try:
        predicted = plan(model, feeds).peak_bytes
    except OrtlabError as exc:
        return [Row(check, SKIPPED, f"ortlab.memory cannot plan it: {_why(exc)}")]
    if predicted < FIRST_REGION:
        return [Row(check, SKIPPED, f"predicted {predicted:,} B fits ORT's first 1 MiB arena region, "
                                    "which ORT never logs: nothing to compare (feed larger dims)")]
    theirs = ort_block(model, feeds)
    if theirs is None:
        return [Row(check, DIFFER, f"predicted {predicted:,} B, but ORT logged no arena request")]
    return [Row(check, AGREE if theirs == predicted else DIFFER,
                f"predicted {predicted:,} B, ORT requested {theirs:,} B")]


# --- all of it -----------------------------------------------------------------------------------

def compare(model, loss=None, x=None, feeds=None, dims=None, seed=0):
    """Every check of `model` (a ModelProto or a .onnx path) through ortlab and ORT; a Report.

    loss, x: a graph output and the initializers (a list, or one comma-separated str) to differentiate;
    without them the gradient check is skipped. feeds: {input: array} (generated, seeded, when None);
    dims: {dim_param: size} for the generated feeds.
    """
    model = load(model)
    check_ort_loads(model)
    loss, xs = check_gradient_names(model, loss, x)
    if feeds is None:
        feeds, note = generate_feeds(model, dims, seed)
    else:
        if not isinstance(feeds, dict):
            raise CompareError(f"feeds must be a dict {{input name: array}}, not {type(feeds).__name__}")
        wanted = set(generate_feeds(model, dims, seed)[0])
        if set(feeds) != wanted:
            raise CompareError(f"feeds must name exactly the graph inputs {sorted(wanted)}; got {sorted(feeds)}")
        feeds = {n: np.asarray(a) for n, a in feeds.items()}
        note = "feeds given by the caller"
    rows = graph_rows(model)
    if loss is None:
        rows.append(Row("gradients", SKIPPED, "no --loss/--x given"))
    else:
        rows += gradient_rows(model, loss, xs, feeds)
    rows += engine_rows(model, feeds)
    rows += memory_rows(model, feeds)
    return Report(rows, note)


def parse_dims(items):
    """['N=8', 'seq=4'] -> {'N': 8, 'seq': 4}."""
    dims = {}
    for item in items or ():
        name, _, value = item.partition("=")
        if not name or not value.isdigit():
            raise CompareError(f"--dim takes NAME=N (a dim_param and a size), got {item!r}")
        dims[name] = int(value)
    return dims


def main(argv):
    """The `python -m ortlab compare` command: prints the table; returns the exit code."""
    import argparse
    import sys

    parser = argparse.ArgumentParser(prog="python -m ortlab compare",
                                     description="Compare ortlab with ORT 1.19.2 on one ONNX model.")
    parser.add_argument("model", help="path to a .onnx file")
    parser.add_argument("--loss", help="a graph output to differentiate")
    parser.add_argument("--x", help="comma-separated initializer names to differentiate with respect to")
    parser.add_argument("--dim", action="append", help="NAME=N: the size of a dynamic dim (default 2)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated feeds")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE ('-': stdout)")
    args = parser.parse_args(argv)
    try:
        report = compare(args.model, args.loss, args.x, dims=parse_dims(args.dim), seed=args.seed)
    except OrtlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if args.json == "-":
        print(report.to_json())
    else:
        print(report)
        if args.json:
            Path(args.json).write_text(report.to_json())
    return report.exit_code

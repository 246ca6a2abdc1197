"""compare(model): a learner's own model through ortlab and through ORT 1.19.2, side by side, one row per
check: the optimized graph at each level, the gradient graph, the engine's outputs, the memory block.

Each check reuses the package that mirrors ORT: ortlab.transformers (GraphTransformerManager, next to
the graph ORT writes to SessionOptions.optimized_model_filepath and the "GraphTransformer X modified: 1"
lines graph_transformer.cc logs), ortlab.gradients (build_gradient_graph next to ORT's
gradient_graph_builder.cc through ort_gradient_graph), ortlab.engine.InferenceSession next to ORT's
InferenceSession, and ortlab.memory.plan next to the block ORT asks its arena for (bfc_arena.cc's
"Extending BFCArena" line). A top-floor tool: nothing in ortlab imports it.

ORT runs in a child process (ortlab.compare.ort_child), so that a kernel that traps (SIGFPE on an integer
division by zero) or hangs ends the comparison with a message, not the caller's process. The feeds are
generated (ortlab.compare.feeds) after the options are checked against the model: a --dim names one of
its dynamic dimensions, the feeds fit in memory, the seed is numpy's.

    python -m ortlab compare MODEL.onnx [--loss NAME --x NAMES] [--dim NAME=N ...] [--seed N] [--timeout S]
        [--json FILE]

Exit code: 0 when every check agrees (or is skipped, with its reason), 1 on any disagreement, 2 on
bad input (one line on stderr), ORT dying or hanging included.
"""
import argparse
import os
import stat
import sys
from pathlib import Path

import numpy as np
import onnx

from ortlab.compare import ort_child
from ortlab.compare.checks import engine_rows, gradient_rows, graph_rows, memory_rows
from ortlab.compare.feeds import (DEFAULT_DIM, INT_RANGE, check_dims, check_seed, dynamic_dims, generate_feeds,
                                  graph_inputs)
from ortlab.compare.ort_child import OrtDied
from ortlab.compare.report import AGREE, DIFFER, INFO, SKIPPED, CompareError, Report, Row, why
from ortlab.errors import OrtlabError, as_names
from ortlab.ir import GraphError, load_model

__all__ = ["AGREE", "DEFAULT_DIM", "DIFFER", "INFO", "INT_RANGE", "SKIPPED", "CompareError", "OrtDied", "Report",
           "Row", "compare", "dynamic_dims", "generate_feeds", "main", "parse_dims"]


# --- inputs ------------------------------------------------------------------------------------

def load(model):
    """An onnx.ModelProto from a ModelProto or a path, checked; a clear CompareError otherwise."""
    if isinstance(model, onnx.ModelProto):
        loaded = model
    elif not isinstance(model, (str, Path)):
        raise CompareError(f"compare() takes an onnx.ModelProto or a path to a .onnx file, not "
                           f"{type(model).__name__}")
    else:
        _check_path(model)
        try:
            loaded = load_model(model)
        except GraphError as exc:  # a missing file, a folder, not a model, missing external data
            raise CompareError(str(exc)) from None
    if not loaded.graph.output:  # an empty file parses as an empty ModelProto
        where = model if isinstance(model, (str, Path)) else "the model"
        raise CompareError(f"{where} declares no graph outputs, so there is nothing to compare: is it an ONNX "
                           "model?")
    return loaded


def _check_path(path):
    """A path that names nothing, or something that is neither a file nor a folder, said plainly."""
    if not str(path).strip():
        raise CompareError("no model path given: name a .onnx file")
    path = Path(path)
    if path.exists() and not path.is_file() and not path.is_dir():
        raise CompareError(f"{path} is not a plain file (a pipe, a device, a socket...): give a .onnx file")


def check_ort_loads(model):
    """ORT 1.19.2 must load the model (optimizations off): else there is nothing to compare with."""
    try:
        ort_child.in_child("loading the model", ort_child.ort_loads, model)
    except OrtDied:
        raise
    except OrtlabError as exc:
        raise CompareError(f"ORT 1.19.2 cannot load this model, so there is nothing to compare with: "
                           f"{why(exc)}") from None


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


def given_feeds(model, feeds):
    """The caller's feeds, checked: a dict naming exactly the graph inputs."""
    if not isinstance(feeds, dict):
        raise CompareError(f"feeds must be a dict {{input name: array}}, not {type(feeds).__name__}")
    wanted = {vi.name for vi in graph_inputs(model)}
    if set(feeds) != wanted:
        raise CompareError(f"feeds must name exactly the graph inputs {sorted(wanted)}; got {sorted(feeds)}")
    return {n: np.asarray(a) for n, a in feeds.items()}, "feeds given by the caller"


# --- all of it -----------------------------------------------------------------------------------

def compare(model, loss=None, x=None, feeds=None, dims=None, seed=0, timeout=None):
    """Every check of `model` (a ModelProto or a .onnx path) through ortlab and ORT; a Report.

    loss, x: a graph output and the initializers (a list, or one comma-separated str) to differentiate;
    without them the gradient check is skipped. feeds: {input: array} (generated, seeded, when None);
    dims: {dynamic dimension: size} for the generated feeds, each one of the model's dim_params (or
    'input[axis]' for a dynamic dimension without a name). timeout: seconds each ORT call (and the engine's
    run) may take, 600 by default; ORT dying or running longer raises OrtDied.
    """
    limit = ort_child.TIMEOUT_S.set(ort_child.check_timeout(timeout))
    try:
        return _compare(model, loss, x, feeds, dims, seed)
    finally:
        ort_child.TIMEOUT_S.reset(limit)


def _compare(model, loss, x, feeds, dims, seed):
    model = load(model)
    dims, seed = check_dims(model, dims), check_seed(seed)
    loss, xs = check_gradient_names(model, loss, x)
    feeds, note = generate_feeds(model, dims, seed) if feeds is None else given_feeds(model, feeds)
    check_ort_loads(model)
    rows = graph_rows(model)
    if loss is None:
        rows.append(Row("gradients", SKIPPED, "no --loss/--x given"))
    else:
        rows += gradient_rows(model, loss, xs, feeds)
    rows += engine_rows(model, feeds)
    rows += memory_rows(model, feeds)
    return Report(rows, note)


# --- the command line ----------------------------------------------------------------------------

def parse_dims(items):
    """['N=8', 'seq=4'] -> {'N': 8, 'seq': 4}; a malformed or repeated one is a CompareError."""
    dims = {}
    for item in items or ():
        name, _, value = (part.strip() for part in item.partition("="))
        if not name or not value.isdecimal():
            raise CompareError(f"--dim takes NAME=N (a dynamic dimension's name and a size of 0 or more), "
                               f"got {item!r}")
        if name in dims:
            raise CompareError(f"--dim {name} is given twice ({dims[name]} and {int(value)}): give it once")
        dims[name] = int(value)
    return dims


def check_json_target(path):
    """--json FILE: '-' (stdout) or a file that can be written, checked before the run (a plain file is
    created and removed again when it did not exist)."""
    if path is None or path == "-":
        return path
    if not path.strip():
        raise CompareError("--json needs a file name (or '-' for stdout)")
    target = Path(path)
    if target.is_dir():
        raise CompareError(f"--json {path} is a folder: give the name of a file to write")
    if target.exists() and not target.is_file():
        if stat.S_ISCHR(target.stat().st_mode) and os.access(target, os.W_OK):
            return path  # /dev/stdout, /dev/null
        raise CompareError(f"--json {path} is not a plain file (a pipe, a socket...): give a file to write")
    existed = target.exists()
    try:
        with open(target, "a"):
            pass
    except OSError as exc:
        raise CompareError(f"--json {path} cannot be written ({exc.strerror or type(exc).__name__}): give a "
                           "file in a folder that exists and that you may write to") from None
    if not existed:
        target.unlink()
    return path


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (and exit code 2, as any bad input)."""

    def error(self, message):
        self.exit(2, f"error: {message} (python -m ortlab compare --help: the options)\n")


def _parser():
    parser = _Parser(prog="python -m ortlab compare",
                                     description="Compare ortlab with ORT 1.19.2 on one ONNX model.")
    parser.add_argument("model", help="path to a .onnx file")
    parser.add_argument("--loss", help="a graph output to differentiate")
    parser.add_argument("--x", help="comma-separated initializer names to differentiate with respect to")
    parser.add_argument("--dim", action="append",
                        help=f"NAME=N: the size of one of the model's dynamic dims (default {DEFAULT_DIM})")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated feeds (0 or more)")
    parser.add_argument("--timeout", type=float, metavar="SECONDS",
                        help=f"stop ORT (or the engine) after this long on one call "
                             f"(default {ort_child.ORT_TIMEOUT_S})")
    parser.add_argument("--json", metavar="FILE", help="also write the rows as JSON to FILE ('-': stdout)")
    return parser


def main(argv):
    """The `python -m ortlab compare` command: prints the table; returns the exit code."""
    args = _parser().parse_args(argv)
    try:
        ort_child.check_timeout(args.timeout)
        json_target = check_json_target(args.json)
        report = compare(args.model, args.loss, args.x, dims=parse_dims(args.dim), seed=args.seed,
                         timeout=args.timeout)
    except OrtlabError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if json_target == "-":
        print(report.to_json())
        return report.exit_code
    print(report)
    if json_target:
        try:
            Path(json_target).write_text(report.to_json())
        except OSError as exc:
            print(f"error: --json {json_target} could not be written ({exc.strerror or type(exc).__name__})",
                  file=sys.stderr)
            return 2
    return report.exit_code

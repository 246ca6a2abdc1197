"""Looking inside onnxruntime.InferenceSession: its initialization log, its optimized graph,
its execution order, and one-node runs.

Mirrors what onnxruntime/core/session/inference_session.h/.cc does in Load(),
Initialize() and Run(), observed through the real session (onnxruntime 1.19.2,
training build) rather than re-implemented.
"""
import difflib
import json
import os
import re
import tempfile
from pathlib import Path

import numpy as np
import onnx

from ortlab.capture import captured_lines
from ortlab.env import providers as default_providers
from ortlab.env import quiet_import
from ortlab.errors import OrtlabError
from ortlab.ir.model_load import missing_external_data
from ortlab.onnx_defs import DEFAULT_OPSET, one_node_model

ort = quiet_import("onnxruntime")

LEVELS = {"disable": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
          "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC,
          "extended": ort.GraphOptimizationLevel.ORT_ENABLE_EXTENDED,
          "all": ort.GraphOptimizationLevel.ORT_ENABLE_ALL}
ORDERS = {"default": ort.ExecutionOrder.DEFAULT, "priority": ort.ExecutionOrder.PRIORITY_BASED}
_LOG_PREFIX = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d+ ")


class SessionError(OrtlabError):
    """ORT refused a model or an option; the message carries ORT's own reason."""


def session_options(level="all", order="default", **options):
    """SessionOptions from plain values: level in LEVELS, order in ORDERS, other attributes as given.

    Logging defaults to errors only (log_severity_level=3): ORT's warnings go to the
    process's stderr, which Jupyter shows in whichever cell happens to be running.
    """
    if level not in LEVELS or order not in ORDERS:
        raise OrtlabError(f"level must be one of {list(LEVELS)} and order one of {list(ORDERS)}; "
                          f"got level={level!r}, order={order!r}")
    so = ort.SessionOptions()
    so.graph_optimization_level, so.execution_order = LEVELS[level], ORDERS[order]
    so.log_severity_level = 3
    for name, value in options.items():
        if not hasattr(so, name):
            raise OrtlabError(f"SessionOptions has no option {name!r}")
        try:
            setattr(so, name, value)
        except TypeError:
            wanted = type(getattr(so, name)).__name__
            raise OrtlabError(f"SessionOptions.{name} takes a {wanted}, not {type(value).__name__} "
                              f"{value!r}") from None
    return so


def create(model, options=None, providers=None):
    """An InferenceSession for a ModelProto or path, with ORT's error turned into a SessionError."""
    data = _model_source(model)
    providers = None if providers is None else check_providers(providers)
    try:
        return ort.InferenceSession(data, options or session_options(),
                                    providers=providers or default_providers())
    except Exception as exc:
        raise SessionError(f"onnxruntime could not load the model: {exc}".splitlines()[0]) from None


def check_providers(providers, error=SessionError):
    """Provider names checked against ORT's, as a list (one str is one name; (name, options) pairs
    are kept): a typo would otherwise make ORT fall back to the CPU EP silently. The one check for
    sessions, the transformer manager and MiniORTModule."""
    if isinstance(providers, str):
        providers = [providers]
    if not isinstance(providers, (list, tuple)) or not providers:
        raise error(f"providers must be a list of execution provider names, e.g. "
                    f"['CPUExecutionProvider'], not {providers!r}")
    known = ort.get_all_providers()
    for p in providers:
        name = p[0] if isinstance(p, tuple) and p else p
        if name not in known:
            close = difflib.get_close_matches(str(name), known, n=1, cutoff=0.6)
            raise error(f"unknown execution provider {name!r}{f' (did you mean {close[0]!r}?)' if close else ''}; "
                        f"ORT's are {', '.join(known)} (available here: {', '.join(ort.get_available_providers())})")
    return list(providers)


def run_session(session, fetches, feeds):
    """session.run with the feeds checked by name and ORT's run-time errors as a SessionError."""
    if not isinstance(feeds, dict):
        raise SessionError(f"feeds must be a dict {{input name: array}}, not {type(feeds).__name__}")
    inputs = session.get_inputs()
    missing = [i.name for i in inputs if i.name not in feeds]
    if missing:
        expected = ", ".join(f"{i.name} {i.type}{i.shape}" for i in inputs)
        raise SessionError(f"the feeds lack {missing}; the model's inputs are: {expected}")
    try:
        return session.run(fetches, feeds)
    except Exception as exc:
        text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        expected = ", ".join(f"{i.name} {i.type}{i.shape}" for i in inputs)
        got = ", ".join(f"{n} {getattr(v, 'dtype', type(v).__name__)}{list(np.shape(v))}" for n, v in feeds.items())
        raise SessionError(f"onnxruntime could not run the model: {text} (the model's inputs: {expected}; "
                           f"fed: {got})") from None


def _model_source(model):
    """What InferenceSession takes: serialized bytes, or a path checked first (the file and any
    external-data file it refers to exist), so that a missing file is named plainly."""
    if isinstance(model, onnx.ModelProto):
        return model.SerializeToString()
    if isinstance(model, bytes):
        return model
    if not isinstance(model, (str, Path)):
        raise SessionError(f"a session needs an onnx.ModelProto, a path to a .onnx file or serialized "
                           f"bytes, not {type(model).__name__}")
    path = Path(model)
    if not path.is_file():
        raise SessionError(f"{path}: no such model file")
    try:
        header = onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # protobuf's DecodeError: not an ONNX model at all
        raise SessionError(f"{path} is not an ONNX model (it does not parse as a ModelProto: "
                           f"{type(exc).__name__}); is it the right file?") from None
    missing = missing_external_data(header, path.parent)
    if missing:
        tensor, file = missing[0]
        raise SessionError(f"{path}: the data of initializer '{tensor}' is stored outside the model in "
                           f"{file}, which does not exist; put that file next to the model or save the "
                           "model again with its weights inside")
    return str(path)


def initialization_log(model, severity=0, providers=None, **options):
    """The lines ORT logs while creating a session (0 = verbose), timestamps removed.

    ORT writes its log from C++ to stderr, outside Python's sys.stderr, so the
    lines are captured at the file-descriptor level.
    """
    so = session_options(**options)
    so.log_severity_level, so.log_verbosity_level = severity, 0
    with captured_lines(fds=(2,), python=False, clean=lambda line: _LOG_PREFIX.sub("", line.rstrip())) as lines:
        create(model, so, providers)
    return lines


def grep(lines, *words):
    """The lines that contain every one of `words`."""
    return [line for line in lines if all(w in line for w in words)]


def optimized_model(model, level="all", providers=None, **options):
    """The graph ORT runs after its transformers at `level` (SessionOptions.optimized_model_filepath).

    The EPs matter: some fusions exist only for CUDA (BiasSoftmax, BiasDropout).
    """
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "optimized.onnx"
        create(model, session_options(level, optimized_model_filepath=str(path), **options), providers)
        return onnx.load(str(path))


def profile(model, feeds, runs=1, fetches=None, run_options=None, providers=None, **options):
    """Run with ORT's profiler on; return its Chrome-trace events (a list of dicts)."""
    with tempfile.TemporaryDirectory() as tmp:
        so = session_options(enable_profiling=True, profile_file_prefix=os.path.join(tmp, "p"), **options)
        session = create(model, so, providers)
        for _ in range(runs):
            session.run(fetches, feeds, run_options)
        with open(session.end_profiling()) as f:
            return json.load(f)


def kernel_events(events):
    """The profiler's per-node kernel events, in the order the nodes ran."""
    return [e for e in events if e.get("cat") == "Node" and e["name"].endswith("_kernel_time")]


def execution_order(model, feeds, order="default", level="disable", **kwargs):
    """Node names in the order ORT's SequentialExecutor ran them, read from its profiler."""
    events = profile(model, feeds, order=order, level=level, **kwargs)
    return [e["name"][: -len("_kernel_time")] for e in kernel_events(events)]


def run_model(model, feeds, providers=("CPUExecutionProvider",), level="disable"):
    """Run a model once, with graph optimizations off unless `level` says otherwise
    ("basic", "extended", "all"); returns {output name: array}. ortlab's one way to ask ORT
    for a model's outputs by name."""
    session = create(model, session_options(level), list(providers))
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, run_session(session, names, feeds)))


def run_node(op_type, inputs, attributes=None, domain="", opset=DEFAULT_OPSET, outputs=1):
    """Run one op in ORT on numpy inputs (an OpTester in miniature); returns the output arrays.

    Mirrors the idea of onnxruntime/test/providers/op_tester.h: a one-node model
    built from the inputs' types (ortlab.onnx_defs.one_node_model; an input given as None is
    an omitted optional input), run in a session of its own.
    """
    model = one_node_model(op_type, inputs, attributes, domain, opset, outputs, prefixes=("in", "out"),
                           name=op_type)
    feeds = {f"in{i}": np.asarray(a) for i, a in enumerate(inputs) if a is not None}
    return list(run_model(model, feeds).values())


def node_outputs(model, feeds, providers=("CPUExecutionProvider",)):
    """Every node's outputs, computed in one run: [(node name, op type, output name, array)] in graph order.

    A release build of ORT cannot dump node inputs and outputs (that needs a build with
    onnxruntime_DEBUG_NODE_INPUTS_OUTPUTS, see onnxruntime/core/framework/
    debug_node_inputs_outputs_utils.cc); making every value a graph output, with the graph
    optimizations off so that every value still exists, shows the same numbers.
    """
    model = onnx.ModelProto.FromString(model.SerializeToString())
    present = {o.name for o in model.graph.output}
    produced = [(n, o) for n in model.graph.node for o in n.output if o]
    model.graph.output.extend(onnx.ValueInfoProto(name=o) for _, o in produced if o not in present)
    values = run_model(model, feeds, providers)
    return [(n.name or "(no name)", n.op_type, o, values[o]) for n, o in produced]


def first_non_finite(model, feeds):
    """The first node (in graph order) whose output holds a NaN or an inf, as (node, op, output), or None."""
    for node, op, output, value in node_outputs(model, feeds):
        if np.asarray(value).dtype.kind == "f" and not np.all(np.isfinite(value)):
            return node, op, output
    return None

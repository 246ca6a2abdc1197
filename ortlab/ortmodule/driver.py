"""Driving the real ORTModule (onnxruntime-training 1.19.2) from a notebook: its variables,
its logs, the graphs it dumps, and its fallback to PyTorch.

ORTModule lives in orttraining/orttraining/python/training/ortmodule/ (ortmodule.py; its
options in options.py, the ORTMODULE_* variables in options.py's _RuntimeOptions, the dump
names in _graph_execution_manager.py). Its Python logger writes through the root logger, its
C++ core straight to file descriptors 1 and 2; `captured_logs` collects both.
"""
import ast
import contextlib
import copy
import gc
import re
import tempfile
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

import onnx
import torch

from ortlab.capture import captured_lines
from ortlab.env import quiet_import
from ortlab.errors import OrtlabError
from ortlab.patch import environment
from ortlab.onnx_defs import op_counts
from ortlab.training.loop import train as torch_train
from ortlab.viz import Table

# What ORTModule writes with DebugOptions(save_onnx=True), in the order it makes them.
DUMPS = ("torch_exported", "post_processed", "optimized_pre_grad", "optimized", "execution_model")
LOG_LEVELS = ("VERBOSE", "DEVINFO", "INFO", "WARNING", "ERROR", "FATAL")
_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_STAMP = re.compile(r"^(\s*)\d{4}-\d\d-\d\d \d\d:\d\d:\d\d[.,]\d+ ")

# ORTModule imports torch.utils.cpp_extension, which prints "No CUDA runtime is found, using CUDA_HOME=..."
# on a machine with a CUDA toolkit and no GPU: noise on every notebook that trains. Imported here first,
# quietly, it is cached and says nothing when ORTModule (or a learner's cell) imports it again.
quiet_import("torch.utils.cpp_extension")


class OrtModuleError(OrtlabError):
    """ORTModule failed (with fallback disabled), or a helper was given something it cannot use."""


@contextlib.contextmanager
def ortmodule_env(**variables):
    """Set ORTMODULE_<NAME>=value for the block (ORTModule reads them when it is constructed).

    ortmodule_env(FALLBACK_POLICY="FALLBACK_DISABLE", ONNX_OPSET_VERSION=15)
    """
    with environment({f"ORTMODULE_{k.upper()}": str(v) for k, v in variables.items()}):
        yield


def clean_log_line(line):
    """A log line without colours and timestamps; the C++ logger's '[W:onnxruntime:, file:line fn]'
    prefix becomes 'onnxruntime [W]'."""
    line = _STAMP.sub(r"\1", _ANSI.sub("", line.rstrip()))
    return re.sub(r"^\[([VIWEF]):onnxruntime:[^\]]*\] ", r"onnxruntime [\1] ", line)


def captured_logs():
    """Collect what ORTModule says inside the block: Python logging (its 'orttraining' logger and the
    root logger's stream handlers), prints, C++ logs (fds 1, 2); ortlab.capture.captured_lines.

    Yields a list that holds the cleaned lines (clean_log_line) once the block ends.
    """
    return captured_lines(loggers=("orttraining",), clean=clean_log_line)


@contextlib.contextmanager
def label_sparsity_hook_fix():
    """Work around an ORT 1.19.2 crash: with ORTMODULE_ENABLE_COMPUTE_OPTIMIZER=0 (or the embedding
    sparse optimizer off) every export fails with "TypeError: 'NoneType' object is not iterable".

    GraphTransitionManager._add_check_label_sparsity_hook returns None when disabled, and
    _export_model loops over what it returned (ortmodule/_graph_transition_manager.py). Inside
    this block it returns [] instead.
    """
    gtm = quiet_import("onnxruntime.training.ortmodule._graph_transition_manager").GraphTransitionManager
    original = gtm.__dict__["_add_check_label_sparsity_hook"]
    gtm._add_check_label_sparsity_hook = staticmethod(lambda *a, **k: original.__func__(*a, **k) or [])
    try:
        yield
    finally:
        gtm._add_check_label_sparsity_hook = original


@contextlib.contextmanager
def profiled_sessions(folder):
    """ORTModule's sessions with ORT's profiler on, writing into `folder`.

    ORTModule builds its SessionOptions in GraphExecutionManager._get_session_config
    (ortmodule/_graph_execution_manager.py) and has no profiling switch; this wraps it.
    """
    gem = quiet_import("onnxruntime.training.ortmodule._graph_execution_manager").GraphExecutionManager
    original = gem._get_session_config

    def with_profiling(self):
        options, providers, provider_options = original(self)
        options.enable_profiling, options.profile_file_prefix = True, str(Path(folder) / "ortmodule")
        return options, providers, provider_options

    gem._get_session_config = with_profiling
    try:
        yield
    finally:
        gem._get_session_config = original


def end_profiling(model):
    """Stop the profiler of an ORTModule's training session; returns the trace's path."""
    manager = model._torch_module._execution_manager(True)
    return Path(manager._execution_agent._inference_session.end_profiling())


@dataclass
class OrtModuleRun:
    """What train() saw: the losses, the log lines, where the graphs went, whether it fell back."""

    losses: list
    log: list
    folder: Path
    prefix: str
    fell_back: bool
    seconds: float
    step_times: list = field(default_factory=list)
    profile: Path = None  # ORT's trace of the training session, when train(profile=True)
    model: object = field(default=None, repr=False)  # the ORTModule itself, to look inside

    def training_agent(self):
        """The ORTModule's TrainingAgent (ortmodule/_execution_agent.py): one InferenceSession over
        the whole training graph, run forward to the YieldOp and then backward from it."""
        if self.model is None or self.fell_back:
            raise OrtModuleError("no ORT training session: this run fell back to PyTorch or kept no model")
        return self.model._torch_module._execution_manager(True)._execution_agent

    def graphs(self, mode="training"):
        """{dump kind: onnx.ModelProto} of the graphs ORTModule saved (DUMPS order)."""
        found = {}
        for kind in DUMPS:
            path = self.folder / f"{self.prefix}_{kind}_{mode}.onnx"
            if path.exists():
                found[kind] = onnx.load(str(path))
        return found

    def grep(self, *words):
        """Log lines containing every one of `words`."""
        return [line for line in self.log if all(w in line for w in words)]

    def records(self, kind="orttraining [INFO]", width=130):
        """log_records(self.log, kind, width): ORTModule's lines of one kind with their field lists."""
        return log_records(self.log, kind, width)

    def __repr__(self):
        how = "fell back to PyTorch" if self.fell_back else "ran in ORT"
        return (f"OrtModuleRun({len(self.losses)} steps, {how}, loss {self.losses[0]:.4f} -> "
                f"{self.losses[-1]:.4f}, {len(self.graphs())} graphs saved, {len(self.log)} log lines)")


def log_records(log, kind="orttraining [INFO]", width=130):
    """ORTModule's own log lines of one kind, each with the field list that follows it: ModelInfoForExport,
    ExportedModelInfo and PostExportProcessedModelInfo print one indented, tab-led line per field
    (the `__str__`s in ortmodule/_io.py and ortmodule/_graph_transition_manager.py). Each line is
    cut to `width` characters; a field keeps a 4-space indent."""
    kept, inside = [], False
    for line in log:
        if line.startswith(kind):
            kept.append(line[:width])
            inside = True
        elif inside and line[:1].isspace() and "\t" in line:
            kept.append("    " + line.strip()[:width - 4])
        else:
            inside = False
    return kept


def record_field(log, record, name):
    """The value of field `name` of the first `record` (e.g. 'ExportedModelInfo') in an ORTModule INFO log."""
    lines = log_records(log, width=10**6)
    start = next((i for i, line in enumerate(lines) if f"{record} class:" in line), None)
    for line in lines[start + 1:] if start is not None else []:
        if not line.startswith("    "):
            break
        key, _, value = line.strip().partition(":")
        if key == name:
            return value.strip()
    raise OrtModuleError(f"no field {name!r} of {record} in this log (run ORTModule at log level INFO)")


def gradient_info_by_mode(module, batch):
    """What ORTModule prepares for a training step and for an eval call under torch.no_grad(): its export
    mode, the graph inputs its ExportedModelInfo and PostExportProcessedModelInfo list as requiring a
    gradient (ortmodule/_graph_transition_manager.py), and the graphs it builds (its dumps, DUMPS order)."""
    rows = []
    for mode in ("training", "eval"):
        with tempfile.TemporaryDirectory() as folder, ortmodule_env(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with captured_logs() as log:
                model = ortmodule(copy.deepcopy(module).train(mode == "training"), "INFO", True, "m", folder)
                if mode == "training":
                    model(*batch).backward()
                else:
                    with torch.no_grad():
                        model(*batch)
            built = [kind for kind in DUMPS if list(Path(folder).glob(f"m_{kind}_*.onnx"))]
        counts = [len(ast.literal_eval(record_field(log, record, "onnx_graph_input_names_require_grad")))
                  for record in ("ExportedModelInfo", "PostExportProcessedModelInfo")]
        rows.append((mode, record_field(log, "ModelInfoForExport", "Export mode").split(".")[-1], *counts,
                     ", ".join(built)))
    return Table(("mode", "export mode", "require grad (ExportedModelInfo)",
                  "require grad (PostExportProcessedModelInfo)", "graphs built"), rows)


def ortmodule(module, log_level="WARNING", save_onnx=False, prefix="model", folder=None):
    """ORTModule(module, DebugOptions(...)); folder is where save_onnx writes (default: a temp dir)."""
    om = quiet_import("onnxruntime.training.ortmodule")
    if log_level not in LOG_LEVELS:
        raise OrtModuleError(f"log_level must be one of {LOG_LEVELS}, not {log_level!r}")
    options = om.DebugOptions(log_level=om.LogLevel[log_level], save_onnx=save_onnx, onnx_prefix=prefix,
                              save_path=str(folder or ""))
    return om.ORTModule(module, options)


def fell_back(model):
    """True when an ORTModule handed its module back to PyTorch (ORT's _fallback.py): a fallback pending in
    its execution manager, or a switch to PyTorch at construction (_utils.switch_backend_to_pytorch puts a
    TorchModulePytorch, which has no execution manager, in place of the ORT one)."""
    torch_module = model._torch_module
    if not hasattr(torch_module, "_execution_manager"):
        return True
    manager = torch_module._execution_manager(torch_module.is_training())
    return bool(manager._fallback_manager.is_pending())


def _gradient_gap(model, reference):
    """The largest absolute difference between two models' parameter gradients (same parameter order)."""
    return max((a.grad - b.grad).abs().max().item() for a, b in zip(model.parameters(), reference.parameters()))


def data_parallel_cases(make_model, inputs, target):
    """ORTModule and torch.nn.DataParallel in both wrap orders, one forward and backward (MSE) each, against
    the same step in PyTorch; `make_model()` builds a fresh, identically initialised model.

    torch/nn/parallel/data_parallel.py: without a GPU, DataParallel keeps device_ids == [] and its forward
    calls the module itself; with one GPU it calls the module on it; with two or more it replicate()s the
    module every step, which calls each submodule's _replicate_for_data_parallel(), and ORTModule's raises
    (ortmodule.py, _torch_module_ort.py): called directly here, as replicate() would. ORTModule(DataParallel)
    is refused by the module check in _graph_execution_manager.py, an error under FALLBACK_DISABLE and,
    under the default policy, a switch to PyTorch that says so only at INFO level.
    Returns one dict per case: wrapping, outcome, whether ORT ran, gradient gap to PyTorch, and whether a
    warning or a log line at the default WARNING level says ORTModule fell back."""
    if isinstance(make_model, torch.nn.Module) or not callable(make_model):
        raise OrtModuleError(f"make_model must be a function that builds a fresh model (each case trains its own), "
                             f"got {type(make_model).__name__}")
    quiet_import("onnxruntime.training.ortmodule")
    reference = make_model()
    try:
        torch.nn.functional.mse_loss(reference(inputs), target).backward()
    except Exception as exc:
        raise OrtModuleError(f"the model's PyTorch step fails on these inputs and target, so there is nothing to "
                             f"compare with: {type(exc).__name__}: {str(exc).splitlines()[0]}") from None
    rows = []

    def case(wrapping, build, **variables):
        model = make_model()
        with ortmodule_env(**variables), captured_logs() as log, warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                wrapped, ort_module = build(model)
                torch.nn.functional.mse_loss(wrapped(inputs), target).backward()
            except Exception as exc:
                rows.append({"wrapping": wrapping, "outcome": f"{type(exc).__name__}: {str(exc).splitlines()[0]}",
                             "ORT ran it": "-", "gradient gap to PyTorch": "-", "ORT says it fell back": "-"})
                return
        lines = [str(w.message) for w in caught] + list(log)
        said = [line for line in lines if "Fallback to PyTorch due" in line or "Fallback for policy" in line]
        parallel = isinstance(wrapped, torch.nn.DataParallel)
        devices = f"; DataParallel device_ids {wrapped.device_ids}" if parallel else ""
        rows.append({"wrapping": wrapping, "outcome": f"trains{devices}",
                     "ORT ran it": "no (PyTorch)" if fell_back(ort_module) else "yes",
                     "gradient gap to PyTorch": f"{_gradient_gap(model, reference):.1e}",
                     "ORT says it fell back": "yes" if said else "no"})

    def dp_of_ort(model):
        inner = ortmodule(model)
        return torch.nn.DataParallel(inner), inner

    def ort_of_dp(model):
        outer = ortmodule(torch.nn.DataParallel(model))
        return outer, outer

    def replicated(model):
        inner = ortmodule(model)
        inner._replicate_for_data_parallel()  # what replicate() calls on every submodule, with 2+ GPUs
        return inner, inner

    case("DataParallel(ORTModule(model)), this machine", dp_of_ort)
    case("ORTModule(DataParallel(model))", ort_of_dp)
    case("ORTModule(DataParallel(model)), FALLBACK_DISABLE", ort_of_dp, FALLBACK_POLICY="FALLBACK_DISABLE")
    case("DataParallel(ORTModule(model)), 2+ GPUs: what replicate() calls", replicated)
    return rows


def train(module, batches, steps, lr=0.05, log_level="WARNING", save_onnx=True, prefix="model",
          folder=None, fix_label_hook=True, profile=False, **variables):
    """Train `module` with ORTModule and torch.optim.SGD in ortlab.training.train's loop (stepping
    even on non-finite gradients, as a plain loop does); `variables` are ORTMODULE_* settings.

    Everything ORTModule prints is captured into the returned OrtModuleRun's log.
    fix_label_hook applies label_sparsity_hook_fix (needed to turn the compute optimizer off);
    profile=True turns ORT's profiler on (the trace path lands in OrtModuleRun.profile).
    """
    quiet_import("onnxruntime.training.ortmodule")  # its logging handler exists before the capture
    folder = Path(variables.get("SAVE_ONNX_PATH") or folder or tempfile.mkdtemp(prefix="ortmodule-"))
    folder.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    fix = label_sparsity_hook_fix() if fix_label_hook else contextlib.nullcontext()
    profiling = profiled_sessions(folder) if profile else contextlib.nullcontext()
    trace = None
    with ortmodule_env(**variables), fix, profiling, captured_logs() as log, warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            model = ortmodule(module, log_level, save_onnx, prefix, folder)
            history = torch_train(model, batches, torch.optim.SGD(model.parameters(), lr=lr), steps,
                                  progress=False, skip_non_finite=False)
            if profile and not fell_back(model):
                trace = end_profiling(model)
        except Exception as exc:
            failure = exc
        else:
            failure = None
    if failure is not None:
        reason = clean_log_line(str(failure).strip().splitlines()[0]) if str(failure).strip() else ""
        reason = reason.split(" was false. ")[-1]  # an ORT_ENFORCE: keep its message, not the C++ condition
        cause = _root_cause(failure)
        if cause:
            reason += f" (caused by {cause[:160]})"
        raise OrtModuleError(f"ORTModule failed: {type(failure).__name__}: {reason}") from None
    return OrtModuleRun(history.losses, log, folder, prefix, fell_back(model), time.perf_counter() - start,
                        history.step_times, trace, model)


LINE_KINDS = {"ORTModule INFO lines": "orttraining [INFO]", "ORTModule WARNING lines": "orttraining [WARNING]",
              "torch exporter's graph": "Exported graph:", "ORT C++ INFO": "onnxruntime [I]",
              "ORT C++ VERBOSE": "onnxruntime [V]"}
COUNTED = ("ORTModule INFO lines", "ORTModule WARNING lines")  # the others vary in number: yes/no


def log_levels(module, batch, levels=LOG_LEVELS):
    """What each DebugOptions log level prints during one training step, as a table: per level,
    how many lines of ORTModule's own, whether the exporter's graph and the C++ core's INFO and
    VERBOSE logs appear, or the error the level causes."""
    rows = []
    for level in levels:
        try:
            run = train(copy.deepcopy(module), [batch], 1, log_level=level, save_onnx=False)
        except OrtModuleError as exc:
            rows.append((level, *[""] * len(LINE_KINDS), str(exc)))
            continue
        log = run.log
        with captured_logs():  # at VERBOSE an ORT worker thread logs when it first runs, maybe after train's
            run.model = None   # capture on a busy machine: the sessions' thread pools end (joined) in here,
            gc.collect()       # and ORT's default logger goes back to WARNING, its default, for any late one
            quiet_import("onnxruntime").set_default_logger_severity(2)
        seen = {kind: sum(marker in line for line in log) for kind, marker in LINE_KINDS.items()}
        rows.append((level, *(seen[k] if k in COUNTED else ("yes" if seen[k] else "no") for k in LINE_KINDS), ""))
    return Table(("log level", *LINE_KINDS, "error"), rows)


def export_decisions(module, calls, **variables):
    """For each call (args, kwargs), did ORTModule export again? Read from its INFO log
    ('_export_check completed - need_export_model: ...'). Returns one entry per call: True,
    False, 'skipped' (the fast path did not check) or 'error: ...' (the call failed).

    ORTModule checks the input schema only while ORTMODULE_SKIPCHECK_POLICY lets it: by default
    its fast path skips the checks after the first call; SKIPCHECK_POLICY='SKIP_CHECK_DISABLED'
    checks every call.
    """
    return [outcome.decision for outcome in call_outcomes(module, calls, **variables)]


@dataclass
class CallOutcome:
    """One call of an ORTModule: whether it exported again, what it returned, or why it failed."""

    decision: object   # True, False, 'skipped' or 'error: <type>'
    returned: str      # e.g. 'float32 [8, 4]' or '' after an error
    error: str = ""    # the innermost error line ORT reported, '' when the call worked


def _describe(value):
    if isinstance(value, torch.Tensor):
        return f"{str(value.dtype).replace('torch.', '')} {list(value.shape)}"
    return type(value).__name__


def call_outcomes(module, calls, **variables):
    """export_decisions with what each call returned (dtype and shape) and, for a failed call,
    the innermost error ORT reported (graph_transition_manager's schema check, _io.py)."""
    quiet_import("onnxruntime.training.ortmodule")
    outcomes = []
    with ortmodule_env(**variables), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with captured_logs():
            model = ortmodule(module, "INFO", False)
        for args, kwargs in calls:
            with captured_logs() as log:
                try:
                    returned, error = _describe(model(*args, **kwargs)), None
                except Exception as exc:
                    returned, error = "", exc
            said = [line.rsplit(" ", 1)[-1] == "True" for line in log if "need_export_model:" in line]
            decision = f"error: {type(error).__name__}" if error else (said[0] if said else "skipped")
            cause = (_root_cause(error) or str(error).splitlines()[0]) if error else ""
            outcomes.append(CallOutcome(decision, returned, cause))
    return outcomes


def _root_cause(exc):
    """The innermost 'SomeError: message' line of an exception, its chain, and the tracebacks ORT
    pastes into its messages as text; None when there is nothing deeper than the first line."""
    texts = []
    while exc is not None:
        texts.append(str(exc))
        exc = exc.__cause__ or exc.__context__
    tails = "\n".join(t.split("\n", 1)[1] for t in texts if "\n" in t)
    lines = re.findall(r"^[\w.]+(?:Error|Exception): .+$", tails, re.MULTILINE)
    if not lines:
        return None
    name, _, message = lines[0].partition(": ")
    return f"{name.rsplit('.', 1)[-1]}: {message}"


def step_time_table(module, batches, steps=20, warmup=3, lr=0.05):
    """PyTorch and ORTModule side by side on copies of `module`, the same batches and SGD: the median
    ms per step after `warmup` steps (the first ORTModule step exports and builds the session),
    the fastest and slowest of those steps, and the first step. Times are this machine's."""
    if steps <= warmup:
        raise OrtModuleError(f"need steps > warmup to time anything; got steps={steps}, warmup={warmup}")
    reference = copy.deepcopy(module)
    timed = {"PyTorch": torch_train(reference, batches, torch.optim.SGD(reference.parameters(), lr=lr), steps,
                                    progress=False).step_times,
             "ORTModule": train(copy.deepcopy(module), batches, steps, lr=lr, save_onnx=False).step_times}
    rows = [(name, f"{1e3 * median(t[warmup:]):.2f}", f"{1e3 * min(t[warmup:]):.2f}", f"{1e3 * max(t[warmup:]):.2f}",
             f"{1e3 * t[0]:.1f}") for name, t in timed.items()]
    return Table(("", f"median ms/step (steps {warmup + 1}-{steps})", "fastest", "slowest", "first step ms"), rows)


def graph_changes(graphs):
    """A table of op-type counts across graphs ({name: ModelProto}, in order), changed rows only,
    with what happened between the first and the last: appears, disappears, fewer, more."""
    counts = {name: op_counts(m) for name, m in graphs.items()}
    ops = sorted({op for c in counts.values() for op in c})
    names = list(graphs)
    rows = []
    for op in ops:
        values = [counts[n].get(op, 0) for n in names]
        if len(set(values)) == 1:
            continue
        first, last = values[0], values[-1]
        change = ("appears" if first == 0 else "disappears" if last == 0 else
                  "fewer" if last < first else "more" if last > first else "changes in between")
        rows.append((op, *values, change))
    total = [sum(c.values()) for c in counts.values()]
    rows.append(("(all nodes)", *total, ""))
    return Table(("op", *names, "first -> last"), rows)

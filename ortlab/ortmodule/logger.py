"""ORTMODULE_LOG_LEVEL as an environment variable, and the rank-0 filtering of ORTModule's logger.

ORT reads the variable in ortmodule/options.py (_LoggingOptions._extract_info):
`LogLevel[os.getenv("ORTMODULE_LOG_LEVEL", log_level.name)]`, so it is case-sensitive, and it sets
only `DebugOptions.logging.log_level`; `DebugOptions.log_level` keeps the constructor's value and
_graph_transition_manager.py uses that one for the exporter's verbosity. In a process group,
ortmodule/_logger.py (configure_ortmodule_logger) names the logger `orttraining.rank-<r>` and
disables it on every rank but 0 for levels >= INFO (warnings included).
"""
import contextlib
import copy
import re

from ortlab import models
from ortlab.errors import OrtlabError
from ortlab.patch import environment
from ortlab.ortmodule.driver import LINE_KINDS, LOG_LEVELS, OrtModuleError, train
from ortlab.viz import Table

ENV = "ORTMODULE_LOG_LEVEL"
DEFAULT_CASES = (("WARNING", None), ("WARNING", "INFO"), ("WARNING", "DEVINFO"), ("INFO", "WARNING"),
                 ("INFO", None), ("WARNING", "info"))
COUNTS = ("lines", "ORTModule INFO", "ORTModule WARNING", "exporter graph", "ORT C++ INFO")
_ORT_LEVEL = re.compile(r"orttraining(?:\.rank-\d+)? \[(INFO|WARNING)\]")


class LoggerError(OrtlabError):
    """A log-level helper was given a level, case or model it cannot use."""


@contextlib.contextmanager
def log_level_env(value):
    """ORTMODULE_LOG_LEVEL=value inside the block (None: unset), restored afterwards."""
    if value is not None and not isinstance(value, str):
        raise LoggerError(f"the ORTMODULE_LOG_LEVEL value must be a str or None, not {type(value).__name__}")
    with environment({ENV: value}):
        yield


def count_lines(log):
    """{COUNTS name: number} for a captured ORTModule log: all lines, ORTModule's own INFO and
    WARNING lines (any rank's logger), the torch exporter's graph, the C++ core's INFO lines."""
    levels = [m.group(1) for m in map(_ORT_LEVEL.search, log) if m]
    return {"lines": len(log), "ORTModule INFO": levels.count("INFO"),
            "ORTModule WARNING": levels.count("WARNING"),
            "exporter graph": sum(LINE_KINDS["torch exporter's graph"] in line for line in log),
            "ORT C++ INFO": sum(LINE_KINDS["ORT C++ INFO"] in line for line in log)}


def _module(module):
    """A fresh copy of a zoo model (by name) or of an nn.Module with example_inputs()."""
    if isinstance(module, str):
        return models.get(module, dropout=0.0)
    if not hasattr(module, "example_inputs"):
        raise LoggerError(f"module must be a zoo model name or a zoo model (with example_inputs()), "
                          f"not {type(module).__name__}")
    return copy.deepcopy(module)


def one_step(options_level="WARNING", env_level=None, module="mlp"):
    """One ORTModule training step with DebugOptions(log_level=options_level) and
    ORTMODULE_LOG_LEVEL=env_level: count_lines(log) plus the two levels ORT ended up with
    ('debug_options.log_level', 'debug_options.logging.log_level') and 'error' ('' or ORT's)."""
    if options_level not in LOG_LEVELS:
        raise LoggerError(f"options_level must be one of {LOG_LEVELS}, not {options_level!r}")
    model = _module(module)
    with log_level_env(env_level):
        try:
            run = train(model, [model.example_inputs()], 1, log_level=options_level, save_onnx=False)
        except OrtModuleError as exc:
            error = str(exc).removeprefix("ORTModule failed: ")
            return {**dict.fromkeys(COUNTS, ""), "debug_options.log_level": options_level,
                    "debug_options.logging.log_level": "", "error": error}
    debug = run.model._torch_module._execution_manager(True)._debug_options
    return {**count_lines(run.log), "debug_options.log_level": debug.log_level.name,
            "debug_options.logging.log_level": debug.logging.log_level.name, "error": ""}


def env_level_table(cases=DEFAULT_CASES, module="mlp", portable=False):
    """For each (DebugOptions level, ORTMODULE_LOG_LEVEL value or None), one training step's line
    counts and the levels ORT kept, as a Table (a bad value shows ORT's error).

    portable=True keeps the table the same on any machine: how many lines ORT's C++ core logs depends
    on it (thread pools), so 'ORT C++ INFO' becomes yes/no and 'lines' counts the other lines only."""
    if not isinstance(portable, bool):
        raise LoggerError(f"portable must be True or False, not {portable!r}")
    rows = []
    for case in cases:
        if not isinstance(case, (tuple, list)) or len(case) != 2:
            raise LoggerError(f"each case must be (DebugOptions level, env value or None), not {case!r}")
        result = one_step(case[0], case[1], module)
        if portable and not result["error"]:
            result["lines"] -= result["ORT C++ INFO"]
            result["ORT C++ INFO"] = "yes" if result["ORT C++ INFO"] else "no"
        rows.append((case[0], "(unset)" if case[1] is None else case[1],
                     *(result[k] for k in COUNTS), result["debug_options.log_level"],
                     result["debug_options.logging.log_level"], result["error"]))
    counts = [("lines (C++ INFO aside)" if portable and k == "lines" else k) for k in COUNTS]
    return Table(("DebugOptions", ENV, *counts, "debug_options.log_level", "debug_options.logging.log_level",
                  "error"), rows)


def rank_log_counts(rank, world_size, levels=("WARNING",), module="mlp"):
    """Rank function for ortlab.distributed.launch: on this rank, one ORTModule training step per
    DebugOptions level in `levels`; returns {level: count_lines(...) plus 'logger names'}.

    results = launch(rank_log_counts, world_size=2, args=(("WARNING", "INFO"),))
    """
    levels = [levels] if isinstance(levels, str) else list(levels)
    found = {}
    for level in levels:
        if level not in LOG_LEVELS:
            raise LoggerError(f"levels must be taken from {LOG_LEVELS}, not {level!r}")
        model = _module(module)
        with log_level_env(None):
            run = train(model, [model.example_inputs()], 1, log_level=level, save_onnx=False)
        names = sorted({m.group(0).split(" [")[0] for m in map(_ORT_LEVEL.search, run.log) if m})
        found[level] = {**count_lines(run.log), "logger names": names}
    return found


def rank_filter_table(results):
    """The rank_log_counts results of a launch as a Table: one row per level and rank."""
    if not isinstance(results, (list, tuple)) or not all(isinstance(r, dict) for r in results):
        raise LoggerError("results must be the list launch(rank_log_counts, ...) returned "
                          "(one dict per rank)")
    rows = [(level, rank, *(counts[k] for k in COUNTS), ", ".join(counts["logger names"]) or "-")
            for level in results[0] for rank, result in enumerate(results) for counts in [result[level]]]
    return Table(("level", "rank", *COUNTS, "logger"), rows)

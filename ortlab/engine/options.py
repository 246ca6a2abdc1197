"""SessionOptions and RunOptions: the settings of ORT's that mean something in ortlab's engine.

Mirrors include/onnxruntime/core/framework/session_options.h and run_options.h. Either class
also accepts onnxruntime's own SessionOptions / RunOptions (the attributes below are read from it),
so a notebook can hand the same options to both runtimes.
"""
from dataclasses import dataclass, fields

import numpy as np

from ortlab.engine.errors import InvalidArgument
from ortlab.memory.planners import OFFSET_PLANNERS, planner_problem

# ORT's GraphOptimizationLevel values -> ortlab.transformers' levels (0: none)
LEVELS = {0: 0, 1: 1, 2: 2, 99: 3}
LEVEL_NAMES = {"disable": 0, "basic": 1, "extended": 2, "all": 99}
ORDERS = {0: "default", 1: "priority", "default": "default", "priority": "priority"}


class _Options:
    """What SessionOptions and RunOptions share: typed fields checked when made, and from_any()."""

    argument = ""  # the name InferenceSession's API gives the options

    def __post_init__(self):
        _check_types(self)

    @classmethod
    def from_any(cls, options):
        """`cls` from None (the defaults), a `cls`, or onnxruntime's class of the same name (its attributes read)."""
        if options is None:
            return cls()
        if isinstance(options, cls):
            return options
        if type(options).__name__ != cls.__name__:
            raise InvalidArgument(f"{cls.argument} must be ortlab.engine.{cls.__name__} or onnxruntime.{cls.__name__}, "
                                  f"not {type(options).__name__}")
        values = {f.name: getattr(options, f.name) for f in fields(cls) if hasattr(options, f.name)}
        if values.get("log_severity_level", 2) < 0:  # ORT's -1: the default logger's severity, WARNING
            values["log_severity_level"] = 2
        return cls(**values)


@dataclass
class SessionOptions(_Options):
    """graph_optimization_level: 0, 1, 2 or 99 (ORT's enum or its name: 'disable', 'basic', 'extended',
    'all'; default 99, ORT's); execution_order: 'default' (reverse DFS) or 'priority' (priority-based
    Kahn), as ortlab.ir computes them; enable_profiling, profile_file_prefix; log_severity_level
    (0 verbose .. 4 fatal, default 2); optimized_model_filepath: where to save the graph as it will
    run (partitioned, Memcpy nodes included); enable_mem_pattern, enable_mem_reuse (for the memory
    planner); memory_planner: where the pattern's tensors go in the block: 'ort' (ORT's best fit in
    program order, mem_pattern_planner.cc), a name registered with ortlab.memory's
    @register_offset_planner, or a function tensors -> {name: offset} (lab09's better_planner). Not an
    ORT option: ORT has the one planner."""

    graph_optimization_level: object = 99
    execution_order: object = "default"
    enable_profiling: bool = False
    profile_file_prefix: str = "ortlab_profile"
    log_severity_level: int = 2
    optimized_model_filepath: str = ""
    enable_mem_pattern: bool = True
    enable_mem_reuse: bool = True
    memory_planner: object = "ort"
    argument = "sess_options"

    def level(self):
        """ortlab.transformers' level (0 means no transformers)."""
        value = self.graph_optimization_level
        value = LEVEL_NAMES.get(value, value) if isinstance(value, str) else value
        try:
            value = int(value)
        except (TypeError, ValueError):
            value = None
        if value not in LEVELS:
            raise InvalidArgument(f"graph_optimization_level must be one of {list(LEVEL_NAMES)} (ORT's 0, 1, 2, "
                                  f"99), got {self.graph_optimization_level!r}")
        return LEVELS[value]

    def planner(self):
        """'ort', a registered offset planner's name, or a function; anything else is refused here."""
        value = self.memory_planner
        if isinstance(value, str) and (value == "ort" or value in OFFSET_PLANNERS):
            return value
        problem = f"{value!r}" if isinstance(value, str) else planner_problem(value)
        if problem is None:
            return value
        raise InvalidArgument(f"memory_planner must be 'ort', one of {OFFSET_PLANNERS.known()} (registered with "
                              f"@register_offset_planner) or a function tensors -> {{name: offset}}, not {problem}")

    def order(self):
        value = self.execution_order
        key = value if isinstance(value, str) else _enum_int(value)
        if key not in ORDERS:
            raise InvalidArgument(f"execution_order must be 'default' or 'priority' (ORT's ExecutionOrder), "
                                  f"got {value!r}")
        return ORDERS[key]


def _enum_int(value):
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


@dataclass
class RunOptions(_Options):
    """terminate: stop the run before its next node; only_execute_path_to_fetches: run only the
    nodes the requested outputs need; log_severity_level; run_tag (a name for the run's log)."""

    terminate: bool = False
    only_execute_path_to_fetches: bool = False
    log_severity_level: int = 2
    run_tag: str = ""
    argument = "run_options"


def _check_types(options):
    """Flags must be bools and names strs (a str 'no' would otherwise count as true)."""
    for f in fields(options):
        value, kind = getattr(options, f.name), f.type
        if kind in (bool, "bool") and not isinstance(value, (bool, np.bool_)):
            raise InvalidArgument(f"{type(options).__name__}.{f.name} takes True or False, not {value!r}")
        if kind in (str, "str") and not isinstance(value, str):
            raise InvalidArgument(f"{type(options).__name__}.{f.name} takes a str, not {value!r}")
        if kind in (int, "int") and (isinstance(value, bool) or not isinstance(value, (int, np.integer))):
            raise InvalidArgument(f"{type(options).__name__}.{f.name} takes an int, not {value!r}")

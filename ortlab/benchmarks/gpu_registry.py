"""The parts of `python -m ortlab.benchmarks.gpu_check`, registered by name (gpu_parts.py registers seven).

A part is a function `run(context) -> dict` of plain data; it raises `Skip(reason)` when it cannot run
here, and stops before its first device call when `context.dry_run` is set (raising Skip then too,
once its CPU side has run). A part that does many independent checks may read `time_left(context)`
and record what it had no time for, rather than be killed at its budget with nothing recorded.
"""
import math
import time
from dataclasses import dataclass


class Skip(Exception):
    """Raised by a part that cannot run here; the message is the reason recorded."""


@dataclass(frozen=True)
class Part:
    """One check: `run(context) -> dict` (JSON-able), given at most `budget_s` seconds."""

    name: str
    title: str
    run: object
    budget_s: float


@dataclass(frozen=True)
class Context:
    """What every part is given: dry_run stops it before its first device call; deadline is the
    time.monotonic() at which the part's budget runs out (None: no limit), set by gpu_check.run_part."""

    dry_run: bool = False
    deadline: float = None


PARTS = {}


def register_part(part):
    """Add a Part to PARTS (they run in registration order)."""
    if part.name in PARTS:
        raise ValueError(f"a gpu-check part named {part.name!r} is already registered")
    PARTS[part.name] = part
    return part


def dry_run_stop(context, what):
    """Raise Skip when dry-running: the CPU side ran, `what` (the device calls) did not."""
    if context.dry_run:
        raise Skip(f"dry run: CPU side done, stopped before {what}")


def time_left(context):
    """Seconds until the part's budget runs out (math.inf when the context has no deadline)."""
    return math.inf if context.deadline is None else context.deadline - time.monotonic()

"""Checks a Plan the way ORT's GenerateMemPattern does: planned tensors that are live at the same
time never share bytes of the block, and every tensor lies inside it.

Mirrors the ORT_ENFORCE in MemPatternPlanner::GenerateMemPattern
(onnxruntime/core/framework/mem_pattern_planner.h: "Time schedules of overlapping memory blocks SHOULD
NOT intersect"), here with a message naming the two values.
"""
import numpy as np

from ortlab.errors import OrtlabError


class PlanValidationError(OrtlabError):
    """A plan puts two live tensors in the same bytes, or a tensor outside the block."""


def _live_together(a, b):
    return a.start <= b.end and b.start <= a.end


def _is_count(value):
    """An int >= 0 (Python or numpy; not a bool)."""
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) and value >= 0


def _check_fields(v):
    """A planned value's offset and size are byte counts (ints >= 0): a negative size would hide an overlap
    (its bytes [offset, offset + size) are empty), and None cannot be compared."""
    for what in ("offset", "size"):
        value = getattr(v, what)
        if not _is_count(value):
            raise PlanValidationError(f"value '{v.name}' (ML index {v.index}) has {what}={value!r}; a planned "
                                      f"tensor's {what} is a byte count (an int >= 0)")


def validate(plan):
    """Raise PlanValidationError naming the offending value (or pair); returns the number of planned
    tensors checked."""
    if not all(hasattr(plan, a) for a in ("planned", "peak_bytes", "values")):
        raise PlanValidationError(f"validate takes a Plan (ortlab.memory.plan(model, shapes), or a Placement's "
                                  f"as_plan()), not {type(plan).__name__}")
    if not _is_count(plan.peak_bytes):
        raise PlanValidationError(f"the plan's peak_bytes is {plan.peak_bytes!r}; the block's size is a byte "
                                  "count (an int >= 0)")
    for v in plan.values:
        if v.offset is not None:
            _check_fields(v)
    planned = plan.planned()
    for v in planned:
        if v.offset < 0 or v.offset + v.size > plan.peak_bytes:
            raise PlanValidationError(
                f"value '{v.name}' (ML index {v.index}) lies at [{v.offset}, {v.offset + v.size}) but the "
                f"block has {plan.peak_bytes} bytes: a planned tensor must fit in the memory-pattern block")
        if v.start is None or v.end is None or v.start > v.end:
            raise PlanValidationError(f"value '{v.name}' (ML index {v.index}) is planned without a valid "
                                      f"program-counter interval ({v.start}, {v.end})")
    for k, a in enumerate(planned):          # sorted by offset: stop at the first block past a's end
        for b in planned[k + 1:]:
            if b.offset >= a.offset + a.size:
                break
            if b.size and a.size and _live_together(a, b):
                raise PlanValidationError(
                    f"values '{a.name}' (bytes [{a.offset}, {a.offset + a.size}), program counters "
                    f"[{a.start}, {a.end}]) and '{b.name}' (bytes [{b.offset}, {b.offset + b.size}), program "
                    f"counters [{b.start}, {b.end}]) are live at the same time and overlap in the block; "
                    "two tensors alive together need disjoint bytes")
    return len(planned)

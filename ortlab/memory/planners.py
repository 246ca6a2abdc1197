"""Other offset planners on the same tensors ORT puts in its memory pattern, to set ORT's best fit in
program order beside greedy by size and the lower bound.

ORT (mem_pattern_planner.h, mirrored in ortlab.memory.mem_pattern_planner) places each tensor when its
producer runs, in the gap between live blocks that wastes least. Greedy by size (Pisarchyk and Lee 2020,
"Efficient Memory Management for Deep Neural Net Inference", arXiv:2001.03288; TensorFlow Lite's
GreedyBySize planners) sees every tensor's lifetime first: tensors are taken largest first, and each
goes at an offset where it overlaps no already placed tensor whose program-counter interval intersects
its own: the lowest such offset (fit="first", TFLite Micro's GreedyMemoryPlanner) or the smallest gap
that holds it (fit="best", the paper's "greedy by size" for offset calculation, TFLite GPU's
GreedyBySizeAssignment). Both only move tensors: the set of tensors, their 256-aligned sizes and their
[start, end] intervals (the whole reuse chain of a kAllocate buffer) are ORT's. The lower bound is the
most bytes live at one program counter (Plan.lower_bound_bytes): no placement can do better.
"""
import dataclasses
import inspect
import os
from collections import namedtuple
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from ortlab.errors import OrtlabError
from ortlab.memory.allocation_planner import K_ALLOCATE, K_ALLOCATE_OUTPUT
from ortlab.memory.plan import ORDERS, session_graph_for
from ortlab.memory.plan import plan as make_plan
from ortlab.memory.validator import validate
from ortlab.registry import Registry
from ortlab.viz import Table

FITS = ("first", "best")

# One pattern tensor as an offset planner sees it: [start, end] the program counters its buffer is held
# (inclusive; the whole reuse chain of a kAllocate buffer), size its 256-aligned bytes.
Tensor = namedtuple("Tensor", "name size start end")

# name -> planner(tensors) -> {tensor name: offset}. ORT's own best fit in program order is not here: it runs
# inside plan() (mem_pattern_planner.py), where the allocation order is known; SessionOptions.memory_planner
# "ort" means that one, and any name below re-places the same tensors in the same block.
OFFSET_PLANNERS = Registry("offset planner", op_keys=False, duplicates="replace",
                           hint="Add one with @register_offset_planner(name) on a function tensors -> {name: offset}.")


def register_offset_planner(name):
    """Decorator: file `planner(tensors) -> {tensor name: offset}` under `name` (the engine's
    SessionOptions.memory_planner takes the name)."""
    def register(planner):
        if not callable(planner):
            raise PlannerError(f"an offset planner is a function tensors -> {{name: offset}}, not {planner!r}")
        return OFFSET_PLANNERS.register(name, planner)
    return register


class PlannerError(OrtlabError):
    """A planner was asked for something it does not do; the message says what to pass instead."""


@dataclass
class Placement:
    """Offsets a planner chose for a Plan's pattern tensors."""

    algorithm: str
    offsets: dict                 # ML index -> offset in the block
    peak_bytes: int               # the block: the end of the highest tensor
    lower_bound_bytes: int
    source: object = None         # the Plan whose tensors were placed

    def as_plan(self):
        """A copy of the source Plan with these offsets and this block (for validate() and .plot())."""
        values = [dataclasses.replace(v, offset=self.offsets[v.index]) if v.index in self.offsets else v
                  for v in self.source.values]
        copy = dataclasses.replace(self.source, values=values, peak_bytes=self.peak_bytes)
        copy._by_name = {v.name: v for v in values}
        return copy

    def validate(self):
        """ortlab.memory.validate on as_plan(): no two live tensors share bytes, all fit the block."""
        return validate(self.as_plan())


def pattern_tensors(plan):
    """Tensor(name, size, start, end) of every tensor ORT placed in the pattern, by ML index."""
    return [Tensor(v.name, v.size, v.start, v.end) for v in sorted(plan.planned(), key=lambda v: v.index)]


def _live_together(a, b):
    return a.start <= b.end and b.start <= a.end


def place(size, taken, fit="first"):
    """The offset for `size` bytes among `taken` (offset, size) blocks sorted by offset: the lowest gap
    that holds it (fit='first') or the smallest (fit='best'); else the end of the highest block."""
    current, best, best_gap = 0, None, None
    for offset, other in taken:
        gap = offset - current
        if gap >= size:
            if fit == "first":
                return current
            if best_gap is None or gap < best_gap:
                best, best_gap = current, gap
        current = max(current, offset + other)
    return current if best is None else best


def _greedy(tensors, fit):
    """Greedy by size: largest first (ties: earlier start, then the order given: ML index for
    pattern_tensors), each at the lowest free offset
    (fit='first') or in the smallest gap that holds it (fit='best') among the tensors placed so far
    whose lifetimes intersect its own."""
    placed, offsets = [], {}
    for tensor in sorted(tensors, key=lambda t: (-t.size, t.start)):  # stable: ties keep their order
        taken = sorted((offsets[o.name], o.size) for o in placed if o.size and _live_together(o, tensor))
        offsets[tensor.name] = place(tensor.size, taken, fit) if tensor.size else 0
        placed.append(tensor)
    return offsets


@register_offset_planner("greedy_by_size")
def greedy_by_size_first_fit(tensors):
    """Greedy by size, first fit (TFLite Micro's GreedyMemoryPlanner)."""
    return _greedy(tensors, "first")


@register_offset_planner("greedy_by_size_best_fit")
def greedy_by_size_best_fit(tensors):
    """Greedy by size, best fit (the paper's offset calculation; TFLite GPU's GreedyBySizeAssignment)."""
    return _greedy(tensors, "best")


def placement_of(plan, planner, algorithm=None):
    """The Placement `planner` (a registered name or a function tensors -> {name: offset}) gives a Plan's
    pattern tensors, validated: every tensor placed once at an int offset >= 0 (Python or numpy), the block
    within this machine's memory (checked before anything is allocated), no two live at once sharing a byte.
    A planner that breaks a rule, or raises, is named with what it did (PlannerError)."""
    fn = OFFSET_PLANNERS.lookup(planner) if isinstance(planner, str) else planner
    problem = planner_problem(fn)
    if problem:
        raise PlannerError(f"a memory planner is a registered name ({', '.join(OFFSET_PLANNERS.known())}) or a "
                           f"function tensors -> {{name: offset}}, not {problem}")
    tensors = pattern_tensors(plan)
    label = algorithm or (planner if isinstance(planner, str) else getattr(fn, "__name__", "planner"))
    offsets = _check_offsets(label, tensors, _call(label, fn, tensors))
    _check_block(label, tensors, offsets)
    by_index = {plan.value(t.name).index: offsets[t.name] for t in tensors}
    peak = max((offsets[t.name] + t.size for t in tensors), default=0)
    placement = Placement(label, by_index, peak, plan.lower_bound_bytes, plan)
    try:
        placement.validate()
    except OrtlabError as exc:
        raise PlannerError(f"planner {label!r} placed live tensors on the same bytes: {exc}") from None
    return placement


def planner_problem(planner):
    """Why `planner` is no offset planner, in words for a message ("builtins.dict, a class..."), or None
    when it is a function that can take one argument (the list of tensors)."""
    if isinstance(planner, type):
        return (f"{planner.__module__}.{planner.__qualname__}, a class: calling it builds a {planner.__name__}, "
                "not offsets; pass a function, e.g. def my_planner(tensors): return {t.name: 0 for t in tensors}")
    if not callable(planner):
        return f"{planner!r} ({type(planner).__name__})"
    try:
        signature = inspect.signature(planner)
    except (TypeError, ValueError):  # a builtin without a signature: calling it will tell
        return None
    try:
        signature.bind(None)
    except TypeError:
        name = getattr(planner, "__name__", type(planner).__name__)
        return f"{name}{signature}: a planner takes one argument, the list of tensors"
    return None


def _call(label, fn, tensors):
    """fn(tensors), its own exception named as the planner's."""
    try:
        return fn(list(tensors))
    except OrtlabError:
        raise
    except Exception as exc:
        raise PlannerError(f"planner {label!r} raised {type(exc).__name__}: {exc} (the traceback above shows "
                           "where); fix the planner, or run with memory_planner='ort'") from exc


def _offset(value):
    """An offset as a Python int (from a Python or numpy integer >= 0), or None."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        return None
    return int(value) if value >= 0 else None


def _check_offsets(label, tensors, offsets):
    """{name: int offset} of a planner's answer, or PlannerError naming what is wrong with it."""
    if not isinstance(offsets, Mapping):
        raise PlannerError(f"planner {label!r} returned {type(offsets).__name__}; return {{tensor name: offset}}")
    names = {t.name for t in tensors}
    missing, extra = sorted(names - set(offsets)), sorted(set(offsets) - names, key=repr)
    if missing or extra:
        raise PlannerError(f"planner {label!r} must place exactly the pattern's tensors: missing {missing[:5]}, "
                           f"unknown {extra[:5]}")
    bad = [f"{n!r}: {o!r} ({_type_name(o)})" for n, o in offsets.items() if _offset(o) is None]
    if bad:
        raise PlannerError(f"planner {label!r}: offsets must be ints >= 0 (Python or numpy integers, bytes from the "
                           f"block's start), got {', '.join(bad[:3])}")
    return {n: _offset(o) for n, o in offsets.items()}


def _type_name(value):
    kind = type(value)
    return kind.__name__ if kind.__module__ == "builtins" else f"{kind.__module__}.{kind.__name__}"


def machine_memory():
    """This machine's physical memory in bytes (2**48 where the system does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, OSError, ValueError):
        return 2 ** 48


def _check_block(label, tensors, offsets):
    """Refuse a block larger than the machine's memory, naming the tensor that ends highest."""
    if not tensors:
        return
    top = max(tensors, key=lambda t: offsets[t.name] + t.size)
    block, limit = offsets[top.name] + top.size, machine_memory()
    if block > limit:
        raise PlannerError(
            f"planner {label!r} puts tensor {top.name!r} at offset {offsets[top.name]}: a block of {block} bytes "
            f"({_bytes(block)}), more than this machine's memory ({_bytes(limit)}), which no session could "
            f"allocate. Offsets are byte positions in one block: every tensor on bytes of its own needs "
            f"{sum(t.size for t in tensors)} bytes")


def _bytes(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB", "PiB"):
        if n < 1024:
            return f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} EiB"


def greedy_by_size(plan, fit="first"):
    """Greedy by size on a Plan's pattern tensors (fit 'first' or 'best'); returns a Placement."""
    if fit not in FITS:
        raise PlannerError(f"fit must be one of {FITS} (lowest offset, or smallest gap), not {fit!r}")
    if not hasattr(plan, "planned") or not hasattr(plan, "lower_bound_bytes"):
        raise PlannerError(f"greedy_by_size takes a Plan (ortlab.memory.plan(model, shapes)), not "
                           f"{type(plan).__name__}")
    name = "greedy_by_size" if fit == "first" else "greedy_by_size_best_fit"
    return placement_of(plan, name, f"greedy by size ({fit} fit)")


def compare_planners(model, input_shapes, orders=ORDERS, enable_mem_reuse=True):
    """A Table, one row per execution order: ORT's block (plan().peak_bytes), greedy by size's (first
    and best fit), the lower bound, and each planner's bytes over the bound. Every greedy placement is
    validated (ortlab.memory.validate) before it is reported."""
    shared = session_graph_for(model)   # planned once, shared by the orders
    rows = []
    for order in orders:
        p = make_plan(shared, input_shapes, order=order, enable_mem_reuse=enable_mem_reuse)
        first, best = greedy_by_size(p, "first"), greedy_by_size(p, "best")
        first.validate()
        best.validate()
        bound = p.lower_bound_bytes
        peaks = (p.peak_bytes, first.peak_bytes, best.peak_bytes)
        rows.append((order, len(p.planned()), *peaks, bound, *(_over(peak, bound) for peak in peaks)))
    return Table(("order", "tensors", "ORT best fit", "greedy by size (first fit)",
                  "greedy by size (best fit)", "lower bound", "ORT over bound", "first fit over bound",
                  "best fit over bound"), rows)


def _over(peak, bound):
    return f"{(peak - bound) / bound:+.2%}" if bound else ""


def peak_by_order(model, input_shapes, orders=ORDERS, enable_mem_reuse=True):
    """A Table, one row per execution order (SessionOptions.execution_order): ORT's memory-pattern block,
    the lower bound, the tensors in the pattern, the kAllocate values left out of it (their shape is
    known only at run time) and the graph outputs (allocated at run time). Recompute (ORTModule's
    memory optimizer) changes the graph, not the planner: plan the graph ORT's optimizer makes
    (ortlab.walkthroughs.memory_recompute.recompute_graphs; recompute_peaks sets both blocks side by side)."""
    shared = session_graph_for(model)   # planned once, shared by the orders
    rows = []
    for order in orders:
        p = make_plan(shared, input_shapes, order=order, enable_mem_reuse=enable_mem_reuse)
        dynamic = sum(1 for v in p.values if v.kind == K_ALLOCATE and not v.planned)
        outputs = sum(1 for v in p.values if v.kind == K_ALLOCATE_OUTPUT)
        rows.append((order, p.peak_bytes, p.lower_bound_bytes, len(p.planned()), dynamic, outputs))
    return Table(("order", "ORT block", "lower bound", "tensors in the pattern",
                  "kAllocate outside it (shape unknown)", "graph outputs (kAllocateOutput)"), rows)

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
from dataclasses import dataclass

from ortlab.errors import OrtlabError
from ortlab.memory.allocation_planner import K_ALLOCATE, K_ALLOCATE_OUTPUT
from ortlab.memory.plan import ORDERS, _session_graph
from ortlab.memory.plan import plan as make_plan
from ortlab.memory.validator import validate
from ortlab.viz import Table

FITS = ("first", "best")


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
    """(ML index, bytes, start, end) of every tensor ORT placed in the pattern, by ML index."""
    return [(v.index, v.size, v.start, v.end) for v in sorted(plan.planned(), key=lambda v: v.index)]


def _live_together(a, b):
    return a[2] <= b[3] and b[2] <= a[3]


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


def greedy_by_size(plan, fit="first"):
    """Greedy by size on a Plan's pattern tensors: largest first (ties: earlier start, then ML index),
    each at the lowest free offset (fit='first') or in the smallest gap that holds it (fit='best')
    among the tensors placed so far whose lifetimes intersect its own. Returns a Placement."""
    if fit not in FITS:
        raise PlannerError(f"fit must be one of {FITS} (lowest offset, or smallest gap), not {fit!r}")
    if not hasattr(plan, "planned") or not hasattr(plan, "lower_bound_bytes"):
        raise PlannerError(f"greedy_by_size takes a Plan (ortlab.memory.plan(model, shapes)), not "
                           f"{type(plan).__name__}")
    tensors = sorted(pattern_tensors(plan), key=lambda t: (-t[1], t[2], t[0]))
    placed, offsets, peak = [], {}, 0
    for tensor in tensors:
        index, size = tensor[0], tensor[1]
        taken = sorted((offsets[o[0]], o[1]) for o in placed if o[1] and _live_together(o, tensor))
        offsets[index] = place(size, taken, fit) if size else 0
        peak = max(peak, offsets[index] + size)
        placed.append(tensor)
    return Placement(f"greedy by size ({fit} fit)", offsets, peak, plan.lower_bound_bytes, plan)


def compare_planners(model, input_shapes, orders=ORDERS, enable_mem_reuse=True):
    """A Table, one row per execution order: ORT's block (plan().peak_bytes), greedy by size's (first
    and best fit), the lower bound, and each planner's bytes over the bound. Every greedy placement is
    validated (ortlab.memory.validate) before it is reported."""
    shared = _session_graph(model)   # planned once, shared by the orders
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
    shared = _session_graph(model)   # planned once, shared by the orders
    rows = []
    for order in orders:
        p = make_plan(shared, input_shapes, order=order, enable_mem_reuse=enable_mem_reuse)
        dynamic = sum(1 for v in p.values if v.kind == K_ALLOCATE and not v.planned)
        outputs = sum(1 for v in p.values if v.kind == K_ALLOCATE_OUTPUT)
        rows.append((order, p.peak_bytes, p.lower_bound_bytes, len(p.planned()), dynamic, outputs))
    return Table(("order", "ORT block", "lower bound", "tensors in the pattern",
                  "kAllocate outside it (shape unknown)", "graph outputs (kAllocateOutput)"), rows)

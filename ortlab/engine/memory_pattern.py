"""The memory pattern in the engine: one block per run, each planned tensor at its offset.

Mirrors onnxruntime/core/framework/session_state.cc (GetMemoryPatternGroup: the training build
plans the pattern statically, per set of feed shapes, and caches it by those shapes) and
execution_frame.cc (the frame allocates one block of the pattern's peak size, and
AllocateMLValueTensorSelfOwnBufferHelper places a planned tensor at buffer + offset when its size
is the planned size; otherwise it logs and falls back to the allocator). The plan itself is
ortlab.memory's mirror of ORT's planner, so the peak the engine measures is the one predicted
before the run.
"""
import math

import numpy as np

from ortlab.errors import OrtlabError
from ortlab.memory import plan, validate
from ortlab.memory.planners import placement_of
from ortlab.ops.kernel_def import KernelDef

ALIGNMENT = 256  # kAllocAlignment: planned sizes are rounded up to it


class MemoryPattern:
    """{value name: (offset, planned bytes)} and the block's size, from an ortlab.memory Plan."""

    def __init__(self, plan):
        self.peak_bytes = plan.peak_bytes
        self.placements = {}
        by_name = {v.name: v for v in plan.values}
        for v in plan.values:
            origin = v
            while origin.reuses is not None and origin.offset is None:
                origin = by_name[origin.reuses]
            if origin.offset is not None and (v is origin or v.kind == "kReuse"):
                self.placements[v.name] = (origin.offset, origin.size)

    def block(self):
        """The run's one allocation for every planned tensor (ORT: alloc->Alloc(peak))."""
        return np.empty(self.peak_bytes, np.uint8)

    def place(self, block, name, shape, dtype):
        """A tensor of `shape` and `dtype` at `name`'s offset in `block`, or None when `name` is not
        planned or its size differs from the planned size (ORT falls back to the allocator)."""
        found = self.placements.get(name)
        if found is None:
            return None
        offset, planned = found
        nbytes = math.prod(shape) * dtype.itemsize
        if (nbytes + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT != planned:
            return None
        return block[offset:offset + nbytes].view(dtype).reshape(shape)


def _declarations(state):
    """node -> KernelDef of the kernel the session really created (ORT's planner reads the chosen
    kernel's KernelDef): a learner's kernel that declares no MayInplace is never run in place."""
    return lambda node: state.kernel_defs.get(node.index) or KernelDef(node.op_type, node.domain)


class ReusePlan:
    """Without the memory pattern ORT still follows its allocation plan: a kReuse value is written into the
    buffer of the value it reuses (in place, or a freed buffer from the freelist), and a buffer is freed once
    every value living in it has been released (ORT: ExecutionFrame's AllocateAsPerAllocationPlan with
    kReuse, and the plan's release actions after the last reader of any of them). The plan is the session
    state's own (SessionState.allocation_plan)."""

    def __init__(self, state):
        plan = state.allocation_plan
        self.origin = {v.index: v.reused_buffer for v in plan.values if v.kind == "kReuse"}
        released = {slot for step in state.steps for slot in step.releases}
        self.holders = {}                    # buffer slot -> how many of its values the run will release
        for slot in released:
            buffer = self.origin.get(slot, slot)
            self.holders[buffer] = self.holders.get(buffer, 0) + 1


def reuse_for(session, feeds):
    """(ReusePlan or None, why not): the allocation plan's reuse for a run without the memory pattern."""
    if not all(p.is_cpu_based for p in session.state.providers.values()):
        return None, "a device EP holds tensors: the plan's reuse covers host memory only here"
    return ReusePlan(session.state), ""


def pattern_for(session, feeds):
    """(MemoryPattern or None, why not) for a session's graph fed arrays of these shapes. With a
    memory_planner other than 'ort', that planner re-places the plan's pattern tensors (validated: a
    planner that overlaps live tensors raises PlannerError, never runs)."""
    found, why = _plan(session, feeds)
    if found is None:
        return None, why
    planner = session.options.planner()
    if planner != "ort":
        found = placement_of(found, planner).as_plan()
    return MemoryPattern(found), ""


def _plan(session, feeds):
    """(ortlab.memory Plan in the session's own order, or None, why not)."""
    state = session.state
    if not all(p.is_cpu_based for p in state.providers.values()):
        return None, "a device EP holds tensors: the plan covers host memory only here"
    if any(not hasattr(v, "shape") for v in feeds.values()):
        return None, ("a feed is a sequence or an empty optional: ORT's ExecutionFrame uses the memory pattern only "
                      "when every feed is a tensor (execution_frame.cc)")
    shapes = {state.value_names[slot]: tuple(np.shape(v)) for slot, v in feeds.items()}
    try:
        found = plan(session.planning_graph(), shapes, order=session.options.order(),
                     enable_mem_reuse=session.options.enable_mem_reuse, declarations=_declarations(state))
        validate(found)
    except OrtlabError as exc:
        return None, f"no static plan: {exc}"
    ours = [s.node.output_names for s in state.steps]
    theirs = [n.output_names for n in found.order]
    if ours != theirs:
        return None, "the planner's execution order differs from the session's"
    return found, ""

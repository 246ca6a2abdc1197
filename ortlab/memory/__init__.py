"""ortlab.memory: ORT 1.19.2's tensor memory planning, mirrored without onnxruntime.

    plan(model, input_shapes, order="default", enable_mem_reuse=True) -> Plan
        .values (ValuePlan per ML value index: AllocKind, reused buffer, bytes, program counters,
        offset), .peak_bytes (the memory-pattern block ORT allocates), .lower_bound_bytes, .table(),
        .plot(), .allocation_trace(pattern=...)
    validate(plan)                   no two live planned tensors overlap, each fits the block
    BFCArena().replay(trace)         ORT's arena on an allocation trace: extensions, AllocatorStats
    CachingAllocator().replay(trace) PyTorch's CUDA caching allocator on the same trace: memory_stats()
    compare_allocators(trace)        the two side by side (peak in use, reserved, growths, fragmentation)
    greedy_by_size(plan)             ORT's pattern tensors placed largest first: a Placement (offsets, peak)
    @register_offset_planner(name)   a planner tensors -> {name: offset}; placement_of(plan, name) places a plan,
                                     and the engine's SessionOptions(memory_planner=name) runs with it
    compare_planners(model, shapes)  ORT's block, greedy by size's and the lower bound, per execution order
    peak_by_order(model, shapes)     ORT's block and the lower bound, default vs priority order

Modules are named after the ORT files they mirror: allocation_planner (allocation_planner.cc),
mem_pattern_planner (mem_pattern_planner.h, session_state.cc's static planning), bfc_arena
(bfc_arena.cc), session_graph (graph.cc; its types from ortlab.ir.shape_inference), lifetimes
(ort_value_name_idx_map.h).
caching_allocator mirrors PyTorch's c10/cuda/CUDACachingAllocator.cpp; planners holds greedy by size
(Pisarchyk and Lee 2020), which is not ORT's.
ort_arena_log reads ORT's own arena from its log (ort_first_run_log, arena_requests, ort_block): what
the mirrors are checked against.
"""
from ortlab.memory.bfc_arena import AllocatorStats, ArenaError, BFCArena
from ortlab.memory.session_graph import SessionGraph, session_graph
from ortlab.memory.plan import Plan, PlanError, ValuePlan, plan
from ortlab.memory.validator import PlanValidationError, validate

__all__ = ["AllocatorStats", "ArenaError", "BFCArena", "Plan", "PlanError", "PlanValidationError",
           "SessionGraph", "ValuePlan", "plan", "session_graph", "validate"]

from ortlab.memory.caching_allocator import (CachingAllocator, CachingAllocatorError, OutOfMemoryError,
                                             compare_allocators)
from ortlab.memory.planners import (OFFSET_PLANNERS, Placement, PlannerError, Tensor, compare_planners,
                                    greedy_by_size, peak_by_order, placement_of, register_offset_planner)

__all__ += ["OFFSET_PLANNERS", "Tensor", "placement_of", "register_offset_planner"]
__all__ += ["CachingAllocator", "CachingAllocatorError", "OutOfMemoryError", "Placement", "PlannerError",
            "compare_allocators", "compare_planners", "greedy_by_size", "peak_by_order"]

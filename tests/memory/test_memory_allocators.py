"""PyTorch's caching allocator simulated, other offset planners, and the peak by execution order.

The allocator's references are PyTorch's documented rules (c10/cuda/CUDACachingAllocator.cpp's header
comment and constants, the "CUDA memory management" notes): requests round to 512 bytes, up to 1 MiB
they go to the small pool and its 2 MiB segments, larger ones to the large pool (a 20 MiB segment under
10 MiB, else the request rounded up to 2 MiB), best fit by (size, address), splitting when at least
512 bytes (small) or more than 1 MiB (large) would remain, freed blocks merging with free neighbours of
their own segment only. Every expected figure below is worked out by hand from those rules; on a CUDA
machine the last test replays traces through torch.cuda itself and compares memory_stats().

The planners' references are maths: a placement is valid when no two tensors live at the same program
counter share a byte (ortlab.memory.validate), and no valid placement is below the most bytes live at
one program counter.
"""
import json
import os
import subprocess
import sys

import pytest
import torch

from test_memory import chain_model, training_model
from ortlab.errors import OrtlabError
from ortlab.memory import (CachingAllocator, OutOfMemoryError, Plan, PlanValidationError, ValuePlan,
                           compare_allocators, compare_planners, greedy_by_size, peak_by_order, plan,
                           session_graph)
from ortlab.memory.mem_pattern_planner import MemPatternPlanner
from ortlab.memory.planners import place

KIB, MIB = 1 << 10, 1 << 20


def stats(allocator, *keys):
    found = allocator.memory_stats()
    return tuple(found[k] for k in keys)


# --- the caching allocator, by PyTorch's rules -----------------------------------------------------------
@pytest.mark.parametrize("request_bytes, allocated, reserved, pool", [
    (1, 512, 2 * MIB, "small_pool"),                     # at least 512 bytes, in a 2 MiB small segment
    (513, 1024, 2 * MIB, "small_pool"),                  # a multiple of 512
    (1 * MIB, 1 * MIB, 2 * MIB, "small_pool"),           # 1 MiB is still small
    (1 * MIB + 1, 1 * MIB + 512, 20 * MIB, "large_pool"),  # over 1 MiB: large, a 20 MiB segment, split
    (9 * MIB, 9 * MIB, 20 * MIB, "large_pool"),          # under 10 MiB: 20 MiB segment, 11 MiB left: split
    (10 * MIB, 10 * MIB, 10 * MIB, "large_pool"),        # 10 MiB: its own size rounded to 2 MiB
    (11 * MIB + 1, 12 * MIB, 12 * MIB, "large_pool"),    # 12 MiB segment, < 1 MiB would remain: no split
    (19 * MIB, 20 * MIB, 20 * MIB, "large_pool"),        # exactly 1 MiB would remain: not > 1 MiB
])
def test_rounding_pools_segment_sizes_and_the_split_rule(request_bytes, allocated, reserved, pool):
    allocator = CachingAllocator()
    allocator.malloc(request_bytes)
    assert stats(allocator, "allocated_bytes.all.current", "reserved_bytes.all.current",
                 f"allocated_bytes.{pool}.current", f"reserved_bytes.{pool}.current",
                 "requested_bytes.all.current", "segment.all.current") == \
        (allocated, reserved, allocated, reserved, request_bytes, 1)
    split = reserved - allocated if allocated < reserved else 0
    assert stats(allocator, "inactive_split_bytes.all.current", "inactive_split.all.current") == \
        (split, 1 if split else 0)


def test_small_requests_are_packed_into_2mib_segments():
    allocator = CachingAllocator()
    for _ in range(4):
        allocator.malloc(512 * KIB)                      # 4 x 512 KiB fill one 2 MiB segment exactly
    assert stats(allocator, "segment.all.current", "reserved_bytes.all.current",
                 "inactive_split_bytes.all.current") == (1, 2 * MIB, 0)
    allocator.malloc(512 * KIB)
    assert stats(allocator, "segment.small_pool.current", "reserved_bytes.all.current") == (2, 4 * MIB)


def test_best_fit_by_size_then_address():
    allocator = CachingAllocator()
    a, b, c, d = (allocator.malloc(n * MIB) for n in (2, 2, 3, 2))   # one 20 MiB segment, 11 MiB tail
    allocator.free(a)
    allocator.free(c)
    assert allocator.malloc(2 * MIB) == a               # the 2 MiB hole, not the 3 MiB one or the tail
    assert allocator.malloc(2 * MIB + 512 * KIB) == c   # the 3 MiB hole: 512 KiB left, not split
    assert stats(allocator, "allocated_bytes.all.current", "segment.all.current") == (9 * MIB, 1)
    w, x, y, z = (allocator.malloc(2 * MIB) for _ in range(4))       # from the tail (11 -> 3 MiB)
    allocator.free(y)
    allocator.free(w)                                   # two equal holes: the lower address wins
    assert allocator.malloc(2 * MIB) == w
    del b, d, x, z


def test_free_merges_within_a_segment_never_across_segments():
    allocator = CachingAllocator()
    a, b, c = (allocator.malloc(4 * MIB) for _ in range(3))          # 20 MiB segment: 8 MiB tail
    allocator.free(a)
    allocator.free(c)                                   # c merges with the tail: holes of 4 and 12 MiB
    assert stats(allocator, "inactive_split_bytes.all.current", "inactive_split.all.current") == \
        (16 * MIB, 2)
    allocator.free(b)                                   # all three merge: the whole segment, unsplit
    assert stats(allocator, "inactive_split_bytes.all.current", "inactive_split.all.current",
                 "reserved_bytes.all.current", "allocated_bytes.all.peak") == (0, 0, 20 * MIB, 12 * MIB)
    assert allocator.malloc(20 * MIB) == a and stats(allocator, "segment.all.current") == (1,)

    other = CachingAllocator()
    first, second = other.malloc(15 * MIB), other.malloc(15 * MIB)   # two 16 MiB segments
    other.free(first)
    other.free(second)
    other.malloc(30 * MIB)                              # 32 MiB free in all, but in two segments
    assert stats(other, "segment.all.current", "reserved_bytes.all.current") == (3, 62 * MIB)


def test_pools_serve_only_their_own_sizes():
    allocator = CachingAllocator()
    allocator.free(allocator.malloc(512 * KIB))         # a cached 2 MiB small segment
    big = allocator.malloc(1 * MIB + 512 * KIB)         # large: a new 20 MiB segment
    allocator.free(big)
    allocator.malloc(KIB)                               # small: back in the small segment
    assert stats(allocator, "segment.small_pool.current", "segment.large_pool.current",
                 "reserved_bytes.all.current") == (1, 1, 22 * MIB)


def test_empty_cache_releases_unsplit_cached_segments_only():
    allocator = CachingAllocator()
    kept = allocator.malloc(4 * MIB)                    # split from a 20 MiB segment: 16 MiB stay free
    allocator.free(allocator.malloc(18 * MIB))          # too big for them: its own 18 MiB segment
    allocator.empty_cache()
    assert stats(allocator, "reserved_bytes.all.current", "segment.all.current", "num_device_free") == \
        (20 * MIB, 1, 1)
    allocator.free(kept)
    allocator.empty_cache()
    assert stats(allocator, "reserved_bytes.all.current", "reserved_bytes.all.peak") == (0, 38 * MIB)


def test_a_memory_limit_releases_the_cache_and_retries_then_runs_out():
    allocator = CachingAllocator(memory_limit=30 * MIB)
    allocator.free(allocator.malloc(15 * MIB))          # a cached 16 MiB segment
    allocator.malloc(20 * MIB)                          # 16 + 20 > 30: release the cache, retry
    assert stats(allocator, "num_alloc_retries", "num_device_free", "reserved_bytes.all.current",
                 "num_ooms") == (1, 1, 20 * MIB, 0)
    with pytest.raises(OutOfMemoryError, match="memory_limit"):
        allocator.malloc(20 * MIB)
    assert stats(allocator, "num_alloc_retries", "num_ooms") == (2, 1)


def test_max_split_size_keeps_oversize_blocks_whole():
    allocator = CachingAllocator(max_split_size=32 * MIB)
    allocator.free(allocator.malloc(40 * MIB))          # an oversize 40 MiB segment, cached
    assert stats(allocator, "oversize_segments.current", "oversize_allocations.peak", "max_split_size") == \
        (1, 1, 32 * MIB)
    allocator.malloc(8 * MIB)                           # may not take the oversize block: new 20 MiB
    assert stats(allocator, "reserved_bytes.all.current") == (60 * MIB,)
    allocator.malloc(30 * MIB)                          # under max_split_size: not the oversize block
    assert stats(allocator, "segment.all.current") == (3,)
    allocator.malloc(39 * MIB)                          # oversize, within 20 MiB of 40: reused, unsplit
    assert stats(allocator, "segment.all.current", "allocated_bytes.all.current") == \
        (3, 8 * MIB + 30 * MIB + 40 * MIB)
    with pytest.raises(OrtlabError, match="more than 20 MiB"):
        CachingAllocator(max_split_size=20 * MIB)


def test_stats_are_named_as_torch_names_them():
    found = CachingAllocator().memory_stats()
    assert list(found) == sorted(found)
    for name in ("allocation", "allocated_bytes", "active", "active_bytes", "segment", "reserved_bytes",
                 "inactive_split", "inactive_split_bytes", "requested_bytes"):
        for pool in ("all", "small_pool", "large_pool"):
            for metric in ("current", "peak", "allocated", "freed"):
                assert f"{name}.{pool}.{metric}" in found
    assert found["max_split_size"] == -1 and found["num_alloc_retries"] == 0


def test_replay_takes_bfcarenas_trace_format():
    allocator = CachingAllocator()
    left = allocator.replay([("alloc", 3 * MIB), 100, ("free", 0), ("alloc", 0)])
    assert sorted(left) == [1, 3] and left[3] is None
    assert stats(allocator, "allocated_bytes.all.current", "allocation.all.allocated") == (512, 2)
    with pytest.raises(OrtlabError, match="not an allocation made earlier"):
        CachingAllocator().replay([("free", 0)])
    with pytest.raises(OrtlabError, match="free each address"):
        CachingAllocator().free(12345)


def test_compare_allocators_on_a_hand_worked_trace():
    """BFCArena: a 4 MiB region (1 MiB doubled until 3 MiB fits), a second 4 MiB region, the 1 KiB
    request split from the freed first one. Caching allocator: both 3 MiB blocks split from one 20 MiB
    segment, the 1 KiB request in a new 2 MiB small segment."""
    table = compare_allocators([("alloc", 3 * MIB), ("alloc", 3 * MIB), ("free", 0), ("alloc", KIB)])
    rows = {row[0]: row[1:] for row in table.rows}
    assert rows["trace peak (requested bytes live at once)"] == (6 * MIB, 6 * MIB)
    assert rows["peak in use (rounded blocks)"] == (8 * MIB, 6 * MIB)
    assert rows["peak reserved"] == (8 * MIB, 22 * MIB)
    assert rows["growths (extensions / segments)"] == (2, 2)
    assert rows["fragmentation (1 - peak in use / peak reserved)"] == ("0.00%", f"{1 - 6 / 22:.2%}")


def plan_trace(pattern):
    return plan(chain_model(), {"x": (1_000_000,)}).allocation_trace(pattern=pattern)


@pytest.mark.parametrize("pattern", [False, True])
def test_compare_allocators_on_a_plan_trace(pattern):
    trace = plan_trace(pattern)
    rows = {row[0]: row[1:] for row in compare_allocators(trace).rows}
    live, peak = 0, 0        # the trace's peak: each alloc adds its bytes, each free takes its alloc's
    for event in trace:
        live += event[1] if event[0] == "alloc" else -trace[event[1]][1]
        peak = max(peak, live)
    assert rows["trace peak (requested bytes live at once)"] == (peak, peak)
    for k in range(2):
        assert peak <= rows["peak in use (rounded blocks)"][k] <= rows["peak reserved"][k]


@pytest.mark.skipif(not torch.cuda.is_available(),
                    reason="needs a CUDA device: replays traces through torch.cuda's own caching "
                           "allocator (torch.cuda.caching_allocator_alloc, _delete), compares memory_stats()")
def test_simulation_matches_torch_cuda_memory_stats():
    """A fresh process (a clean allocator, default PYTORCH_CUDA_ALLOC_CONF) replays each trace through
    torch.cuda; the simulation must report the same statistics. (Best fit breaks ties between equal
    free blocks by address; the simulation gives each new segment a higher address than the last, which
    is what cudaMalloc usually does: a tie broken the other way could change later merges.)"""
    traces = [[("alloc", 3 * MIB), ("alloc", 3 * MIB), ("free", 0), ("alloc", KIB)],
              [("alloc", n * MIB) for n in (2, 2, 3, 2)] + [("free", 0), ("free", 2), ("alloc", 2 * MIB)],
              plan_trace(False), plan_trace(True)]
    script = """
import json, sys, torch
out = []
for trace in json.loads(sys.stdin.read()):
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()
    ptrs = {}
    for k, (kind, value) in enumerate(trace):
        if kind == "alloc":
            ptrs[k] = torch.cuda.caching_allocator_alloc(value)
        else:
            torch.cuda.caching_allocator_delete(ptrs.pop(value))
    out.append(dict(torch.cuda.memory_stats()))
    for ptr in ptrs.values():
        torch.cuda.caching_allocator_delete(ptr)
print(json.dumps(out))
"""
    env = {k: v for k, v in os.environ.items() if k != "PYTORCH_CUDA_ALLOC_CONF"}
    done = subprocess.run([sys.executable, "-c", script], input=json.dumps(traces), capture_output=True,
                          text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    keys = ["allocation.all.allocated", "allocated_bytes.all.current", "allocated_bytes.all.peak",
            "reserved_bytes.all.current", "reserved_bytes.all.peak", "segment.all.current",
            "segment.all.peak", "inactive_split.all.current", "inactive_split_bytes.all.current",
            "inactive_split_bytes.all.peak", "requested_bytes.all.peak", "num_alloc_retries"]
    for trace, measured in zip(traces, json.loads(done.stdout)):
        allocator = CachingAllocator()
        allocator.replay([tuple(e) for e in trace])
        simulated = allocator.memory_stats()
        assert {k: simulated[k] for k in keys} == {k: measured[k] for k in keys}


# --- planners ----------------------------------------------------------------------------------------------
def toy_plan(tensors, lower_bound):
    """A Plan holding only pattern tensors (name, bytes, start, end), all at offset 0."""
    values = [ValuePlan(i, name, "kAllocate", size=size, start=start, end=end, offset=0)
              for i, (name, size, start, end) in enumerate(tensors)]
    p = Plan(order=[], values=values, peak_bytes=0, lower_bound_bytes=lower_bound, unresolved=[], dims={})
    p._by_name = {v.name: v for v in values}
    return p


def test_greedy_by_size_where_program_order_best_fit_loses():
    """A [0, 1] and B [0, 3] start together, C [2, 3] comes when A is dead but B is not. In program order
    A goes at 0 and B at 2 units; C (3 units) does not fit in A's 2-unit hole below B: it goes at 3, a
    6-unit block. Largest first: C at 0, A at 0 (never live with C), B at 3: 4 units, the most live at
    once (B and C at pcs 2-3)."""
    unit = 256
    tensors = [("A", 2 * unit, 0, 1), ("B", 1 * unit, 0, 3), ("C", 3 * unit, 2, 3)]
    ort = MemPatternPlanner()
    for index, (_, size, start, end) in enumerate(tensors):
        ort.trace_allocation(index, size, ([start], [end]))
    assert ort.pattern()[1] == 6 * unit
    greedy = greedy_by_size(toy_plan(tensors, 4 * unit))
    assert greedy.offsets == {2: 0, 0: 0, 1: 3 * unit} and greedy.peak_bytes == 4 * unit
    assert greedy.validate() == 3


def test_first_fit_and_best_fit_choose_different_gaps():
    taken = [(0, 100), (300, 100), (450, 50)]          # free: [100, 300) and [400, 450), then 500 on
    assert place(50, taken, "first") == 100 and place(50, taken, "best") == 400
    assert place(150, taken, "first") == 100 == place(150, taken, "best")
    assert place(250, taken, "first") == 500 == place(250, taken, "best")
    with pytest.raises(OrtlabError, match="fit must be one of"):
        greedy_by_size(toy_plan([("A", 256, 0, 0)], 256), fit="worst")


def test_a_broken_placement_does_not_validate():
    tensors = [("A", 512, 0, 2), ("B", 512, 1, 3)]
    placement = greedy_by_size(toy_plan(tensors, 1024))
    placement.offsets[1] = placement.offsets[0]
    with pytest.raises(PlanValidationError, match="overlap in the block"):
        placement.validate()


@pytest.fixture(scope="module")
def tinygpt_training_64():
    """The lab's TinyGPT forward + backward graph at batch 64 (ortlab's gradient builder), as
    tests/memory/test_memory.py builds it (its ORT block is checked against ORT 1.19.2 there)."""
    training, feeds = training_model("gpt", "ortlab", 64)
    return session_graph(training), feeds


def most_live_at_once(p):
    """The lower bound, from the pattern tensors' intervals: the most bytes live at one program counter."""
    pcs = {pc for v in p.planned() for pc in (v.start, v.end)}
    return max(sum(v.size for v in p.planned() if v.start <= pc <= v.end) for pc in pcs)


def test_greedy_by_size_on_tinygpt_training(tinygpt_training_64):
    """Valid placements (compare_planners validates each), never below the lower bound, and on this
    graph no larger than ORT's block, in both execution orders."""
    model, feeds = tinygpt_training_64
    table = compare_planners(model, feeds)
    assert [row[0] for row in table.rows] == ["default", "priority"]
    for order, _, ort_block, first, best, bound, *_ in table.rows:
        p = plan(model, feeds, order=order)
        assert (ort_block, bound) == (p.peak_bytes, most_live_at_once(p))
        assert bound <= first <= ort_block and bound <= best <= ort_block


def test_peak_by_order(tinygpt_training_64):
    model, feeds = tinygpt_training_64
    table = peak_by_order(model, feeds)
    for order, block, bound, planned, *_ in table.rows:
        p = plan(model, feeds, order=order)
        assert (block, bound, planned) == (p.peak_bytes, most_live_at_once(p), len(p.planned()))
        assert bound <= block

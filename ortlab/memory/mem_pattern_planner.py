"""The memory pattern: one block per location, every planned tensor at an offset in it.

Mirrors onnxruntime/core/framework/mem_pattern_planner.h (MemPatternPlanner: blocks_ is the list of
live blocks sorted by offset; TraceAllocation takes the gap between live blocks, or the tail gap up to
buffer_size_, with the least waste, else the end of the furthest live block; with program counters
(training builds) a live block whose [start, end] schedule does not overlap the new one's is ignored;
TraceFree drops a block; the peak is buffer_size_) and SessionState::GeneratePatternGroupCache in
onnxruntime/core/framework/session_state.cc (the training build's static planning on the first run:
dim_params resolved from the feeds' shapes, TryResolveShape on every node output, then in execution
order a TraceAllocation for each kAllocate non-string tensor of known size with its
CalcMemSizeForArrayWithAlignment<256> size, and a TraceFree for each release action).
"""
from dataclasses import dataclass, field

from ortlab.errors import OrtlabError
from ortlab.memory.allocation_planner import K_ALLOCATE, element_size, is_string, shape_of

ALIGNMENT = 256  # kAllocAlignment (onnxruntime/core/framework/allocator.h)
SIZE_MAX = (1 << 64) - 1  # size_t: TryResolveShape's SafeInt<size_t> and CalcMemSizeForArrayWithAlignment's limit


def aligned_size(elements, elem_size, alignment=ALIGNMENT):
    """IAllocator::CalcMemSizeForArrayWithAlignment<256>: bytes rounded up to a multiple of 256."""
    return (elements * elem_size + alignment - 1) // alignment * alignment


def overlapping(counter1, counter2):
    """MemPatternPlanner::OverlappingTimeSchedules on (starts, ends) pairs, intervals inclusive."""
    (s1, e1), (s2, e2) = counter1, counter2
    i = j = 0
    while i < len(s1) and j < len(s2):
        if s1[i] <= s2[j]:
            if e1[i] >= s2[j]:
                return True
            i += 1
        else:
            if e2[j] >= s1[i]:
                return True
            j += 1
    return False


@dataclass
class MemoryBlock:
    offset: int
    size: int


class MemPatternPlanner:
    """Best-fit placement by offset (training build: with program counters)."""

    def __init__(self, using_counters=True):
        self.using_counters = using_counters
        self.allocs = []      # (ml index, MemoryBlock, counter or None)
        self.blocks = []      # indices into allocs, sorted by offset
        self.buffer_size = 0

    def trace_allocation(self, index, size, counter=None):
        if size == 0:
            self.allocs.append((index, MemoryBlock(0, 0), None))
            return
        current, waste, best, found = 0, None, 0, False
        for k in self.blocks:
            _, block, other = self.allocs[k]
            if self.using_counters and other is not None and not overlapping(counter, other):
                continue
            if block.offset >= current:
                gap = block.offset - current
                if gap >= size and (waste is None or gap - size < waste):
                    waste, best, found = gap - size, current, True
            current = max(current, block.offset + block.size)
        if current < self.buffer_size:
            gap = self.buffer_size - current
            if gap >= size and (waste is None or gap - size < waste):
                best, found = current, True
        if not found:
            best = current
        self.buffer_size = max(self.buffer_size, best + size)
        self.allocs.append((index, MemoryBlock(best, size), counter if self.using_counters else None))
        position = len(self.blocks)
        for p, k in enumerate(self.blocks):
            block = self.allocs[k][1]
            if block.offset < best:
                continue
            if block.offset > best or block.size >= size:
                position = p
                break
        self.blocks.insert(position, len(self.allocs) - 1)

    def trace_free(self, index):
        for p, k in enumerate(self.blocks):
            if self.allocs[k][0] == index:
                del self.blocks[p]
                return

    def pattern(self):
        """{ml index: MemoryBlock} and the peak (GenerateMemPattern)."""
        return {index: block for index, block, _ in self.allocs}, self.buffer_size


class ShapeResolutionError(OrtlabError):
    """The feeds do not fit the graph inputs' declared shapes (ResolveDimParams fails)."""


class SizeOverflowError(OrtlabError):
    """A planned tensor's byte count does not fit a size_t (GeneratePatternGroupCache: "Size overflow")."""


def resolve_dim_params(graph, types, input_shapes):
    """ResolveDimParams: {dim_param: size} from the graph inputs' declared shapes and the feeds."""
    found = {}
    for name in [n for n in graph.inputs if n not in graph.initializers]:  # GraphViewer::GetInputs
        if name not in input_shapes:
            raise ShapeResolutionError(
                f"graph input '{name}' is not in input_shapes ({sorted(input_shapes)}): ORT resolves "
                "symbolic dims from every feed; give a shape for each graph input")
        given = tuple(input_shapes[name])
        shape = shape_of(types.get(name))
        if not given and shape is None:
            continue
        if shape is None or len(shape.dim) != len(given):
            declared = "no shape" if shape is None else f"rank {len(shape.dim)}"
            raise ShapeResolutionError(
                f"graph input '{name}' is declared with {declared} but fed shape {list(given)}; ORT cannot "
                "resolve the symbolic dims then (and skips static memory planning); feed the declared rank")
        for dim, size in zip(shape.dim, given):
            if dim.HasField("dim_param") and dim.dim_param not in found:
                found[dim.dim_param] = int(size)
    return found


def try_resolve_shape(type_proto, dims):
    """TryResolveShape: (resolved dims or None, ok). ok is False when a dim_param is not resolvable
    (ORT logs "Could not resolve shape"); a missing shape, an unknown or a 0 dim give (None, True)."""
    shape = shape_of(type_proto)
    if shape is None:
        return None, True
    resolved, size = [], 1
    for dim in shape.dim:
        if dim.HasField("dim_param"):
            if dim.dim_param not in dims:
                return None, False
            size *= dims[dim.dim_param]
            resolved.append(dims[dim.dim_param])
        elif dim.HasField("dim_value") and dim.dim_value > 0:
            size *= dim.dim_value
            resolved.append(dim.dim_value)
        else:
            size = 0
    return (tuple(resolved) if size else None), True


@dataclass
class StaticPattern:
    """What GeneratePatternGroupCache produced."""

    blocks: dict                       # ml index -> MemoryBlock
    peak: int
    resolved: dict                     # ml index -> resolved dims
    sizes: dict                        # ml index -> aligned bytes (planned values)
    unresolved: list = field(default_factory=list)   # ml indices ORT logs "Could not resolve shape" for


def generate_pattern_group_cache(plan, dims):
    """SessionState::GeneratePatternGroupCache for a SequentialExecutionPlan and resolved dims."""
    resolved, unresolved = {}, []
    for node in plan.order:
        for arg in node.outputs:
            if not arg.exists():
                continue
            index = plan.index_of[arg.name]
            type_proto = plan.types.get(arg.name)
            if type_proto is not None and not type_proto.HasField("tensor_type"):
                continue
            dims_found, ok = try_resolve_shape(type_proto, dims)
            if not ok:
                unresolved.append(index)
            elif dims_found is not None:
                resolved[index] = dims_found
    planner, sizes = MemPatternPlanner(using_counters=True), {}
    for pc, node in enumerate(plan.order):
        for arg in node.outputs:
            if not arg.exists():
                continue
            index = plan.index_of[arg.name]
            value, type_proto = plan.values[index], plan.types.get(arg.name)
            if type_proto is not None and not type_proto.HasField("tensor_type"):
                continue
            if value.kind == K_ALLOCATE and not is_string(type_proto) and index in resolved:
                elements = 1
                for d in resolved[index]:
                    elements *= d
                sizes[index] = aligned_size(elements, element_size(type_proto))
                if sizes[index] > SIZE_MAX:
                    raise SizeOverflowError(
                        f"'{arg.name}' {list(resolved[index])} takes {sizes[index]:,} bytes, more than a size_t holds: "
                        "ORT's GeneratePatternGroupCache fails with \"Size overflow\" (session_state.cc); give "
                        "input shapes of a size that can be allocated")
                planner.trace_allocation(index, sizes[index], (value.starts, value.ends))
        for index in plan.release_after.get(pc, []):
            if not is_string(plan.types.get(plan.values[index].name)):
                planner.trace_free(index)
    blocks, peak = planner.pattern()
    return StaticPattern(blocks, peak, resolved, sizes, unresolved)

"""ORT's best-fit-with-coalescing arena, simulated: where each request lands, when the arena grows
by how much, and the AllocatorStats, replayed from an allocation trace.

Mirrors onnxruntime/core/framework/bfc_arena.h/.cc and allocator_stats.h: 21 bins (bin b holds free
chunks of at least 256 << b bytes, BinNumForSize = min(20, floor(log2(max(bytes, 256) >> 8)))),
requests rounded up to 256 bytes, FindChunkPtr scanning bins upward for the smallest free chunk
(ordered by size, then address) that fits, the split rule (split when the chunk is at least twice the
request, or would waste max_dead_bytes_per_chunk), FreeAndMaybeCoalesce (merge with the next, then the
previous free chunk), and Extend: kNextPowerOfTwo doubles curr_region_allocation_bytes_ (starting at
initial_chunk_size_bytes) until the request fits, and doubles it after an extension that did not need
to grow it (capped at max_power_of_two_extend_bytes; the cap's exact code in 1.19.2 is unverified);
kSameAsRequested extends by the rounded request. Reserve() is a direct allocation outside the bins.
The log lines are ORT's words (bfc_arena.cc:347 and :206-209).
"""
import bisect
from dataclasses import dataclass, field

import numpy as np

from ortlab.errors import OrtlabError

K_NEXT_POWER_OF_TWO, K_SAME_AS_REQUESTED = "kNextPowerOfTwo", "kSameAsRequested"
MIN_ALLOCATION_BITS, NUM_BINS = 8, 21
MIN_ALLOCATION_SIZE = 1 << MIN_ALLOCATION_BITS


class ArenaError(OrtlabError):
    """The simulated arena cannot do what was asked (out of memory, a bad free, a bad trace)."""


def byte_count(value, what, error=ArenaError):
    """`value` as a Python int >= 0 (numpy integers too; not a bool, float or None), else `error`: ORT's
    allocators take a size_t."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value < 0:
        raise error(f"{what} takes a byte count (an int >= 0), not {type(value).__name__} {value!r}")
    return int(value)


def trace_events(trace, error=ArenaError):
    """(position, kind, value) for each event of an allocation trace, checked: ('alloc', bytes) or a bare
    int allocates, ('free', k) frees the allocation of event k. One reading for every replay."""
    if isinstance(trace, (str, bytes, dict)) or not hasattr(trace, "__iter__"):
        raise error(f"a trace is a list of events ('alloc', bytes) / ('free', k), not {type(trace).__name__}")
    for position, event in enumerate(trace):
        if isinstance(event, (int, np.integer)) and not isinstance(event, (bool, np.bool_)):
            event = ("alloc", event)
        if not isinstance(event, (tuple, list)) or len(event) != 2 or event[0] not in ("alloc", "free"):
            raise error(f"trace event {position} is {event!r}; events are ('alloc', bytes) or ('free', k)")
        kind, value = event
        yield position, kind, byte_count(value, f"trace event {position} ({kind!r}, ...)", error)


def rounded_bytes(num_bytes):
    """BFCArena::RoundedBytes: up to a multiple of 256."""
    return (num_bytes + MIN_ALLOCATION_SIZE - 1) // MIN_ALLOCATION_SIZE * MIN_ALLOCATION_SIZE


def bin_num_for_size(num_bytes):
    """BFCArena::BinNumForSize."""
    v = max(num_bytes, MIN_ALLOCATION_SIZE) >> MIN_ALLOCATION_BITS
    return min(NUM_BINS - 1, v.bit_length() - 1)


def bin_num_to_size(index):
    return MIN_ALLOCATION_SIZE << index


@dataclass
class AllocatorStats:
    """allocator_stats.h."""

    num_allocs: int = 0
    num_reserves: int = 0
    num_arena_extensions: int = 0
    num_arena_shrinkages: int = 0
    bytes_in_use: int = 0
    total_allocated_bytes: int = 0
    max_bytes_in_use: int = 0
    max_alloc_size: int = 0
    bytes_limit: int = 0


@dataclass
class Chunk:
    ptr: int
    size: int
    region: int
    prev: object = None
    next: object = None
    requested: int = 0
    allocation_id: int = -1
    bin_num: int = None

    def in_use(self):
        return self.allocation_id != -1


@dataclass
class Extension:
    """One growth of the arena, as ORT logs it."""

    requested: int
    rounded: int
    bin_num: int
    extended_by: int
    total: int

    def lines(self, device="Cpu"):
        return [f"Extending BFCArena for {device}. bin_num:{self.bin_num} (requested) num_bytes: "
                f"{self.requested} (actual) rounded_bytes:{self.rounded}",
                f"Extended allocation by {self.extended_by} bytes.",
                f"Total allocated bytes: {self.total}"]


@dataclass
class BFCArena:
    """The arena. alloc(n) -> address, free(address); .extensions, .stats, .lines()."""

    initial_chunk_size_bytes: int = 1 << 20
    max_dead_bytes_per_chunk: int = 128 << 20
    initial_growth_chunk_size_bytes: int = 2 << 20
    max_power_of_two_extend_bytes: int = 1 << 30
    memory_limit: int = (1 << 64) - 1
    arena_extend_strategy: str = K_NEXT_POWER_OF_TWO
    device: str = "Cpu"
    stats: AllocatorStats = field(default_factory=AllocatorStats)
    extensions: list = field(default_factory=list)

    def __post_init__(self):
        if self.arena_extend_strategy not in (K_NEXT_POWER_OF_TWO, K_SAME_AS_REQUESTED):
            raise ArenaError(f"arena_extend_strategy must be {K_NEXT_POWER_OF_TWO!r} (0, ORT's default) or "
                             f"{K_SAME_AS_REQUESTED!r} (1), not {self.arena_extend_strategy!r}")
        for name in ("initial_chunk_size_bytes", "max_dead_bytes_per_chunk", "initial_growth_chunk_size_bytes",
                     "max_power_of_two_extend_bytes", "memory_limit"):
            value = getattr(self, name)
            if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or value <= 0:
                raise ArenaError(f"{name} must be a positive int (bytes), not {value!r}")
            setattr(self, name, int(value))
        first = min(self.memory_limit, self.initial_chunk_size_bytes)
        self.curr_region_allocation_bytes = rounded_bytes(first)
        self.stats.bytes_limit = self.memory_limit
        self.bins = [[] for _ in range(NUM_BINS)]     # sorted (size, ptr) keys
        self.chunks = {}                              # ptr -> Chunk (live chunks, free or in use)
        self.reserved = {}
        self.regions = []                             # (base, size)
        self.next_address = 1 << 32
        self.next_allocation_id = 1

    # --- bins ------------------------------------------------------------------------------------------
    def _insert_free(self, chunk):
        chunk.bin_num = bin_num_for_size(chunk.size)
        bisect.insort(self.bins[chunk.bin_num], (chunk.size, chunk.ptr))

    def _remove_free(self, chunk):
        keys = self.bins[chunk.bin_num]
        keys.pop(bisect.bisect_left(keys, (chunk.size, chunk.ptr)))
        chunk.bin_num = None

    # --- extend ----------------------------------------------------------------------------------------
    def _available(self):
        """Bytes the memory limit still allows, rounded down to 256."""
        left = self.memory_limit - self.stats.total_allocated_bytes
        return left // MIN_ALLOCATION_SIZE * MIN_ALLOCATION_SIZE

    def _extend_bytes(self, rounded):
        if self.arena_extend_strategy == K_SAME_AS_REQUESTED:
            return rounded
        increased = False
        while rounded > self.curr_region_allocation_bytes:
            self.curr_region_allocation_bytes *= 2
            increased = True
        available = self._available()
        extend = min(self.curr_region_allocation_bytes, available)
        if not increased:
            if self.curr_region_allocation_bytes * 2 < self.max_power_of_two_extend_bytes:
                self.curr_region_allocation_bytes *= 2
            else:
                self.curr_region_allocation_bytes = self.max_power_of_two_extend_bytes
        return extend

    def _extend(self, requested, rounded, bin_num):
        available = self._available()
        if rounded > available:
            raise ArenaError(f"Available memory of {available} is smaller than requested bytes of {rounded}")
        size = self._extend_bytes(rounded)
        base = self.next_address
        self.next_address += size + (1 << 20)
        self.regions.append((base, size))
        self.stats.total_allocated_bytes += size
        self.stats.num_arena_extensions += 1
        self.extensions.append(Extension(requested, rounded, bin_num, size, self.stats.total_allocated_bytes))
        chunk = Chunk(base, size, len(self.regions) - 1)
        self.chunks[base] = chunk
        self._insert_free(chunk)

    # --- allocate / free --------------------------------------------------------------------------------
    def _find_chunk(self, bin_num, rounded, requested):
        for b in range(bin_num, NUM_BINS):
            keys = self.bins[b]
            k = bisect.bisect_left(keys, (rounded, -1))
            if k < len(keys):
                chunk = self.chunks[keys[k][1]]
                self._remove_free(chunk)
                if chunk.size >= 2 * rounded or chunk.size - rounded >= self.max_dead_bytes_per_chunk:
                    self._split(chunk, rounded)
                chunk.requested = requested
                chunk.allocation_id = self.next_allocation_id
                self.next_allocation_id += 1
                self.stats.num_allocs += 1
                self.stats.bytes_in_use += chunk.size
                self.stats.max_bytes_in_use = max(self.stats.max_bytes_in_use, self.stats.bytes_in_use)
                self.stats.max_alloc_size = max(self.stats.max_alloc_size, chunk.size)
                return chunk
        return None

    def _split(self, chunk, num_bytes):
        rest = Chunk(chunk.ptr + num_bytes, chunk.size - num_bytes, chunk.region, prev=chunk, next=chunk.next)
        if chunk.next is not None:
            chunk.next.prev = rest
        chunk.next, chunk.size = rest, num_bytes
        self.chunks[rest.ptr] = rest
        self._insert_free(rest)

    def alloc(self, num_bytes):
        """AllocateRawInternal: the address of a chunk of at least `num_bytes` (None for 0 bytes)."""
        num_bytes = byte_count(num_bytes, "alloc")
        if num_bytes == 0:
            return None
        rounded = rounded_bytes(num_bytes)
        bin_num = bin_num_for_size(rounded)
        chunk = self._find_chunk(bin_num, rounded, num_bytes)
        if chunk is None:
            self._extend(num_bytes, rounded, bin_num)
            chunk = self._find_chunk(bin_num, rounded, num_bytes)
        return chunk.ptr

    def free(self, ptr):
        """Free / FreeAndMaybeCoalesce: merge with the next, then the previous free chunk."""
        if ptr is None:
            return  # ORT's Free(nullptr) does nothing (what alloc(0) and reserve(0) return)
        if ptr in self.reserved:
            size = self.reserved.pop(ptr)
            self.stats.bytes_in_use -= size
            self.stats.total_allocated_bytes -= size
            return
        chunk = self.chunks.get(ptr)
        if chunk is None or not chunk.in_use():
            shown = f"{ptr:#x}" if isinstance(ptr, (int, np.integer)) else repr(ptr)
            raise ArenaError(f"free({shown}): no chunk in use starts there; free each address alloc "
                             "returned, once")
        chunk.allocation_id = -1
        self.stats.bytes_in_use -= chunk.size
        if chunk.next is not None and not chunk.next.in_use():
            self._merge(chunk, chunk.next)
        if chunk.prev is not None and not chunk.prev.in_use():
            chunk = self._merge(chunk.prev, chunk)
        self._insert_free(chunk)

    def _merge(self, first, second):
        if second.bin_num is not None:
            self._remove_free(second)
        if first.bin_num is not None:
            self._remove_free(first)
        first.size += second.size
        first.next = second.next
        if second.next is not None:
            second.next.prev = first
        del self.chunks[second.ptr]
        return first

    def reserve(self, size):
        """Reserve(): a direct allocation outside the bins (ORT logs "Reserving memory in BFCArena"); None for
        0 bytes, as ORT returns nullptr."""
        size = byte_count(size, "reserve")
        if size == 0:
            return None
        ptr = self.next_address
        self.next_address += size + (1 << 20)
        self.reserved[ptr] = size
        self.stats.bytes_in_use += size
        self.stats.num_reserves += 1
        self.stats.num_allocs += 1
        self.stats.max_alloc_size = max(self.stats.max_alloc_size, size)
        self.stats.max_bytes_in_use = max(self.stats.max_bytes_in_use, self.stats.bytes_in_use)
        self.stats.total_allocated_bytes += size
        return ptr

    # --- traces -----------------------------------------------------------------------------------------
    def replay(self, trace):
        """Run a trace: ('alloc', bytes) / an int (allocate), ('free', k) (free the k-th event's
        allocation). Returns {event position: address}."""
        addresses = {}
        for position, kind, value in trace_events(trace):
            if kind == "alloc":
                addresses[position] = self.alloc(value)
                continue
            if value not in addresses:
                raise ArenaError(f"trace event {position} frees event {value}, which is not an "
                                 "allocation made earlier in the trace")
            address = addresses.pop(value)
            if address is not None:  # a 0-byte allocation got no chunk: nothing to free
                self.free(address)
        return addresses

    def lines(self):
        """The arena's log lines so far, ORT's words."""
        return [line for e in self.extensions for line in e.lines(self.device)]

    def free_bytes(self):
        """Bytes in free chunks."""
        return sum(size for keys in self.bins for size, _ in keys)

"""PyTorch's CUDA caching allocator, simulated on one device and one stream, replaying the same traces
as BFCArena (Plan.allocation_trace()), with the statistics torch.cuda.memory_stats() reports.

Mirrors DeviceCachingAllocator in c10/cuda/CUDACachingAllocator.cpp (PyTorch 2.x, default settings:
no expandable segments, no roundup_power2_divisions, max_split_size unlimited, no garbage collection):
- round_size: requests round up to a multiple of 512 bytes (kMinBlockSize), at least 512;
- get_pool: rounded sizes up to 1 MiB (kSmallSize) go to the small pool, larger ones to the large pool;
  a pool only ever serves its own sizes;
- get_free_block: best fit in the pool, blocks ordered by (size, address);
- get_allocation_size: a new segment (cudaMalloc) is 2 MiB for the small pool (kSmallBuffer), 20 MiB
  (kLargeBuffer) for requests under 10 MiB (kMinLargeAlloc), else the request rounded up to 2 MiB;
- should_split: a small-pool block splits when at least 512 bytes would remain, a large-pool block when
  more than 1 MiB would remain (and the request is under max_split_size);
- free_block: a freed block merges with its free neighbours in its own segment (try_merge_blocks);
  segments never merge with each other, and stay reserved until empty_cache() (release_cached_blocks);
- with a memory limit (torch.cuda.set_per_process_memory_fraction): a failed cudaMalloc frees cached
  oversize blocks (release_available_cached_blocks, only with max_split_size set), then every unsplit
  cached segment, and retries (num_alloc_retries); a failure after that is an OOM (num_ooms).
Statistics follow increase_stat / decrease_stat, alloc_found_block and free_block, by the names and
the flattening of torch.cuda.memory_stats (e.g. "reserved_bytes.all.peak").
"""
import bisect
from dataclasses import dataclass

from ortlab.errors import OrtlabError
from ortlab.memory.bfc_arena import BFCArena, byte_count, trace_events
from ortlab.viz import Table

MIB = 1 << 20
K_MIN_BLOCK_SIZE = 512            # all sizes are rounded to at least 512 bytes
K_SMALL_SIZE = 1 * MIB            # largest "small" allocation
K_SMALL_BUFFER = 2 * MIB          # small allocations are packed in 2 MiB segments
K_LARGE_BUFFER = 20 * MIB         # large allocations under kMinLargeAlloc get a 20 MiB segment
K_MIN_LARGE_ALLOC = 10 * MIB
K_ROUND_LARGE = 2 * MIB           # larger ones are rounded up to 2 MiB
UNLIMITED = (1 << 64) - 1         # SIZE_MAX: max_split_size's default

ARRAY_STATS = ("allocation", "allocated_bytes", "active", "active_bytes", "segment", "reserved_bytes",
               "inactive_split", "inactive_split_bytes", "requested_bytes")
POOLS = ("all", "small_pool", "large_pool")


class CachingAllocatorError(OrtlabError):
    """The simulated caching allocator cannot do what was asked (a bad free, a bad trace, bad options)."""


class OutOfMemoryError(CachingAllocatorError):
    """The request does not fit in the memory limit even after the cache was released (torch's
    torch.cuda.OutOfMemoryError)."""


def round_size(size):
    """DeviceCachingAllocator::round_size (roundup_power2_divisions off): a multiple of 512, at least 512."""
    if size < K_MIN_BLOCK_SIZE:
        return K_MIN_BLOCK_SIZE
    return K_MIN_BLOCK_SIZE * ((size + K_MIN_BLOCK_SIZE - 1) // K_MIN_BLOCK_SIZE)


def get_allocation_size(size):
    """DeviceCachingAllocator::get_allocation_size: the bytes of a new segment for a rounded request."""
    if size <= K_SMALL_SIZE:
        return K_SMALL_BUFFER
    if size < K_MIN_LARGE_ALLOC:
        return K_LARGE_BUFFER
    return K_ROUND_LARGE * ((size + K_ROUND_LARGE - 1) // K_ROUND_LARGE)


def pool_name(size):
    """get_pool: 'small_pool' for rounded sizes up to 1 MiB, else 'large_pool'."""
    return "small_pool" if size <= K_SMALL_SIZE else "large_pool"


@dataclass
class Stat:
    """c10::CachingAllocator::Stat."""

    current: int = 0
    peak: int = 0
    allocated: int = 0
    freed: int = 0

    def increase(self, amount):
        self.current += amount
        self.peak = max(self.peak, self.current)
        self.allocated += amount

    def decrease(self, amount):
        self.current -= amount
        self.freed += amount


@dataclass(eq=False)
class Block:
    """A block of a segment: allocated, or cached in its pool."""

    ptr: int
    size: int
    pool: str
    segment: int
    prev: object = None
    next: object = None
    allocated: bool = False
    requested: int = 0

    def is_split(self):
        return self.prev is not None or self.next is not None


class CachingAllocator:
    """The allocator. malloc(n) -> address, free(address), empty_cache(), replay(trace),
    memory_stats(), segments().

    max_split_size: PYTORCH_CUDA_ALLOC_CONF's max_split_size_mb in bytes (None: unlimited, the default;
    PyTorch requires more than 20 MiB); memory_limit: bytes cudaMalloc may hold at once (None: no limit;
    set_per_process_memory_fraction times the device's memory)."""

    def __init__(self, max_split_size=None, memory_limit=None):
        if max_split_size is not None:
            max_split_size = byte_count(max_split_size, "CachingAllocator(max_split_size=...)", CachingAllocatorError)
        if memory_limit is not None:  # bytes, an int: "1GB" is 1 << 30
            memory_limit = byte_count(memory_limit, "CachingAllocator(memory_limit=...) (None: no limit)",
                                      CachingAllocatorError)
        if max_split_size is not None and max_split_size <= K_LARGE_BUFFER:
            raise CachingAllocatorError(
                f"max_split_size {max_split_size} is too small: PyTorch requires max_split_size_mb > 20 "
                "(more than 20 MiB); pass None for the default (unlimited)")
        self.max_split_size = UNLIMITED if max_split_size is None else int(max_split_size)
        self.memory_limit = memory_limit
        self.pools = {"small_pool": [], "large_pool": []}   # sorted (size, ptr) of cached blocks
        self.blocks = {}                                      # ptr -> Block (every live block)
        self.active = {}                                      # ptr -> allocated Block
        self.total_allocated_memory = 0
        self.next_address = 1 << 32
        self.next_segment = 0
        self.stats = {name: {pool: Stat() for pool in POOLS} for name in ARRAY_STATS}
        self.oversize_allocations, self.oversize_segments = Stat(), Stat()
        self.counters = dict.fromkeys(("num_alloc_retries", "num_ooms", "num_sync_all_streams",
                                       "num_device_alloc", "num_device_free"), 0)

    # --- statistics ------------------------------------------------------------------------------------
    def _increase(self, name, pool, amount):
        for key in ("all", pool):
            self.stats[name][key].increase(amount)

    def _decrease(self, name, pool, amount):
        for key in ("all", pool):
            self.stats[name][key].decrease(amount)

    def memory_stats(self):
        """The statistics as torch.cuda.memory_stats() names and orders them (a dict sorted by key)."""
        flat = {}
        for name, pools in self.stats.items():
            for pool, stat in pools.items():
                for metric in ("current", "peak", "allocated", "freed"):
                    flat[f"{name}.{pool}.{metric}"] = getattr(stat, metric)
        for name, stat in (("oversize_allocations", self.oversize_allocations),
                           ("oversize_segments", self.oversize_segments)):
            for metric in ("current", "peak", "allocated", "freed"):
                flat[f"{name}.{metric}"] = getattr(stat, metric)
        flat.update(self.counters)
        flat["max_split_size"] = -1 if self.max_split_size == UNLIMITED else self.max_split_size
        return dict(sorted(flat.items()))

    # --- pools -----------------------------------------------------------------------------------------
    def _insert(self, block):
        bisect.insort(self.pools[block.pool], (block.size, block.ptr))

    def _remove(self, block):
        keys = self.pools[block.pool]
        keys.pop(bisect.bisect_left(keys, (block.size, block.ptr)))

    def _get_free_block(self, pool, size):
        """get_free_block: the smallest cached block of at least `size`, lowest address first."""
        keys = self.pools[pool]
        k = bisect.bisect_left(keys, (size, -1))
        if k == len(keys):
            return None
        block = self.blocks[keys[k][1]]
        if size < self.max_split_size and block.size >= self.max_split_size:
            return None           # do not return an oversized block for a smaller request
        if size >= self.max_split_size and block.size >= size + K_LARGE_BUFFER:
            return None           # an oversized block may be rounded up, but within a limit
        keys.pop(k)
        return block

    def _should_split(self, block, size):
        remaining = block.size - size
        if block.pool == "small_pool":
            return remaining >= K_MIN_BLOCK_SIZE
        return size < self.max_split_size and remaining > K_SMALL_SIZE

    # --- segments --------------------------------------------------------------------------------------
    def _alloc_block(self, pool, alloc_size, retry=False):
        """alloc_block: cudaMalloc a new segment, or None when the memory limit forbids it."""
        if retry:
            self.counters["num_alloc_retries"] += 1
        if self.memory_limit is not None and self.total_allocated_memory + alloc_size > self.memory_limit:
            return None
        self.total_allocated_memory += alloc_size
        block = Block(self.next_address, alloc_size, pool, self.next_segment)
        self.next_address += alloc_size + K_SMALL_BUFFER      # segments are never contiguous
        self.next_segment += 1
        self.blocks[block.ptr] = block
        self._increase("segment", pool, 1)
        self._increase("reserved_bytes", pool, alloc_size)
        if alloc_size >= self.max_split_size:
            self.oversize_segments.increase(1)
        self.counters["num_device_alloc"] += 1
        return block

    def _release_block(self, block):
        """release_block: cudaFree an unsplit cached segment."""
        self._remove(block)
        del self.blocks[block.ptr]
        self.total_allocated_memory -= block.size
        self._decrease("segment", block.pool, 1)
        self._decrease("reserved_bytes", block.pool, block.size)
        if block.size >= self.max_split_size:
            self.oversize_segments.decrease(1)
        self.counters["num_device_free"] += 1

    def _release_available_cached_blocks(self, pool, size):
        """release_available_cached_blocks: free oversize cached blocks (only with max_split_size set)."""
        if self.max_split_size == UNLIMITED:
            return False
        keys = self.pools[pool]
        target = max(size, self.max_split_size)
        k = bisect.bisect_left(keys, (target, -1))
        if k < len(keys):
            self._release_block(self.blocks[keys[k][1]])
            return True
        released = 0
        for cached_size, ptr in reversed(list(keys)):   # largest first, while oversize
            if released >= target or cached_size < self.max_split_size:
                break
            released += cached_size
            self._release_block(self.blocks[ptr])
        return released >= target

    def empty_cache(self):
        """release_cached_blocks (torch.cuda.empty_cache): cudaFree every unsplit cached segment."""
        self.counters["num_sync_all_streams"] += 1
        for pool in ("large_pool", "small_pool"):
            for _, ptr in list(self.pools[pool]):
                block = self.blocks[ptr]
                if not block.is_split():
                    self._release_block(block)
        return True

    # --- malloc / free ---------------------------------------------------------------------------------
    def malloc(self, num_bytes):
        """DeviceCachingAllocator::malloc: the address of a block of at least `num_bytes` (None for 0,
        as the allocator hands out a null pointer for an empty request)."""
        num_bytes = byte_count(num_bytes, "malloc", CachingAllocatorError)
        if num_bytes == 0:
            return None
        size = round_size(num_bytes)
        pool = pool_name(size)
        alloc_size = get_allocation_size(size)
        block = self._get_free_block(pool, size)
        if block is None:
            block = self._alloc_block(pool, alloc_size)
            if block is None and self._release_available_cached_blocks(pool, size):
                block = self._alloc_block(pool, alloc_size)
            if block is None and self.empty_cache():
                block = self._alloc_block(pool, alloc_size, retry=True)
            if block is None:
                self.counters["num_ooms"] += 1
                raise OutOfMemoryError(
                    f"out of memory: tried to allocate {alloc_size} bytes with {self.total_allocated_memory} "
                    f"of the {self.memory_limit}-byte limit reserved after releasing the cache; raise "
                    "memory_limit, or free blocks first")
        return self._alloc_found_block(block, size, num_bytes).ptr

    def _alloc_found_block(self, block, size, requested):
        pool, already_split = block.pool, block.is_split()
        if self._should_split(block, size):
            remaining = block
            block = Block(remaining.ptr, size, pool, remaining.segment, prev=remaining.prev, next=remaining)
            if block.prev is not None:
                block.prev.next = block
            remaining.prev = block
            remaining.ptr += size
            remaining.size -= size
            del self.blocks[block.ptr]
            self.blocks[block.ptr] = block
            self.blocks[remaining.ptr] = remaining
            self._insert(remaining)
            if already_split:
                self._decrease("inactive_split_bytes", pool, block.size)
            else:
                self._increase("inactive_split_bytes", pool, remaining.size)
                self._increase("inactive_split", pool, 1)
        elif already_split:
            self._decrease("inactive_split_bytes", pool, block.size)
            self._decrease("inactive_split", pool, 1)
        block.allocated, block.requested = True, requested
        self.active[block.ptr] = block
        for name, amount in (("allocation", 1), ("allocated_bytes", block.size), ("active", 1),
                             ("active_bytes", block.size), ("requested_bytes", requested)):
            self._increase(name, pool, amount)
        if block.size >= self.max_split_size:
            self.oversize_allocations.increase(1)
        return block

    def free(self, ptr):
        """free + free_block: the block returns to its pool, merged with its free neighbours; free(None)
        does nothing, as the allocator's free of a null pointer (what malloc(0) returns)."""
        if ptr is None:
            return
        block = self.active.pop(ptr, None)
        if block is None:
            raise CachingAllocatorError(f"free({ptr!r}): no allocated block starts there; free each address "
                                        "malloc returned, once")
        pool, size, requested = block.pool, block.size, block.requested
        block.allocated = False
        self._decrease("allocation", pool, 1)
        self._decrease("allocated_bytes", pool, size)
        if size >= self.max_split_size:
            self.oversize_allocations.decrease(1)
        split_blocks, split_bytes = 0, 0
        for neighbour in (block.prev, block.next):
            subsumed = self._try_merge(block, neighbour)
            if subsumed:
                split_blocks -= 1
                split_bytes -= subsumed
        self._insert(block)
        if block.is_split():
            split_blocks += 1
            split_bytes += block.size
        for name, change in (("inactive_split", split_blocks), ("inactive_split_bytes", split_bytes)):
            if change > 0:
                self._increase(name, pool, change)
            elif change < 0:
                self._decrease(name, pool, -change)
        self._decrease("active", pool, 1)
        self._decrease("active_bytes", pool, size)
        self._decrease("requested_bytes", pool, requested)

    def _try_merge(self, dst, src):
        """try_merge_blocks: absorb a free neighbour; returns its size (0 when it is absent or in use)."""
        if src is None or src.allocated:
            return 0
        self._remove(src)
        del self.blocks[src.ptr]
        if dst.prev is src:
            del self.blocks[dst.ptr]
            dst.ptr, dst.prev = src.ptr, src.prev
            if dst.prev is not None:
                dst.prev.next = dst
            self.blocks[dst.ptr] = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    # --- traces and views ------------------------------------------------------------------------------
    def replay(self, trace):
        """Run a trace as BFCArena.replay does: ('alloc', bytes) or an int allocates, ('free', k) frees
        the k-th event's allocation. Returns {event position: address} of what is still allocated."""
        addresses = {}
        for position, kind, value in trace_events(trace, CachingAllocatorError):
            if kind == "alloc":
                addresses[position] = self.malloc(value)
                continue
            if value not in addresses:
                raise CachingAllocatorError(f"trace event {position} frees event {value}, which is "
                                            "not an allocation made earlier in the trace")
            ptr = addresses.pop(value)
            if ptr is not None:
                self.free(ptr)
        return addresses

    def segments(self):
        """One dict per segment, by address, as torch.cuda.memory_snapshot() describes them: address,
        total_size, allocated_size, segment_type, blocks [(size, 'active_allocated' | 'inactive')]."""
        heads = sorted((b for b in self.blocks.values() if b.prev is None), key=lambda b: b.ptr)
        found = []
        for head in heads:
            blocks, block = [], head
            while block is not None:
                blocks.append((block.size, "active_allocated" if block.allocated else "inactive"))
                block = block.next
            found.append({"address": head.ptr, "total_size": sum(s for s, _ in blocks),
                          "allocated_size": sum(s for s, state in blocks if state == "active_allocated"),
                          "segment_type": head.pool.split("_")[0], "blocks": blocks})
        return found


def trace_peak(trace):
    """The most bytes the trace itself holds at once (requested sizes, no rounding)."""
    live, sizes, peak = 0, {}, 0
    for position, kind, value in trace_events(trace, CachingAllocatorError):
        if kind == "alloc":
            sizes[position] = value
            live += value
            peak = max(peak, live)
        elif value in sizes:
            live -= sizes.pop(value)
        else:
            raise CachingAllocatorError(f"trace event {position} frees event {value}, which is not an "
                                        "allocation made earlier in the trace")
    return peak


def compare_allocators(trace, arena=None, allocator=None):
    """A Table of ORT's BFCArena (default options unless `arena` is given) against PyTorch's caching
    allocator (`allocator`, default options) on one trace: requests, the trace's own peak, peak bytes in
    use (rounded blocks), peak reserved from the device, growths (arena extensions / cudaMalloc
    segments), reserved at the end and fragmentation (1 - peak in use / peak reserved)."""
    arena = BFCArena() if arena is None else arena
    allocator = CachingAllocator() if allocator is None else allocator
    arena.replay(trace)
    allocator.replay(trace)
    s, m = arena.stats, allocator.memory_stats()
    requested = trace_peak(trace)
    rows = [("allocations", s.num_allocs, m["allocation.all.allocated"]),
            ("trace peak (requested bytes live at once)", requested, requested),
            ("peak in use (rounded blocks)", s.max_bytes_in_use, m["allocated_bytes.all.peak"]),
            ("peak reserved", s.total_allocated_bytes, m["reserved_bytes.all.peak"]),
            ("reserved at the end", s.total_allocated_bytes, m["reserved_bytes.all.current"]),
            ("growths (extensions / segments)", s.num_arena_extensions, m["num_device_alloc"]),
            ("fragmentation (1 - peak in use / peak reserved)",
             _fraction(s.max_bytes_in_use, s.total_allocated_bytes),
             _fraction(m["allocated_bytes.all.peak"], m["reserved_bytes.all.peak"])),
            ("peak inactive split bytes", "", m["inactive_split_bytes.all.peak"])]
    return Table(("measure", "ORT BFCArena", "PyTorch caching allocator"), rows)


def _fraction(used, reserved):
    return f"{1 - used / reserved:.2%}" if reserved else ""

"""RunStats: what one InferenceSession.run did, kept on the session as `last_run`.

ORT keeps no such record in Python; its profiler (enable_profiling) and the verbose log say the same
things one run at a time. The fields are what the walkthroughs and the tests read:

    peak_bytes          most host bytes held at once by the run's tensors (the pattern block included)
    allocations         outputs given a new buffer (not a place in the block, not a reused buffer)
    steps               nodes executed (fewer with only_execute_path_to_fetches)
    pattern_bytes       the memory-pattern block's size, 0 without one
    placed_in_pattern   tensors placed in that block
    allocation_trace    ("alloc" | "free", bytes) in order, for BFCArena.replay (session.arena())
    feed_data_ptrs      {input name: address the run read it from}
    fetch_data_ptrs     {output name: address of the value returned}
    preplaced_fetches   outputs written into buffers bound beforehand (IOBinding)
"""
from dataclasses import dataclass, field


@dataclass(frozen=True)
class RunStats:
    peak_bytes: int
    allocations: int
    steps: int
    pattern_bytes: int = 0
    placed_in_pattern: int = 0
    allocation_trace: list = field(default_factory=list)
    feed_data_ptrs: dict = field(default_factory=dict)
    fetch_data_ptrs: dict = field(default_factory=dict)
    preplaced_fetches: list = field(default_factory=list)

    def __repr__(self):
        return (f"RunStats({self.steps} steps, peak {self.peak_bytes} bytes, {self.allocations} allocations, "
                f"pattern block {self.pattern_bytes} bytes holding {self.placed_in_pattern} tensors)")

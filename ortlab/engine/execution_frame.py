"""ExecutionFrame: every value of one run, by index.

Mirrors onnxruntime/core/framework/execution_frame.h/.cc: `all_values_` holds one OrtValue per
index of the OrtValueNameIdxMap; Init fills it with the pre-placed fetches (an IOBinding's output
buffers), the initializers, then the feeds (shared with the caller, not copied); a kernel's
Output(i, shape) lands in GetOrCreateNodeOutputMLValue, which returns a pre-placed fetch after
checking its shape, or allocates through the output's EP (its allocator); ReleaseMLValue empties a
slot after its last use. The frame counts the bytes it holds, so a run reports its peak.
"""
import math

import numpy as np

from ortlab.engine.errors import KernelFailure


class EmptyOptional:
    """An optional value holding nothing, as the frame keeps it: ORT's OrtValue of optional type that is not
    allocated (onnxruntime/core/providers/cpu/optional/optional_ops.cc). A kernel reads it as None, the caller
    fetches None; the frame's own None still means "not computed yet" (or released)."""

    def __repr__(self):
        return "<empty optional>"


EMPTY_OPTIONAL = EmptyOptional()


def nbytes(value):
    """Bytes a tensor value holds (numpy array or torch tensor); 0 for anything else."""
    size = getattr(value, "nbytes", None)
    if size is None and hasattr(value, "element_size"):
        size = value.element_size() * value.numel()
    return int(size or 0)


def data_ptr(value):
    """The address of a tensor value's first element (numpy or torch), None for anything else."""
    if isinstance(value, np.ndarray):
        return value.__array_interface__["data"][0]
    if hasattr(value, "data_ptr"):
        return value.data_ptr()
    return None


def const_view(value):
    """A read-only view of a numpy array (its memory, not a copy); anything else as it is (a torch tensor
    on a device EP has no read-only flag)."""
    if isinstance(value, np.ndarray) and value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value


def shape_text(shape):
    """A shape as ORT prints it in its messages: {4,8}."""
    return "{" + ",".join(str(int(d)) for d in shape) + "}"


class ExecutionFrame:
    """Values by index for one run; `allocate` and `release` keep count of the bytes held.

    `fetches`: {slot: buffer} pre-placed outputs (ORT: the `fetches` given to ExecutionFrame, an
    IOBinding's bound outputs): a kernel writing that output writes into the buffer."""

    def __init__(self, state, feeds, pattern=None, fetches=None, reuse=None):
        self.state = state
        self.values = [None] * len(state.value_names)
        self.preplaced = dict(fetches or {})
        for slot, buffer in self.preplaced.items():
            self.values[slot] = buffer
        for slot, value in state.initializers.items():
            if slot in self.preplaced:  # an initializer that is also a bound output: copied into its fetch
                self._check_fetch(slot, np.shape(value), np.asarray(value).dtype)
                np.copyto(self.preplaced[slot], value, casting="no")
            else:
                self.values[slot] = value
        for slot, value in feeds.items():  # last, sharing the caller's value, even over a fetch (as ORT)
            self.preplaced.pop(slot, None)
            self.values[slot] = value
        self.allocations = self.placed = self.reused = 0   # outputs given a buffer: new or in the block; reused
        self.pattern = pattern
        self.block = pattern.block() if pattern is not None else None
        self.bytes_in_use = self.peak_bytes = pattern.peak_bytes if pattern is not None else 0
        self.in_block = set()
        self.trace, self.trace_position = [], {}  # ('alloc', bytes) / ('free', k): what an arena would see
        if pattern is not None and pattern.peak_bytes:
            self.trace.append(("alloc", pattern.peak_bytes))
        self.copy_back = {}                     # slot -> a fetch bound on another device than its producer's
        self.reuse = reuse                      # without the pattern: the allocation plan's kReuse (ReusePlan)
        self.buffers, self.owner = {}, {}       # buffer slot -> its bytes; value slot -> the buffer it lives in
        self.pending = dict(reuse.holders) if reuse is not None else {}
        # inputs are const (ORT: OpKernelContext::Input is a const Tensor*): a value this run produced is made
        # read-only in place when a node reads it (made writable again when fetched); a feed, a weight or a
        # bound output is not the frame's to flag, and is read through a read-only view
        self.not_owned = set(feeds) | set(state.initializers) | set(self.preplaced)
        self.locked = set()

    def allocate(self, slot, shape, dtype, provider):
        """A buffer for value `slot` in `provider`'s memory: its place in the memory-pattern block when
        it is planned there with this size; without the pattern, the buffer the allocation plan reuses for it
        (kReuse); else a new one (ORT: AllocateMLValueTensorSelfOwnBuffer)."""
        if shape and min(shape) < 0:
            raise KernelFailure(f"cannot allocate {self.state.value_names[slot]!r} with shape {shape}")
        on_cpu = provider.is_cpu_based
        if slot in self.preplaced:
            fetch = self._check_fetch(slot, shape, dtype)
            if isinstance(fetch, np.ndarray) == bool(on_cpu):
                return fetch
            self.copy_back[slot] = fetch   # bound on another device: computed on the EP's, copied at the end
        name = self.state.value_names[slot]
        buffer = None
        if self.block is not None and on_cpu:
            buffer = self.pattern.place(self.block, name, shape, dtype)
            if buffer is not None:
                self.placed += 1
                self.in_block.add(slot)
        elif self.reuse is not None and on_cpu:
            buffer = self._reuse(slot, shape, dtype)   # no new bytes: the planned buffer it lives in
            if buffer is not None:
                self.reused += 1
                self.values[slot] = buffer
                return buffer
        if buffer is None:
            size = math.prod(shape) * dtype.itemsize
            if self.pattern is not None and name in self.pattern.placements:
                self.state.logger.verbose("execution_frame.cc AllocateMLValueTensorSelfOwnBufferHelper",
                                          f"For ort_value with index: {slot}, block in memory pattern size is: "
                                          f"{self.pattern.placements[name][1]} but the actual size is: "
                                          f"{size}, fall back to default allocation behavior")
            buffer = provider.allocate(shape, dtype)
            if self.reuse is not None and isinstance(buffer, np.ndarray) and buffer.dtype != object:
                self._own(slot, buffer)  # (a string tensor holds no bytes to reuse: SameSize is false for it)
            self.bytes_in_use += size
            if on_cpu:
                self.trace_position[slot] = len(self.trace)
                self.trace.append(("alloc", size))
            self.peak_bytes = max(self.peak_bytes, self.bytes_in_use)
        self.values[slot] = buffer
        self.allocations += 1
        return buffer

    def _reuse(self, slot, shape, dtype):
        """The planned kReuse buffer for `slot` viewed as `shape`/`dtype`, or None (not reused, its buffer
        already freed, or too small)."""
        origin = self.reuse.origin.get(slot)
        base = self.buffers.get(origin)
        nbytes = math.prod(shape) * np.dtype(dtype).itemsize
        if base is None or base.nbytes < nbytes:
            return None
        self.owner[slot] = origin
        return base[:nbytes].view(dtype).reshape(shape)

    def _own(self, slot, buffer):
        """Record a new buffer allocated for `slot`, which later kReuse values may live in."""
        self.buffers[slot] = buffer.reshape(-1).view(np.uint8)
        self.owner[slot] = slot
        self.pending.setdefault(slot, 1)

    def _check_fetch(self, slot, shape, dtype):
        """The pre-placed buffer of output `slot` when it has this shape and dtype (ORT:
        IExecutionFrame::GetOrCreateNodeOutputMLValue's shape verification), else a KernelFailure."""
        buffer = self.preplaced[slot]
        if tuple(buffer.shape) != tuple(shape):
            name = self.state.value_names[slot]
            raise KernelFailure(
                f"OrtValue shape verification failed. Current shape:{shape_text(buffer.shape)} Requested "
                f"shape:{shape_text(shape)}. Output {name!r} is bound to a buffer of the first shape (bound "
                "with bind_output/bind_ortvalue_output, or kept from an earlier run when it was bound to a "
                "device without a buffer); call binding.clear_binding_outputs() and bind it again, or bind a "
                "buffer of the new shape")
        if np.dtype(dtype).name != str(buffer.dtype).replace("torch.", ""):
            raise KernelFailure(f"output {self.state.value_names[slot]!r} is bound to a {buffer.dtype} "
                                f"buffer, the kernel writes {np.dtype(dtype)}; bind a buffer of the output's "
                                "type")
        return buffer

    def store(self, slot, value):
        """A value that is not a tensor (a sequence, an optional, a map) kept with tensors of its own: ORT's
        TensorSeq owns its tensors (onnxruntime/core/providers/cpu/sequence/sequence_ops.cc copies each input
        into it), while a kernel here may return the frame's own arrays, whose buffers the plan frees and
        hands to later outputs after their last tensor reader."""
        if isinstance(value, list):
            value = [np.array(v) if isinstance(v, np.ndarray) else v for v in value]
        self.values[slot] = value

    def copy_outputs_across_devices(self):
        """utils::CopyOutputsAcrossDevices: each fetch bound on another device than the EP that computed it
        receives the value now, at the end of the run (ORT adds no Memcpy node for a graph output)."""
        for slot, target in self.copy_back.items():
            value = self.values[slot]
            if isinstance(target, np.ndarray):
                np.copyto(target, value.detach().cpu().numpy() if hasattr(value, "detach") else value)
            else:
                import torch  # heavy: torch

                target.copy_(value if hasattr(value, "detach") else torch.from_numpy(np.ascontiguousarray(value)))
            self.values[slot] = target
        self.copy_back = {}

    def bytes_freed_by(self, slots):
        """The bytes releasing `slots` now would give back: a buffer several values live in only when its
        last one goes; a value in the memory-pattern block never (the block stays whole)."""
        pending, freed = dict(self.pending), 0
        for slot in slots:
            if slot in self.in_block:
                continue
            if slot in self.owner:
                buffer = self.owner[slot]
                pending[buffer] -= 1
                freed += self.buffers[buffer].nbytes if pending[buffer] == 0 else 0
            else:
                freed += nbytes(self.values[slot])
        return freed

    def release(self, slot):
        """Drop value `slot` after its last use (ORT: ExecutionFrame::ReleaseMLValue)."""
        if slot in self.in_block:
            self.in_block.discard(slot)  # its place in the block stays the block's
        elif slot in self.owner:         # the buffer goes once every value living in it is released
            buffer = self.owner.pop(slot)
            self.pending[buffer] -= 1
            if self.pending[buffer] == 0:
                self.bytes_in_use -= self.buffers.pop(buffer).nbytes
                if buffer in self.trace_position:
                    self.trace.append(("free", self.trace_position.pop(buffer)))
        else:
            self.bytes_in_use -= nbytes(self.values[slot])
            if slot in self.trace_position:
                self.trace.append(("free", self.trace_position.pop(slot)))
        self.values[slot] = None

    def const_input(self, slot):
        """Value `slot` as a kernel's input: read-only (the frame's own array, flagged; another's, a view)."""
        value = self.values[slot]
        if value is EMPTY_OPTIONAL:
            return None  # as onnx.reference's Optional ops and ORT's OpKernelContext see an empty optional
        if not isinstance(value, np.ndarray) or not value.flags.writeable:
            return value
        if slot in self.not_owned:
            return const_view(value)
        value.flags.writeable = False
        self.locked.add(slot)
        return value

    def fetch(self, name):
        """A value by name, as the caller gets it: writable again if a node read it (ORT's fetches are)."""
        slot = self.state.index_of[name]
        value = self.values[slot]
        if value is EMPTY_OPTIONAL:
            return None  # ORT's Python API returns None for an empty optional output
        if slot in self.locked and isinstance(value, np.ndarray):
            value.flags.writeable = True
            self.locked.discard(slot)
        return value

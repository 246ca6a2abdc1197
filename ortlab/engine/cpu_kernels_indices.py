"""CPU kernels for the ops that take indices, checked as ORT 1.19.2 checks them before onnx.reference
computes: an index outside [-n, n - 1] of its axis is refused with ORT's words (onnx.reference
wraps some silently, GatherElements' -4 on an axis of 3 reading element 2, and fails on others with
numpy's IndexError); negative indices in range count from the end, as in ORT.

Each is an override of onnx.reference's op (override_reference_op), so it holds inside If, Loop and
Scan bodies too. OneHot needs no check: ORT gives a row of off values for an index out of range
(cpu_kernels_elementwise.OrtOneHot). Checked by tests/engine/test_engine_index_bounds.py.
"""
import numpy as np
from onnx.defs import get_schema
from onnx.reference.ops import load_op

from ortlab.engine.cpu_execution_provider import override_reference_op
from ortlab.engine.errors import KernelFailure

LAST = 10 ** 6


def first_out_of_range(indices, size):
    """(position, value) of the first index outside [-size, size - 1], or None."""
    values = np.asarray(indices).astype(np.int64, copy=False)
    bad = (values < -size) | (values >= size)
    if not bad.any():
        return None
    position = np.unravel_index(int(np.argmax(bad)), values.shape)
    return tuple(int(p) for p in position), int(values[position])


def refuse_out_of_range(op, indices, size, axis, ort_words):
    """Raise ORT's refusal when an index of `indices` lies outside axis `axis` of length `size`; `ort_words`
    is ORT's message, formatted with the index (value), low (-size) and high (size - 1)."""
    found = first_out_of_range(indices, size)
    if found is None:
        return
    position, value = found
    words = ort_words.format(value=value, low=-size, high=size - 1)
    raise KernelFailure(f"{op}: index {value} (at position {list(position)} of the indices) is out of range for "
                        f"axis {axis} of size {size}; ORT 1.19.2 refuses it ('{words}'). Each index must lie "
                        f"in [{-size}, {size - 1}] (a negative one counts from the end)")


def _axis(op, axis, rank):
    if not -rank <= axis < rank:
        raise KernelFailure(f"{op}: axis {axis} is out of range for data of rank {rank}; it must be in "
                            f"[{-rank}, {rank - 1}]")
    return axis % rank


BOUNDS_WORDS = "indices element out of data bounds, idx={value} must be within the inclusive range [{low},{high}]"


def check_gather(data, indices, axis=0, **_):
    """ORT: onnxruntime/core/providers/cpu/tensor/gather.cc (GatherCopyData)."""
    axis = _axis("Gather", axis, data.ndim)
    refuse_out_of_range("Gather", indices, data.shape[axis], axis, BOUNDS_WORDS)


def check_gather_elements(data, indices, axis=0, **_):
    """ORT: onnxruntime/core/providers/cpu/tensor/gather_elements.cc (core_impl)."""
    axis = _axis("GatherElements", axis, data.ndim)
    refuse_out_of_range("GatherElements", indices, data.shape[axis], axis,
                        "GatherElements op: Out of range value in index tensor")


def check_scatter_elements(data, indices, updates=None, axis=0, op="ScatterElements", **_):
    """ORT: onnxruntime/core/providers/cpu/tensor/scatter.cc (ScatterData)."""
    axis = _axis(op, axis, data.ndim)
    refuse_out_of_range(op, indices, data.shape[axis], axis, BOUNDS_WORDS)


def _check_nd(op, data, indices, batch_dims, words):
    indices = np.asarray(indices)
    if indices.ndim == 0 or indices.shape[-1] > data.ndim - batch_dims:
        return  # a shape error: the reference's or the session's own check reports it
    for k in range(indices.shape[-1]):
        axis = batch_dims + k
        refuse_out_of_range(op, indices[..., k], data.shape[axis], axis, words)


def check_gather_nd(data, indices, batch_dims=0, **_):
    """ORT: onnxruntime/core/providers/cpu/tensor/gather_nd.cc (PrepareForCompute: each index column
    against its axis, after batch_dims)."""
    _check_nd("GatherND", data, indices, batch_dims or 0, "invalid index found, index = {value}")


def check_scatter_nd(data, indices, updates=None, **_):
    """ORT: onnxruntime/core/providers/cpu/tensor/scatter_nd.cc (PrepareForCompute)."""
    _check_nd("ScatterND", data, indices, 0, "invalid indice found, indice = {value}")


def _checked(op, check, versions):
    """Override onnx.reference's `op` from each opset in `versions` (where its schema changed) to the next:
    its own class, with `check(*inputs, **attributes)` run first."""
    for first, nxt in zip(versions, list(versions[1:]) + [LAST + 1]):
        base = load_op("", op, first)

        def _run(self, *args, _base=base, **attributes):
            check(*args, **attributes)
            if attributes.get("axis") is not None:  # checked: in range (the reference misreads a negative one)
                attributes["axis"] = attributes["axis"] % max(np.ndim(args[0]), 1)
            if op == "GatherND" and attributes.get("batch_dims") is None:  # opset 11 has no batch_dims
                attributes["batch_dims"] = 0
            if op == "Gather" and np.size(args[1]) == 0:  # the reference's answer is [0], whatever the shapes
                return (np.take(args[0], np.asarray(args[1], np.int64), axis=attributes.get("axis") or 0),)
            return _base._run(self, *args, **attributes)

        cls = type(f"Bounded{op}", (base,), {"_run": _run, "__module__": __name__, "op_schema": get_schema(op, first),
                                              "__doc__": f"{op} with ORT's index check first: {check.__doc__}"})
        override_reference_op(op, first, nxt - 1)(cls)


_checked("Gather", check_gather, [1, 11, 13])
_checked("GatherElements", check_gather_elements, [11, 13])
_checked("GatherND", check_gather_nd, [11, 12, 13])
_checked("ScatterElements", check_scatter_elements, [11, 13, 16, 18])
_checked("ScatterND", check_scatter_nd, [11, 13, 16, 18])


# --- Sequences --------------------------------------------------------------------------------
def sequence_position(op, index, length, allow_end=False):
    """A sequence position from ORT's index: in [-length, length - 1] (to `length` for SequenceInsert,
    which appends there), negative counting from the end; anything else refused with ORT's words.
    ORT: onnxruntime/core/providers/cpu/sequence/sequence_ops.cc (ValidateSeqIdx)."""
    value = int(np.asarray(index).reshape(-1)[0])
    high = length if allow_end else length - 1
    if not -length <= value <= high:
        raise KernelFailure(f"{op}: index {value} for a sequence of {length} tensor(s); ORT 1.19.2 refuses it "
                            f"('Invalid sequence index ({value}) specified for sequence of size ({length})'). "
                            f"Give an index in [{-length}, {high}] (a negative one counts from the end)")
    return value + length if value < 0 else value


class OrtSequenceAt(load_op("", "SequenceAt", 11)):
    """SequenceAt(seq, i) with ORT's range check (sequence_position): the reference's
    Python list indexing fails with 'list index out of range'. ORT: sequence_ops.cc (SequenceAt)."""

    def _run(self, seq, index):
        return (seq[sequence_position("SequenceAt", index, len(seq))],)


class OrtSequenceErase(load_op("", "SequenceErase", 11)):
    """SequenceErase(seq, i) with ORT's range check (default: the last one).
    ORT: onnxruntime/core/providers/cpu/sequence/sequence_ops.cc (SequenceErase)."""

    def _run(self, seq, index=None):
        if not seq:
            raise KernelFailure("SequenceErase of an empty sequence: there is nothing to erase; ORT 1.19.2 fails on "
                                "it (a SafeInt overflow). Check SequenceLength first, or erase only from a non-empty "
                                "sequence")
        at = len(seq) - 1 if index is None else sequence_position("SequenceErase", index, len(seq))
        return (seq[:at] + seq[at + 1:],)


class OrtSequenceInsert(load_op("", "SequenceInsert", 11)):
    """SequenceInsert(seq, t, i): t inserted before position i, i = len(seq) (or no i) appending it, as ORT
    does; onnx.reference takes i modulo len(seq), so inserting at len(seq) puts t first, silently, and an
    out-of-range i wraps. ORT: onnxruntime/core/providers/cpu/sequence/sequence_ops.cc (SequenceInsert)."""

    def _run(self, seq, tensor, index=None):
        seq = list(seq or [])
        at = len(seq) if index is None else sequence_position("SequenceInsert", index, len(seq), allow_end=True)
        return (seq[:at] + [tensor] + seq[at:],)


override_reference_op("SequenceAt", 11, LAST)(OrtSequenceAt)
override_reference_op("SequenceErase", 11, LAST)(OrtSequenceErase)
override_reference_op("SequenceInsert", 11, LAST)(OrtSequenceInsert)

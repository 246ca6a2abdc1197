"""Laying a tensor out as rows for row-wise kernels (softmax, losses, norms, reductions).

A Triton program handles one row of contiguous elements; an op over another axis first moves
that axis last (as ORT's CUDA Softmax transposes when axis is not the last one, see
onnxruntime/core/providers/cuda/math/softmax.cc), runs, and moves it back.
"""
import numpy as np


def normalize_axis(axis, rank, kernel, name="axis"):
    kernel.expect(-rank <= axis < max(rank, 1), f"{name}={axis} is out of range for rank {rank}")
    return axis % max(rank, 1)


def as_rows(x, axis):
    """(rows, cols) view of x with `axis` last; returns the 2-D tensor and how to undo it."""
    moved = x.movedim(axis, -1).contiguous()
    cols = moved.shape[-1] if moved.dim() else 1
    return moved.reshape(-1, cols), (moved.shape, axis)


def from_rows(rows, layout):
    shape, axis = layout
    return rows.reshape(shape).movedim(-1, axis)


def flatten_from(shape, axis):
    """(prod(shape[:axis]), prod(shape[axis:])): LayerNormalization's view of X."""
    return int(np.prod(shape[:axis], dtype=np.int64)), int(np.prod(shape[axis:], dtype=np.int64))


def stats_shape(shape, axis):
    """The shape of per-row statistics (LayerNormalization's Mean, InvStdDev): X's dims before
    `axis` (>= 0), then ones."""
    return tuple(shape[:axis]) + (1,) * (len(shape) - axis)


def split_at(shape, axis):
    """(prod(shape[:axis]), shape[axis], prod(shape[axis + 1:])): a gather's view of a tensor as
    (outer, the gathered dimension, inner)."""
    return (int(np.prod(shape[:axis], dtype=np.int64)), int(shape[axis]),
            int(np.prod(shape[axis + 1:], dtype=np.int64)))

"""ReduceSum over trailing axes: reduce_sum.cu's reduce_sum_last_axis on the input viewed as [rows, cols].

Mirrors onnxruntime/core/providers/cuda/reduction/reduction_ops.cc around
reduction_functions.cu (which reduces any axes, through cuDNN).
"""
import numpy as np

from ortlab.cuda.kernels.launch_shapes import F32, as_f32, dtype_refusal, row_geometry
from ortlab.cuda.kernels.registration import CudaOpError, CudaSource, register_cuda_op, register_source

SOURCE = register_source(CudaSource(
    "reduce_sum", "reduce_sum.cu", ("reduce_sum_last_axis",),
    ("onnxruntime/core/providers/cuda/reduction/reduction_functions.cu",)))


def _reduce_axes(given, rank, attributes):
    """(sorted axes reduced, None) or (None, why): the trailing axes only (reduce_sum_last_axis over
    [rows, cols]); empty axes reduce all, or none with noop_with_empty_axes. rank None (unknown): only
    negative axes -k..-1 can be checked, and are returned as they are."""
    axes = given
    if axes is not None and np.ndim(axes) != 1:
        return None, (f"axes of shape {np.shape(axes)}: ORT takes a vector of axes ('An axes tensor must be a "
                      "vector tensor', core/providers/cpu/reduction/reduction_ops.cc)")
    if rank is None:
        negative = sorted({int(a) for a in np.reshape(axes, -1)}) if axes is not None and np.size(axes) else None
        if negative is None or negative != list(range(-len(negative), 0)):
            return None, ("the input's rank is unknown: the axes must be -k..-1 (the trailing axes counted from "
                          "the end) to be checked when partitioning")
        return negative, None
    if axes is None or np.size(axes) == 0:
        if attributes.get("noop_with_empty_axes", 0):
            return [], None
        return list(range(rank)), None
    axes = sorted({int(a) + rank if int(a) < 0 else int(a) for a in np.reshape(axes, -1)})
    if any(not 0 <= a < max(rank, 1) for a in axes):
        return None, f"axes {list(np.reshape(given, -1))} out of range for a rank-{rank} input"
    if axes != list(range(rank - len(axes), rank)):
        return None, (f"axes {axes} of a rank-{rank} input are not the trailing axes: reduce_sum.cu reduces the "
                      "last axes of a [rows, cols] view (ORT's CUDA ReduceSum, through cuDNN, reduces any axes)")
    return axes, None


def _reduce_sum_check(spec):
    if why := dtype_refusal(spec, {0: F32, 1: ("int64",)}):
        return why
    if spec.opset < 13:
        axes = spec.attributes.get("axes")
    elif spec.dtype(1) is None:
        axes = None
    elif 1 in spec.constants:
        axes = spec.constants[1]
    else:
        return ("axes is a runtime input, not a constant: the kernel reduces trailing axes only, which is "
                "checked when partitioning")
    return _reduce_axes(axes, spec.rank(0), spec.attributes)[1]


@register_cuda_op("ReduceSum", "", SOURCE, check=_reduce_sum_check)
def reduce_sum(call, x, axes=None):
    """y = sum of x over its trailing `axes` (keepdims as the attribute says): reduce_sum_last_axis on
    x viewed as [rows, cols], cols the product of the reduced axes. No axes with noop_with_empty_axes give
    x, as ONNX says (ORT 1.19.2's CPU kernel fails when the axes input is left out)."""
    rank = x.ndim
    axes = call.attribute("axes") if axes is None else axes
    found, why = _reduce_axes(axes, rank, call.attributes)
    if why:
        raise CudaOpError(f"ReduceSum: {why}")
    lead = x.shape[:rank - len(found)]
    rows, cols = int(np.prod(lead, dtype=np.int64)), int(np.prod(x.shape[rank - len(found):], dtype=np.int64))
    launcher = call.launcher(SOURCE.name)
    xp = launcher.xp
    y = xp.zeros(rows, xp.float32)
    if rows and cols:
        grid, block = row_geometry(launcher, rows, cols)
        launcher("reduce_sum_last_axis", grid, block, as_f32(xp, x).reshape(rows, cols), y, rows, cols)
    shape = lead + ((1,) * len(found) if call.attribute("keepdims", 1) else ())
    return [y.reshape(shape)]

"""GatherGrad: the atomicAdd path and the deterministic sorted path of gather_grad.cu.

Mirrors orttraining/orttraining/training_ops/cuda/tensor/gather_grad.cc around gather_grad_impl.cu.
"""
import numpy as np

from ortlab.cuda.kernels.launch_shapes import F32, LABELS, as_f32, dtype_refusal, flat_geometry, normalised_axis
from ortlab.cuda.kernels.registration import MS, CudaOpError, CudaSource, register_cuda_op, register_source

SOURCE = register_source(CudaSource(
    "gather_grad", "gather_grad.cu", ("gather_grad_atomic", "gather_grad_sort", "gather_grad_sorted"),
    ("orttraining/orttraining/training_ops/cuda/tensor/gather_grad_impl.cu",)))


PATHS = ("sorted", "atomic")


def _gather_grad_check(spec):
    return dtype_refusal(spec, {0: ("int64",), 1: LABELS, 2: F32})


@register_cuda_op("GatherGrad", MS, SOURCE, check=_gather_grad_check)
def gather_grad(call, shape, indices, dy):
    """dx = zeros(shape); dx[..., indices[i], ...] += dy[..., i, ...] along `axis`. call.options["path"]:
    "sorted" (default, deterministic: ORT's CUDA GatherGrad always sorts, gather_grad_impl.cu) runs
    gather_grad_sort then gather_grad_sorted; "atomic" runs gather_grad_atomic (order-dependent sums)."""
    path = call.options.get("path", "sorted")
    if path not in PATHS:
        raise CudaOpError(f"GatherGrad path {path!r}: choose one of {PATHS}")
    shape = tuple(int(d) for d in np.asarray(shape).reshape(-1))
    axis = normalised_axis(int(call.attribute("axis", 0)), len(shape), "GatherGrad")
    outer, gather_dim = int(np.prod(shape[:axis], dtype=np.int64)), shape[axis]
    inner, n = int(np.prod(shape[axis + 1:], dtype=np.int64)), int(indices.size)
    expected = shape[:axis] + tuple(indices.shape) + shape[axis + 1:]
    if tuple(dy.shape) != expected:
        raise CudaOpError(f"GatherGrad: dY has shape {tuple(dy.shape)}; shape {list(shape)}, axis {axis} and "
                          f"indices {tuple(indices.shape)} make it {expected}")
    launcher = call.launcher(SOURCE.name)
    xp = launcher.xp
    host = np.asarray(launcher.to_numpy(indices)).reshape(-1)
    if host.size and (host.min() < -gather_dim or host.max() >= gather_dim):
        raise CudaOpError(f"GatherGrad: an index is outside [-{gather_dim}, {gather_dim}) (axis {axis} has "
                          f"{gather_dim} entries)")
    flat = xp.ascontiguousarray(indices, dtype=xp.int64).reshape(-1)
    dx = xp.zeros(shape, xp.float32)
    total = outer * n * inner
    if total:
        dy = as_f32(xp, dy)
        grid, block = flat_geometry(launcher, total)
        if path == "atomic":
            launcher("gather_grad_atomic", grid, block, dy, flat, dx, outer, n, gather_dim, inner)
        else:
            sorted_index, sorted_position = xp.zeros(n, xp.int64), xp.zeros(n, xp.int64)
            launcher("gather_grad_sort", *flat_geometry(launcher, n), flat, sorted_index, sorted_position, n,
                     gather_dim)
            launcher("gather_grad_sorted", grid, block, dy, sorted_index, sorted_position, dx, outer, n,
                     gather_dim, inner)
    return [dx]

"""What every CUDA op kernel does around its launch: check dtypes, view tensors as float32 [rows, cols],
pick a grid and a block (ORT: onnxruntime/core/providers/cuda/cu_inc/common.cuh, GridDim)."""
from ortlab.cuda.kernels.registration import CudaOpError

F32 = ("float32",)
FLOATS = ("float16", "float32", "float64")
LABELS = ("int32", "int64")


def dtype_refusal(spec, wanted):
    """Why not, when an input's dtype is not among wanted[i] (None: the input may be absent)."""
    for i, allowed in wanted.items():
        got = spec.dtype(i)
        if got is not None and got not in allowed:
            return (f"input {i} is {got}; the .cu kernel takes {' or '.join(allowed)} "
                    "(ORT's CUDA kernel also has float16/double/bfloat16 versions)")
    return None


def whole_warps(n, most):
    """n threads rounded up to whole warps of 32, at least one warp, at most `most`."""
    return int(min(most, max(32, -(-n // 32) * 32)))


def row_geometry(launcher, rows, cols):
    """(grid, block) of a block-per-row kernel: whole warps up to the launcher's block, at most max_grid."""
    return max(1, min(rows, launcher.max_grid)), whole_warps(cols, launcher.block)


def flat_geometry(launcher, n):
    """(grid, block) of a grid-stride elementwise kernel over n elements."""
    block = launcher.block
    return max(1, min(-(-n // block), launcher.max_grid)), block


def as_f32(xp, a):
    """`a` as a contiguous float32 array of the launcher's array module."""
    return xp.ascontiguousarray(a, dtype=xp.float32)


def normalised_axis(axis, rank, what):
    """axis in [0, rank), from ONNX's [-rank, rank); CudaOpError naming `what` when out of range."""
    if not -rank <= axis < max(rank, 1):
        raise CudaOpError(f"{what}: axis {axis} is out of range for a rank-{rank} input")
    return axis + rank if axis < 0 else axis


"""ortlab.cuda.kernels: ORT's training kernels written in CUDA C++, one .cu file per op family.

Each source is registered with the ORT file it mirrors and the __global__ kernels it defines;
`source(name)` is its text after common.cuh (the shared warp and block reductions), ready for
`ortlab.cuda.compile` (NVRTC + ptxas) and for `ortlab.cuda.cpu_kernel` (the CPU runner). The
kernels take float32 [rows, cols] views of their tensors; the shapes, attributes and launch
geometry are the caller's (tests/test_cuda_kernels.py shows each launch).

    reduce_sum             ReduceSum over the last axis
    dropout                Dropout (own counter-based generator) and DropoutGrad (given mask)
    layer_norm             LayerNormalization forward (+ mean, inv_std) and LayerNormalizationGrad
    softmax_cross_entropy  SoftmaxCrossEntropyLoss (mean) and SoftmaxCrossEntropyLossGrad
    gather_grad            GatherGrad: atomicAdd path and the deterministic sorted path
    layer_norm_versions    LayerNormalization forward three ways, naive to ORT's shape (notebook L3_01); no
                           op kernel runs them: ortlab.walkthroughs.kernel_optimization launches them

ortlab.cuda.op_kernels holds each op's launch recipe (views, grid, block) for the first five.
"""
from dataclasses import dataclass
from pathlib import Path

from ortlab.errors import OrtlabError

FOLDER = Path(__file__).parent
COMMON = "common.cuh"


@dataclass(frozen=True)
class CudaSource:
    """One registered .cu file: the kernels it defines and the ORT sources it mirrors."""

    name: str
    file: str
    kernels: tuple
    mirrors: tuple


SOURCES = {}


def register_source(entry):
    """Add a CudaSource to SOURCES (its file must exist in this folder)."""
    if entry.name in SOURCES:
        raise OrtlabError(f"a CUDA source named {entry.name!r} is already registered")
    if not (FOLDER / entry.file).is_file():
        raise OrtlabError(f"CUDA source {entry.file!r} is not in {FOLDER}")
    SOURCES[entry.name] = entry
    return entry


def source(name):
    """The CUDA C++ text of registered source `name`: common.cuh, then its .cu file."""
    if name not in SOURCES:
        raise OrtlabError(f"no CUDA source named {name!r}; registered: {sorted(SOURCES)}")
    return (FOLDER / COMMON).read_text() + "\n" + (FOLDER / SOURCES[name].file).read_text()


register_source(CudaSource(
    "reduce_sum", "reduce_sum.cu", ("reduce_sum_last_axis",),
    ("onnxruntime/core/providers/cuda/reduction/reduction_functions.cu",)))
register_source(CudaSource(
    "dropout", "dropout.cu", ("dropout", "dropout_grad"),
    ("onnxruntime/core/providers/cuda/nn/dropout_impl.cu",
     "orttraining/orttraining/training_ops/cuda/nn/dropout_grad_impl.cu")))
register_source(CudaSource(
    "layer_norm", "layer_norm.cu", ("layer_norm", "layer_norm_grad_input", "layer_norm_grad_scale_bias"),
    ("onnxruntime/contrib_ops/cuda/layer_norm_impl.cu",
     "orttraining/orttraining/training_ops/cuda/nn/layer_norm_impl.cu")))
register_source(CudaSource(
    "softmax_cross_entropy", "softmax_cross_entropy.cu",
    ("log_softmax_rows", "cross_entropy_terms", "cross_entropy_mean", "cross_entropy_grad"),
    ("onnxruntime/core/providers/cuda/loss/softmax_cross_entropy_loss_impl.cu",
     "orttraining/orttraining/training_ops/cuda/loss/softmax_cross_entropy_loss_impl.cu")))
register_source(CudaSource(
    "gather_grad", "gather_grad.cu", ("gather_grad_atomic", "gather_grad_sort", "gather_grad_sorted"),
    ("orttraining/orttraining/training_ops/cuda/tensor/gather_grad_impl.cu",)))
register_source(CudaSource(
    "layer_norm_versions", "layer_norm_versions.cu",
    ("layer_norm_naive", "layer_norm_block_tree", "layer_norm_warp_vec4"),
    ("onnxruntime/contrib_ops/cuda/layer_norm_impl.cu",)))

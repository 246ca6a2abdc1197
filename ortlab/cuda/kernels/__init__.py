"""ortlab.cuda.kernels: ORT's training kernels written in CUDA C++, one .cu file per op family, each
registered, with the op kernels that launch it, by the Python module of the same name beside it.

    reduce_sum             ReduceSum over the last axes
    dropout                Dropout (own counter-based generator) and DropoutGrad (given mask)
    layer_norm             LayerNormalization forward (+ mean, inv_std) and LayerNormalizationGrad
    softmax_cross_entropy  SoftmaxCrossEntropyLoss (mean) and SoftmaxCrossEntropyLossGrad
    gather_grad            GatherGrad: atomicAdd path and the deterministic sorted path
    layer_norm_versions    LayerNormalization forward three ways, naive to ORT's shape (notebook L3_01); no
                           op kernel runs them: ortlab.walkthroughs.kernel_optimization launches them

`source(name)` is a .cu file's text after common.cuh (the shared warp and block reductions), ready for
`ortlab.cuda.compile` (NVRTC + ptxas) and for `ortlab.cuda.cpu_kernel` (the CPU runner). The kernels
take float32 [rows, cols] views of their tensors. To add a kernel: a .cu file and one module here that
registers it (registration.py says how); every module of this folder is imported here, so nothing else
names it.
"""
import importlib
import pkgutil

from ortlab.cuda.kernels.registration import (COMMON, FOLDER, OPS, SOURCES, CudaOp, CudaSource,  # noqa: F401
                                              register_cuda_op, register_source, registered, source)

SHARED = ("registration", "launch_shapes")  # what the op-family modules use; they register nothing
for _family in sorted(m.name for m in pkgutil.iter_modules(__path__) if m.name not in SHARED):
    importlib.import_module(f"{__name__}.{_family}")

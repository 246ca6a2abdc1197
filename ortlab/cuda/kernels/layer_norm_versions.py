"""LayerNormalization forward three ways, naive to ORT's shape (notebook L3_01). No op kernel runs them:
ortlab.walkthroughs.kernel_optimization launches them.

Mirrors onnxruntime/contrib_ops/cuda/layer_norm_impl.cu (the third version's shape).
"""
from ortlab.cuda.kernels.registration import CudaSource, register_source

SOURCE = register_source(CudaSource(
    "layer_norm_versions", "layer_norm_versions.cu",
    ("layer_norm_naive", "layer_norm_block_tree", "layer_norm_warp_vec4"),
    ("onnxruntime/contrib_ops/cuda/layer_norm_impl.cu",)))

# (label, kernel, what it does), naive first
VERSIONS = (
    ("naive", "layer_norm_naive", "one thread per row, three walks over its row"),
    ("block tree", "layer_norm_block_tree", "one block per row, shared-memory tree sums"),
    ("warp + float4", "layer_norm_warp_vec4", "one block per row, float4 loads, warp shuffles"),
)


def grid(kernel, rows, block):
    """Blocks to launch: the naive kernel has a thread per row, the others a block per row."""
    return -(-rows // block) if kernel == "layer_norm_naive" else rows

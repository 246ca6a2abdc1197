"""The transformers ORT applies to a forward graph before it builds the gradient graph.

Mirrors GeneratePreTrainingTransformers in orttraining/orttraining/core/optimizer/
graph_transformer_utils.cc. In training, fusions that are "extended" for inference run at
level 1 and before the gradient builder, so the backward graph is built from fused ops
(one LayerNormalizationGrad instead of the gradients of nine small ops). Two things differ
from inference: trainable weights are excluded from constant folding and sharing (folding
Transpose(W) would cut W off from its gradient), and Dropout stays unless its ratio is 0.
"""
from ortlab.errors import as_names
from ortlab.transformers.cse import CommonSubexpressionElimination
from ortlab.transformers.div_mul_fusion import DivMulFusion
from ortlab.transformers.constant_folding import ConstantFolding
from ortlab.transformers.constant_sharing import ConstantSharing
from ortlab.transformers.eliminations import CastElimination, EliminateDropout
from ortlab.transformers.gelu_fusion import GeluFusion
from ortlab.transformers.gemm_sum_fusion import GemmSumFusion
from ortlab.transformers.gemm_transpose_fusion import GemmTransposeFusion
from ortlab.transformers.graph_transformer import RuleBasedGraphTransformer
from ortlab.transformers.layer_norm_fusion import LayerNormFusion
from ortlab.transformers.manager import GraphTransformerManager
from ortlab.transformers.noop_elimination import NoopElimination
from ortlab.transformers.not_where_fusion import NotWhereFusion
from ortlab.transformers.simplified_layer_norm_fusion import SimplifiedLayerNormFusion
from ortlab.viz import Table

# ORT 1.19's list, in order, and the ortlab class for each where ortlab has one.
ORT_PRE_TRAINING_TRANSFORMERS = [
    ("rules: InsertMaxPoolOutput, BatchNormReplacement, UnsqueezeElimination, ExpandElimination, "
     "CastElimination, PreShapeNodeElimination, NoopElimination, DivMulFusion, EliminateDropout, "
     "GemmSumFusion, GemmTransposeFusion, NotWhereFusion, InsertSoftmaxCrossEntropyLossOutput, "
     "LSTMReplacement", "CastElimination, NoopElimination, DivMulFusion, EliminateDropout, GemmSumFusion, "
     "GemmTransposeFusion, NotWhereFusion"),
    ("ConstantSharing", "ConstantSharing"),
    ("LayerNormFusion (before CSE, which would merge its two ReduceMeans' users)", "LayerNormFusion"),
    ("CommonSubexpressionElimination", "CommonSubexpressionElimination"),
    ("GeluFusion", "GeluFusion"),
    ("SimplifiedLayerNormFusion, FastGeluFusion, QuickGeluFusion, SoftmaxCrossEntropyLossInternalFusion, "
     "GatherToSplitFusion, GatherToSliceFusion", "SimplifiedLayerNormFusion"),
    ("BiasGeluFusion (CUDA/ROCm only)", "-"),
    ("ConstantFolding (trainable weights excluded)", "ConstantFolding"),
    ("ReshapeFusion, ShapeOptimizer, ConcatSliceElimination, recompute, cast propagation, "
     "compute optimizer passes", "-"),
]


def pre_training_transformers(weights_to_train=(), steps=5):
    """A manager holding ortlab's subset of ORT's pre-training transformers, all at level 1, in ORT's order.

    weights_to_train: the initializer names that must stay trainable (not folded, not shared);
    one str is one name.
    """
    excluded = tuple(as_names(weights_to_train, "weights_to_train"))
    manager = GraphTransformerManager(steps)
    rules = RuleBasedGraphTransformer("Level1_RuleBasedTransformer", [
        CastElimination(), NoopElimination(excluded), DivMulFusion(excluded), EliminateDropout(), GemmSumFusion(),
        GemmTransposeFusion(), NotWhereFusion()])
    for transformer in (ConstantSharing(excluded), LayerNormFusion(), CommonSubexpressionElimination(),
                        GeluFusion(), SimplifiedLayerNormFusion(), ConstantFolding(excluded), rules):
        manager.register(transformer, level=1)
    return manager


def optimize_for_training(model, weights_to_train, steps=5):
    """The forward model after the pre-training transformers (a new ModelProto); returns (model, manager)."""
    manager = pre_training_transformers(weights_to_train, steps)
    return manager.optimize(model), manager


def ort_pre_training_table():
    """ORT's pre-training transformers next to the ortlab class that mirrors each."""
    return Table(("ORT (GeneratePreTrainingTransformers)", "ortlab"), ORT_PRE_TRAINING_TRANSFORMERS)

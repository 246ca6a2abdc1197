"""ortlab.transformers: a teaching mirror of ORT's graph optimizer (onnxruntime/core/optimizer/).

    optimize(model, level=2, names=None) -> onnx.ModelProto
    GraphTransformer, RewriteRule, RuleBasedGraphTransformer, GraphTransformerManager
    PatternFusion, Match: a fusion stated as anchor, match and rewrite (the walk is the base's)
    register_transformer(level), register_rule(level): add one by decorating a class
    pre_training_transformers(weights): the subset of ORT's GeneratePreTrainingTransformers
"""
from ortlab.transformers import graph_utils
from ortlab.transformers.graph_transformer import (GraphTransformer, RewriteRule, RuleBasedGraphTransformer,
                                                   RuleEffect, TransformerError)
from ortlab.transformers.pattern import Match, PatternFusion
from ortlab.transformers.registry import LEVELS, known_names, register_rule, register_transformer, unregister

# importing the modules registers their transformers and rules; the order they run in is
# registry.ORT_ORDER and registry.ORT_RULE_ORDER, not the order of these lines
from ortlab.transformers import eliminations  # noqa: E402,F401  (level 1 rules)
from ortlab.transformers.slice_elimination import EliminateSlice  # noqa: E402
from ortlab.transformers.expand_elimination import ExpandElimination  # noqa: E402
from ortlab.transformers.pre_shape_node_elimination import PreShapeNodeElimination  # noqa: E402
from ortlab.transformers.noop_elimination import NoopElimination  # noqa: E402
from ortlab.transformers.div_mul_fusion import DivMulFusion  # noqa: E402
from ortlab.transformers.gemm_sum_fusion import GemmSumFusion  # noqa: E402
from ortlab.transformers.gemm_transpose_fusion import GemmTransposeFusion  # noqa: E402
from ortlab.transformers.not_where_fusion import NotWhereFusion  # noqa: E402
from ortlab.transformers.constant_sharing import ConstantSharing  # noqa: E402
from ortlab.transformers.cse import CommonSubexpressionElimination  # noqa: E402
from ortlab.transformers.constant_folding import ConstantFolding  # noqa: E402
from ortlab.transformers.reshape_fusion import ReshapeFusion  # noqa: E402
from ortlab.transformers.matmul_fusions import (GemmActivationFusion, MatMulAddFusion,  # noqa: E402
                                                MatMulScaleFusion, MatmulTransposeFusion)
from ortlab.transformers.gelu_fusion import BiasGeluFusion, GeluFusion  # noqa: E402
from ortlab.transformers.layer_norm_fusion import LayerNormFusion  # noqa: E402
from ortlab.transformers.gather_to_slice_fusion import GatherToSliceFusion  # noqa: E402
from ortlab.transformers.simplified_layer_norm_fusion import SimplifiedLayerNormFusion  # noqa: E402
from ortlab.transformers.bias_fusions import BiasDropoutFusion, BiasSoftmaxFusion  # noqa: E402
from ortlab.transformers.skip_layer_norm_fusion import SkipLayerNormFusion  # noqa: E402
from ortlab.transformers.eliminations import (CastElimination, EliminateDropout,  # noqa: E402
                                              EliminateIdentity, NoopReshapeElimination)
from ortlab.transformers.manager import GraphTransformerManager, TransformerRecord, optimize  # noqa: E402
from ortlab.transformers.pre_training import (optimize_for_training, ort_pre_training_table,  # noqa: E402
                                              pre_training_transformers)

__all__ = ["BiasDropoutFusion", "BiasGeluFusion", "BiasSoftmaxFusion", "CastElimination",
           "CommonSubexpressionElimination", "ConstantFolding", "ConstantSharing", "DivMulFusion",
           "EliminateDropout", "EliminateIdentity", "EliminateSlice", "ExpandElimination", "GatherToSliceFusion",
           "GemmSumFusion", "GemmTransposeFusion",
           "GeluFusion", "GemmActivationFusion", "GraphTransformer", "GraphTransformerManager", "LEVELS",
           "LayerNormFusion", "Match", "MatMulAddFusion", "MatMulScaleFusion", "MatmulTransposeFusion",
           "NoopElimination", "NoopReshapeElimination", "NotWhereFusion", "PatternFusion",
           "PreShapeNodeElimination", "ReshapeFusion", "RewriteRule",
           "RuleBasedGraphTransformer", "RuleEffect", "SimplifiedLayerNormFusion", "SkipLayerNormFusion",
           "TransformerError", "TransformerRecord", "graph_utils", "known_names", "optimize",
           "optimize_for_training", "ort_pre_training_table", "pre_training_transformers",
           "register_rule", "register_transformer", "unregister"]

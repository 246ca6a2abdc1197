"""Which transformers and rewrite rules run at which optimization level, filled by decorators.

Mirrors onnxruntime/core/optimizer/graph_transformer_utils.cc (GenerateTransformers,
GenerateRewriteRules): level 1 "basic" (semantics-preserving rewrites in ONNX ops, on
every EP), level 2 "extended" (fusions into ORT's com.microsoft ops, for the EPs that
have their kernels), level 3 "layout" (NCHWc/NHWC layout changes for CPU convolutions;
ortlab's models have no Conv, so ortlab registers none there by default).
A lab adds a transformer or a rule by decorating one class; both tables are
ortlab.registry.Registry objects keyed by class name, in registration order, where a class
registered again under the same name (a re-run notebook cell) replaces the old one in place.
"""
from ortlab.errors import OrtlabError
from ortlab.registry import Registry

LEVELS = {1: "basic", 2: "extended", 3: "layout"}
TRANSFORMERS = Registry("graph transformer", op_keys=False, duplicates="replace")  # name -> (level, class, EPs)
RULES = Registry("rewrite rule", op_keys=False, duplicates="replace")  # name -> (level, class)


# The one source of the order in which the optimizer runs them, within each level: ORT's, as
# onnxruntime/core/optimizer/graph_transformer_utils.cc lists them (GenerateRewriteRules,
# GenerateTransformers). A name not listed (ortlab's own, or a lab's) runs after these, in the
# order it was registered. Importing a module only registers; it sets no order.
ORT_RULE_ORDER = ["EliminateIdentity", "EliminateSlice", "EliminateDropout", "ExpandElimination", "CastElimination",
                  "PreShapeNodeElimination", "NoopElimination", "DivMulFusion", "GemmSumFusion",
                  "GemmTransposeFusion", "NotWhereFusion"]
ORT_ORDER = ["ConstantSharing", "CommonSubexpressionElimination", "ConstantFolding", "MatMulAddFusion",
             "ReshapeFusion", "GemmActivationFusion", "GeluFusion", "LayerNormFusion", "SimplifiedLayerNormFusion",
             "GatherToSliceFusion", "MatmulTransposeFusion", "BiasGeluFusion", "SkipLayerNormFusion",
             "BiasSoftmaxFusion", "BiasDropoutFusion", "MatMulScaleFusion"]


def in_ort_order(table=None):
    """The entries of `table` (TRANSFORMERS: (level, class, EPs); RULES: (level, class)) in the order
    the optimizer runs them: ORT's first, in ORT_ORDER / ORT_RULE_ORDER, then the rest in registration
    order."""
    table = TRANSFORMERS if table is None else table
    order = ORT_RULE_ORDER if table is RULES else ORT_ORDER
    rank = {name: i for i, name in enumerate(order)}
    return sorted(table.values(), key=lambda entry: rank.get(entry[1].__name__, len(rank)))


def _check_level(level):
    if level not in LEVELS:
        raise OrtlabError(f"level must be one of {list(LEVELS)} ({', '.join(LEVELS.values())}), got {level!r}")


def register_transformer(level=None, compatible_eps=None):
    """Class decorator: run this GraphTransformer at `level` (default: the class's `level`).

    compatible_eps: the execution providers whose kernels the emitted ops need
    (None = all), as ORT's GraphTransformer(name, compatible_execution_providers).
    """
    def decorate(cls):
        chosen = cls.level if level is None else level
        _check_level(chosen)
        cls.level, cls.compatible_eps = chosen, compatible_eps
        TRANSFORMERS.register(cls.__name__, (chosen, cls, compatible_eps))
        return cls
    return decorate


def register_rule(level=1):
    """Class decorator: add this RewriteRule to the level's rule-based transformer."""
    def decorate(cls):
        _check_level(level)
        RULES.register(cls.__name__, (level, cls))
        return cls
    return decorate


def unregister(name):
    """Remove the transformer or rule registered under `name` (labs use it to clean up)."""
    TRANSFORMERS.unregister(name)
    RULES.unregister(name)


def known_names():
    """Every registered transformer and rule name, plus the rule-based transformers' names."""
    return list(TRANSFORMERS) + list(RULES) + [rule_transformer_name(level) for level in LEVELS]


def rule_transformer_name(level):
    return f"Level{level}_RuleBasedTransformer"

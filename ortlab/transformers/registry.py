"""Which transformers run at which optimization level, filled by decorators.

Mirrors onnxruntime/core/optimizer/graph_transformer_utils.cc (GenerateTransformers,
GenerateRewriteRules): level 1 "basic" (semantics-preserving rewrites in ONNX ops, on
every EP), level 2 "extended" (fusions into ORT's com.microsoft ops, for the EPs that
have their kernels), level 3 "layout" (NCHWc/NHWC layout changes for CPU convolutions;
ortlab's models have no Conv, so ortlab registers none there by default).
A lab adds a transformer by decorating one class.
"""
from ortlab.errors import OrtlabError

LEVELS = {1: "basic", 2: "extended", 3: "layout"}
TRANSFORMERS = []  # (level, class, compatible EPs or None for all), in registration order
RULES = []  # (level, class)


# ORT's order within each level (graph_transformer_utils.cc); transformers a lab adds run after these.
ORT_ORDER = ["ConstantSharing", "CommonSubexpressionElimination", "ConstantFolding", "MatMulAddFusion",
             "GemmActivationFusion", "GeluFusion", "LayerNormFusion", "MatmulTransposeFusion",
             "BiasGeluFusion", "BiasSoftmaxFusion", "BiasDropoutFusion", "MatMulScaleFusion"]


def in_ort_order():
    """The registered (level, class, EPs) entries, ORT's own first in ORT's order, then the rest."""
    rank = {name: i for i, name in enumerate(ORT_ORDER)}
    return sorted(TRANSFORMERS, key=lambda t: (rank.get(t[1].__name__, len(rank)), TRANSFORMERS.index(t)))


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
        _replace(TRANSFORMERS, cls, (chosen, cls, compatible_eps))
        return cls
    return decorate


def register_rule(level=1):
    """Class decorator: add this RewriteRule to the level's rule-based transformer."""
    def decorate(cls):
        _check_level(level)
        _replace(RULES, cls, (level, cls))
        return cls
    return decorate


def _replace(table, cls, entry):
    """Re-registering a class of the same name (a re-run notebook cell) replaces the old one."""
    for i, old in enumerate(table):
        if old[1].__name__ == cls.__name__:
            table[i] = entry
            return
    table.append(entry)


def unregister(name):
    """Remove a transformer or rule registered under `name` (labs use it to clean up)."""
    TRANSFORMERS[:] = [t for t in TRANSFORMERS if t[1].__name__ != name]
    RULES[:] = [r for r in RULES if r[1].__name__ != name]


def known_names():
    """Every registered transformer and rule name, plus the rule-based transformers' names."""
    return ([cls.__name__ for _, cls, _ in TRANSFORMERS] + [cls.__name__ for _, cls in RULES]
            + [rule_transformer_name(level) for level in LEVELS])


def rule_transformer_name(level):
    return f"Level{level}_RuleBasedTransformer"

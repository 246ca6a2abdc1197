"""GraphTransformerManager and optimize(): run the registered transformers level by level until nothing changes.

Mirrors onnxruntime/core/optimizer/graph_transformer_mgr.h/.cc (ApplyTransformers) and the
level loop of InferenceSession::TransformGraph (onnxruntime/core/session/inference_session.cc):
transform_graph changes a Graph in place (what ortlab.engine's session does to its one Graph);
optimize() does it to a Graph loaded from a copy of a model and returns the model it becomes.
For each level, step after step up to the step limit: every transformer of the level in the
order it was registered with the manager (from_registry: ORT's order, registry.ORT_ORDER and
ORT_RULE_ORDER; apply-once ones in the first step only), the graph re-resolved after each
one that changed it; the loop ends with the first step in which nothing changed. Every
application is recorded: which nodes it removed, added and fused, why it declined others, and
how many times each transformer (each rule, inside a rule-based transformer) fired.
"""
import difflib
import inspect
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ortlab.errors import OrtlabError, as_names
from ortlab.ir import Graph, load_model
from ortlab.ir.subgraph import load_bodies
from ortlab.transformers import graph_utils as gu, registry
from ortlab.transformers.graph_transformer import GraphTransformer, RuleBasedGraphTransformer, TransformerError
from ortlab.transformers.graph_utils import label
from ortlab.viz import Table


@dataclass
class TransformerRecord:
    """One application of one transformer in one step."""
    level: int
    step: int
    transformer: str
    modified: bool
    removed: list = field(default_factory=list)
    added: list = field(default_factory=list)
    fused: list = field(default_factory=list)  # (new node, its op type, [op types it replaced])
    declined: list = field(default_factory=list)  # (node, reason)
    fires: dict = field(default_factory=dict)  # {transformer or rule name: rewrites it made}


class GraphTransformerManager:
    """Holds transformers per level and applies them in a loop (GraphTransformerManager)."""

    def __init__(self, steps=10):
        if not isinstance(steps, int) or steps < 1:
            raise OrtlabError(f"steps must be a positive int (ORT's session default is 10), got {steps!r}")
        self.steps = steps
        self.transformers = {level: [] for level in registry.LEVELS}
        self.history = []

    @classmethod
    def from_registry(cls, level=2, names=None, providers=None, steps=10, **options):
        """A manager holding the registered transformers of levels 1..level.

        names: only these transformers or rules (a transformer named here runs whatever the EPs).
        providers: EPs the model will run on (default: ortlab.env.providers()); a transformer
        registered for other EPs only (BiasSoftmaxFusion: CUDA/ROCm) is skipped.
        options: keyword arguments for the transformers that take them (excluded_initializers).
        """
        registry._check_level(level)
        wanted = _check_names(names)
        options = _check_options(options)
        if providers is None:
            from ortlab.env import providers as default_providers  # lazy: ortlab.env imports torch
            providers = default_providers()
        from ortlab.session import check_providers  # lazy: ortlab.session imports onnxruntime (2 s)
        providers = check_providers(providers, OrtlabError)
        manager = cls(steps)
        for lvl in range(1, level + 1):
            rules = [_instantiate(r, options) for lv, r in registry.in_ort_order(registry.RULES)
                     if lv == lvl and _named(wanted, r.__name__, lvl)]
            if rules:
                manager.register(RuleBasedGraphTransformer(registry.rule_transformer_name(lvl), rules, lvl))
            for lv, cls_, eps in registry.in_ort_order():
                name_ok = wanted is None or cls_.__name__ in wanted
                ep_ok = eps is None or any(p in eps for p in providers) or wanted is not None
                if lv == lvl and name_ok and ep_ok:
                    manager.register(_instantiate(cls_, options))
        return manager

    def register(self, transformer, level=None):
        """Add a GraphTransformer instance at its level (or `level`); returns it."""
        if not isinstance(transformer, GraphTransformer):
            raise OrtlabError(f"register() takes a GraphTransformer instance, not {type(transformer).__name__}"
                              "; for a RewriteRule, wrap it in a RuleBasedGraphTransformer")
        level = transformer.level if level is None else level
        registry._check_level(level)
        self.transformers[level].append(transformer)
        return transformer

    def apply_transformers(self, graph, level):
        """Run one level's transformers in a loop until a step changes nothing; returns modified."""
        modified_any = False
        for step in range(self.steps):
            modified = False
            for t in self.transformers[level]:
                if t.should_only_apply_once and step > 0:
                    continue
                modified |= self._apply_one(graph, t, level, step)
            modified_any |= modified
            if not modified:
                break
        return modified_any

    def _apply_one(self, graph, transformer, level, step):
        before = {n.index: label(n) for n in graph.nodes()}
        modified = transformer.apply(graph)
        if modified:
            gu.remove_unused_initializers(graph)
        after = {n.index: label(n) for n in graph.nodes()}
        if modified:
            try:
                graph.resolve()
            except OrtlabError as exc:
                raise TransformerError(f"transformer {transformer.name} left a graph that does not "
                                       f"resolve: {exc}") from None
        self.history.append(TransformerRecord(
            level, step, transformer.name, modified,
            [before[i] for i in before if i not in after], [after[i] for i in after if i not in before],
            list(transformer.fused), list(transformer.declined), _fires(transformer, modified)))
        return modified

    def transform_graph(self, graph, level=None):
        """Transform `graph` in place (InferenceSession::TransformGraph): resolve it first, so that a malformed
        model fails with a message naming the node, then run each level's transformers up to `level`
        (apply_transformers). Returns whether anything changed; once anything did, every subgraph is written
        from its Graph (load_bodies), as ORT writes a changed model. ortlab.engine's InferenceSession calls
        this on the one Graph it loaded, as ORT's session transforms its own Graph."""
        levels = self._levels(level)
        graph.resolve()
        self.history = []
        modified = False
        for lv in levels:
            modified |= self.apply_transformers(graph, lv)
        if modified:  # ORT writes a changed model's subgraphs from their Graphs, untouched ones too
            load_bodies(graph)
        return modified

    def optimize(self, model, level=None):
        """A new, optimized onnx.ModelProto; `model` itself is never changed.

        The graph is loaded from a copy as ORT loads it (Constant nodes become initializers),
        transformed in place (transform_graph) and written back as a model.
        """
        self._levels(level)
        graph = Graph.from_model(_copy(model), constants_as_initializers=True)
        self.transform_graph(graph, level)
        return graph.to_model()

    def _levels(self, level):
        """The levels to run, in order: all those registered, or those up to `level` (checked)."""
        if level is not None:
            registry._check_level(level)
        return [lv for lv in self.transformers if level is None or lv <= level]

    # --- what happened ---------------------------------------------------------------------------

    def history_table(self, all_steps=False):
        """Per level, step and transformer: what it removed, added and fused (modifying steps only
        unless all_steps)."""
        rows = []
        for r in self.history:
            if r.modified or all_steps:
                rows.append((r.level, r.step, r.transformer, len(r.removed), len(r.added), _summary(r.fused)))
        return Table(("level", "step", "transformer", "removed", "added", "fused"), rows)

    def fire_counts(self):
        """{transformer or rule name: how many times it fired over the whole run}; the rules of a
        rule-based transformer are counted under their own names."""
        counts = {}
        for r in self.history:
            for name, n in r.fires.items():
                counts[name] = counts.get(name, 0) + n
        return counts

    def declined(self, name=None):
        """Why each transformer (or the one called `name`) left nodes alone, last step only."""
        last = {}
        for r in self.history:
            if name is None or r.transformer == name:
                last[r.transformer] = r
        rows = [(t, node, why) for t, r in last.items() for node, why in r.declined]
        return Table(("transformer", "node", "declined because"), rows)

    def __repr__(self):
        parts = [f"{registry.LEVELS[lv]}: {[t.name for t in ts]}" for lv, ts in self.transformers.items() if ts]
        return f"GraphTransformerManager(steps={self.steps}, " + ", ".join(parts) + ")"


def optimize(model, level=2, names=None, providers=None, steps=10, **options):
    """Optimize a model with ortlab's transformers of levels 1..level; returns a new ModelProto.

    level: 1 basic, 2 extended, 3 layout (as ORT's GraphOptimizationLevel).
    names: only the named transformers or rules (see registry.known_names()).
    providers: the EPs the model will run on (a list, or one name).
    options: keywords the transformers take, e.g. excluded_initializers=[names] (initializers to
    keep variable: never folded or shared). An unknown keyword raises (a typo would otherwise
    be dropped silently), and so does an excluded name the model does not have.
    """
    model = _copy(model)
    manager = GraphTransformerManager.from_registry(level, names, providers, steps, **options)
    excluded = options.get("excluded_initializers")
    if excluded is not None:
        _check_excluded(model, as_names(excluded, "excluded_initializers"))
    return manager.optimize(model)


def _fires(transformer, modified):
    """{name: fires} of one application; a transformer that changed the graph without counting
    its fires (a learner's apply_impl) is counted once per fused node, or once."""
    fires = transformer.fire_counts()
    if modified and not fires:
        fires = {transformer.name: max(len(transformer.fused), 1)}
    return fires


def _summary(fused):
    """'5 x LayerNormalization <- ReduceMean+Sub+...' per distinct rewrite."""
    counts = {}
    for _, op, ops in fused:
        key = f"{op} <- {'+'.join(ops)}"
        counts[key] = counts.get(key, 0) + 1
    return "; ".join(f"{n} x {key}" for key, n in counts.items())


def _copy(model):
    if not isinstance(model, onnx.ModelProto):
        if not isinstance(model, (str, Path)):
            raise OrtlabError(f"optimize() takes an onnx.ModelProto or a path to a .onnx file, not "
                              f"{type(model).__name__}")
        return load_model(model)
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _check_names(names):
    if names is None:
        return None
    names = as_names(names, "names")
    known = registry.known_names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise OrtlabError(f"no transformer or rule named {unknown}{_close(unknown[0], known)}; "
                          f"registered: {', '.join(known)}")
    return set(names)


def _close(name, candidates):
    match = difflib.get_close_matches(str(name), list(candidates), n=1, cutoff=0.6)
    return f" (did you mean {match[0]!r}?)" if match else ""


def option_names():
    """The keywords the registered transformers' constructors take (what optimize() passes on)."""
    found = set()
    classes = [cls_ for _, cls_, _ in registry.TRANSFORMERS.values()] + [cls_ for _, cls_ in registry.RULES.values()]
    for cls_ in classes:
        for name, p in inspect.signature(cls_.__init__).parameters.items():
            if name != "self" and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY):
                found.add(name)
    return sorted(found)


def _check_options(options):
    known = option_names()
    for key in options:
        if key not in known:
            raise OrtlabError(f"optimize() got an unknown keyword {key!r}{_close(key, known)}; the "
                              f"transformers take {', '.join(known) or 'no options'} (and optimize() "
                              "itself level, names, providers, steps)")
    options = dict(options)
    if "excluded_initializers" in options:
        options["excluded_initializers"] = as_names(options["excluded_initializers"], "excluded_initializers")
    return options


def _check_excluded(model, excluded):
    values = {t.name for t in model.graph.initializer} | {i.name for i in model.graph.input}
    values |= {n.output[0] for n in model.graph.node if n.op_type == "Constant" and n.output}
    missing = [n for n in excluded if n not in values]
    if missing:
        raise OrtlabError(f"excluded_initializers names {missing[0]!r}, which is not an initializer of "
                          f"the model{_close(missing[0], values)}; excluding it would protect nothing")


def _named(wanted, rule_name, level):
    return wanted is None or rule_name in wanted or registry.rule_transformer_name(level) in wanted


def _instantiate(cls, options):
    accepted = inspect.signature(cls.__init__).parameters
    return cls(**{k: v for k, v in options.items() if k in accepted})

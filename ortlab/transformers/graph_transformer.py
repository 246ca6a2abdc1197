"""GraphTransformer, RewriteRule and RuleBasedGraphTransformer: the three shapes an ORT optimization takes.

Mirrors include/onnxruntime/core/optimizer/graph_transformer.h, rewrite_rule.h and
rule_based_graph_transformer.h (with their .cc files in onnxruntime/core/optimizer/).

- A GraphTransformer sees the whole graph and says whether it changed it (`apply_impl`).
- A RewriteRule sees one node at a time: `target_op_types`, `satisfy_condition`, `apply`.
- A RuleBasedGraphTransformer walks the graph in topological order and offers each node to
  the rules that target its op type, then to the rules that target every op.

Every check that declines says why (`self.decline(node, reason)`), so a learner can ask a
transformer why it left a node alone, and every rewrite counts as one fire (`self.fired()`),
per rule inside a rule-based transformer. A fusion stated as a pattern (anchor, match,
rewrite) is a PatternFusion (pattern.py), which owns the walk.
"""
import enum

from ortlab.errors import OrtlabError, as_names
from ortlab.ir.subgraph import transform_bodies
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_utils import label


class TransformerError(OrtlabError):
    """A transformer failed on a graph; the message names the transformer and the node."""


class RuleEffect(enum.Enum):
    """What a rule did (RewriteRule::RewriteRuleEffect)."""
    NONE = "none"
    UPDATED_CURRENT_NODE = "updated current node"
    REMOVED_CURRENT_NODE = "removed current node"
    MODIFIED_REST_OF_GRAPH = "modified rest of graph"


class _Explained:
    """Bookkeeping shared by transformers and rules: why nodes were declined, what was fused,
    how many times it fired (in the last apply)."""

    def decline(self, node, reason):
        """Record why this node was left alone; returns False so a check can `return self.decline(...)`."""
        self.declined.append((label(node), reason))
        return False

    def fired(self, times=1):
        """Count a rewrite this transformer or rule made."""
        self.fires += times

    def fire_counts(self):
        """{name: fires} for the last apply ({} when it did not fire)."""
        return {self.name: self.fires} if self.fires else {}

    def reset_log(self):
        self.declined, self.fused, self.fires = [], [], 0

    @property
    def name(self):
        return type(self).__name__


class GraphTransformer(_Explained):
    """A whole-graph optimization: subclasses implement `apply_impl(graph) -> bool` (modified).

    Mirrors onnxruntime/core/optimizer/graph_transformer.h (GraphTransformer::Apply, ApplyImpl).
    `level` is the optimization level it belongs to (1 basic, 2 extended, 3 layout);
    `should_only_apply_once` makes the manager run it in the first step only.
    `excluded_initializers` are initializers it must treat as variable (ORT passes the
    trainable weights during training, so folding or sharing never cuts one off its gradient).
    """

    level = 1
    should_only_apply_once = False
    recurses = True  # works inside subgraphs too (GraphTransformer::Recurse), as nearly every ORT transformer

    def __init__(self, excluded_initializers=()):
        self.reset_log()
        self.current = None
        self.excluded = set(as_names(excluded_initializers, "excluded_initializers"))

    def nodes(self, graph):
        """The live nodes in topological order, remembering the current one for error messages.
        Nodes a previous iteration removed are skipped. (A walk over the graph, not Graph.nodes().)"""
        for node in graph.topological_order():
            if graph.has_node(node):
                self.current = node
                yield node
        self.current = None

    def apply(self, graph):
        """Run apply_impl; an exception becomes a TransformerError naming this transformer and node."""
        self.reset_log()
        self.current = None
        try:
            modified = bool(self.apply_impl(graph))
            return self.apply_to_subgraphs(graph) | modified if self.recurses else modified
        except (TransformerError, NotImplementedError):
            raise  # NotImplementedError: an unfinished lab exercise, reported as "not done"
        except Exception as exc:
            where = f" at node {label(self.current)}" if self.current is not None else ""
            raise TransformerError(f"transformer {self.name} failed{where}: {type(exc).__name__}: "
                                   f"{exc}".splitlines()[0]) from exc

    def apply_impl(self, graph):
        raise NotImplementedError(f"{self.name} must implement apply_impl(graph) -> bool")

    def apply_to_subgraphs(self, graph):
        """The same transformation inside every subgraph of `graph` (If's branches, Loop's and Scan's body),
        nested ones included, as ORT's transformers call GraphTransformer::Recurse for each node that holds
        subgraphs; returns whether any changed. A body is worked on as a Graph of its own (ortlab.ir.subgraph)
        and written back only when it changed; once anything changed, optimize writes every body from its Graph
        (ortlab.ir.subgraph.load_bodies), as ORT does: only a wholly unchanged model keeps its Constant nodes."""
        return any(transform_bodies(graph, self._apply_to_body))

    def _apply_to_body(self, sub):
        """This transformation on one body Graph and the bodies inside it; whether it changed anything."""
        changed = bool(self.apply_impl(sub))
        changed = self.apply_to_subgraphs(sub) | changed
        if changed:
            gu.remove_unused_initializers(sub)
        return changed

    def __repr__(self):
        return f"{self.name}(level={self.level})"


class RewriteRule(_Explained):
    """A local rewrite of one node's neighbourhood (onnxruntime/core/optimizer/rewrite_rule.h).

    Subclasses set `target_op_types` (empty: every op), optionally `target_versions` (the since-versions
    of those ops the rule is written for: the transformer offers the rule no other node, as every ORT
    rule's SatisfyCondition starts with graph_utils::IsSupportedOptypeVersionAndDomain), and implement
    `satisfy_condition(graph, node) -> bool` and `apply(graph, node) -> RuleEffect`.
    """

    target_op_types = ()
    target_versions = ()

    def __init__(self):
        self.reset_log()

    def is_target(self, graph, node):
        """True when the node's op is at one of target_versions (ONNX domain), or the rule names none."""
        return not self.target_versions or gu.is_op_version(graph, node, node.op_type, self.target_versions)

    def satisfy_condition(self, graph, node):
        raise NotImplementedError(f"{self.name} must implement satisfy_condition(graph, node)")

    def apply(self, graph, node):
        raise NotImplementedError(f"{self.name} must implement apply(graph, node) -> RuleEffect")

    def __repr__(self):
        return f"{self.name}(targets={list(self.target_op_types) or 'all ops'})"


class PlannedRule(RewriteRule):
    """A rewrite rule whose condition is finding its plan: plan(graph, node) returns what the rewrite
    needs (plain data) or None where the rule does not fit; satisfy_condition holds when there is a
    plan, and apply(graph, node) is rewrite(graph, node, plan)."""

    def plan(self, graph, node):
        raise NotImplementedError(f"{self.name} must implement plan(graph, node) -> its plan, or None")

    def rewrite(self, graph, node, plan):
        raise NotImplementedError(f"{self.name} must implement rewrite(graph, node, plan) -> RuleEffect")

    def satisfy_condition(self, graph, node):
        return self.plan(graph, node) is not None

    def apply(self, graph, node):
        return self.rewrite(graph, node, self.plan(graph, node))


class RuleBasedGraphTransformer(GraphTransformer):
    """Runs a set of RewriteRules over the graph (rule_based_graph_transformer.cc).

    For each node in topological order: the rules registered for its op type, then the
    rules for every op; once a rule removes the node, later rules do not see it.
    """

    def __init__(self, name, rules=(), level=1):
        super().__init__()
        self._name, self.level, self.rules = name, level, []
        for rule in rules:
            self.register(rule)

    @property
    def name(self):
        return self._name

    def register(self, rule):
        """Add a rule (RuleBasedGraphTransformer::Register); returns it."""
        if not isinstance(rule, RewriteRule):
            raise TransformerError(f"{self.name}: register() takes a RewriteRule instance, "
                                   f"not {type(rule).__name__}")
        self.rules.append(rule)
        return rule

    def rules_for(self, op_type):
        return ([r for r in self.rules if op_type in r.target_op_types]
                + [r for r in self.rules if not r.target_op_types])

    def apply_impl(self, graph):
        for rule in self.rules:
            rule.reset_log()
        modified = False
        for node in self.nodes(graph):
            for rule in self.rules_for(node.op_type):
                effect = self._apply_rule(rule, graph, node)
                if effect is not RuleEffect.NONE:
                    rule.fired()
                    modified = True
                if effect is RuleEffect.REMOVED_CURRENT_NODE:
                    break
        self.declined = [d for r in self.rules for d in r.declined]
        self.fused = [f for r in self.rules for f in r.fused]
        return modified

    def fire_counts(self):
        """{rule name: fires} for the last apply: each rule counted under its own name."""
        return {name: n for rule in self.rules for name, n in rule.fire_counts().items()}

    def _apply_rule(self, rule, graph, node):
        try:
            if not rule.is_target(graph, node) or not rule.satisfy_condition(graph, node):
                return RuleEffect.NONE
            effect = rule.apply(graph, node)
        except (TransformerError, NotImplementedError):
            raise
        except Exception as exc:
            raise TransformerError(f"rule {rule.name} (in {self.name}) failed at node {label(node)}: "
                                   f"{type(exc).__name__}: {exc}".splitlines()[0]) from exc
        if not isinstance(effect, RuleEffect):
            raise TransformerError(f"rule {rule.name}.apply() returned {effect!r} at node {label(node)}; "
                                   "return a RuleEffect (RuleEffect.NONE when it changed nothing)")
        return effect

    def __repr__(self):
        return f"RuleBasedGraphTransformer('{self.name}', level={self.level}, rules={[r.name for r in self.rules]})"

"""PatternFusion: a fusion stated as a pattern (anchor, match, rewrite); the walk over the graph is the base's.

Mirrors the shape every ORT fusion's ApplyImpl repeats (onnxruntime/core/optimizer/gelu_fusion.cc,
layer_norm_fusion.cc, matmul_add_fusion.cc, ...): visit the nodes in topological order, keep the
ones of the anchor op (graph_utils::IsSupportedOptypeVersionAndDomain), follow the edges from
there, and replace the matched nodes by one (graph_utils::FinalizeNodeFusion). Stated as
onnxscript's rewriter states a rule: what to look for, a check that says why it declined, a
rewrite. A fusion writes three things:

    anchor    the op the pattern starts from: "Erf", ("Gelu", MS_DOMAIN), or a list of these
    match     match(graph, node) -> a Match (plain data: what to replace and by what),
              a str (why this anchor does not fit: recorded as the node's declined reason),
              or None (not the pattern at all: nothing worth saying)
    rewrite   rewrite(graph, match): by default one fused node, `fused_op` (op type[, domain]),
              built from the Match's nodes, inputs, outputs and attributes

The base counts each rewrite as one fire and keeps the declined reasons; `why_not(graph, node)`
asks the fusion about one node without changing the graph.
"""
from typing import NamedTuple

from ortlab.onnx_defs import node_op_name, op_key, op_name
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import GraphTransformer, TransformerError


class Match(NamedTuple):
    """What one fused node replaces: `nodes` (the first names the fused node), and the fused
    node's inputs, outputs and attributes."""
    nodes: list
    inputs: list
    outputs: list
    attributes: dict = {}


def op_keys(ops):
    """An anchor as a list of op keys: "Erf" -> [("Erf", "")], ("Gelu", MS) -> [("Gelu", MS)]."""
    if isinstance(ops, str):
        return [op_key(ops)]
    if isinstance(ops, tuple) and len(ops) == 2 and all(isinstance(o, str) for o in ops):
        return [op_key(*ops)]
    return [key for op in (ops or ()) for key in op_keys(op)]


class PatternFusion(GraphTransformer):
    """A fusion that states `anchor`, `match` and `rewrite` (or `fused_op`); see the module docstring."""

    anchor = ()
    fused_op = None  # op type or (op type, domain) of the node the default rewrite adds

    def match(self, graph, node):
        raise NotImplementedError(f"{self.name} must implement match(graph, node) -> Match, str or None")

    def rewrite(self, graph, match):
        """Replace match.nodes by one `fused_op` node (gu.fuse); returns the new node."""
        if self.fused_op is None:
            raise TransformerError(f"{self.name} sets no fused_op: set it, or implement rewrite(graph, match)")
        (op_type, domain), = op_keys(self.fused_op)
        return gu.fuse(self, graph, match.nodes, op_type, match.inputs, match.outputs, domain=domain,
                       **match.attributes)

    def is_anchor(self, node):
        keys = op_keys(self.anchor)
        if not keys:
            raise TransformerError(f"{self.name} sets no anchor: say which op its pattern starts from, "
                                   "e.g. anchor = 'Erf' or anchor = ('Gelu', 'com.microsoft')")
        return op_key(node.op_type, node.domain) in keys

    def apply_impl(self, graph):
        modified = False
        for node in self.nodes(graph):
            if self.is_anchor(node):
                modified |= self._try(graph, node)
        return modified

    def _matched(self, graph, node):
        """match(graph, node), refused when it is not a Match-like value, a str or None."""
        found = self.match(graph, node)
        if found is None or isinstance(found, str) or (hasattr(found, "nodes") and not isinstance(found, bool)):
            return found
        raise TransformerError(f"{self.name}.match returned {type(found).__name__} {found!r} for node "
                               f"{node.name or node.op_type}: return a Match (the nodes to fuse and the fused "
                               "node's inputs and outputs), a str (why it declined) or None (not this pattern)")

    def _try(self, graph, node):
        found = self._matched(graph, node)
        if found is None:
            return False
        if isinstance(found, str):
            self.decline(node, found)
            return False
        self.rewrite(graph, found)
        self.fired()
        return True

    def why_not(self, graph, node):
        """Why this fusion leaves `node` alone, or None when it would fuse there (the graph is not changed)."""
        if not self.is_anchor(node):
            wanted = " or ".join(op_name(*k) for k in op_keys(self.anchor))
            return f"{self.name} starts from {wanted}, not {node_op_name(node)}"
        found = self._matched(graph, node)
        if found is None:
            return f"the nodes around it are not {self.name}'s pattern"
        return found if isinstance(found, str) else None

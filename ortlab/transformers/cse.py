"""CommonSubexpressionElimination: two nodes computing the same thing from the same values become one.

Mirrors onnxruntime/core/optimizer/common_subexpression_elimination.cc: value numbering
over the graph in topological order. A node's key is its op type, domain, attributes
and the equivalence classes of its inputs; a node whose key was seen before is
removed and its consumers read the first node's outputs. Non-deterministic ops
(Dropout, Random*) are never merged, and a node producing a graph output is kept.
"""
from ortlab.onnx_defs import MS_DOMAIN, ONNX_DOMAIN, domain_of
from ortlab.transformers.constant_folding import NON_DETERMINISTIC
from ortlab.transformers.graph_transformer import GraphTransformer
from ortlab.transformers.graph_utils import label
from ortlab.transformers.registry import register_transformer


@register_transformer(level=1)
class CommonSubexpressionElimination(GraphTransformer):
    """f(a, b) computed twice -> computed once, both consumers share the result."""

    def apply_impl(self, graph):
        seen, modified = {}, False
        for node in self.nodes(graph):
            if node.op_type in NON_DETERMINISTIC or domain_of(node.domain) not in (ONNX_DOMAIN, MS_DOMAIN):
                continue
            key = self.key(node)
            first = seen.get(key)
            if first is None:
                seen[key] = node
                continue
            if any(o in graph.outputs for o in node.output_names):
                self.decline(node, f"it produces a graph output (same value as {label(first)})")
                continue
            pairs = [(mine, theirs) for mine, theirs in zip(node.output_names, first.output_names) if mine]
            if not all(graph.can_replace_all_uses(mine, theirs) for mine, theirs in pairs):
                self.decline(node, f"a subgraph reads its output and has a value of its own named as the output "
                                   f"of {label(first)}")
                continue
            graph.remove_node(node)
            for mine, theirs in zip(node.output_names, first.output_names):
                if mine:
                    graph.replace_all_uses(mine, theirs)
            self.fused.append((label(first), "shared " + node.op_type, [node.op_type]))
            self.fired()
            modified = True
        return modified

    @staticmethod
    def key(node):
        attributes = tuple(sorted((n, a.SerializeToString()) for n, a in node.attribute_protos.items()))
        return (node.op_type, domain_of(node.domain), tuple(node.input_names), attributes, len(node.outputs))

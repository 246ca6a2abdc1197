"""ConstantSharing: initializers holding the same small value become one, so CSE can see equal inputs.

Mirrors onnxruntime/core/optimizer/constant_sharing.cc: constant initializers (not graph
inputs, not excluded weights) of one element are grouped by element type, shape and value;
every reader of a copy reads the first of its group instead.
"""
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import GraphTransformer
from ortlab.transformers.registry import register_transformer


@register_transformer(level=1)
class ConstantSharing(GraphTransformer):
    """c1 = 2.0, c2 = 2.0 -> one initializer read by both."""

    def apply_impl(self, graph):
        first, modified = {}, False
        for name in list(graph.initializers):
            value = gu.constant(graph, name, self.excluded)
            if value is None or value.size != 1 or name in graph.outputs:
                continue
            key = (value.dtype.str, value.shape, value.tobytes())
            keep = first.setdefault(key, name)
            if keep != name:
                graph.replace_all_uses(name, keep)
                graph.remove_initializer(name)
                self.fired()
                modified = True
        return modified

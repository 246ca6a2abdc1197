"""ConstantSharing: initializers holding the same small value become one, so CSE can see equal inputs.

Mirrors onnxruntime/core/optimizer/constant_sharing.cc as ORT 1.19.2 runs it: constant
initializers (not graph inputs, not excluded weights) of 1 to 8 elements, of a type it
supports (float, float16, double, int32, int64), are grouped by element type, shape and
bytes (so -0.0 and 0.0 stay apart, and two equal NaNs are one); every reader of a copy
reads the first of its group instead. A [4] and a [1, 4] of the same values stay apart. An
initializer a subgraph reads (an implicit input of If, Loop, Scan) is left alone, as ORT's
PrepareInputPortsToReplace skips it.
"""
import numpy as np

from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import GraphTransformer
from ortlab.transformers.registry import register_transformer

MAX_ELEMENTS = 8  # ORT 1.19.2 shares no initializer of more elements
SHARED_DTYPES = {np.dtype(t) for t in (np.float32, np.float16, np.float64, np.int32, np.int64)}


@register_transformer(level=1)
class ConstantSharing(GraphTransformer):
    """c1 = 2.0, c2 = 2.0 -> one initializer read by both.

    Also a tensor of up to 8 elements: same element type, shape and bytes (see the module's docstring).
    """

    def apply_impl(self, graph):
        first, modified = {}, False
        read_by_subgraphs = {name for node in graph.nodes() for name in node.implicit_input_names()}
        for name in list(graph.initializers):
            value = gu.constant(graph, name, self.excluded)
            if value is None or not 1 <= value.size <= MAX_ELEMENTS or value.dtype not in SHARED_DTYPES \
                    or name in graph.outputs or name in read_by_subgraphs:
                continue
            key = (value.dtype.str, value.shape, value.tobytes())
            keep = first.setdefault(key, name)
            if keep != name:
                graph.replace_all_uses(name, keep)
                graph.remove_initializer(name)
                self.fired()
                modified = True
        return modified

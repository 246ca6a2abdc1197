"""ConstantFolding: evaluate nodes whose inputs are all constant and store their outputs as initializers.

Mirrors onnxruntime/core/optimizer/constant_folding.cc. ORT runs the node's CPU kernel;
ortlab evaluates ONNX-domain nodes with onnx.reference. Skipped, as in ORT: ops that
are not deterministic, nodes producing a value that is not a tensor (a sequence, an optional: no
initializer holds one), nodes with subgraphs, and (during training) anything reading an excluded
initializer, i.e. a trainable weight. An If whose condition is a constant is replaced by the nodes of
the branch it takes (ConstantFoldIfNode). A node whose output is a graph output is folded too: the
output becomes an initializer (ORT 1.19.2 does; older ORT skipped such nodes). A Shape
node folds when the dims it returns are all known, even if its input is not constant; a
Gather of a Shape with a symbolic dim stays, even where the dims it picks are known (so
ORT 1.19.2 leaves it for ReshapeFusion to read); a Shape node left with no reader is removed.
"""
import numpy as np
import onnx
from onnx import helper
from onnx.reference import ReferenceEvaluator

from ortlab.ir.subgraph import inline_if_branch
from ortlab.onnx_defs import ONNX_DOMAIN, domain_of
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_transformer import GraphTransformer
from ortlab.transformers.graph_utils import label
from ortlab.transformers.registry import register_transformer

NON_DETERMINISTIC = {"Dropout", "RandomNormal", "RandomUniform", "RandomNormalLike",
                     "RandomUniformLike", "Multinomial", "Bernoulli"}


@register_transformer(level=1)
class ConstantFolding(GraphTransformer):
    """f(constants) -> constant: the node is replaced by initializers holding its outputs."""

    def apply_impl(self, graph):
        modified = False
        for node in self.nodes(graph):
            if node.op_type == "Shape" and not graph.consumers(node.output_names[0]) \
                    and node.output_names[0] not in graph.outputs:
                graph.remove_node(node)  # its readers were all folded
                self.fired()
                modified = True
                continue
            if self._fold_if(graph, node):
                modified = True
                continue
            values = self.fold(graph, node)
            if values is None:
                continue
            graph.remove_node(node)
            for name, value in zip(node.output_names, values):
                if name:
                    graph.add_initializer(name, value)
            self.fused.append((label(node), "initializer", [node.op_type]))
            self.fired()
            modified = True
        return modified

    def _fold_if(self, graph, node):
        """An If whose condition is a constant is replaced by the branch it takes (ConstantFoldIfNode, which
        inlines the branch rather than folding it); True when it was."""
        if node.op_type != "If" or domain_of(node.domain) != ONNX_DOMAIN:
            return False
        condition = gu.constant(graph, node.input_names[0])
        if condition is None or condition.size != 1:
            return False
        inline_if_branch(graph, node, bool(condition.reshape(-1)[0]))
        self.fused.append((label(node), "the branch it takes", ["If"]))
        self.fired()
        return True

    def fold(self, graph, node):
        """The node's output values, or None when it must not or cannot be folded."""
        if domain_of(node.domain) != ONNX_DOMAIN or node.op_type in NON_DETERMINISTIC:
            return None
        if any(_not_a_tensor(graph.node_arg(o).type_proto) for o in node.output_names if graph.node_arg(o)):
            return None  # "Unsupported output type ... Can't constant fold": an initializer is a tensor
        if any(a.type == onnx.AttributeProto.GRAPH for a in node.attribute_protos.values()):
            return None
        if node.op_type == "Shape":
            return self._fold_shape(graph, node)
        inputs = [n for n in node.input_names if n]
        values = [gu.constant(graph, n, self.excluded) for n in inputs]
        if not inputs or any(v is None for v in values):
            return None
        return self._evaluate(graph, node, dict(zip(inputs, values)))

    def _fold_shape(self, graph, node):
        dims = gu.shape(graph, node.input_names[0])
        if dims is None:
            return None
        start, end = node.attribute("start", 0), node.attribute("end", len(dims))
        picked = dims[slice(start, end)]
        if not all(isinstance(d, int) for d in picked):
            return None
        return [np.array(picked, dtype=np.int64)]

    @staticmethod
    def _evaluate(graph, node, feeds):
        proto = node.to_proto()
        model = helper.make_model(
            helper.make_graph([proto], "fold", [helper.make_tensor_value_info(n, 0, None) for n in feeds],
                              [helper.make_tensor_value_info(o, 0, None) for o in proto.output if o]),
            opset_imports=[helper.make_opsetid(d, v) for d, v in graph.opset_imports.items()])
        try:
            values = list(ReferenceEvaluator(model).run(None, feeds))
        except Exception:
            return None  # onnx.reference cannot run it: leave it to the runtime, as ORT does
        return values if all(isinstance(v, np.ndarray) for v in values) else None  # a sequence or optional


def _not_a_tensor(type_proto):
    """True when a value's known type is a sequence, optional or map: no initializer can hold it."""
    return type_proto is not None and type_proto.WhichOneof("value") not in (None, "tensor_type")

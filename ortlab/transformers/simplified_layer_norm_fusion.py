"""SimplifiedLayerNormFusion: the RMSNorm subgraph -> one SimplifiedLayerNormalization node.

Mirrors SimplifiedLayerNormFusion in onnxruntime/core/optimizer/layer_norm_fusion.cc (level 2,
CPU/CUDA/ROCm). The pattern, from X (float):

    ms = ReduceMean(Pow(X, 2), axes=[-1]);  Y = Div(X, Sqrt(Add(ms, epsilon))) * scale
        -> SimplifiedLayerNormalization(X, scale, axis=-1, epsilon)

each intermediate read only by the next node, epsilon a constant of X's element type, scale
1-D of X's last dimension. The fused node is ORT's contrib op registered under the ONNX domain
(contrib_defs.cc); its schema is in ortlab.ops.schemas, which ortlab's Graph.resolve installs.
ortlab does not follow ORT into the variants with Cast nodes (float16 models) or with
Reciprocal and Mul in place of the Div (ORT 1.19.2 does not fuse the latter either).
"""
from onnx import TensorProto, helper

from ortlab.transformers import graph_utils as gu
from ortlab.transformers.layer_norm_fusion import last_axis_reason, epsilon_add
from ortlab.transformers.pattern import Match, PatternFusion
from ortlab.transformers.registry import register_transformer

CPU_CUDA_ROCM = ("CPUExecutionProvider", "CUDAExecutionProvider", "ROCMExecutionProvider")


@register_transformer(level=2, compatible_eps=CPU_CUDA_ROCM)
class SimplifiedLayerNormFusion(PatternFusion):
    """X / sqrt(mean(X^2) + eps) * scale -> SimplifiedLayerNormalization(X, scale, epsilon=eps)."""

    anchor = "Pow"

    def match(self, graph, pow_):
        x = pow_.input_names[0]
        if not gu.is_float(graph, x) or not gu.is_scalar_close(graph, pow_.input_names[1], 2.0):
            return None
        rm = gu.single_consumer(graph, pow_.output_names[0])
        if not gu.is_op(rm, "ReduceMean"):
            return None
        reason = last_axis_reason(graph, rm, pow_.output_names[0])
        if reason:
            return reason
        add, eps = epsilon_add(graph, rm, x, "the mean square", "ms")
        if add is None:
            return eps
        sqrt = gu.single_consumer(graph, add.output_names[0])
        div = gu.single_consumer(graph, sqrt.output_names[0]) if gu.is_op(sqrt, "Sqrt") else None
        if not gu.is_op(div, "Div") or div.input_names != [x, sqrt.output_names[0]]:
            return "ms + epsilon does not go through Sqrt into Div(X, .)"
        mul = gu.single_consumer(graph, div.output_names[0])
        scale = gu.other_input(mul, div.output_names[0]) if gu.is_op(mul, "Mul") else None
        if scale is None or not gu.broadcasts_to_last_dim(graph, scale, x):
            return "the Div is not read only by Mul(scale), scale 1-D of X's last dimension"
        return Match([pow_, rm, add, sqrt, div, mul], [x, scale], mul.output_names,
                     {"axis": -1, "epsilon": eps, "stash_type": 1})

    def rewrite(self, graph, m):
        # ORT's training build adds the output SimplifiedLayerNormalizationGrad reads
        stat = gu.unique_value_name(graph, "saved_inv_std_var")
        gu.fuse(self, graph, m.nodes, "SimplifiedLayerNormalization", m.inputs, [*m.outputs, stat],
                **m.attributes)
        dims = list(gu.shape(graph, m.inputs[0]))
        graph.node_arg(stat).type_proto = helper.make_tensor_type_proto(TensorProto.FLOAT, dims[:-1] + [1])

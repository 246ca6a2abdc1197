"""LayerNormFusion: torch's exported LayerNorm subgraph -> one LayerNormalization node.

Mirrors onnxruntime/core/optimizer/layer_norm_fusion.cc. The pattern, from X:

    mean = ReduceMean(X, axes=[-1]);  d = Sub(X, mean)        (one Sub, or two identical ones)
    var  = ReduceMean(Pow(d, 2), axes=[-1])
    Y    = Div(d, Sqrt(Add(var, epsilon))) * scale + bias       -> LayerNormalization(X, scale, bias)

It declines when the reduction is not over the last axis alone, when an intermediate
value has another consumer (it would lose its producer), when epsilon is not a constant
of X's element type, or when scale and bias are not 1-D of X's last dimension.

At every opset, as ORT 1.19.2 does: the fused node is LayerNormalization of the default
domain even when the model imports opset 14, 15 or 16, where ONNX has no such op (ONNX's
LayerNormalization-17). ORT resolves it there against its own registration, the op's
earlier life as a contrib op under the ONNX domain (contrib_defs.cc: LayerNormalization,
kOnnxDomain, since version 1; CPU kernel registered for versions 1 to 16). ortlab.ops.schemas
holds that schema; ortlab's Graph.resolve installs it, so it accepts the fused node at those
opsets as ORT's Graph::Resolve does.
"""
from typing import NamedTuple

from onnx import TensorProto, helper

from ortlab.onnx_defs import opset_of
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.pattern import PatternFusion
from ortlab.transformers.registry import register_transformer


def epsilon_add(graph, reduce_mean, x, what, short):
    """(Add, epsilon) when `reduce_mean`'s output is read only by Add(it, constant epsilon) with epsilon of X's
    element type; else (None, why not). Shared by LayerNormFusion and SimplifiedLayerNormFusion."""
    add = gu.single_consumer(graph, reduce_mean.output_names[0])
    eps_name = gu.other_input(add, reduce_mean.output_names[0]) if gu.is_op(add, "Add") else None
    eps = gu.scalar(graph, eps_name) if eps_name else None
    if eps is None:
        return None, f"{what} is not only read by Add({short}, constant epsilon)"
    if gu.elem_type(graph, eps_name) != gu.elem_type(graph, x):
        return None, "epsilon's element type differs from X's"
    return add, eps


def _type_saved_statistics(graph, x, stats):
    """Give the saved mean and inverse std the types ORT's schema infers (float, X's shape with
    the last axis 1): onnx's shape inference cannot, for a schema registered from Python."""
    dims = list(gu.shape(graph, x))
    for name in stats:
        graph.node_arg(name).type_proto = helper.make_tensor_type_proto(TensorProto.FLOAT, dims[:-1] + [1])


class LayerNormMatch(NamedTuple):
    """What LayerNormFusion found: the nodes it replaces and LayerNormalization's inputs, epsilon, output."""
    nodes: list
    x: str
    scale: str
    bias: str
    epsilon: float
    output: str


@register_transformer(level=2)
class LayerNormFusion(PatternFusion):
    """(X - mean) / sqrt(var + eps) * scale + bias -> LayerNormalization(X, scale, bias, epsilon=eps).

    At every opset, as ORT does: below opset 17 the node is ORT's own registration of
    LayerNormalization in the ONNX domain (see the module's docstring).
    """

    anchor = "ReduceMean"

    def rewrite(self, graph, m):
        # ORT's training build adds the two outputs LayerNormalizationGrad reads
        stats = [gu.unique_value_name(graph, n) for n in ("saved_mean", "saved_inv_std_var")]
        gu.fuse(self, graph, m.nodes, "LayerNormalization", [m.x, m.scale, m.bias], [m.output, *stats],
                axis=-1, epsilon=m.epsilon, stash_type=1)
        if (opset_of(graph.opset_imports) or 17) < 17:
            _type_saved_statistics(graph, m.x, stats)

    def match(self, graph, rm1):
        """A LayerNormMatch, the reason it declines (str), or None when X is not a float tensor."""
        x, mean = rm1.input_names[0], rm1.output_names[0]
        if not gu.is_float(graph, x):
            return None
        reason = last_axis_reason(graph, rm1, x)
        if reason:
            return reason
        subs = graph.consumers(mean)
        if not subs or gu.uses(graph, mean) != len(subs) or len(subs) > 2 or not all(
                gu.is_op(s, "Sub") and s.input_names == [x, mean] for s in subs):
            return "its mean is not read only by Sub(X, mean) nodes"
        readers = [c for s in subs for c in graph.consumers(s.output_names[0])]
        if sum(gu.uses(graph, s.output_names[0]) for s in subs) != 2 or len(readers) != 2:
            return "X - mean has consumers outside the pattern"
        pow_ = next((c for c in readers if gu.is_op(c, "Pow")), None)
        div = next((c for c in readers if gu.is_op(c, "Div")), None)
        if pow_ is None or div is None or not gu.is_scalar_close(graph, pow_.input_names[1], 2.0):
            return "X - mean does not feed Pow(., 2) and Div"
        chain = self._variance_chain(graph, rm1, pow_, div)
        if isinstance(chain, str):
            return chain
        rm2, add_eps, sqrt, eps = chain
        tail = self._affine(graph, x, div)
        if tail is None:
            return ("the Div is not followed by Mul(scale) and Add(bias), "
                    "1-D of X's last dimension, each its only consumer")
        mul, add_bias, scale, bias = tail
        nodes = [rm1, *subs, pow_, rm2, add_eps, sqrt, div, mul, add_bias]
        return LayerNormMatch(nodes, x, scale, bias, eps, add_bias.output_names[0])

    def _variance_chain(self, graph, rm1, pow_, div):
        """(ReduceMean, Add, Sqrt, epsilon) from Pow's output to the Div, or why not (str)."""
        rm2 = gu.single_consumer(graph, pow_.output_names[0])
        not_variance = "Pow's output is not only read by a ReduceMean over the last axis"
        if not gu.is_op(rm2, "ReduceMean"):
            return not_variance
        reason = last_axis_reason(graph, rm2, pow_.output_names[0])
        if reason:
            self.decline(rm2, reason)
            return not_variance
        add, eps = epsilon_add(graph, rm2, rm1.input_names[0], "the variance", "var")
        if add is None:
            return eps
        sqrt = gu.single_consumer(graph, add.output_names[0])
        if not gu.is_op(sqrt, "Sqrt") or gu.single_consumer(graph, sqrt.output_names[0]) is not div \
                or div.input_names[1] != sqrt.output_names[0]:
            return "var + epsilon does not go through Sqrt into the Div's denominator"
        return rm2, add, sqrt, eps

    @staticmethod
    def _affine(graph, x, div):
        mul = gu.single_consumer(graph, div.output_names[0])
        scale = gu.other_input(mul, div.output_names[0]) if gu.is_op(mul, "Mul") else None
        add = gu.single_consumer(graph, mul.output_names[0]) if scale else None
        bias = gu.other_input(add, mul.output_names[0]) if gu.is_op(add, "Add") else None
        if bias is None or not (gu.broadcasts_to_last_dim(graph, scale, x)
                                and gu.broadcasts_to_last_dim(graph, bias, x)):
            return None
        return mul, add, scale, bias


def last_axis_reason(graph, node, x):
    """Why a ReduceMean of `x` is not a reduction over the last axis alone (keepdims), or None."""
    dims = gu.shape(graph, x)
    axes = gu.reduce_axes(graph, node)
    if dims is None or axes is None or node.attribute("keepdims", 1) != 1:
        return "its axes or input rank are unknown, or keepdims is 0"
    if gu.normalized_axes(axes, len(dims)) != [len(dims) - 1]:
        return f"it reduces over axes {axes}, not the last axis alone"
    return None

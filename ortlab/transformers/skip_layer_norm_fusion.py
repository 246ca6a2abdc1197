"""SkipLayerNormFusion: LayerNormalization(Add(x, skip) [+ bias]) -> one SkipLayerNormalization node.

Mirrors onnxruntime/core/optimizer/skip_layer_norm_fusion.cc (level 2; CPU, CUDA, DML, ROCm).
From a LayerNormalization (version 1 or 17, float, float16 or bfloat16) whose input is made by
an Add (Add1) of two 3-D inputs of one static shape (dim 0 may be one named dim):

    format 1   LN(Add1(Add2(x, bias), skip))  -> SkipLayerNormalization(x, skip, gamma, beta, bias)
    format 2   LN(Add1(x, Add2(skip, bias)))  -> SkipLayerNormalization(x, skip, gamma, beta, bias)
    format 3   LN(Add1(x, skip))              -> SkipLayerNormalization(x, skip, gamma, beta)

where Add2's second input is a constant 1-D bias of the last dimension; every Add's output
is read only by the next node and is no graph output. The fused node (com.microsoft) takes
the LayerNormalization's outputs and epsilon. The Adds' shapes are the ones ORT knows: onnx's
shape inference without data propagation (ORT's Graph::Resolve does none), so a residual Add
after a Reshape to a computed shape, which ortlab's own NodeArgs know to be [batch, S, H]
(inferred with data propagation), is [?, ?, ?] to ORT and not fused, as in ORT. ortlab also requires the
LayerNormalization to normalize the last axis, which SkipLayerNormalization always does (ORT does not check it).
"""
from onnx import shape_inference

from ortlab.onnx_defs import MS_DOMAIN
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.pattern import Match, PatternFusion
from ortlab.transformers.registry import register_transformer

SKIP_LN_EPS = ("CPUExecutionProvider", "CUDAExecutionProvider", "DmlExecutionProvider", "ROCMExecutionProvider")
SUPPORTED = {1, 10, 16}  # float, float16, bfloat16 (no double: SkipLayerNormalization has no such kernel)
ADD_VERSIONS = (7, 13, 14)
LN_DEFAULT_EPSILON = 1e-5  # LayerNormalization's schema default, which ORT's Graph writes on the node


def _types_ok(graph, node):
    return all(gu.elem_type(graph, n) in SUPPORTED for n in node.input_names if n)


def _same_3d(a, b):
    """Both 3-D with equal static dims (dim 0 may instead be one and the same named dim)."""
    if a is None or b is None or len(a) != 3 or len(b) != 3:
        return False
    if a[0] != b[0] or (a[0] is None):
        return False
    return all(isinstance(x, int) and x == y for x, y in zip(a[1:], b[1:]))


def ort_shapes(graph):
    """{value name: dims} as onnx's shape inference without data propagation gives them (what
    ORT's Graph knows); dims are ints, dim names or None, and a value of unknown rank is absent."""
    model = graph.to_model()
    model.graph.ClearField("value_info")
    try:
        inferred = shape_inference.infer_shapes(model, strict_mode=False, data_prop=False)
    except Exception:  # noqa: BLE001  (then ORT's shapes are unknown: nothing fuses)
        return {}
    shapes = {}
    g = inferred.graph
    for vi in list(g.input) + list(g.value_info) + list(g.output):
        t = vi.type.tensor_type
        if t.HasField("shape"):
            shapes[vi.name] = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in t.shape.dim]
    for name in graph.initializers:
        shapes[name] = list(graph.initializer_value(name).shape)
    return shapes


def _first_add_ok(graph, add, shapes):
    """CheckFirstAdd: a supported Add read only by the LayerNormalization, of two equal 3-D inputs."""
    return (gu.is_op_version(graph, add, "Add", ADD_VERSIONS) and _types_ok(graph, add)
            and gu.single_consumer(graph, add.output_names[0]) is not None
            and _same_3d(*(shapes.get(n) for n in add.input_names)))


def _second_add_ok(graph, add, shapes):
    """CheckSecondAdd: a supported Add read only by Add1, of a 3-D input and a constant 1-D bias of its last dim."""
    if not (gu.is_op_version(graph, add, "Add", ADD_VERSIONS) and _types_ok(graph, add)
            and gu.single_consumer(graph, add.output_names[0]) is not None):
        return False
    if gu.constant(graph, add.input_names[1]) is None:
        return False
    x, bias = (shapes.get(n) for n in add.input_names)
    return (x is not None and bias is not None and len(x) == 3 and len(bias) == 1
            and isinstance(x[2], int) and x[2] == bias[0])


@register_transformer(level=2, compatible_eps=SKIP_LN_EPS)
class SkipLayerNormFusion(PatternFusion):
    """LayerNormalization(x + skip [+ bias]) -> SkipLayerNormalization(x, skip, gamma, beta[, bias])."""

    anchor, fused_op = "LayerNormalization", ("SkipLayerNormalization", MS_DOMAIN)

    shapes = None  # ORT's shapes of the graph being walked (apply_impl), else computed per match

    def apply_impl(self, graph):
        self.shapes = ort_shapes(graph)
        try:
            return super().apply_impl(graph)
        finally:
            self.shapes = None

    def match(self, graph, ln):
        if not gu.is_op_version(graph, ln, "LayerNormalization", (1, 17)) or not _types_ok(graph, ln):
            return None
        add1 = graph.producer(ln.input_names[0])
        if not gu.is_op(add1, "Add"):
            return None
        dims = gu.shape(graph, ln.input_names[0])
        axis = ln.attribute("axis", -1)
        if dims is None or axis not in (-1, len(dims) - 1):
            return f"it normalizes axis {axis}, and SkipLayerNormalization only the last"
        shapes = self.shapes if self.shapes is not None else ort_shapes(graph)  # why_not() runs match alone
        if not _first_add_ok(graph, add1, shapes):
            return ("its input is not an Add read only by it, of two 3-D inputs of one static shape "
                    "(as ORT's shape inference, without data propagation, knows them), of float, "
                    "float16 or bfloat16")
        gamma = ln.input_names[1]
        beta = ln.input_names[2] if len(ln.input_names) > 2 else ""
        x, skip = add1.input_names
        nodes, inputs = [add1, ln], None
        for slot in (0, 1):  # format 1 (bias on x), then format 2 (bias on skip)
            add2 = graph.producer(add1.input_names[slot])
            if gu.is_op(add2, "Add") and _second_add_ok(graph, add2, shapes):
                pair = [add2.input_names[0], skip] if slot == 0 else [x, add2.input_names[0]]
                inputs = pair + [gamma, beta, add2.input_names[1]]
                nodes.insert(0, add2)
                break
        if inputs is None:
            inputs = [x, skip, gamma, beta]
        eps = ln.attribute("epsilon", LN_DEFAULT_EPSILON)
        return Match(nodes, inputs, ln.output_names, {"epsilon": eps})

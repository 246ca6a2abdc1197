"""Types and shapes as ORT 1.19.2's Graph::Resolve leaves them: what the allocation planner sees.

Mirrors onnxruntime/core/graph/graph.cc (InferAndVerifyTypeMatch: each node's schema inference in
topological order, its inputs' current types, getInputData giving constant initializers only and
getSymbolicInput nothing: "ORT does not implement partial data propagation yet"; NodeArg::
UpdateTypeAndShape: an inferred shape fills a missing one or is merged into the declared one with
onnx's mergeInShapeInfo, and a conflict falls back to UnionShapeInfo, "lenient merge") and, for ORT's
com.microsoft ops that onnx does not know, their TypeAndShapeInferenceFunction from
onnxruntime/core/graph/contrib_ops/contrib_defs.cc (FusedMatMulShapeInference) and
orttraining/orttraining/core/graph/training_op_defs.cc. No unknown dimension gets a made-up name
(onnx's Python inference would call it unk__N; ORT leaves it unknown), which matters: two unknown
dims never count as the same shape for reuse, and a name that no input defines is logged as
"[Static memory planning] Could not resolve shape".
"""
import onnx
from onnx import TensorProto, TypeProto, defs, helper
from onnx.shape_inference import infer_node_outputs

from ortlab.onnx_defs import opset_of

MS = "com.microsoft"


# --- onnx's shape merging, as ORT calls it ---------------------------------------------------------
class _Conflict(Exception):
    """Two known dims differ (onnx's InferenceError from mergeInDimensionInfo)."""


def _merge_dim(source, target):
    """onnx mergeInDimensionInfo: a value wins over a param or nothing; a target param is kept."""
    if source.HasField("dim_value"):
        if target.HasField("dim_value"):
            if target.dim_value != source.dim_value:
                raise _Conflict
        else:
            target.dim_value = source.dim_value
    elif target.HasField("dim_value") or target.HasField("dim_param"):
        return
    elif source.HasField("dim_param"):
        target.dim_param = source.dim_param


def _union_shape(source, target_tensor):
    """onnx UnionShapeInfo: keep what both agree on; a different rank drops the shape."""
    target = target_tensor.shape
    if len(source.dim) != len(target.dim):
        target_tensor.ClearField("shape")
        return
    for s, t in zip(source.dim, target.dim):
        same = ((s.HasField("dim_value") and t.HasField("dim_value") and s.dim_value == t.dim_value)
                or (s.HasField("dim_param") and t.HasField("dim_param") and s.dim_param == t.dim_param)
                or not (s.HasField("dim_value") or s.HasField("dim_param") or t.HasField("dim_value")
                        or t.HasField("dim_param")))
        if not same:
            t.ClearField("dim_value")
            t.ClearField("dim_param")


def merge_type(current, inferred):
    """NodeArg::UpdateTypeAndShape(inferred): the new current type (a TypeProto)."""
    if current is None or current.WhichOneof("value") is None:
        return inferred
    if current.WhichOneof("value") != "tensor_type" or inferred.WhichOneof("value") != "tensor_type":
        return current
    merged = TypeProto()
    merged.CopyFrom(current)
    tensor, source = merged.tensor_type, inferred.tensor_type
    if not tensor.elem_type and source.elem_type:
        tensor.elem_type = source.elem_type
    if not source.HasField("shape"):
        return merged
    if not tensor.HasField("shape"):
        tensor.shape.CopyFrom(source.shape)
        return merged
    try:
        if len(source.shape.dim) != len(tensor.shape.dim):
            raise _Conflict
        for s, t in zip(source.shape.dim, tensor.shape.dim):
            _merge_dim(s, t)
    except _Conflict:  # graph.cc MergeShapeInfo: "Falling back to lenient merge."
        _union_shape(source.shape, tensor)
    return merged


# --- ORT's com.microsoft inference functions ----------------------------------------------------------
def _tensor(elem_type, shape=None):
    t = TypeProto()
    t.tensor_type.elem_type = elem_type
    if shape is not None:
        t.tensor_type.shape.CopyFrom(shape)
    return t


def _elem(tp):
    return tp.tensor_type.elem_type if tp is not None and tp.HasField("tensor_type") else 0


def _shape(tp):
    return tp.tensor_type.shape if tp is not None and tp.HasField("tensor_type") and \
        tp.tensor_type.HasField("shape") else None


def _first_input(node, inputs, data):
    """propagateShapeAndTypeFromFirstInput (ReluGrad, SoftmaxGrad_13, DropoutGrad, Scale, ...)."""
    return [_tensor(_elem(inputs[0]), _shape(inputs[0]))] + [None] * (len(node.outputs) - 1)


def _like_input(index, shape=True):
    def rule(node, inputs, data):
        src = inputs[index] if index < len(inputs) else None
        return [_tensor(_elem(src), _shape(src) if shape else None)]
    return rule


def _div_grad(node, inputs, data):
    """DivGrad: every output the elem type of dY, output i the shape of input i + 1."""
    return [_tensor(_elem(inputs[0]), _shape(inputs[i + 1]) if i + 1 < len(inputs) else None)
            for i in range(len(node.outputs))]


def _broadcast_gradient_args(node, inputs, data):
    """BroadcastGradientArgs: int64 outputs, no shape."""
    return [_tensor(TensorProto.INT64) for _ in node.outputs]


def _reduce_sum_training(node, inputs, data):
    """ReduceSumTraining: a shape only when `axes` is a constant initializer."""
    out = _tensor(_elem(inputs[0]))
    shape, axes = _shape(inputs[0]), data.get(1)
    if shape is None or axes is None:
        return [out]
    keep = node.attribute("keepdims", 1)
    noop = node.attribute("noop_with_empty_axes", 0)
    rank = len(shape.dim)
    axes = [a + rank if a < 0 else a for a in onnx.numpy_helper.to_array(axes).reshape(-1).tolist()]
    result = out.tensor_type.shape
    for i, dim in enumerate(shape.dim):
        if (not axes and noop) or (axes and i not in axes):
            result.dim.add().CopyFrom(dim)
        elif keep == 1:
            result.dim.add().dim_value = 1
    return [out]


def _broadcast(left, right):
    """onnx multidirectionalBroadcastShapeInference on two TensorShapeProtos."""
    out = onnx.TensorShapeProto()
    shapes = [list(left.dim), list(right.dim)]
    rank = max(len(s) for s in shapes)
    for i in range(rank):
        value, symbolic, count = 1, None, 0
        for dims in shapes:
            if i < rank - len(dims):
                continue
            dim = dims[i - rank + len(dims)]
            if dim.HasField("dim_value"):
                if dim.dim_value != 1:
                    value = dim.dim_value
            elif count == 0:
                symbolic, count = dim, 1
            elif dim.dim_param != symbolic.dim_param:
                count += 1
        if value != 1 or count == 0:
            out.dim.add().dim_value = value
        elif count == 1:
            out.dim.add().CopyFrom(symbolic)
        else:
            out.dim.add()
    return out


def _fused_matmul(node, inputs, data):
    """FusedMatMulShapeInference (contrib_defs.cc): MatMul's rule after transA/transB/transBatch*."""
    out = _tensor(_elem(inputs[0]))
    s0, s1 = _shape(inputs[0]), _shape(inputs[1])
    if s0 is None or s1 is None or not s0.dim or not s1.dim:
        return [out]
    ta, tb = node.attribute("transA", 0) != 0, node.attribute("transB", 0) != 0
    tba, tbb = node.attribute("transBatchA", 0) != 0, node.attribute("transBatchB", 0) != 0

    def arrange(raw, trans, trans_batch):
        dims, rank = list(raw.dim), len(raw.dim)
        if rank == 1:
            return dims
        inner = dims[1:rank - 1] if trans_batch else dims[:rank - 2]
        row = rank - 1 if trans else (0 if trans_batch else rank - 2)
        col = (0 if trans_batch else rank - 2) if trans else rank - 1
        return inner + [dims[row], dims[col]]

    a = arrange(s0, ta and len(s0.dim) > 1, tba)
    b = arrange(s1, tb and len(s1.dim) > 1, tbb)
    one = onnx.TensorShapeProto.Dimension(dim_value=1)
    left = [one, a[0]] if len(a) == 1 else a
    right = [b[0], one] if len(b) == 1 else b
    prefix = _broadcast(onnx.TensorShapeProto(dim=left[:-2]), onnx.TensorShapeProto(dim=right[:-2]))
    result = out.tensor_type.shape
    result.dim.extend(prefix.dim)
    if len(a) != 1:
        result.dim.add().CopyFrom(left[-2])
    if len(b) != 1:
        result.dim.add().CopyFrom(right[-1])
    return [out]


CONTRIB_INFERENCE = {
    "FusedMatMul": _fused_matmul,
    "ReluGrad": _first_input, "SoftmaxGrad": _first_input, "SoftmaxGrad_13": _first_input,
    "LogSoftmaxGrad": _first_input, "LogSoftmaxGrad_13": _first_input, "DropoutGrad": _first_input,
    "Scale": _first_input, "GeluGrad": _first_input, "FastGeluGrad": _first_input,
    "SigmoidGrad": _first_input, "TanhGrad": _first_input,
    "SoftmaxCrossEntropyLossGrad": _like_input(1),
    "GatherGrad": _like_input(2, shape=False),  # no inference function: T bound by dY, no shape
    "DivGrad": _div_grad,
    "BroadcastGradientArgs": _broadcast_gradient_args,
    "ReduceSumTraining": _reduce_sum_training,
}


# --- one node, then the graph --------------------------------------------------------------------------
def _constant_inputs(graph, node):
    """{input position: TensorProto} for inputs that are constant initializers (not graph inputs)."""
    return {i: graph.initializers[a.name] for i, a in enumerate(node.inputs)
            if a.exists() and a.name in graph.initializers and a.name not in graph.inputs}


def infer_node(graph, node, types):
    """{output name: inferred TypeProto} for one node, from its inputs' current `types`; {} when no
    rule or schema is known (the outputs keep what the model declares)."""
    data = _constant_inputs(graph, node)
    inputs = [types.get(a.name) if a.exists() else None for a in node.inputs]
    domain = "" if node.domain in ("", "ai.onnx") else node.domain
    if domain == MS:
        rule = CONTRIB_INFERENCE.get(node.op_type)
        if rule is None or (inputs and inputs[0] is None):
            return {}
        results = rule(node, inputs, data)
        return {o.name: t for o, t in zip(node.outputs, results) if o.exists() and t is not None}
    version = opset_of(graph.opset_imports, domain)
    try:
        schema = defs.get_schema(node.op_type, version, domain)
    except defs.SchemaError:
        return {}
    if any(a.exists() and types.get(a.name) is None for a in node.inputs) or _holds_contrib_ops(node):
        return {}
    proto = node.to_proto()
    try:
        return infer_node_outputs(schema, proto, {a.name: types[a.name] for a in node.inputs if a.exists()},
                                  {node.inputs[i].name: tensor for i, tensor in data.items()},
                                  opset_imports=[helper.make_opsetid(d, v)
                                                 for d, v in graph.opset_imports.items()])
    except Exception:  # noqa: BLE001 (ORT would refuse the model; leave the declared types)
        return {}


def _holds_contrib_ops(node):
    """True when a subgraph of `node` (nested ones included) runs an op outside ONNX's domain (a fusion's
    com.microsoft node): onnx 1.17's infer_node_outputs crashes the process on such a body (a segfault, with the
    domain imported), so its outputs keep their declared types."""
    def foreign(graph):
        return any(n.domain not in ("", "ai.onnx") or any(foreign(g) for a in n.attribute
                                                           for g in ([a.g] if a.type == a.GRAPH else a.graphs))
                   for n in graph.node)
    return any(foreign(body) for _, bodies in node.subgraphs() for body in bodies)


def declared_types(graph):
    """The NodeArg types ORT starts from: declared inputs, outputs and value_info, initializers."""
    return {arg.name: arg.type_proto for arg in graph.node_args()
            if arg.exists() and arg.type_proto is not None}


def infer_types(graph, order, types=None):
    """Graph::Resolve's inference pass over `order` (ortlab.ir Nodes): {value name: TypeProto}."""
    types = dict(declared_types(graph) if types is None else types)
    for node in order:
        for name, inferred in infer_node(graph, node, types).items():
            types[name] = merge_type(types.get(name), inferred)
    return types

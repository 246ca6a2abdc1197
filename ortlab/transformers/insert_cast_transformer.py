"""InsertCastTransformer: a float16 node that ORT's CPU EP has no float16 kernel for runs in float32, between Casts.

Mirrors onnxruntime/core/optimizer/insert_cast_transformer.cc (InsertCastTransformer::ApplyImpl, NeedInsertCast,
AddCastNode), which InferenceSession::TransformGraph runs after partitioning, at every optimization level, and which
ends with RemoveDuplicateCastTransformer (ortlab.transformers.remove_duplicate_cast): ortlab.engine's
graph_partitioner runs both after partitioning, and ortlab.memory's session_graph before planning. For each node on
the CPU EP, in topological order: every float16 input it has no float16 kernel for reads a new float32 value,
Cast(to=FLOAT) of it (one Cast per value, shared by its readers); the node then writes float32 values, each
Cast(to=FLOAT16) back to the original output. The new values and Casts are named InsertedPrecisionFreeCast_<value>:
the remover counts those Casts as lossless, so between two such nodes the float32 value travels on (Add then Sub of
float16 60000s gives 60000, not inf), and a user's Cast(float -> float16) feeding such a node goes too (float32
70000.5 + 70000.5 is 140001, not inf): ORT 1.19.2's answers.

NO_FLOAT16_KERNEL: the ops whose float16 nodes ORT 1.19.2 casts, read from its optimized models at opset 18
(SessionOptions.optimized_model_filepath; tests/engine/test_engine_silent_divergences.py asks ORT again for each).
ORT asks its kernel registry (KernelRegistry::HasImplementationOf); the engine, whose kernels take any numpy type,
reads this table. Not mirrored: ForceSingleNodeCPUFloat16ToFloat32, for a float16 node between nodes of other EPs
(the engine's EPs are not ORT's).
"""
from onnx import TensorProto

from ortlab.ir.subgraph import transform_bodies
from ortlab.transformers.remove_duplicate_cast import INSERTED

CPU = "CPUExecutionProvider"  # the EP whose float16 kernels NO_FLOAT16_KERNEL lists

NO_FLOAT16_KERNEL = frozenset((
    "Add", "Sub", "Mul", "Div", "Pow", "Sum", "Mean", "Abs", "Neg", "Relu", "Sigmoid", "Tanh", "Exp", "Log",
    "Sqrt", "Reciprocal", "Floor", "Ceil", "Erf", "Softmax", "LogSoftmax", "MatMul", "ReduceSum", "ReduceMean",
    "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum", "ReduceLogSumExp",
    "ReduceSumSquare", "ArgMax", "LeakyRelu", "Equal", "Less", "Greater", "Sin", "Cos", "Tan", "Asin", "Acos",
    "Atan", "Sinh", "Cosh", "HardSigmoid", "Softplus", "Softsign", "Elu", "Selu", "ThresholdedRelu", "PRelu",
    "HardSwish", "Mish"))


def needs_float32(node, assignment):
    """NeedInsertCast: a node on the CPU EP (every node of a body) of an op ORT has no float16 kernel for."""
    return (node.domain in ("", "ai.onnx") and node.op_type in NO_FLOAT16_KERNEL
            and (assignment is None or assignment.get(node.index) == CPU))


def _is_float16(graph, name):
    arg = graph.node_arg(name) if name else None
    type_proto = arg.type_proto if arg is not None else None
    return (type_proto is not None and type_proto.HasField("tensor_type")
            and type_proto.tensor_type.elem_type == TensorProto.FLOAT16)


def _float_type(graph, name):
    type_proto = type(graph.node_arg(name).type_proto)()
    type_proto.CopyFrom(graph.node_arg(name).type_proto)
    type_proto.tensor_type.elem_type = TensorProto.FLOAT
    return type_proto


def _fresh_name(graph, base):
    """A value name not in `graph` yet, from `base` (ORT: Graph::GenerateNodeArgName)."""
    name, k = base, 0
    while graph.node_arg(name) is not None:
        k += 1
        name = f"{base}_{k}"
    return name


def _add_cast(graph, source, to):
    """AddCastNode: Cast(source) -> a new float32 value named InsertedPrecisionFreeCast_<source>."""
    target = _fresh_name(graph, INSERTED + source)
    graph.get_or_create_node_arg(target, _float_type(graph, source))
    return graph.add_node("Cast", [source], [target], name=graph.generate_node_name(INSERTED + source), to=to)


def insert_casts(graph, assignment=None):
    """InsertCastTransformer::ApplyImpl on `graph` ({node index: EP} or None for a body, every node on CPU), then
    in every If/Loop/Scan body; returns the new Cast nodes of `graph` itself (the caller assigns them to CPU)."""
    added, cast_of = [], {}
    for node in graph.topological_order():
        if not needs_float32(node, assignment):
            continue
        if any(a.name.startswith(INSERTED) for a in node.outputs):
            continue  # computed in float32 already (a body this transformer has seen)
        halves = [i for i, a in enumerate(node.inputs) if _is_float16(graph, a.name)]
        if not halves:
            continue
        for i in halves:
            name = node.inputs[i].name
            if name not in cast_of:
                added.append(_add_cast(graph, name, TensorProto.FLOAT))
                cast_of[name] = added[-1].outputs[0].name
            graph.replace_node_input(node, i, cast_of[name])
        for i, arg in enumerate(node.outputs):
            if _is_float16(graph, arg.name):
                name, computed = arg.name, _fresh_name(graph, INSERTED + arg.name)
                graph.get_or_create_node_arg(computed, _float_type(graph, name))
                graph.replace_node_output(node, i, computed)
                # the readers keep reading the float16 value; a reader computed in float32 casts it back, and
                # RemoveDuplicateCastTransformer drops that pair (both Casts are inserted ones: lossless)
                added.append(graph.add_node("Cast", [computed], [name],
                                            name=graph.generate_node_name(INSERTED + name), to=TensorProto.FLOAT16))
    transform_bodies(graph, lambda body: bool(insert_casts(body)))
    return added


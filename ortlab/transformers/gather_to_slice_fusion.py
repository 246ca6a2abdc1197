"""GatherToSliceFusion: Gather(data, Range(s, l, d), axis) -> Slice(data, [s], [l], [axis], [d]).

Mirrors GatherToSliceFusion in onnxruntime/core/optimizer/gather_fusion.cc (a level-2 transformer for
the CPU, CUDA and ROCm EPs): a Range-1/11 read by nothing but one Gather-1/11/13, as its indices.
Range's three scalars become 1-D through one Unsqueeze each (axes [0], one shared initializer from
opset 13, an attribute before), and the Slice's axes is an initializer [axis] of Range's type.
The two agree while every index is in [0, limit) with limit >= 0: ORT 1.19.2 fuses whatever the
values, and a negative index, which Gather wraps and Slice reads as counted from the end, then
changes the result. ortlab fuses only when start is a constant >= 0, delta a constant > 0 and
limit a constant >= 0 or a dim read from a Shape, and otherwise says why.
"""
import numpy as np
from onnx import TensorProto

from ortlab.onnx_defs import opset_of
from ortlab.transformers import graph_utils as gu
from ortlab.transformers.graph_utils import label
from ortlab.transformers.pattern import Match, PatternFusion
from ortlab.transformers.registry import register_transformer

CPU_CUDA_ROCM = ("CPUExecutionProvider", "CUDAExecutionProvider", "ROCMExecutionProvider")
RANGE, GATHER = (1, 11), (1, 11, 13)


def is_a_dim(graph, name):
    """True when `name` is a dim of some value: Gather(Shape(x), k) (or Shape(x) itself), so >= 0."""
    node = graph.producer(name)
    if gu.is_op(node, "Gather"):
        node = graph.producer(node.input_names[0])
    return gu.is_op(node, "Shape")


def indices_reason(graph, start, limit, delta):
    """Why Gather(Range(start, limit, delta)) may differ from the Slice ('' when it cannot)."""
    s, d = gu.scalar(graph, start), gu.scalar(graph, delta)
    if s is None or s < 0:
        return "start is not a constant >= 0"
    if d is None or d <= 0:
        return "delta is not a constant > 0"
    l_value = gu.scalar(graph, limit)
    if not (is_a_dim(graph, limit) or (l_value is not None and l_value >= 0)):
        return "limit is neither a constant >= 0 nor a dim read by Shape"
    return ""


@register_transformer(level=2, compatible_eps=CPU_CUDA_ROCM)
class GatherToSliceFusion(PatternFusion):
    """Gather(data, Range(start, limit, delta), axis) -> Slice(data, [start], [limit], [axis], [delta])."""

    anchor = "Range"

    def match(self, graph, rng):
        if not gu.is_op_version(graph, rng, "Range", RANGE):
            return None
        gather = gu.single_consumer(graph, rng.output_names[0])
        if gather is None or not gu.is_op_version(graph, gather, "Gather", GATHER):
            return None
        if gather.input_names[1] != rng.output_names[0]:
            return None
        why = indices_reason(graph, *rng.input_names)
        if why:
            return (f"{why}: a negative index wraps in Gather but counts from the end in Slice "
                    "(ORT 1.19.2 fuses it anyway)")
        return Match([rng, gather], [gather.input_names[0]] + rng.input_names, gather.output_names,
                     {"axis": gather.attribute("axis", 0)})

    def rewrite(self, graph, match):
        rng, gather = match.nodes
        data, *scalars = match.inputs
        elem = gu.elem_type(graph, rng.output_names[0])
        dtype = np.int32 if elem == TensorProto.INT32 else np.int64  # Slice's indices: int32 or int64, as Range's
        opset = opset_of(graph.opset_imports, "")
        for node in (gather, rng):
            graph.remove_node(node)
        axes = None
        if opset >= 13:
            axes = gu.unique_value_name(graph, "UnsqueezeAxesInitializer")
            graph.add_initializer(axes, np.array([0], np.int64))
        ones = []
        for k, scalar in enumerate(scalars):
            out = gu.unique_value_name(graph, f"unsqueeze_output_{k}")
            name = gu.unique_node_name(graph, f"Unsqueeze_{k}")
            if axes is None:
                graph.add_node("Unsqueeze", [scalar], [out], name=name, axes=[0])
            else:
                graph.add_node("Unsqueeze", [scalar, axes], [out], name=name)
            ones.append(out)
        slice_axes = gu.unique_value_name(graph, "SliceAxesInitializer")
        graph.add_initializer(slice_axes, np.array([match.attributes["axis"]], dtype))
        node = graph.add_node("Slice", [data, ones[0], ones[1], slice_axes, ones[2]], match.outputs,
                              name=gu.unique_node_name(graph, "Slice"))
        self.fused.append((label(node), "Slice", ["Range", "Gather"]))
        return node

"""NodeArg: a named value flowing between nodes, an edge of the graph.

Mirrors include/onnxruntime/core/graph/node_arg.h: a NodeArg is identified by its
name, carries a type and shape when known, and `exists()` is False for the empty
name that marks a missing optional input or output.
"""
import weakref

import onnx
from onnx import helper

from ortlab.ir.tensor_value import dtype_name, np_dtype


class NodeArg:
    """A value in the graph: name (its identity), type and shape when known."""

    def __init__(self, name, type_proto=None, graph=None):
        self.name = name
        self.type_proto = type_proto
        self._graph = weakref.ref(graph) if graph is not None else (lambda: None)

    def exists(self):
        """False for the empty name ORT uses for a missing optional input/output."""
        return self.name != ""

    @property
    def elem_type(self):
        """The tensor element type (an onnx.TensorProto enum value), or None when unknown."""
        t = self.type_proto
        if t is None or not t.HasField("tensor_type") or not t.tensor_type.elem_type:
            return None
        return t.tensor_type.elem_type

    @property
    def dtype(self):
        """The element type's name (e.g. 'float32', 'bfloat16'), or None when unknown."""
        et = self.elem_type
        return None if et is None else dtype_name(et)

    @property
    def np_dtype(self):
        """The numpy dtype values are held in (onnx.reference's stand-in for bfloat16, float8 and int4),
        or None when unknown."""
        et = self.elem_type
        return None if et is None else np_dtype(et)

    @property
    def shape(self):
        """Dims as ints (known), strings (symbolic) or None (unknown); None when the rank is unknown."""
        t = self.type_proto
        if t is None or not t.HasField("tensor_type") or not t.tensor_type.HasField("shape"):
            return None
        dims = []
        for d in t.tensor_type.shape.dim:
            kind = d.WhichOneof("value")
            dims.append(d.dim_value if kind == "dim_value" else d.dim_param if kind else None)
        return dims

    def admits(self, shape):
        """True when a concrete shape (e.g. what a run produced) fits this NodeArg's shape:
        same rank, equal known dims; a symbolic or unknown dim fits any size."""
        mine = self.shape
        return mine is not None and len(mine) == len(shape) and all(
            d is None or isinstance(d, str) or d == n for d, n in zip(mine, shape))

    def _flag(self, test):
        graph = self._graph()
        return graph is not None and test(graph)

    @property
    def is_graph_input(self):
        return self._flag(lambda g: self.name in g.inputs)

    @property
    def is_initializer(self):
        return self._flag(lambda g: self.name in g.initializers)

    @property
    def is_graph_output(self):
        return self._flag(lambda g: self.name in g.outputs)

    def __repr__(self):
        if not self.exists():
            return "NodeArg('' missing optional)"
        kind = [k for k, f in (("input", self.is_graph_input), ("initializer", self.is_initializer),
                               ("output", self.is_graph_output)) if f]
        shape = "?" if self.shape is None else "[" + ", ".join(
            "?" if d is None else str(d) for d in self.shape) + "]"
        tail = f", {'/'.join(kind)}" if kind else ""
        return f"NodeArg('{self.name}', {self.dtype or '?'}{shape}{tail})"


def tensor_type(elem_type, shape=None):
    """A TypeProto for a tensor: elem_type as onnx.TensorProto enum or numpy dtype name."""
    if isinstance(elem_type, str):
        elem_type = helper.np_dtype_to_tensor_dtype(__import__("numpy").dtype(elem_type))
    return helper.make_tensor_type_proto(elem_type, shape)


def type_of_tensor(tensor: onnx.TensorProto):
    """The TypeProto of an initializer."""
    return helper.make_tensor_type_proto(tensor.data_type, list(tensor.dims))

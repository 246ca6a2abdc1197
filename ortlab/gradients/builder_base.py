"""What a gradient builder sees of its forward node, with ORT's shorthands I, O, GI, GO, IA.

Mirrors orttraining/orttraining/core/graph/gradient_builder_base.h: GradientBuilderBase,
its shorthands, constant helpers and HandleBroadcasting. A builder is a function
`get_xxx_gradient(b)` that emits nodes through `b.emit(...)` and returns, for each
forward input, the name of that input's gradient (None where none flows).
"""
import numpy as np
from onnx import TensorProto, helper

from ortlab.errors import OrtlabError
from ortlab.onnx_defs import MS_DOMAIN

MS = MS_DOMAIN  # kMSDomain, the domain of the Grad ops


class GradientBuilderError(OrtlabError):
    """A builder cannot differentiate this node (an unsupported attribute, rank or type)."""


class GradientBuilderBase:
    """One forward node's view for its builder; the emitted NodeProtos collect in `self.emitted`."""

    def __init__(self, graph, node, gradient_inputs, required, names):
        self.graph, self.node = graph, node
        self._go = gradient_inputs        # output index -> name of the gradient arriving there
        self._required = required         # input indices whose gradient is needed
        self._names = names               # the graph builder's unique-name generator
        self.emitted = []
        self.initializers = {}            # constants, stored as initializers as ORT's graph does
        self.prefix = f"{node.name or f'{node.op_type}_{node.index}'}_Grad/"

    # --- ORT's shorthands --------------------------------------------------------------------

    def I(self, i):  # noqa: E743 (ORT's gradient-builder shorthand I(i), kept with GI, GO)
        """Name of forward input i ('' when the optional input is absent)."""
        return self.node.inputs[i].name if i < len(self.node.inputs) else ""

    def O(self, i):  # noqa: E743 (ORT's gradient-builder shorthand O(i), kept with GI, GO)
        """Name of forward output i; an absent optional output is added to the forward node."""
        if i >= len(self.node.outputs) or not self.node.outputs[i].exists():
            while len(self.node.outputs) <= i:
                self.graph.append_node_output(self.node)
            self.graph.replace_node_output(self.node, i, self._names(f"{self.prefix}forward_output_{i}"))
        return self.node.outputs[i].name

    def GO(self, i):
        """Name of the gradient of forward output i, or None when no gradient reaches it."""
        return self._go.get(i)

    def GI(self, i):
        """A fresh name for the gradient of forward input i ('<input>_grad')."""
        return self._names(f"{self.I(i)}_grad")

    def IA(self, suffix):
        """A fresh name for an intermediate value of this builder."""
        return self._names(self.prefix + suffix)

    def needs(self, i):
        """Whether the gradient of forward input i is needed (IsGradientRequiredForSrcNodeInput)."""
        return i in self._required

    def attr(self, name, default=None):
        return self.node.attribute(name, default)

    def shape(self, name):
        """Static shape of a value (ints, or strings for symbolic dims), or None when unknown."""
        arg = self.graph.node_arg(name)
        if arg is None:  # the gradient of an output has that output's shape
            outputs = [i for i, g in self._go.items() if g == name]
            return self.shape(self.O(outputs[0])) if outputs else None
        return arg.shape

    def rank(self, name):
        shape = self.shape(name)
        return None if shape is None else len(shape)

    def elem_type(self, name):
        arg = self.graph.node_arg(name)
        return (arg.elem_type if arg is not None else None) or TensorProto.FLOAT

    # --- emitting ----------------------------------------------------------------------------

    def emit(self, op_type, inputs, outputs=None, domain="", **attributes):
        """Add one gradient node; returns its output name (or names, when several)."""
        outputs = outputs or [self.IA(op_type.lower())]
        self.emitted.append(helper.make_node(op_type, list(inputs), list(outputs),
                                           name=self.IA(op_type), domain=domain or None, **attributes))
        return outputs[0] if len(outputs) == 1 else outputs

    def constant(self, value, like=None, dtype=None):
        """A constant typed like the value `like` (or `dtype`), stored as an initializer.

        ORT's builders emit Constant nodes (ZeroConstant_Type..., HalfConstant...), which
        ORT's graph turns into initializers when it loads the model.
        """
        if dtype is None and like:
            dtype = helper.tensor_dtype_to_np_dtype(self.elem_type(like))
        name = self.IA("const")
        self.initializers[name] = np.asarray(value, dtype=dtype)
        return name

    def axes(self, values):
        return self.constant(np.asarray(values, dtype=np.int64))

    # --- broadcasting ------------------------------------------------------------------------

    def handle_broadcasting(self, grad, target, grad_shape=None):
        """Reduce `grad` (shaped like the broadcast result) to the shape of input `target`.

        `grad_shape` defaults to the shape of forward output 0. Static when both shapes are
        known: ReduceSum over the broadcast axes (and a Reshape
        when leading axes go too); otherwise Shape, Shape, BroadcastGradientArgs (com.microsoft),
        ReduceSum(noop_with_empty_axes=1), Reshape, as ORT's HandleBroadcasting does.
        """
        t_shape = self.shape(target)
        g_shape = grad_shape if grad_shape is not None else self.shape(self.O(0))
        axes = _broadcast_axes(t_shape, g_shape)
        if axes is not None:
            if not axes:
                return grad
            leading = len(g_shape) - len(t_shape)
            if all(a < leading for a in axes):
                return self.emit("ReduceSum", [grad, self.axes(axes)], keepdims=0)
            reduced = self.emit("ReduceSum", [grad, self.axes(axes)], keepdims=1)
            if leading == 0:
                return reduced
            return self.emit("Reshape", [reduced, self.emit("Shape", [target])])
        target_shape = self.emit("Shape", [target])
        measured = self.emit("Shape", [grad])
        target_axes, _ = self.emit("BroadcastGradientArgs", [target_shape, measured],
                                   [self.IA("target_axes"), self.IA("grad_axes")], domain=MS)
        reduced = self.emit("ReduceSum", [grad, target_axes], keepdims=1, noop_with_empty_axes=1)
        return self.emit("Reshape", [reduced, target_shape])


def _broadcast_axes(target, result):
    """Axes of `result` to sum over to get `target`'s shape, or None when shapes don't tell."""
    if target is None or result is None or len(target) > len(result):
        return None
    leading = len(result) - len(target)
    axes = list(range(leading))
    for i, (t, r) in enumerate(zip(target, result[leading:])):
        if t == r and t is not None:  # equal sizes, or the same symbol (same size at run time)
            continue
        if t == 1:  # broadcast from 1 (summing a dimension that is also 1 is harmless)
            axes.append(leading + i)
            continue
        return None
    return axes

"""OpKernel, the object that runs one node, and OpKernelContext, what it sees while it runs.

Mirrors include/onnxruntime/core/framework/op_kernel.h (OpKernel: built once per node at session
initialization, attributes read in the constructor from OpKernelInfo; Compute(OpKernelContext*)
on every run) and onnxruntime/core/framework/op_kernel.cc (OpKernelContext::Input reads the
frame's value at the node's input index, a const Tensor*; Output(i, shape) asks the frame to
allocate it). Inputs are const here too (ExecutionFrame.const_input): a kernel that writes into one
fails with a message saying so, instead of changing the caller's feed, a weight every run shares, or
a value another node reads.
"""
import numpy as np

from ortlab.engine.errors import KernelFailure
from ortlab.engine.execution_frame import EMPTY_OPTIONAL


CONST_INPUTS = ("the kernel wrote into a read-only array: a kernel's inputs are const, as ORT's "
                "OpKernelContext::Input returns a const Tensor* (a feed is the caller's own array, a weight is "
                "shared by every run); write results into ctx.output(i, shape), or compute a new array and "
                "return it (copy an input first, x = ctx.input(0).copy(), to change it)")


def wrote_to_const(exc):
    """Whether a kernel's exception is numpy refusing a write into a read-only array."""
    return isinstance(exc, ValueError) and "read-only" in str(exc)


class OpKernelInfo:
    """What a kernel's constructor may read: the node's attributes, its kernel def, its EP."""

    def __init__(self, node, kernel_def, provider):
        self.node, self.kernel_def, self.provider = node, kernel_def, provider
        self.attributes = node.attributes

    def attribute(self, name, default=None):
        """An attribute's value (str for strings), or `default` when the node does not set it."""
        return self.node.attribute(name, default)


class OpKernel:
    """Base of every kernel: bind what the node says once, then `compute(ctx)` on every run."""

    def __init__(self, info):
        self.info = info

    @property
    def kernel_def(self):
        return self.info.kernel_def

    def compute(self, ctx):
        """Read inputs with ctx.input(i), write outputs into ctx.output(i, shape); or return them."""
        raise NotImplementedError(f"{type(self).__name__} does not implement compute(ctx)")

    def __repr__(self):
        node = self.info.node
        return f"{type(self).__name__}({node.op_type} node {node.name or node.index!r} on {self.info.provider})"


class FunctionKernel(OpKernel):
    """A kernel written as one function `fn(ctx)`: the form `@register_op_kernel` takes."""

    fn = None

    def compute(self, ctx):
        return type(self).fn(ctx)


class OpKernelContext:
    """One node's view of the ExecutionFrame during one run.

    input(i): the value at the node's i-th input, read-only (None for an absent optional input);
    output(i, shape, dtype=None): a buffer for output i allocated by the frame on the kernel's
    device (dtype defaults to the type the graph gives the output); attribute(name, default).
    """

    __slots__ = ("frame", "step", "kernel")

    def __init__(self, frame, step, kernel):
        self.frame, self.step, self.kernel = frame, step, kernel

    @property
    def node(self):
        return self.step.node

    @property
    def input_count(self):
        return len(self.step.inputs)

    @property
    def output_count(self):
        return len(self.step.outputs)

    def input(self, index):
        """The value of input `index`; None for an optional input the node leaves out, including
        trailing ones past its input count (ORT's OpKernelContext::Input returns nullptr there)."""
        if not isinstance(index, int) or isinstance(index, bool) or index < 0:
            raise KernelFailure(f"{self.step.label()}: input({index!r}) asked; an input index is an int >= 0")
        slot = self.step.inputs[index] if index < len(self.step.inputs) else -1
        return None if slot < 0 else self.frame.const_input(slot)

    def inputs(self):
        """Every input, read-only (None for an absent optional one)."""
        return [None if slot < 0 else self.frame.const_input(slot) for slot in self.step.inputs]

    def attribute(self, name, default=None):
        return self.step.node.attribute(name, default)

    def output(self, index, shape, dtype=None):
        """Allocate output `index` of `shape` through the frame (ORT's OpKernelContext::Output)."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.step.outputs):
            raise KernelFailure(f"{self.step.label()}: output({index}) asked, the node has "
                                f"{len(self.step.outputs)} output(s)")
        slot = self.step.outputs[index]
        if slot < 0:
            return None  # an optional output the node leaves out: nothing to write
        step = self.step
        expected = step.output_dtypes[index]
        dtype = expected if dtype is None else np.dtype(dtype)
        if dtype is None:
            raise KernelFailure(f"{step.label()}: the graph gives output {index} no type; pass "
                                "dtype= to ctx.output")
        if not isinstance(shape, (tuple, list)) or any(
                isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
            raise KernelFailure(f"{step.label()}: output({index}, shape) takes a shape as a tuple of ints >= 0, "
                                f"not {shape!r}")
        shape = tuple(int(d) for d in shape)
        if expected is not None and dtype != expected:
            raise KernelFailure(f"{step.label()}: output {index} '{step.node.output_names[index]}' is "
                                f"{dtype}, the graph says {expected}; the kernel computes the wrong type")
        expected_shape = step.output_shapes[index]
        if expected_shape is not None and (len(expected_shape) != len(shape) or any(
                d is not None and d != n for d, n in zip(expected_shape, shape))):
            shown = ["?" if d is None else d for d in expected_shape]
            if step.graph_outputs[index]:  # ORT warns for a graph output (ExecutionFrame's VerifyOutputSizes)
                self.frame.state.logger.warning(
                    "execution_frame.cc VerifyOutputSizes", f"Expected shape from model of {shown} does not match "
                    f"actual shape of {list(shape)} for output {step.node.output_names[index]}")
                return self.frame.allocate(slot, shape, dtype, step.output_providers[index])
            raise KernelFailure(f"{step.label()}: output {index} '{step.node.output_names[index]}' has shape "
                                f"{list(shape)}, the graph's shape inference says {shown}; the kernel computes "
                                "the wrong shape (or the model declares a wrong one)")
        return self.frame.allocate(slot, shape, dtype, step.output_providers[index])

    def put(self, index, value):
        """Store a computed value as output `index`: allocated through output(), then copied in
        (what a kernel returning its results instead of writing them amounts to)."""
        slot = self.step.outputs[index] if index < len(self.step.outputs) else -1
        if slot < 0 or value is None:
            return
        if isinstance(value, (list, dict)) or value is EMPTY_OPTIONAL:
            if self.step.output_dtypes[index] is not None:
                raise KernelFailure(f"{self.step.label()}: output {index} is a tensor in the graph, the kernel "
                                    f"returned a {type(value).__name__}; return a numpy array")
            self.frame.store(slot, value)  # a sequence or map: not a tensor, kept as it is
            return
        if not hasattr(value, "shape"):
            value = np.asarray(value)
        # numpy str arrays hold tensor(string) as object arrays, as ORT's do
        if isinstance(value, np.ndarray) and value.dtype.kind in "US":
            value = value.astype(object)
        provider = self.step.output_providers[index]
        buffer = self.output(index, tuple(value.shape), provider.dtype_of(value))
        provider.copy_into(buffer, value)

    def implicit(self):
        """{name: value} of the outer-scope values a subgraph attribute reads (ORT: implicit inputs)."""
        return {name: self.frame.const_input(slot) for name, slot in self.step.implicit}

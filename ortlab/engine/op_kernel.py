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


class OutputDef:
    """What OpKernelContext checks a kernel's output `index` against, worked out once per session, not per run
    (ORT: SessionState keeps each node's output NodeArgs and the kernel's KernelDef; nothing is looked up again
    when Output(i, shape) is called). `dims`: the inferred shape (None: any; a None dim: symbolic)."""

    __slots__ = ("index", "slot", "name", "dtype", "dims", "fits", "provider", "graph_output")

    def __init__(self, step, index):
        self.index, self.slot = index, step.outputs[index]
        self.name = step.node.output_names[index]
        self.dtype, self.dims = step.output_dtypes[index], step.output_shapes[index]
        self.fits = self.dims  # the last shape found to agree with dims: a run's shapes are the last run's
        self.provider, self.graph_output = step.output_providers[index], step.graph_outputs[index]

    def shape_differs(self, shape):
        """Whether `shape` (a tuple of ints) contradicts the inferred one."""
        if shape == self.fits or self.dims is None:
            return False
        if len(self.dims) != len(shape) or any(d is not None and d != n for d, n in zip(self.dims, shape)):
            return True
        self.fits = shape
        return False


def output_defs(step):
    """The step's OutputDefs, one per output, made on first use and kept on the step (the executor makes them
    for every step when the session is created: ExecutionStep is per-session data)."""
    defs = step.__dict__.get("output_defs")
    if defs is None:
        defs = step.__dict__["output_defs"] = tuple(OutputDef(step, i) for i in range(len(step.outputs)))
    return defs


class OpKernelContext:
    """One node's view of the ExecutionFrame during one run.

    input(i): the value at the node's i-th input, read-only (None for an absent optional input);
    output(i, shape, dtype=None): a buffer for output i allocated by the frame on the kernel's
    device (dtype defaults to the type the graph gives the output); attribute(name, default).
    """

    __slots__ = ("frame", "step", "kernel", "defs")

    def __init__(self, frame, step, kernel):
        self.frame, self.step, self.kernel = frame, step, kernel
        self.defs = output_defs(step)

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
        if type(index) is not int and (not isinstance(index, int) or isinstance(index, bool)) or index < 0:
            raise KernelFailure(f"{self.step.label()}: input({index!r}) asked; an input index is an int >= 0")
        inputs = self.step.inputs
        slot = inputs[index] if index < len(inputs) else -1
        return None if slot < 0 else self.frame.const_input(slot)

    def inputs(self):
        """Every input, read-only (None for an absent optional one)."""
        const_input = self.frame.const_input
        return [None if slot < 0 else const_input(slot) for slot in self.step.inputs]

    def attribute(self, name, default=None):
        return self.step.node.attribute(name, default)

    def output(self, index, shape, dtype=None):
        """Allocate output `index` of `shape` through the frame (ORT's OpKernelContext::Output)."""
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(self.defs):
            raise KernelFailure(f"{self.step.label()}: output({index}) asked, the node has "
                                f"{len(self.defs)} output(s)")
        out = self.defs[index]
        if out.slot < 0:
            return None  # an optional output the node leaves out: nothing to write
        dtype = out.dtype if dtype is None else np.dtype(dtype)
        if dtype is None:
            raise KernelFailure(f"{self.step.label()}: the graph gives output {index} no type; pass "
                                "dtype= to ctx.output")
        if not isinstance(shape, (tuple, list)) or any(
                isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in shape):
            raise KernelFailure(f"{self.step.label()}: output({index}, shape) takes a shape as a tuple of ints "
                                f">= 0, not {shape!r}")
        return self._allocate(out, tuple(int(d) for d in shape), dtype)

    def _allocate(self, out, shape, dtype):
        """Output `out` of `shape` (a tuple of ints >= 0) and `dtype`, checked against what the graph says, then
        allocated by the frame."""
        if out.dtype is not None and dtype != out.dtype:
            raise KernelFailure(f"{self.step.label()}: output {out.index} '{out.name}' is {dtype}, the graph "
                                f"says {out.dtype}; the kernel computes the wrong type")
        if out.shape_differs(shape):
            shown = ["?" if d is None else d for d in out.dims]
            if not out.graph_output:
                raise KernelFailure(f"{self.step.label()}: output {out.index} '{out.name}' has shape {list(shape)}, "
                                    f"the graph's shape inference says {shown}; the kernel computes the wrong "
                                    "shape (or the model declares a wrong one)")
            # ORT warns for a graph output (ExecutionFrame's VerifyOutputSizes)
            self.frame.state.logger.warning(
                "execution_frame.cc VerifyOutputSizes", f"Expected shape from model of {shown} does not match "
                f"actual shape of {list(shape)} for output {out.name}")
        return self.frame.allocate(out.slot, shape, dtype, out.provider)

    def put(self, index, value):
        """Store a computed value as output `index`: allocated through output(), then copied in
        (what a kernel returning its results instead of writing them amounts to)."""
        defs = self.defs
        if value is None or index >= len(defs) or defs[index].slot < 0:
            return
        out = defs[index]
        provider = out.provider
        if type(value) is np.ndarray and value.dtype.kind not in "US":  # the common case: its shape is valid
            buffer = self._allocate(out, value.shape, np.dtype(provider.dtype_of(value)))
        else:
            value = self._as_tensor(out, value)
            if value is None:
                return
            buffer = self.output(index, tuple(value.shape), provider.dtype_of(value))
        provider.copy_into(buffer, value)

    def _as_tensor(self, out, value):
        """A returned value that is not a plain numeric array, as a tensor to copy into output `out` (numpy
        strings as objects, as ORT holds tensor(string); a number as an array); None once a sequence, a map or
        an empty optional is stored as it is."""
        if isinstance(value, (list, dict)) or value is EMPTY_OPTIONAL:
            if out.dtype is not None:
                raise KernelFailure(f"{self.step.label()}: output {out.index} is a tensor in the graph, the kernel "
                                    f"returned a {type(value).__name__}; return a numpy array")
            self.frame.store(out.slot, value)  # a sequence or map: not a tensor, kept as it is
            return None
        if not hasattr(value, "shape"):
            value = np.asarray(value)
        if isinstance(value, np.ndarray) and value.dtype.kind in "US":
            value = value.astype(object)
        return value

    def implicit(self):
        """{name: value} of the outer-scope values a subgraph attribute reads (ORT: implicit inputs)."""
        return {name: self.frame.const_input(slot) for name, slot in self.step.implicit}

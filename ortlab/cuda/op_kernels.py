"""The CUDA op kernels' entry points: outputs = op(inputs) with ORT's shapes and dtypes, computed by the
CUDA C++ kernels of ortlab/cuda/kernels/*.cu on [rows, cols] views of the tensors.

What ORT's CUDA kernel classes do around their .cu launches (read the attributes, check the inputs, flatten
to the views the kernel takes, pick grid and block, launch, give the outputs their shapes) is registered
per op family beside its .cu file (ortlab/cuda/kernels/reduce_sum.py and the others; registration.py says
how). This module finds a registered op and runs it:

    find(op_type, domain, spec)   what a partitioner asks before assigning a node: (op, None) or (None, why)
    run_op(op_type, domain, attributes, inputs, call=None)   the outputs, after the same check
    OpCall                        one op's run: its launchers (the CPU runner by default, CuPy on a GPU)

An op that the .cu files do not cover (ReduceSum over leading axes, SoftmaxCrossEntropyLoss with
reduction 'sum' or class weights, float16 inputs...) is declined with the reason; run() raises
CudaOpError for inputs that check() could not see (a ratio out of range, a label outside the classes).
"""
from dataclasses import dataclass, field

import numpy as np

from ortlab.cuda.kernels import OPS, registered
from ortlab.cuda.kernels.gather_grad import PATHS
from ortlab.cuda.kernels.registration import MS, CudaOpError, NodeSpec
from ortlab.cuda.launcher import CpuLauncher

__all__ = ["CudaOpError", "MS", "NOT_REGISTERED", "NodeSpec", "OPS", "OpCall", "PATHS", "find", "registered",
           "run_op"]

NOT_REGISTERED = "no CUDA C++ kernel in ortlab/cuda/kernels for this op"


@dataclass
class OpCall:
    """One op's run: the launchers by source (made on first use), the node's attributes, per-node state
    kept across runs (Dropout's generator offset) and options (GatherGrad's path)."""

    attributes: dict
    make_launcher: object = CpuLauncher
    state: dict = field(default_factory=dict)
    options: dict = field(default_factory=dict)
    launchers: dict = field(default_factory=dict)

    def launcher(self, source):
        if source not in self.launchers:
            self.launchers[source] = self.make_launcher(source)
        return self.launchers[source]

    def attribute(self, name, default=None):
        value = self.attributes.get(name, default)
        return value.decode() if isinstance(value, bytes) else value


def find(op_type, domain, spec):
    """(CudaOp, None) when a registered op accepts `spec`, else (None, why not)."""
    op = registered(op_type, domain)
    if op is None:
        return None, NOT_REGISTERED
    why = op.check(spec)
    return (None, why) if why else (op, None)


def run_op(op_type, domain, attributes, inputs, call=None):
    """The outputs of one op on numpy (or the launcher's) arrays, after the same check a partitioner makes."""
    op = registered(op_type, domain)
    if op is None:
        raise CudaOpError(f"no CUDA C++ kernel for {domain or 'ai.onnx'}:{op_type}; registered: {sorted(OPS)}")
    spec = NodeSpec(dict(attributes), tuple(None if a is None else str(np.asarray(a).dtype) for a in inputs),
                    tuple(None if a is None else np.ndim(a) for a in inputs),
                    {i: np.asarray(a) for i, a in enumerate(inputs) if a is not None})
    why = op.check(spec)
    if why:
        raise CudaOpError(f"the CUDA kernel for {op_type} declines these inputs: {why}")
    call = call or OpCall(dict(attributes))
    return list(op.run(call, *inputs))

"""Exercises of the walkthrough L0_04_onnx_ops_schemas_kernels: the output shape Reshape's kernel computes,
and an op defined by a function in the model.

The checks live in ortlab.labs.judges.l0_04: 'reshape_shape' against the shape ORT's CPU Reshape kernel returns
(ReshapeHelper, onnxruntime/core/providers/cpu/tensor/reshape_helper.h) on cases the check chooses;
'function_op' by loading the learner's model into ORT, which inlines the model's functions when it loads it
(onnxruntime/core/graph/function_utils.cc), and running it. The reference answers are in
solutions/walkthroughs/L0_04_onnx_ops_schemas_kernels.py, outside the package.
"""
import numpy as np

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe


@probe
def reshape_shapes(fn, cases):
    """The learner's fn(input_shape, target, allowzero) on each case, as lists of ints."""
    out = []
    for input_shape, target, allowzero in cases:
        got = fn(list(input_shape), list(target), allowzero)
        if isinstance(got, (str, bytes, dict)) or not hasattr(got, "__iter__"):
            raise CheckFailed(f"return the output shape as a list of ints, e.g. [2, 12], not {type(got).__name__}")
        shape = []
        for d in got:
            if isinstance(d, (bool, np.bool_)) or not isinstance(d, (int, np.integer)):
                raise CheckFailed(f"each dimension is an int; your shape holds {d!r} ({type(d).__name__})")
            shape.append(int(d))
        out.append(shape)
    return out


@probe
def model_of(fn):
    """The learner's fn(): the ModelProto itself (it crosses as its bytes)."""
    model = fn()
    kind = type(model).__name__
    if kind != "ModelProto":
        raise CheckFailed(f"return the onnx.ModelProto that helper.make_model made, not {kind}")
    return model


def check_reshape_shape(fn):
    """Exercise 'reshape_shape': fn(input_shape, target, allowzero) -> the output shape of Reshape, checked against
    ORT's Reshape kernel on cases the check chooses."""
    judge("reshape_shape", "l0_04.reshape_shape", learner(fn))


def check_function_op(fn):
    """Exercise 'function_op': fn() -> a ModelProto whose one node is lab.Swish, defined by a function in the model
    (y = x · Sigmoid(x)); checked by loading and running it in ORT."""
    judge("function_op", "l0_04.function_op", learner(fn))

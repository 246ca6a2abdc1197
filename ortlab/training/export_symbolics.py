"""Export symbolics MiniORTModule puts in place for the length of its own export.

Mirrors orttraining/orttraining/python/training/ortmodule/_custom_op_symbolic_registry.py, where
ORTModule replaces some of torch's symbolics (torch/onnx/symbolic_opset*.py) because torch's drop
what training needs. Two of them matter for the result, and are mirrored here with standard ONNX
ops, so that both gradient builders (ORT's C++ one and ortlab.gradients) and both runtimes take them:

- aten::embedding: torch exports a plain Gather and loses `padding_idx` (the padding row would
  then be trained). ORT exports an ATen `embedding` op that keeps it and differentiates it with
  ATen's embedding_backward (ortmodule/_custom_gradient_registry.py), which leaves the padding row
  out. Here: Y = Where(idx == padding_idx, Gather(W', idx), Gather(W, idx)) with W' the same weight
  marked NoGradient (graph_transition_manager feeds it as a second input, detached), so dW gets
  nothing from the positions holding padding_idx.
- aten::cross_entropy_loss and aten::nll_loss with an `ignore_index` computed in the graph (e.g.
  `logits.size(-1) - 1`): torch's symbolic needs a constant and fails. ORT passes ignore_index as
  a tensor input of its SoftmaxCrossEntropyLossInternal. Here: targets equal to the computed index
  become the constant IGNORED, and the standard op ignores IGNORED.

Registered through torch/onnx/_internal/registration.py as overrides for one opset, and taken
back afterwards (`registered(opset)`), so torch's own export elsewhere is unchanged.
"""
import contextlib

import torch
from torch.onnx import symbolic_helper
from torch.onnx._internal import registration

DOMAIN = "ortlab"
NO_GRADIENT = "NoGradient"      # ortlab::NoGradient(W) -> W, no gradient flows back through it
IGNORED = -(2 ** 63)            # the constant ignore_index targets are rewritten to (int64 min)
_INDEX_DTYPES = {"Long": torch.int64, "Int": torch.int32}


def _embedding(previous):
    """aten::embedding with padding_idx >= 0: the padding positions read a NoGradient copy of W."""

    def symbolic(g, weight, indices, padding_idx, scale_grad_by_freq, sparse):
        pad = symbolic_helper._maybe_get_const(padding_idx, "i")
        scaled = symbolic_helper._maybe_get_const(scale_grad_by_freq, "b")
        if not isinstance(pad, int) or pad < 0 or scaled:
            return previous(g, weight, indices, padding_idx, scale_grad_by_freq, sparse)
        dtype = _INDEX_DTYPES.get(indices.type().scalarType())
        if dtype is None:  # any other integer type: compare in int64
            indices, dtype = g.op("Cast", indices, to_i=torch.onnx.TensorProtoDataType.INT64), torch.int64
        is_pad = g.op("Equal", indices, g.op("Constant", value_t=torch.tensor(pad, dtype=dtype)))
        is_pad = symbolic_helper._unsqueeze_helper(g, is_pad, [-1])
        held = g.op(f"{DOMAIN}::{NO_GRADIENT}", weight)
        held.setType(weight.type())
        return g.op("Where", is_pad, g.op("Gather", held, indices), g.op("Gather", weight, indices))

    return symbolic


def _computed_ignore_index(previous, n_before):
    """A loss symbolic whose ignore_index may be a graph value: targets == it become IGNORED."""

    def symbolic(g, *args):
        ignore_index, target = args[n_before], args[1]
        if symbolic_helper._is_constant(ignore_index) or not symbolic_helper._is_value(ignore_index) \
                or target.type().scalarType() not in ("Long", "Int"):  # class probabilities: torch's own way
            return previous(g, *args)
        ignore = g.op("Cast", ignore_index, to_i=torch.onnx.TensorProtoDataType.INT64)
        target = g.op("Cast", target, to_i=torch.onnx.TensorProtoDataType.INT64)
        ignored = g.op("Constant", value_t=torch.tensor(IGNORED, dtype=torch.int64))
        target = g.op("Where", g.op("Equal", target, ignore), ignored, target)
        return previous(g, args[0], target, *args[2:n_before], IGNORED, *args[n_before + 1:])

    return symbolic


# aten name -> (make the symbolic from torch's, ...) ; the position of ignore_index in the arguments
SYMBOLICS = {
    "aten::embedding": _embedding,
    "aten::cross_entropy_loss": lambda previous: _computed_ignore_index(previous, 4),
    "aten::nll_loss": lambda previous: _computed_ignore_index(previous, 4),
    "aten::nll_loss2d": lambda previous: _computed_ignore_index(previous, 4),
    "aten::nll_loss_nd": lambda previous: _computed_ignore_index(previous, 4),
}


@contextlib.contextmanager
def registered(opset):
    """SYMBOLICS in place of the symbolics torch would use at `opset`, for the `with` block only."""
    added = []
    try:
        for name, make in SYMBOLICS.items():
            group = registration.registry.get_function_group(name)
            previous = group.get(opset) if group else None
            if previous is None:
                continue
            saved = group._functions._overrides.get(opset)
            registration.registry.register(name, opset, make(previous), custom=True)
            added.append((name, saved))
        yield
    finally:
        for name, saved in added:
            group = registration.registry.get_function_group(name)
            group.remove_custom(opset)
            if saved is not None:
                registration.registry.register(name, opset, saved, custom=True)

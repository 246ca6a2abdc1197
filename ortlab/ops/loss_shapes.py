"""Which logits, labels and weights SoftmaxCrossEntropyLoss(Grad) accepts, as ORT 1.19.2 checks them.

logits (N, C, D1, ..., Dk) need labels (N, D1, ..., Dk) and weights, when given, 1-D (orttraining/
orttraining/training_ops/cpu/loss/softmax_cross_entropy_loss.cc, VerifyLogitWeightAndLabelShape; the
CUDA kernel calls the same function). The messages start with ORT's own words. ORT does not check the
label values: a label outside [0, C) (and not ignore_index), or past the end of the weights, makes it
read past a buffer, so ortlab refuses it. Shapes are plain tuples of ints, values host arrays: one
check for the CPU kernels (numpy) and the Triton kernels (torch, on any device). Labels with no element (N*D1*...*Dk
= 0) kill ORT's process (C = logits' size / 0, GetNDCFromLogitAndLabelShape): refused too.
"""
import numpy as np


def softmax_cross_entropy_shape_problem(logit_shape, label_shape, weight_shape=None, label_name="input 1 'labels'"):
    """None when ORT accepts logits, labels and weights of these shapes, else what is wrong and what to do."""
    logit, label = tuple(int(d) for d in logit_shape), tuple(int(d) for d in label_shape)
    if weight_shape is not None and len(weight_shape) != 1:
        classes = f"({logit[1]},)" if len(logit) > 1 else "(C,)"
        return (f"Weights tensor is not 1-D (weights {tuple(weight_shape)}): pass one weight per class, "
                f"shape {classes}")
    if len(logit) < 2:
        return f"logit_shape must be (1 + label_shape) (logits {logit}): pass logits (N, C, D1, ...) of rank >= 2"
    want = (logit[0],) + logit[2:]
    words = ("logit_shape must be (1 + label_shape)" if len(logit) != len(label) + 1
             else "The shape of logit and label does not match" if label != want else None)
    if words is None:
        return None if all(label) else (
            f"{label_name} {label} holds no label: ORT 1.19.2 divides the logits' size by the label count (0) "
            f"and its process dies (SIGFPE); pass at least one row")
    return (f"{words} (logits {logit}, labels {label}): {label_name} must have shape {want}, the logits' "
            f"shape without the class axis 1; pass one class index per logit row")


def softmax_cross_entropy_label_problem(labels, n_classes, n_weights=None, ignore_index=None,
                                        label_name="input 1 'labels'"):
    """None when every label is ignore_index or a class in [0, C) with a weight, else what is wrong."""
    labels = np.asarray(labels)
    top = n_classes if n_weights is None else min(n_classes, int(n_weights))
    kept = labels if ignore_index is None else labels[labels != ignore_index]
    bad = kept[(kept < 0) | (kept >= top)]
    if bad.size == 0:
        return None
    ignore = "" if ignore_index is None else f" and not ignore_index={ignore_index}"
    weights = "" if top == n_classes else f" (the weights hold {n_weights} of the {n_classes} classes)"
    return (f"{label_name} holds {bad[:3].tolist()} outside [0, {top}){ignore}{weights}; ORT would read past "
            f"its buffers: pass class indices in [0, {top}), or set ignore_index to the label to skip")

"""SoftmaxCrossEntropyLoss (opset 13) and SoftmaxCrossEntropyLossGrad.

  log_prob = log_softmax(scores) over the class axis (axis 1)
  loss_i   = -w[label_i] * log_prob[i, label_i]       (0 where label_i == ignore_index)
  output   = loss (none) | sum loss (sum) | sum loss / sum w[label_i] (mean)
  d_logits = (exp(log_prob) - onehot(label)) * w[label_i] * dY_i / (sum w[label_i] for mean)

Scores (N, C) or (N, C, D1, ...) are laid out as rows of C (the class axis moved last), one
program per row; the sums for the reductions reuse ReduceSum's row_sum kernel.
Mirrors orttraining/orttraining/training_ops/cuda/loss/softmax_cross_entropy_loss_impl.cc
(and .cu: the per-row loss, the weight sum, then the reduction).
"""
import numpy as np
import torch
from ortlab import env  # noqa: F401 - before triton: it sets TRITON_INTERPRET (no GPU), which Triton reads once
import triton.language as tl
import triton

from ortlab.onnx_defs import MS_DOMAIN
from ortlab.triton_kernels.executor import block_size, launch
from ortlab.triton_kernels.kernel_def import INDEX, Arg, Kernel
from ortlab.triton_kernels.ops.reduce_sum import row_sum
from ortlab.ops.loss_shapes import softmax_cross_entropy_label_problem, softmax_cross_entropy_shape_problem
from ortlab.ops.reference import (softmax_cross_entropy_grad_reference,
                                          softmax_cross_entropy_reference)
from ortlab.ops.rows import as_rows, from_rows
from ortlab.triton_kernels.registry import register_kernel

REDUCTIONS = ("mean", "sum", "none")


@triton.jit
def sce_kernel(scores_ptr, label_ptr, weight_ptr, log_prob_ptr, loss_ptr, row_weight_ptr,
               n_classes, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_classes
    x = tl.load(scores_ptr + row * n_classes + cols, mask=mask, other=-float("inf"))
    shifted = x - tl.max(x, axis=0)
    log_sum = tl.log(tl.sum(tl.where(mask, tl.exp(shifted), 0.0), axis=0))
    log_prob = shifted - log_sum
    tl.store(log_prob_ptr + row * n_classes + cols, log_prob, mask=mask)
    label = tl.load(label_ptr + row)
    keep = label != ignore_index
    safe = tl.where(keep, label, 0)
    w = tl.where(keep, tl.load(weight_ptr + safe), 0.0)
    picked = tl.sum(tl.where(cols == safe, log_prob, 0.0), axis=0)
    tl.store(loss_ptr + row, -w * picked)
    tl.store(row_weight_ptr + row, w)


@triton.jit
def sce_grad_kernel(dy_ptr, log_prob_ptr, label_ptr, weight_ptr, d_ptr, n_classes, ignore_index,
                    inv_denominator, DY_PER_ROW: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_classes
    prob = tl.exp(tl.load(log_prob_ptr + row * n_classes + cols, mask=mask, other=0.0))
    label = tl.load(label_ptr + row)
    keep = label != ignore_index
    safe = tl.where(keep, label, 0)
    w = tl.where(keep, tl.load(weight_ptr + safe), 0.0)
    if DY_PER_ROW:
        dy = tl.load(dy_ptr + row)
    else:
        dy = tl.load(dy_ptr)
    grad = (prob - tl.where(cols == safe, 1.0, 0.0)) * (w * dy * inv_denominator)
    tl.store(d_ptr + row * n_classes + cols, grad, mask=mask)


@triton.jit
def label_weight_kernel(label_ptr, weight_ptr, out_ptr, n, ignore_index, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    in_range = offsets < n
    label = tl.load(label_ptr + offsets, mask=in_range, other=0)
    keep = label != ignore_index
    w = tl.load(weight_ptr + tl.where(keep, label, 0), mask=in_range, other=0.0)
    tl.store(out_ptr + offsets, tl.where(keep, w, 0.0), mask=in_range)


NO_IGNORE = -(2**62)


class _SceBase(Kernel):
    attributes = {"reduction": "mean", "ignore_index": None}

    def ignore(self):
        return NO_IGNORE if self.ignore_index is None else int(self.ignore_index)

    def check_labels(self, logits, labels, weights, label_name="input 1 'labels'"):
        """ORT's shape checks and ortlab's label range check (ortlab.ops.loss_shapes), one for every EP."""
        self.expect(self.reduction in REDUCTIONS,
                    f"reduction must be one of {REDUCTIONS}, got {self.reduction!r}")
        weight_shape = None if weights is None else tuple(weights.shape)
        problem = (softmax_cross_entropy_shape_problem(tuple(logits.shape), tuple(labels.shape), weight_shape,
                                                       label_name)
                   or softmax_cross_entropy_label_problem(np.asarray(labels), logits.shape[1],
                                                          None if weights is None else weight_shape[0],
                                                          self.ignore_index, label_name))
        self.expect(problem is None, problem)

    def weights_or_ones(self, weights, n_classes, like):
        if weights is not None:
            return weights
        return torch.ones(n_classes, dtype=like.dtype, device=like.device)


@register_kernel
class SoftmaxCrossEntropyLoss(_SceBase):
    """Softmax cross-entropy of scores (N, C[, D...]) against labels (N[, D...]) (opset 13)."""

    op_type = "SoftmaxCrossEntropyLoss"
    inputs = (Arg("scores", ranks=tuple(range(2, 9))), Arg("labels", INDEX),
              Arg("weights", optional=True))  # rank: check_labels, in ORT's words
    outputs = (Arg("output"), Arg("log_prob", optional=True))
    mirrors = "orttraining/orttraining/training_ops/cuda/loss/softmax_cross_entropy_loss_impl.cc"

    def check_shapes(self, scores, labels, weights):
        self.check_labels(scores, labels, weights)

    @classmethod
    def example(cls, rng, rows=3, cols=37):
        return [rng.standard_normal((rows, cols)).astype(np.float32), rng.integers(0, cols, rows)], {}

    def reference(self, scores, labels, weights=None):
        return softmax_cross_entropy_reference(scores, labels, weights, self.reduction, self.ignore())

    def compute(self, scores, labels, weights=None):
        n_classes = scores.shape[1]
        rows, layout = as_rows(scores, 1)
        log_prob = torch.empty_like(rows)
        loss = torch.empty(rows.shape[0], dtype=scores.dtype, device=scores.device)
        row_weight = torch.empty_like(loss)
        launch(sce_kernel, rows.shape[0], rows, labels.reshape(-1).contiguous(),
               self.weights_or_ones(weights, n_classes, scores), log_prob, loss, row_weight,
               n_classes, self.ignore(), BLOCK=block_size(n_classes))
        if self.reduction == "none":
            out = loss.reshape(labels.shape)
        else:
            total = row_sum(loss.reshape(1, -1))[0]
            out = total if self.reduction == "sum" else total / row_sum(row_weight.reshape(1, -1))[0]
        return out, from_rows(log_prob, layout)


@register_kernel
class SoftmaxCrossEntropyLossGrad(_SceBase):
    """d_logits = (softmax - onehot(label)) * w * dY / normalizer (com.microsoft training op)."""

    op_type, domain = "SoftmaxCrossEntropyLossGrad", MS_DOMAIN
    inputs = (Arg("dY", ranks=tuple(range(0, 8))), Arg("log_prob", ranks=tuple(range(2, 9))),
              Arg("label", INDEX), Arg("weight", optional=True))
    outputs = (Arg("d_logits"),)
    mirrors = "orttraining/orttraining/training_ops/cuda/loss/softmax_cross_entropy_loss_impl.cc"

    def check_shapes(self, dy, log_prob, labels, weights):
        self.check_labels(log_prob, labels, weights, "input 2 'label'")
        want = labels.shape if self.reduction == "none" else ()
        self.expect(dy.shape == want, f"input 0 'dY' must have shape {want} for reduction="
                    f"{self.reduction!r}, got {dy.shape}")

    @classmethod
    def example(cls, rng, rows=3, cols=37):
        """dY of a mean loss, and the log_prob the forward returns for (rows, cols) scores."""
        labels = rng.integers(0, cols, rows)
        _, log_prob = softmax_cross_entropy_reference(rng.standard_normal((rows, cols)).astype(np.float32), labels)
        return [np.array(0.7, np.float32), log_prob, labels], {}

    def reference(self, dy, log_prob, labels, weights=None):
        return (softmax_cross_entropy_grad_reference(dy, log_prob, labels, weights, self.reduction,
                                                     self.ignore()),)

    def compute(self, dy, log_prob, labels, weights=None):
        n_classes = log_prob.shape[1]
        rows, layout = as_rows(log_prob, 1)
        flat_labels = labels.reshape(-1).contiguous()
        weights = self.weights_or_ones(weights, n_classes, log_prob)
        inv_denominator = 1.0
        if self.reduction == "mean":
            row_weight = torch.empty(flat_labels.numel(), dtype=log_prob.dtype, device=log_prob.device)
            launch(label_weight_kernel, triton.cdiv(flat_labels.numel(), 256), flat_labels, weights,
                   row_weight, flat_labels.numel(), self.ignore(), BLOCK=256)
            inv_denominator = 1.0 / float(row_sum(row_weight.reshape(1, -1))[0])
        grad = torch.empty_like(rows)
        launch(sce_grad_kernel, rows.shape[0], dy.reshape(-1).contiguous(), rows, flat_labels,
               weights, grad, n_classes, self.ignore(), inv_denominator,
               DY_PER_ROW=self.reduction == "none", BLOCK=block_size(n_classes))
        return (from_rows(grad, layout),)

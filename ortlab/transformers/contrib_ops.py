"""Reference kernels (numpy, for onnx.reference) of the com.microsoft ops the fusions emit.

They define what each fused op computes, so a fused graph can be checked where ORT's
CPU EP has no kernel (BiasSoftmax, BiasDropout: onnxruntime/contrib_ops/cuda/ only).
Where ortlab has a Triton kernel for the op, the maths is that kernel's numpy reference
(ortlab.kernels.ops.reference, plain numpy: no torch or Triton is loaded here); FusedMatMul
and FusedGemm, which have no kernel, are defined here.
Schemas: onnxruntime/core/graph/contrib_ops/contrib_defs.cc, bert_defs.cc, and
orttraining/orttraining/core/graph/training_op_defs.cc.
"""
import numpy as np
from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun

from ortlab.onnx_defs import MS_DOMAIN
from ortlab.kernels.ops.reference import bias_softmax_reference, dropout_reference, gelu_reference
from ortlab.registry import Registry

# (op type, domain) -> OpRun class: what onnx.reference runs for the ops outside its own domains.
CONTRIB_OPS = Registry("reference op", duplicates="replace")


def register_reference_op(cls):
    """Class decorator: onnx.reference runs this OpRun subclass for (its name, its op_domain)."""
    return CONTRIB_OPS.register((cls.__name__, cls.op_domain), cls)


@register_reference_op
class Gelu(OpRun):
    op_domain = MS_DOMAIN
    op_schema = None  # not ONNX's Gelu (opset 20), whose 'approximate' onnx.reference would add

    def _run(self, x):
        return (gelu_reference(x),)


@register_reference_op
class BiasGelu(OpRun):
    op_domain = MS_DOMAIN

    def _run(self, x, bias):
        return (gelu_reference(x + bias),)


@register_reference_op
class FusedMatMul(OpRun):
    op_domain = MS_DOMAIN

    def _run(self, a, b, alpha=1.0, transA=0, transB=0, transBatchA=0, transBatchB=0):
        a = np.swapaxes(a, -1, -2) if transA else a
        b = np.swapaxes(b, -1, -2) if transB else b
        return ((alpha * np.matmul(a, b)).astype(a.dtype),)


@register_reference_op
class FusedGemm(OpRun):
    op_domain = MS_DOMAIN

    def _run(self, a, b, c=None, alpha=1.0, beta=1.0, transA=0, transB=0, activation=None,
             activation_alpha=0.01, activation_beta=None, activation_gamma=None):
        y = alpha * (a.T if transA else a) @ (b.T if transB else b) + (0 if c is None else beta * c)
        act = {"Relu": lambda v: np.maximum(v, 0), "Sigmoid": lambda v: 1 / (1 + np.exp(-v)),
               "Tanh": np.tanh, "LeakyRelu": lambda v: np.where(v > 0, v, activation_alpha * v)}
        return (act.get(activation, lambda v: v)(y).astype(a.dtype),)


@register_reference_op
class BiasSoftmax(OpRun):
    """softmax(x + bias) over the dimensions from `axis` on; numpy's broadcast of bias covers
    both of ORT's (is_inner_broadcast 0 and 1)."""
    op_domain = MS_DOMAIN

    def _run(self, x, bias, axis=1, is_inner_broadcast=0):
        return (bias_softmax_reference(x, bias, axis),)


@register_reference_op
class BiasDropout(OpRun):
    """Dropout(x + bias) [+ residual]: deterministic when it cannot drop (inference mode or
    ratio 0); otherwise seeded by `seed`."""
    op_domain = MS_DOMAIN

    def _run(self, x, bias, residual=None, ratio=None, training_mode=None, seed=0):
        ratio = 0.5 if ratio is None else float(ratio)
        y, keep = dropout_reference(x + bias, ratio, training_mode is not None and bool(training_mode), seed)
        return ((y if residual is None else y + residual).astype(x.dtype), keep)


def reference_run(model, feeds):
    """Run a model with onnx.reference, com.microsoft ops included; returns {output name: array}."""
    evaluator = ReferenceEvaluator(model, new_ops=list(CONTRIB_OPS.values()))
    names = [o.name for o in model.graph.output]
    return dict(zip(names, evaluator.run(None, feeds)))

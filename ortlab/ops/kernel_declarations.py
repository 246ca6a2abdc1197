"""What ORT 1.19.2's CPU kernels declare to the allocation planner: Alias, VariadicAlias and MayInplace.

The one table of these declarations, in the one KernelDef shape (ortlab/ops/kernel_def.py): the
allocation planner reads it by default, and ortlab.engine's CPU EP gives its kernels the same ones
(cpu_execution_provider.py), so the engine's kernel definitions and the planner agree.

Mirrors (KernelDefBuilder().Alias / .MayInplace in):
  onnxruntime/core/providers/cpu/tensor/reshape.cc, identity_op.cc, squeeze.cc, unsqueeze.cc,
  flatten.cc (Alias(0, 0)); onnxruntime/core/providers/cpu/activation/activations.cc (MayInplace(0, 0)
  for Elu, HardSigmoid, LeakyRelu, Relu, Selu, Sigmoid, Softplus, Softsign, Tanh, ThresholdedRelu);
  onnxruntime/core/providers/cpu/tensor/cast_op.cc (MayInplace(0, 0), "allocation planner will check
  input and output sizes match before inplacing"). Files read and found to declare neither:
  cpu/math/element_wise_ops.cc (Add, Sub, Mul, Div, Pow, Neg, Sqrt, Exp, Sum, ...), cpu/nn/dropout_op.cc
  (Dropout 12+), cpu/math/gemm.cc, orttraining/training_ops/cpu/op_gradients.cc (ReluGrad,
  SoftmaxGrad_13), .../cpu/nn/dropout_op.cc (DropoutGrad), .../cpu/math/scale.cc (Scale).
  VariadicAlias(0, 0): com.microsoft PassThrough, orttraining/orttraining/training_ops/cpu/controlflow/group.cc
  (its Compute fails unless each output is its input's buffer).
"""
from ortlab.onnx_defs import opset_of
from ortlab.ops.kernel_def import KernelDef

ONNX, MS = "", "com.microsoft"
_ALIAS_00 = {"alias": ((0, 0),)}
_INPLACE_00 = {"may_inplace": ((0, 0),)}

# (domain, op) -> [(first opset, last opset or None, declaration)]
ORT_CPU_KERNEL_DECLARATIONS = {
    **{(ONNX, op): [(1, None, _ALIAS_00)]
       for op in ("Reshape", "Identity", "Squeeze", "Unsqueeze", "Flatten")},
    # identity_op.cc; Dropout 12+ (nn/dropout_op.cc) declares nothing
    (ONNX, "Dropout"): [(7, 11, _ALIAS_00)],
    **{(ONNX, op): [(1, None, _INPLACE_00)] for op in ("Elu", "HardSigmoid", "LeakyRelu", "Relu", "Selu",
                                                        "Sigmoid", "Softplus", "Softsign", "Tanh",
                                                        "ThresholdedRelu", "Cast")},
    (MS, "PassThrough"): [(1, None, {"variadic_alias": (0, 0)})],
}


def _domain(node):
    return "" if node.domain in ("", "ai.onnx") else node.domain


def ort_declaration(node):
    """ORT 1.19.2's CPU KernelDef for `node` (an ortlab.ir Node), by op, domain and opset: the part the
    planner reads (Alias, MayInplace); the allocation planner's default `declare`."""
    domain = _domain(node)
    version = opset_of(node.graph.opset_imports, domain) or 0
    for first, last, found in ORT_CPU_KERNEL_DECLARATIONS.get((domain, node.op_type), []):
        if version >= first and (last is None or version <= last):
            return KernelDef(node.op_type, node.domain, **found)
    return KernelDef(node.op_type, node.domain)

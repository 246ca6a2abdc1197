"""Triton kernels for ORT's training ops, with numpy references and an OpTester.

`run(op_type, *inputs, domain="", **attributes)` executes a kernel on numpy inputs (Triton's
interpreter on CPU, compiled on a GPU: ortlab.env chooses); `op_test` compares it with ORT's
own kernel for the same op. Kernels register themselves with `@register_kernel`.
"""
from ortlab import env as _env  # sets TRITON_INTERPRET before any @triton.jit below

from ortlab.kernels.kernel_def import Arg, Kernel, KernelInputError
from ortlab.kernels.launch import count_launches, launch, run, run_reference
from ortlab.kernels.registry import (KERNELS, KernelNotFound, get_kernel, register_kernel,
                                     registered, unregister_kernel)
# Importing a kernel module registers its kernels.
from ortlab.kernels import bias_softmax, dropout, gather_grad, gelu  # noqa: F401,E402
from ortlab.kernels import layer_norm, reduce_sum, softmax, softmax_cross_entropy  # noqa: F401,E402


def op_test(op_type, inputs, attributes=None, domain="", providers=None):
    """See ortlab.kernels.op_tester.op_test (imported on first use: it needs onnx and ORT)."""
    from ortlab.kernels.op_tester import op_test as _op_test

    return _op_test(op_type, inputs, attributes, domain, providers)


__all__ = ["Arg", "Kernel", "KernelInputError", "KernelNotFound", "KERNELS", "count_launches",
           "get_kernel", "launch", "op_test", "register_kernel", "registered", "run", "run_reference",
           "unregister_kernel"]

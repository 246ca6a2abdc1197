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
from ortlab.kernels import (dropout, gelu, layer_norm, reduce_sum, softmax,  # noqa: F401,E402
                             softmax_cross_entropy)  # noqa: F401,E402  (registers the built-in kernels)

__all__ = ["Arg", "Kernel", "KernelInputError", "KernelNotFound", "KERNELS", "count_launches",
           "get_kernel", "launch", "register_kernel", "registered", "run", "run_reference",
           "unregister_kernel"]

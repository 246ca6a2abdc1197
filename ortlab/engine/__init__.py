"""ortlab.engine: a teaching runtime that runs ONNX models as ORT does, on EPs you can read.

    InferenceSession(model_or_path, sess_options=None, providers=None)   ORT's calling convention
    session.io_binding(), session.run_with_iobinding(binding)           bound inputs/outputs, reused by runs
    SessionOptions, RunOptions                                          the options that mean something here
    @register_op_kernel(op, domain="", provider="CPUExecutionProvider", **kernel_def)   add a kernel
    @register_execution_provider class MyEP(ExecutionProvider): ...     add an EP (get_capability, memory)
    OpKernel, OpKernelContext, KernelDef                                what a kernel is and sees

Files are named after ORT's: inference_session, session_state, execution_frame,
sequential_executor, io_binding, kernel_registry, kernel_def, op_kernel, execution_provider,
graph_partitioner, transformer_memcpy, cpu_execution_provider, triton_execution_provider,
memory_pattern (with enable_mem_pattern, ortlab.memory's plan places each tensor in one block).
"""
from ortlab.engine.errors import EngineError, InvalidArgument, InvalidGraph, KernelFailure, NotImplementedKernel
from ortlab.engine.kernel_def import KernelDef
from ortlab.engine.op_kernel import OpKernel, OpKernelContext
from ortlab.engine.kernel_registry import KERNEL_REGISTRIES, kernel_registry, register_op_kernel, unregister_op_kernel
from ortlab.engine.execution_provider import (EXECUTION_PROVIDERS, ExecutionProvider, OrtDevice,
                                              register_execution_provider)
from ortlab.engine.cpu_execution_provider import CPUExecutionProvider
from ortlab.engine import ort_cpu_kernels  # noqa: F401,E402 (they register)
from ortlab.engine.triton_execution_provider import TritonExecutionProvider
from ortlab.engine.options import RunOptions, SessionOptions
from ortlab.engine.inference_session import InferenceSession
from ortlab.engine.io_binding import IOBinding

__all__ = ["CPUExecutionProvider", "EXECUTION_PROVIDERS", "EngineError", "ExecutionProvider", "InferenceSession",
           "IOBinding", "InvalidArgument", "InvalidGraph", "KERNEL_REGISTRIES", "KernelDef", "KernelFailure",
           "NotImplementedKernel", "OpKernel", "OpKernelContext", "OrtDevice", "RunOptions", "SessionOptions",
           "TritonExecutionProvider", "kernel_registry", "register_execution_provider", "register_op_kernel",
           "unregister_op_kernel"]

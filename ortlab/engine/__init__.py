"""ortlab.engine: a teaching runtime that runs ONNX models as ORT does, on EPs you can read.

    InferenceSession(model_or_path, sess_options=None, providers=None)   ORT's calling convention
    session.io_binding(), session.run_with_iobinding(binding)           bound inputs/outputs, reused by runs
    SessionOptions, RunOptions                                          the options that mean something here
    @register_op_kernel(op, domain="", provider="CPUExecutionProvider", **kernel_def)   add a kernel
    @register_execution_provider class MyEP(ExecutionProvider): ...     add an EP (get_capability, memory)
    OpKernel, OpKernelContext, KernelDef                                what a kernel is and sees

Files are named after ORT's: inference_session, session_state, execution_frame,
sequential_executor, io_binding, kernel_registry, kernel_def, op_kernel, execution_provider,
graph_partitioner, transformer_memcpy, cpu_execution_provider (its kernels: cpu_kernels*),
triton_execution_provider and cuda_execution_provider (two device EPs: ortlab's Triton kernels, and
ORT's training kernels in CUDA C++ from ortlab.cuda), memory_pattern (with enable_mem_pattern,
ortlab.memory's plan places each tensor in one block).
KernelDef itself lives in ortlab.ops.kernel_def (the planner reads the same one).

The names below are imported on first use: `import ortlab.engine.sequential_executor` loads the
executor and what it needs, not the session with its graph optimizer. inference_session imports
the EPs and ORT's CPU kernels, so a session always has them registered.
"""
import importlib

_HOMES = {
    "EngineError": "errors", "InvalidArgument": "errors", "InvalidGraph": "errors", "KernelFailure": "errors",
    "NotImplementedKernel": "errors", "OpKernel": "op_kernel", "OpKernelContext": "op_kernel",
    "KERNEL_REGISTRIES": "kernel_registry", "kernel_registry": "kernel_registry",
    "register_op_kernel": "kernel_registry", "unregister_op_kernel": "kernel_registry",
    "EXECUTION_PROVIDERS": "execution_provider", "ExecutionProvider": "execution_provider",
    "OrtDevice": "execution_provider", "register_execution_provider": "execution_provider",
    "CPUExecutionProvider": "cpu_execution_provider", "TritonExecutionProvider": "triton_execution_provider",
    "CUDAExecutionProvider": "cuda_execution_provider",
    "RunOptions": "options", "SessionOptions": "options", "InferenceSession": "inference_session",
    "IOBinding": "io_binding",
}
__all__ = sorted([*_HOMES, "KernelDef"])


def __getattr__(name):
    """`ortlab.engine.InferenceSession` and the other public names, imported from their modules on first use."""
    if name == "KernelDef":
        from ortlab.ops.kernel_def import KernelDef  # lazy: the package's names load on first use
        return KernelDef
    if name not in _HOMES:
        raise AttributeError(f"module 'ortlab.engine' has no attribute {name!r}")
    for public, home in _HOMES.items():
        globals()[public] = getattr(importlib.import_module(f"{__name__}.{home}"), public)
    return globals()[name]


def __dir__():
    return sorted(set(globals()) | set(_HOMES) | {"KernelDef"})

"""A device EP whose kernels are ORT's training kernels in CUDA C++ (ortlab/cuda/kernels/*.cu), one op
kernel per ONNX op (ortlab.cuda.op_kernels).

Mirrors onnxruntime/core/providers/cuda/cuda_execution_provider.cc (the EP: its device, its kernel
registry, GetCapability claiming the nodes it has kernels for, Memcpy kernels) and the kernels it
registers from onnxruntime/core/providers/cuda/ (reduction/reduction_ops.cc, nn/dropout.cc) and
orttraining/orttraining/training_ops/cuda/ (nn/dropout_grad.cc, nn/layer_norm.cc,
loss/softmax_cross_entropy_loss.cc, tensor/gather_grad.cc). A node is claimed when an op kernel
accepts its op, attributes, input dtypes and ranks; find_kernel says why not otherwise, and the node
falls to the next EP.

Where the kernels run: on a GPU when CuPy sees one (the .cu files compiled by NVRTC + ptxas for it,
tensors kept as torch CUDA tensors, which the session's fetches and io_binding read, and handed to
the kernels as CuPy views of the same memory); otherwise on ortlab's CPU runner (the same sources built
by g++, run with CUDA's thread semantics), tensors as numpy arrays. Either way the device is labelled
"GPU", so partitioning and Memcpy insertion are those of a GPU session.

Provider option: gather_grad="sorted" (ORT's CUDA GatherGrad: sort, then sum in order; deterministic)
or "atomic" (atomicAdd; sums in the threads' order).
"""
import functools

import numpy as np

from ortlab.cuda import compile as nvrtc_compile
from ortlab.cuda import kernels, op_kernels
from ortlab.cuda.launcher import CPU_RUNNER, CpuLauncher, CupyLauncher
from ortlab.engine.errors import EngineError
from ortlab.engine.execution_provider import (ExecutionProvider, OrtDevice, check_copy_shape,
                                              register_execution_provider)
from ortlab.engine.kernel_registry import KernelCreateInfo, register_op_kernel
from ortlab.engine.op_kernel import OpKernel
from ortlab.ops.kernel_def import KernelDef

CUDA = "CUDAExecutionProvider"

# Inputs the device kernels read on the host, as ORT's CUDA kernels declare them with
# InputMemoryType(OrtMemTypeCPUInput, i): ReduceSum's axes (cuda/reduction/reduction_ops.cc),
# GatherGrad's shape (orttraining/training_ops/cuda/tensor/gather_grad.cc), Dropout's ratio and
# training_mode (cuda/nn/dropout.cc), DropoutGrad's ratio and training_mode. The Triton EP, which
# mirrors the same kernels, reads the same table.
CPU_INPUTS = {("ReduceSum", ""): (1,), ("GatherGrad", "com.microsoft"): (0,), ("Dropout", ""): (1, 2),
              ("DropoutGrad", "com.microsoft"): (2, 3)}


@functools.lru_cache(maxsize=1)
def gpu_arch():
    """`sm_XY` of the GPU CuPy sees, or None (no CuPy, no device): then the CPU runner runs the kernels."""
    try:
        import cupy  # optional: cupy

        if cupy.cuda.runtime.getDeviceCount() < 1:
            return None
        return f"sm_{cupy.cuda.Device(0).compute_capability}"
    except Exception:  # noqa: BLE001 (no CuPy, no driver, no device: all mean the CPU runner)
        return None


@functools.lru_cache(maxsize=None)
def _cubin(source, arch):
    result = nvrtc_compile(kernels.source(source), arch)
    if result.cubin is None:
        raise EngineError(f"{source}.cu did not assemble for {arch}: {result.why_no_cubin}")
    return result.cubin


def gpu_launcher(source):
    """A CupyLauncher of `source` compiled for this GPU (once per process)."""
    return CupyLauncher(source, _cubin(source, gpu_arch()))


def node_spec(node, dtypes=()):
    """The NodeSpec an op kernel checks: attributes, input dtypes and ranks from the graph, the values of
    inputs that are initializers (not graph inputs, which a feed may override), the ONNX opset."""
    graph = node.graph
    args = [graph.node_arg(a.name) if a.exists() else None for a in node.inputs]
    if not dtypes:
        dtypes = [arg.dtype if arg is not None else None for arg in args]
    ranks = tuple(None if arg is None or arg.shape is None else len(arg.shape) for arg in args)
    constants = {i: graph.initializer_value(a.name) for i, a in enumerate(node.inputs)
                 if a.exists() and a.name in graph.initializers and a.name not in graph.inputs}
    return op_kernels.NodeSpec(node.attributes, tuple(dtypes), ranks, constants,
                               graph.opset_imports.get("", graph.opset_imports.get("ai.onnx", 17)))


@register_execution_provider
class CUDAExecutionProvider(ExecutionProvider):
    """Claims the nodes an ortlab.cuda.op_kernels kernel accepts; Memcpy kernels move values to and from it."""

    type = CUDA
    ort_equivalent = CUDA

    def __init__(self, gather_grad="sorted"):
        if gather_grad not in op_kernels.PATHS:
            raise EngineError(f"CUDAExecutionProvider: gather_grad={gather_grad!r}; choose one of {op_kernels.PATHS}")
        super().__init__(gather_grad=gather_grad)
        self.arch = gpu_arch()
        self.kernel_class = type("CudaKernel", (CudaKernel,), {"provider": self})

    @property
    def on_gpu(self):
        return self.arch is not None

    @property
    def device(self):
        if self.on_gpu:
            return OrtDevice("GPU", 0, f"CUDA memory ({self.arch}), kernels compiled by NVRTC + ptxas, run by CuPy")
        return OrtDevice("GPU", 0, CPU_RUNNER)

    def find_kernel(self, node, dtypes=()):
        found, why = self.kernel_registry().find(node, dtypes)
        if found is not None or why != "no kernel registered":
            return found, why
        if op_kernels.registered(node.op_type, node.domain) is None:  # before reading its initializers
            return None, op_kernels.NOT_REGISTERED
        op, why = op_kernels.find(node.op_type, node.domain, node_spec(node, dtypes))
        if op is None:
            return None, why
        kernel_def = KernelDef(node.op_type, node.domain, CUDA,
                               input_memory=CPU_INPUTS.get((node.op_type, node.domain), ()))
        return KernelCreateInfo(kernel_def, self.kernel_class), None

    def launcher(self, source):
        return gpu_launcher(source) if self.on_gpu else CpuLauncher(source)

    # --- memory: numpy arrays on the CPU runner, torch CUDA tensors on a GPU ------------------
    def allocate(self, shape, dtype):
        if not self.on_gpu:
            return np.empty(shape, dtype)
        import torch  # heavy: torch

        return torch.empty(shape, dtype=torch.from_numpy(np.empty(0, dtype)).dtype, device="cuda")

    def copy_into(self, buffer, value):
        if hasattr(buffer, "detach"):
            check_copy_shape(buffer, value)  # torch's copy_ would broadcast
            buffer.copy_(value if hasattr(value, "detach") else _torch_of(value))
        else:
            super().copy_into(buffer, _host(value))

    def from_host(self, array):
        array = np.array(_host(array), copy=True)
        return _torch_of(array).to("cuda") if self.on_gpu else array

    def to_host(self, value):
        return np.array(_host(value), copy=True)

    def dtype_of(self, value):
        return np.dtype(str(value.dtype).replace("torch.", ""))

    def synchronize(self):
        if self.on_gpu:
            import torch  # heavy: torch

            torch.cuda.synchronize()


def _host(value):
    """A host numpy view of a numpy array, a torch tensor (Triton EP's, or this EP's on a GPU) or a CuPy array."""
    if hasattr(value, "detach"):
        return value.detach().cpu().numpy()
    if hasattr(value, "get") and hasattr(value, "__cuda_array_interface__"):
        return value.get()
    return np.asarray(value)


def _torch_of(array):
    import torch  # heavy: torch

    return torch.from_numpy(np.ascontiguousarray(array))


class CudaKernel(OpKernel):
    """Runs one node's op kernel: its OpCall (attributes, launchers, per-node state) made once, run every run."""

    provider = None  # the EP instance: set on the subclass each CUDAExecutionProvider makes

    def __init__(self, info):
        super().__init__(info)
        node = info.node
        self.op = op_kernels.registered(node.op_type, node.domain)
        self.host_inputs = CPU_INPUTS.get((node.op_type, node.domain), ())
        self.call = op_kernels.OpCall(node.attributes, make_launcher=self.provider.launcher,
                                      options={"path": self.provider.options["gather_grad"]})

    def compute(self, ctx):
        inputs = ctx.inputs()
        while inputs and inputs[-1] is None:
            inputs.pop()
        if self.provider.on_gpu:
            import cupy  # optional: cupy

            inputs = [v if v is None or i in self.host_inputs else cupy.asarray(v) for i, v in enumerate(inputs)]
            return [None if v is None else _torch_from_cupy(v) for v in self.op.run(self.call, *inputs)]
        inputs = [None if v is None else _host(v) for v in inputs]
        return self.op.run(self.call, *inputs)


def _torch_from_cupy(array):
    import torch  # heavy: torch

    return torch.as_tensor(array, device="cuda")


# --- the copies between host and device: ORT's CUDA EP registers MemcpyFromHost with
# InputMemoryType(OrtMemTypeCPUInput, 0) and MemcpyToHost with OutputMemoryType(OrtMemTypeCPUOutput, 0)
# (cuda_execution_provider.cc) ---------------------------------------------------------------------
@register_op_kernel("MemcpyFromHost", provider=CUDA, input_memory=(0,))
def memcpy_from_host(ctx):
    """Host array in (numpy; a torch CPU tensor is read as one), the same values in this EP's memory out."""
    ctx.put(0, _host(ctx.input(0)))


@register_op_kernel("MemcpyToHost", provider=CUDA, output_memory=(0,))
def memcpy_to_host(ctx):
    """This EP's value in, a numpy copy in host memory out."""
    ctx.put(0, np.array(_host(ctx.input(0)), copy=True))

"""A device EP whose kernels are ortlab's Triton kernels (ortlab.triton_kernels).

ORT's CUDA EP (onnxruntime/core/providers/cuda/cuda_execution_provider.cc) is the model: a
device, a kernel registry, GetCapability claiming the nodes it has kernels for, and Memcpy
kernels moving tensors between host and device. Here the device is the GPU when one is usable;
otherwise the tensors are torch CPU tensors run under Triton's interpreter, labelled as such,
so that partitioning and memcpy insertion behave exactly as on a GPU.
"""
import numpy as np

from ortlab.engine.cuda_execution_provider import CPU_INPUTS  # ORT's CUDA kernels' host inputs (it registers that EP)
from ortlab.engine.execution_provider import (ExecutionProvider, OrtDevice, check_copy_shape,
                                              register_execution_provider)
from ortlab.ops.kernel_def import KernelDef
from ortlab.engine.kernel_registry import KernelCreateInfo, register_op_kernel
from ortlab.engine.op_kernel import OpKernel
from ortlab.triton_kernels.registry import KERNELS, get_kernel, load_builtin_kernels

TRITON = "TritonExecutionProvider"


def _torch():
    import torch  # heavy: torch

    return torch


def _device():
    from ortlab.env import kernel_device  # lazy: ortlab.env imports torch; a CPU-only session never loads it

    return kernel_device()


@register_execution_provider
class TritonExecutionProvider(ExecutionProvider):
    """Claims the nodes whose op has a Triton kernel in ortlab.triton_kernels and whose attributes and
    input types that kernel accepts."""

    type = TRITON
    ort_equivalent = "CUDAExecutionProvider"  # the device EP whose kernels (BiasSoftmax, ...) it mirrors

    @property
    def device(self):
        on_gpu = _device() == "cuda"
        return OrtDevice("GPU", 0, "CUDA memory" if on_gpu else "torch CPU tensors, Triton interpreter")

    def find_kernel(self, node, dtypes=()):
        found, why = self.kernel_registry().find(node, dtypes)
        if found is not None or why != "no kernel registered":
            return found, why
        load_builtin_kernels()
        kernel_cls = KERNELS.get((node.op_type, node.domain))
        if kernel_cls is None:
            return None, "no Triton kernel in ortlab.triton_kernels"
        try:
            kernel_cls(**node.attributes)
        except Exception as exc:  # noqa: BLE001 (the kernel's own KernelInputError says why)
            return None, f"the Triton kernel refuses the node's attributes: {exc}"
        constraints = {i: arg.types for i, arg in enumerate(kernel_cls.inputs)}
        kernel_def = KernelDef(node.op_type, node.domain, TRITON, type_constraints=constraints,
                               input_memory=CPU_INPUTS.get((node.op_type, node.domain), ()))
        mismatch = kernel_def.type_mismatch(dtypes)
        if mismatch:
            return None, mismatch
        return KernelCreateInfo(kernel_def, TritonKernel), None

    # --- memory: torch tensors on the kernels' device ----------------------------------------
    def allocate(self, shape, dtype):
        torch = _torch()
        return torch.empty(shape, dtype=_torch_dtype(dtype), device=_device())

    def copy_into(self, buffer, value):
        check_copy_shape(buffer, value)  # torch's copy_ would broadcast
        if not hasattr(value, "device"):  # a host array; a kernel's input is read-only, which torch warns about
            value = _torch().from_numpy(np.array(value) if not value.flags.writeable else np.ascontiguousarray(value))
        buffer.copy_(value)

    def from_host(self, array):
        tensor = _torch().from_numpy(np.array(array, copy=True))  # the copy: a new buffer, as on a GPU
        return tensor if _device() == "cpu" else tensor.to(_device())

    def to_host(self, value):
        return value.detach().cpu().numpy().copy() if hasattr(value, "detach") else np.array(value)

    def dtype_of(self, value):
        return np.dtype(str(value.dtype).replace("torch.", "")) if hasattr(value, "detach") else value.dtype

    def synchronize(self):
        if _device() == "cuda":
            _torch().cuda.synchronize()


def _torch_dtype(dtype):
    torch = _torch()
    return torch.from_numpy(np.empty(0, dtype)).dtype


class TritonKernel(OpKernel):
    """Runs an ortlab.triton_kernels Kernel: attributes bound once, compute(*tensors) every run."""

    def __init__(self, info):
        super().__init__(info)
        node = info.node
        self.kernel = get_kernel(node.op_type, node.domain)(**node.attributes)

    def compute(self, ctx):
        torch = _torch()
        args = [None if v is None else v if hasattr(v, "device") else torch.from_numpy(np.array(v))  # host input
                for v in ctx.inputs()]
        while args and args[-1] is None:
            args.pop()
        # count, types, ranks and shapes, as ortlab.triton_kernels.executor.run checks them
        self.kernel.validate([check_view(a) for a in args])
        return self.kernel.compute(*args)


def check_view(tensor):
    """What a Kernel's checks read of a torch tensor, as numpy, without copying a float tensor off the device.

    The checks read the dtype and shape of every input, and the values only of the small host-side ones: integer
    indices, labels and axes, and scalars such as Dropout's ratio. So a floating tensor of more than one element on
    a device becomes a zero-stride numpy view of its dtype and shape: no device-to-host copy per kernel per run,
    the cost ORT's CUDA kernels also avoid (they check shapes, not float values). Everything else is read for real
    (free for a CPU tensor: numpy shares its memory)."""
    if tensor is None:
        return None
    tensor = tensor.detach()
    if tensor.device.type != "cpu" and tensor.is_floating_point() and tensor.numel() > 1:
        try:
            dtype = np.dtype(str(tensor.dtype).removeprefix("torch."))
        except TypeError:  # a dtype numpy lacks (bfloat16): the copy below fails as it always did
            dtype = None
        if dtype is not None:
            return np.broadcast_to(np.zeros((), dtype), tuple(tensor.shape))
    return tensor.cpu().numpy()


# --- the copies between host and device (ORT: onnxruntime/core/providers/cuda/cuda_execution_provider.cc
# registers Memcpy kernels with InputMemoryType(CPU, 0) for MemcpyFromHost and OutputMemoryType(CPU, 0)
# for MemcpyToHost) -------------------------------------------------------------------------------
@register_op_kernel("MemcpyFromHost", provider=TRITON, input_memory=(0,))
def memcpy_from_host(ctx):
    """Host array in, the same values in device memory out."""
    ctx.put(0, ctx.input(0))


@register_op_kernel("MemcpyToHost", provider=TRITON, output_memory=(0,))
def memcpy_to_host(ctx):
    """Device tensor in, the same values in host memory out."""
    x = ctx.input(0)
    ctx.put(0, x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x))

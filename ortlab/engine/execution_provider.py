"""IExecutionProvider: a device, its allocator, its kernels, and which nodes it claims.

Mirrors include/onnxruntime/core/framework/execution_provider.h and
onnxruntime/core/framework/execution_provider.cc: the default GetCapability claims one node at
a time, every node for which the EP's kernel lookup finds a kernel; an EP with a compiler
overrides it to claim whole subgraphs. EPs register themselves in EXECUTION_PROVIDERS under the
name ORT gives them ("CPUExecutionProvider"), so a session's provider list is a list of names.
"""
from dataclasses import dataclass

import numpy as np

from ortlab.engine.errors import EngineError
from ortlab.engine.kernel_registry import kernel_registry
from ortlab.registry import Registry

EXECUTION_PROVIDERS = Registry("execution provider", op_keys=False, duplicates="replace",
                               hint="Add one with @register_execution_provider on an ExecutionProvider subclass.")


def check_copy_shape(buffer, value):
    """EngineError unless value has buffer's shape: a copy never broadcasts (ORT: DataTransferManager::CopyTensor,
    core/framework/data_transfer_manager.cc, fails 'Tensor size mismatch' on another size)."""
    shape = value.shape if isinstance(value, np.ndarray) else tuple(np.shape(value))
    if shape != tuple(buffer.shape):
        raise EngineError(f"Tensor size mismatch: a value of shape {shape} does not fit the buffer "
                          f"of shape {tuple(buffer.shape)} it is to be copied into (a bound output?); bind a buffer "
                          "of the output's shape, or bind_output(name) and let the run allocate it")


@dataclass(frozen=True)
class OrtDevice:
    """Where an EP's tensors live (include/onnxruntime/core/framework/ortdevice.h): a device type
    ("CPU", "GPU"), an id, and `backing`: the memory that really holds them here."""

    type: str = "CPU"
    id: int = 0
    backing: str = "host memory"

    def __str__(self):
        return f"{self.type}:{self.id} ({self.backing})"


def register_execution_provider(cls):
    """Class decorator: make an ExecutionProvider subclass available by its `type` name."""
    if not (isinstance(cls, type) and issubclass(cls, ExecutionProvider)):
        raise EngineError(f"@register_execution_provider decorates an ExecutionProvider subclass, not {cls!r}")
    if not getattr(cls, "type", "") or not isinstance(cls.type, str):
        raise EngineError(f"{cls.__name__} sets no `type` (the EP's name, e.g. 'MyExecutionProvider')")
    device = cls.__dict__.get("device", ExecutionProvider.device)
    if not isinstance(device, (OrtDevice, property)):
        raise EngineError(f"{cls.__name__}.device must be an OrtDevice (e.g. OrtDevice('GPU', 0, 'its memory')), "
                          f"not {device!r}")
    kernel_registry(cls.type)  # its (empty) KernelRegistry: @register_op_kernel(provider=cls.type) now accepts it
    return EXECUTION_PROVIDERS.register(cls.type, cls)


class ExecutionProvider:
    """Base of every EP. Subclasses set `type` and `device`; a CPU-based EP keeps numpy arrays, a
    device EP overrides allocate / copy_into / from_host / to_host for its tensors."""

    type = ""
    device = OrtDevice()
    ort_equivalent = None  # the ORT EP whose graph transformers apply here (ortlab.transformers' EP lists)

    def __init__(self, **provider_options):
        self.options = dict(provider_options)

    @property
    def is_cpu_based(self):
        return self.device.type == "CPU"

    def kernel_registry(self):
        return kernel_registry(self.type)

    def find_kernel(self, node, dtypes=()):
        """(KernelCreateInfo, None) or (None, why not): ORT's KernelRegistry::TryFindKernel."""
        return self.kernel_registry().find(node, dtypes)

    def get_capability(self, graph, kernel_lookup):
        """Indices of the nodes this EP can run, each its own ComputeCapability (ORT's default:
        a node is claimed when kernel_lookup finds a kernel for it)."""
        return [node.index for node in graph.nodes() if kernel_lookup(node) is not None]

    def registered_ops(self):
        """The op keys this EP's registry holds, printed ('Softmax', 'com.microsoft:Gelu')."""
        return self.kernel_registry().known()

    # --- memory -------------------------------------------------------------------------------
    def allocate(self, shape, dtype):
        """An uninitialized buffer on this EP's device (ORT: its allocator's Alloc)."""
        return np.empty(shape, dtype)

    def copy_into(self, buffer, value):
        """buffer[...] = value, of one shape and dtype (ORT: DataTransferManager::CopyTensor)."""
        check_copy_shape(buffer, value)
        np.copyto(buffer, value, casting="no")

    def from_host(self, array):
        """A copy of a host (numpy) array on this EP's device (ORT: IDataTransfer::CopyTensor)."""
        return np.array(array, copy=True)

    def to_host(self, value):
        return np.array(value, copy=True)

    def dtype_of(self, value):
        return value.dtype

    def synchronize(self):
        """Wait for queued device work (ORT: OnRunEnd with sync_stream); nothing to wait for on CPU."""

    def __repr__(self):
        return f"{type(self).__name__}(type={self.type!r}, device={self.device})"

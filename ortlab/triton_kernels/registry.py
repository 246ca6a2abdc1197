"""The kernel registry: kernels keyed by (op type, domain), added by a decorator.

Mirrors onnxruntime/core/framework/kernel_registry.cc (KernelRegistry::Register, which refuses
a second kernel for a key, and TryFindKernel). KERNELS is an ortlab.registry.Registry: a failed
lookup lists what is registered, like ORT's "Could not find an implementation for ..." but with
the alternatives; `KERNELS.using(key, cls)` swaps a kernel for the length of a `with` block.
ortlab's own kernels (ortlab.triton_kernels.ops) are registered on first use: `load_builtin_kernels`.
"""
import importlib

from ortlab.errors import OrtlabError
from ortlab.registry import NotRegisteredError, Registry


class KernelNotFound(NotRegisteredError):
    """No kernel is registered for an (op type, domain)."""


KERNELS = Registry("kernel", duplicates="error", error=KernelNotFound,
                   hint='An op outside the ONNX domain needs its domain (domain="com.microsoft"); '
                        "a new kernel is added with @register_kernel.")
_builtins_loaded = False


def load_builtin_kernels():
    """Register ortlab's own kernels, once: ortlab.env first (it sets TRITON_INTERPRET before
    Triton compiles anything), then every module of ortlab.triton_kernels.ops."""
    global _builtins_loaded
    if not _builtins_loaded:
        _builtins_loaded = True  # first, so that the op modules' own @register_kernel skip this
        importlib.import_module("ortlab.env")
        importlib.import_module("ortlab.triton_kernels.ops").load()


def register_kernel(cls=None, *, override=False):
    """Class decorator: `@register_kernel` adds a Kernel subclass under (op_type, domain).

    Registering a key twice raises unless override=True (a lab replacing a built-in) or it is the
    same class again (a notebook cell run twice).
    """
    def add(kernel_cls):
        if not kernel_cls.op_type:
            raise OrtlabError(f"{kernel_cls.__name__} sets no op_type")
        load_builtin_kernels()
        return KERNELS.register((kernel_cls.op_type, kernel_cls.domain), kernel_cls, override=override)

    return add(cls) if cls is not None else add


def unregister_kernel(op_type, domain=""):
    """Remove the kernel registered for (op_type, domain); returns it (None when there is none)."""
    load_builtin_kernels()
    return KERNELS.unregister(op_type, domain)


def get_kernel(op_type, domain=""):
    """The Kernel class registered for (op_type, domain); KernelNotFound lists the registered ones."""
    load_builtin_kernels()
    return KERNELS.lookup(op_type, domain)


def registered():
    """The registry as rows: op, domain, inputs, outputs, attributes, ORT CPU kernel, mirrors."""
    load_builtin_kernels()
    return [{"op": cls.op_type, "domain": cls.domain or "ai.onnx",
             "inputs": ", ".join(a.name + ("?" if a.optional else "") for a in cls.inputs),
             "outputs": ", ".join(a.name + ("?" if a.optional else "") for a in cls.outputs),
             "attributes": ", ".join(f"{k}={v!r}" for k, v in cls.attributes.items()),
             "ORT CPU kernel": "yes" if cls.ort_cpu else "no (CUDA only)",
             "mirrors": cls.mirrors}
            for cls in sorted(KERNELS.values(), key=lambda c: (c.domain, c.op_type))]

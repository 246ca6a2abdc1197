"""The kernel registry: kernels keyed by (op type, domain), added by a decorator.

Mirrors onnxruntime/core/framework/kernel_registry.cc (KernelRegistry::Register and
TryFindKernel). A failed lookup lists what is registered, like ORT's
"Could not find an implementation for ..." but with the alternatives.
"""
from ortlab.errors import OrtlabError

KERNELS = {}
MS_DOMAIN = "com.microsoft"


class KernelNotFound(OrtlabError):
    """No kernel is registered for an (op type, domain)."""


def key_of(op_type, domain=""):
    return op_type, ("" if domain in ("", "ai.onnx", None) else domain)


def register_kernel(cls=None, *, override=False):
    """Class decorator: `@register_kernel` adds a Kernel subclass under (op_type, domain).

    Registering a key twice raises unless override=True (a lab replacing a built-in).
    """
    def add(kernel_cls):
        key = key_of(kernel_cls.op_type, kernel_cls.domain)
        if not kernel_cls.op_type:
            raise OrtlabError(f"{kernel_cls.__name__} sets no op_type")
        if key in KERNELS and not override and KERNELS[key] is not kernel_cls:
            raise OrtlabError(f"a kernel for {describe(key)} is already registered "
                              f"({KERNELS[key].__name__}); pass override=True to replace it")
        KERNELS[key] = kernel_cls
        return kernel_cls

    return add(cls) if cls is not None else add


def unregister_kernel(op_type, domain=""):
    KERNELS.pop(key_of(op_type, domain), None)


def describe(key):
    op_type, domain = key
    return f"{domain or 'ai.onnx'}::{op_type}"


def get_kernel(op_type, domain=""):
    """The Kernel class registered for (op_type, domain)."""
    key = key_of(op_type, domain)
    if key not in KERNELS:
        same_name = [describe(k) for k in KERNELS if k[0] == op_type]
        hint = f" (registered under {', '.join(same_name)}: pass domain=)" if same_name else ""
        raise KernelNotFound(f"no ortlab kernel for {describe(key)}{hint}; registered: "
                             f"{', '.join(sorted(describe(k) for k in KERNELS))}")
    return KERNELS[key]


def registered():
    """The registry as rows: op, domain, inputs, outputs, attributes, ORT CPU kernel, mirrors."""
    return [{"op": cls.op_type, "domain": cls.domain or "ai.onnx",
             "inputs": ", ".join(a.name + ("?" if a.optional else "") for a in cls.inputs),
             "outputs": ", ".join(a.name + ("?" if a.optional else "") for a in cls.outputs),
             "attributes": ", ".join(f"{k}={v!r}" for k, v in cls.attributes.items()),
             "ORT CPU kernel": "yes" if cls.ort_cpu else "no (CUDA only)",
             "mirrors": cls.mirrors}
            for cls in sorted(KERNELS.values(), key=lambda c: (c.domain, c.op_type))]

"""Each execution provider's kernel registry, filled by `@register_op_kernel`.

Mirrors onnxruntime/core/framework/kernel_registry.cc: a KernelRegistry maps (op, domain) to
KernelCreateInfo (the KernelDef and a function creating the kernel); Register refuses a second
kernel for a key; TryFindKernel matches a node by op, domain and the kernel def's type
constraints. ORT's registrations are the ONNX_OPERATOR_KERNEL_EX macros of each EP
(onnxruntime/core/providers/cpu/cpu_execution_provider.cc lists the CPU EP's).
"""
from dataclasses import dataclass

import numpy as np

from ortlab.engine.errors import EngineError
from ortlab.ir.tensor_value import STAND_INS, dtype_name
from ortlab.ops.kernel_def import KernelDef
from ortlab.engine.op_kernel import FunctionKernel, OpKernel
from ortlab.onnx_defs import op_key
from ortlab.registry import Registry

CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class KernelCreateInfo:
    """A kernel definition and the OpKernel class that implements it."""

    kernel_def: KernelDef
    kernel_class: type

    def create(self, info):
        return self.kernel_class(info)


class KernelRegistry:
    """One EP's kernels by (op type, domain); `find(node)` is ORT's TryFindKernel."""

    def __init__(self, provider):
        self.provider = provider
        self.kernels = Registry(f"{provider} kernel", duplicates="error",
                                hint="Add one with @register_op_kernel(op, domain=..., provider=...).")
        self.replaced = {}  # key -> the kernels an override put behind it, oldest first

    def register(self, create_info, override=False):
        key = (create_info.kernel_def.op_type, create_info.kernel_def.domain)
        old = self.kernels.get(key)
        rerun = old is not None and _same_name(old.kernel_class, create_info.kernel_class)
        if old is not None and override and not rerun:
            self.replaced.setdefault(self.kernels.key(key), []).append(old)
        return self.kernels.register(key, create_info, override=override or rerun)

    def unregister(self, op_type, domain=""):
        """Remove the kernel registered last for (op, domain), and bring back the one it overrode, if any:
        in ORT a custom registry sits in front of the EP's built-in one, so removing a custom kernel leaves
        the built-in answering. Returns the removed KernelCreateInfo (None when there was none)."""
        removed = self.kernels.unregister(op_type, domain)
        key = self.kernels.key(op_type, domain)
        behind = self.replaced.get(key)
        if removed is not None and behind:
            self.kernels.register(key, behind.pop(), override=True)
        return removed

    def find(self, node, dtypes=()):
        """(KernelCreateInfo, None) for a node, or (None, why not)."""
        found = self.kernels.get(op_key(node.op_type, node.domain))
        if found is None:
            return None, "no kernel registered"
        mismatch = found.kernel_def.type_mismatch(dtypes)
        return (None, mismatch) if mismatch else (found, None)

    def __contains__(self, key):
        return key in self.kernels

    def __len__(self):
        return len(self.kernels)

    def known(self):
        return self.kernels.known()


def _same_name(a, b):
    """A notebook cell run twice defines a new class with the same module and qualified name."""
    return (a.__module__, a.__qualname__) == (b.__module__, b.__qualname__)


# Each EP's KernelRegistry by EP name. An EP gets its registry when it is registered (execution_provider.py)
# or first asks for it; register_op_kernel only files kernels under an EP that has one, so a misspelt
# provider name is refused (with the close match) instead of holding kernels no session ever asks for.
KERNEL_REGISTRIES = Registry("execution provider", op_keys=False, duplicates="replace",
                             hint="Register the EP first (@register_execution_provider on an ExecutionProvider "
                                  "subclass with that `type`), then its kernels.")
KERNEL_REGISTRIES.register(CPU, KernelRegistry(CPU))


def kernel_registry(provider):
    """The KernelRegistry of an EP by name (made empty on first use: an EP's own lookups)."""
    if provider not in KERNEL_REGISTRIES:
        KERNEL_REGISTRIES.register(provider, KernelRegistry(provider))
    return KERNEL_REGISTRIES[provider]


def registered_kernels(provider, where=""):
    """The KernelRegistry of an EP that exists; an unknown name is refused, naming the close match."""
    if not isinstance(provider, str):
        raise EngineError(f"provider must be an EP name (str) such as {CPU!r}, not {type(provider).__name__} "
                          f"{provider!r}")
    return KERNEL_REGISTRIES.lookup(provider, where=where)


def register_op_kernel(op_type, domain="", provider=CPU, *, override=False, **kernel_def):
    """Decorator: a function `fn(ctx)` or an OpKernel subclass becomes `provider`'s kernel for
    (op_type, domain). Keywords are KernelDef fields (type_constraints, alias, may_inplace,
    input_memory, ...), checked here as ORT's KernelDefBuilder would have them. `provider` must be a
    registered EP (a misspelt name is refused with the close match). A second kernel for a key raises
    unless override=True, as in ORT.

        @register_op_kernel("Relu", may_inplace=((0, 0),))
        def relu(ctx):
            x = ctx.input(0)
            np.maximum(x, 0, out=ctx.output(0, x.shape))
    """
    if not isinstance(op_type, str) or not op_type:
        raise EngineError(f"register_op_kernel needs an op type (str), got {op_type!r}")
    domain = "" if domain is None else domain  # None: the ONNX domain, as ortlab.triton_kernels takes it
    if not isinstance(domain, str):
        raise EngineError(f"register_op_kernel: domain must be a str ('' for ONNX, 'com.microsoft'), not {domain!r}")
    registry = registered_kernels(provider, where=f" (register_op_kernel({op_type!r}, provider={provider!r}))")
    unknown = sorted(set(kernel_def) - set(KERNEL_DEF_FIELDS))
    if unknown:
        raise EngineError(f"register_op_kernel: unknown keyword(s) {unknown}; a KernelDef takes "
                          f"{', '.join(KERNEL_DEF_FIELDS)}")
    fields = {name: KERNEL_DEF_FIELDS[name](name, value) for name, value in kernel_def.items()}
    definition = KernelDef(op_type, domain, provider, **fields)

    def add(fn_or_class):
        if isinstance(fn_or_class, type) and issubclass(fn_or_class, OpKernel):
            cls = fn_or_class
        elif callable(fn_or_class):
            cls = type(getattr(fn_or_class, "__name__", op_type), (FunctionKernel,),
                       {"fn": staticmethod(fn_or_class), "__module__": fn_or_class.__module__,
                        "__qualname__": getattr(fn_or_class, "__qualname__", op_type),
                        "__doc__": fn_or_class.__doc__})
        else:
            raise EngineError(f"register_op_kernel decorates a function fn(ctx) or an OpKernel subclass, "
                              f"not {type(fn_or_class).__name__}")
        registry.register(KernelCreateInfo(definition, cls), override=override)
        return fn_or_class

    return add


# --- the KernelDef keywords, checked (kernel_def_builder.h takes ints and type names; a Python call
# can pass anything, and a wrong value would only fail at session creation, or never be used) -------
def _index(value, what):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise EngineError(f"register_op_kernel: {what} must hold indices (ints >= 0), got {value!r}")
    return int(value)


def _indices(name, value):
    """input_memory / output_memory: a tuple of input (output) indices, e.g. (0,)."""
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (tuple, list)):
        raise EngineError(f"register_op_kernel: {name} takes a tuple of indices, e.g. (0,), not {value!r}")
    return tuple(_index(v, name) for v in value)


def _pair(name, value):
    if not isinstance(value, (tuple, list)) or len(value) != 2:
        raise EngineError(f"register_op_kernel: {name} takes (input index, output index) pairs, e.g. "
                          f"{name}=((0, 0),), not {value!r}")
    return _index(value[0], name), _index(value[1], name)


def _pairs(name, value):
    """alias / may_inplace: a tuple of (input, output) pairs, e.g. ((0, 0),) (ORT: Alias(0, 0))."""
    if isinstance(value, (str, bytes, dict)) or not isinstance(value, (tuple, list)) or \
            any(not isinstance(v, (tuple, list)) for v in value):
        raise EngineError(f"register_op_kernel: {name} takes a tuple of (input index, output index) pairs, "
                          f"e.g. {name}=((0, 0),) (a one-pair tuple needs its trailing comma), not {value!r}")
    return tuple(_pair(name, v) for v in value)


def _variadic_alias(name, value):
    """None, or (input offset, output offset) (ORT: VariadicAlias)."""
    return None if value is None else _pair(name, value)


def _since_version(name, value):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise EngineError(f"register_op_kernel: {name} must be an opset version (an int >= 1), not {value!r}")
    return int(value)


# the element types as the graph names them (NodeArg.dtype: numpy's name, or TensorProto's for a type numpy lacks)
DTYPE_NAMES = ("bool", "complex128", "complex64", "float16", "float32", "float64", "int16", "int32", "int64",
               "int8", "object", "uint16", "uint32", "uint64", "uint8", *sorted(map(dtype_name, STAND_INS)))


def _dtype_name(name):
    """A dtype name the graph uses ('float32'); a numpy spelling of one ('float', 'f4') names it."""
    if isinstance(name, str) and name in DTYPE_NAMES:
        return name
    try:
        meant = str(np.dtype(name))
    except (TypeError, ValueError):
        meant = None
    hint = f" (did you mean {meant!r}?)" if meant in DTYPE_NAMES else ""
    raise EngineError(f"register_op_kernel: type_constraints names {name!r}, which is not an element type "
                      f"as the graph names them{hint}; the kernel would match no input. Use one of "
                      f"{', '.join(DTYPE_NAMES)}")


def _type_constraints(name, value):
    """{input index: tuple of dtype names} (ORT: TypeConstraint); one name may be given as a str."""
    if not isinstance(value, dict):
        raise EngineError(f"register_op_kernel: type_constraints takes {{input index: ('float32', ...)}}, "
                          f"not {value!r}")
    found = {}
    for index, names in value.items():
        names = (names,) if isinstance(names, str) else names
        if not isinstance(names, (tuple, list, set, frozenset)) or not names:
            raise EngineError(f"register_op_kernel: type_constraints[{index!r}] takes a tuple of element type "
                              f"names, e.g. ('float32',), not {names!r}")
        found[_index(index, "type_constraints' keys")] = tuple(_dtype_name(n) for n in names)
    return found


KERNEL_DEF_FIELDS = {"since_version": _since_version, "type_constraints": _type_constraints, "alias": _pairs,
                     "variadic_alias": _variadic_alias, "may_inplace": _pairs, "input_memory": _indices,
                     "output_memory": _indices}


def unregister_op_kernel(op_type, domain="", provider=CPU):
    """Remove a registered kernel; returns its KernelCreateInfo (None when there was none)."""
    return registered_kernels(provider, where=" (unregister_op_kernel)").unregister(op_type, domain)

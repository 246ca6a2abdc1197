"""What a kernel declares about itself, as ORT's KernelDefBuilder records it.

Mirrors include/onnxruntime/core/framework/kernel_def_builder.h (KernelDef: op name, domain,
version range, provider, TypeConstraint, Alias, VariadicAlias, MayInplace, InputMemoryType,
OutputMemoryType). The partitioner reads the type constraints (can this kernel take this node?),
the memcpy transformer reads the memory types (a CPU input of a device kernel needs no copy), and
the allocation planner reads Alias / MayInplace (an output that may live in an input's buffer).
"""
from dataclasses import dataclass, field

CPU_MEMORY = "cpu"  # ORT's OrtMemTypeCPUInput / OrtMemTypeCPUOutput


@dataclass(frozen=True)
class KernelDef:
    """One kernel's declaration.

    type_constraints: {input index: tuple of numpy dtype names} the kernel accepts (none: any);
    alias: (input, output) pairs whose output IS the input's buffer (Reshape: (0, 0));
    variadic_alias: (input offset, output offset) for every input from the offset on, or None;
    may_inplace: (input, output) pairs that may share a buffer when the input dies here;
    input_memory / output_memory: indices of inputs / outputs in CPU memory on a device EP;
    external_outputs: the kernel allocates its outputs itself (ORT's ExternalOutputs, e.g. YieldOp).
    """

    op_type: str
    domain: str = ""
    provider: str = "CPUExecutionProvider"
    since_version: int = 1
    type_constraints: dict = field(default_factory=dict)
    alias: tuple = ()
    variadic_alias: tuple = None
    may_inplace: tuple = ()
    input_memory: tuple = ()
    output_memory: tuple = ()
    external_outputs: bool = False

    def is_input_on_cpu(self, index):
        return index in self.input_memory

    def is_output_on_cpu(self, index):
        return index in self.output_memory

    def type_mismatch(self, dtypes):
        """Why this kernel cannot take inputs of `dtypes` (one numpy dtype name or None per input),
        or None when it can (ORT's KernelRegistry::VerifyKernelDef)."""
        for index, allowed in self.type_constraints.items():
            if index < len(dtypes) and dtypes[index] is not None and dtypes[index] not in allowed:
                return f"input {index} is {dtypes[index]}, the kernel takes {', '.join(allowed)}"
        return None

    def describe(self):
        """The declaration in KernelDefBuilder's words, for tables."""
        parts = [f"TypeConstraint({i}: {'|'.join(t)})" for i, t in self.type_constraints.items()]
        parts += [f"Alias({i}, {o})" for i, o in self.alias]
        if self.variadic_alias:
            parts.append(f"VariadicAlias{tuple(self.variadic_alias)}")
        parts += [f"MayInplace({i}, {o})" for i, o in self.may_inplace]
        parts += [f"InputMemoryType(CPU, {i})" for i in self.input_memory]
        parts += [f"OutputMemoryType(CPU, {i})" for i in self.output_memory]
        return " ".join(parts) or "-"

"""The one registration of a CUDA C++ kernel: its .cu source and the op kernels that launch it.

ORT registers a CUDA kernel once, in the .cc file beside its .cu launch code
(ONNX_OPERATOR_KERNEL_EX in onnxruntime/core/providers/cuda/**, collected by
cuda_execution_provider.cc's kernel table). ortlab does the same per op family: one module of
ortlab/cuda/kernels/ (e.g. reduce_sum.py beside reduce_sum.cu) calls

    SOURCE = register_source(CudaSource(name, file, kernels, mirrors))      # the .cu file

    @register_cuda_op(op_type, domain, SOURCE, check=why_not)              # each op it serves
    def op(call, *inputs) -> outputs

check(spec) -> None or why not: what a partitioner asks before assigning a node (a NodeSpec).
run(call, *inputs) -> outputs: the launches, through call.launcher(source name) (the CPU runner, or
CuPy on a GPU), on arrays of the launcher's xp. Both tables are ortlab.registry Registries.
"""
from dataclasses import dataclass, field
from pathlib import Path

from ortlab.errors import OrtlabError
from ortlab.onnx_defs import op_name
from ortlab.registry import Registry

FOLDER = Path(__file__).parent
COMMON = "common.cuh"
MS = "com.microsoft"


class CudaOpError(OrtlabError):
    """A CUDA op kernel refused its inputs or attributes (the message says which and why)."""


@dataclass(frozen=True)
class CudaSource:
    """One registered .cu file: the kernels it defines and the ORT sources it mirrors."""

    name: str
    file: str
    kernels: tuple
    mirrors: tuple


SOURCES = Registry("CUDA source", op_keys=False, hint="Each .cu file of ortlab/cuda/kernels is registered "
                   "by the Python module beside it.")


def register_source(entry):
    """Add a CudaSource to SOURCES (its file must exist in ortlab/cuda/kernels); returns it."""
    if entry.name in SOURCES:
        raise OrtlabError(f"a CUDA source named {entry.name!r} is already registered")
    if not (FOLDER / entry.file).is_file():
        raise OrtlabError(f"CUDA source {entry.file!r} is not in {FOLDER}")
    return SOURCES.register(entry.name, entry)


def source(name):
    """The CUDA C++ text of registered source `name`: common.cuh, then its .cu file."""
    if name not in SOURCES:
        raise OrtlabError(f"no CUDA source named {name!r}; registered: {sorted(SOURCES)}")
    return (FOLDER / COMMON).read_text() + "\n" + (FOLDER / SOURCES[name].file).read_text()


@dataclass(frozen=True)
class NodeSpec:
    """What a partitioner knows of a node before running it: attributes, each input's dtype name and
    rank (None where unknown or absent), the values of constant inputs ({index: array}), the opset."""

    attributes: dict
    dtypes: tuple = ()
    ranks: tuple = ()
    constants: dict = field(default_factory=dict)
    opset: int = 17

    def dtype(self, i):
        return self.dtypes[i] if i < len(self.dtypes) else None

    def rank(self, i):
        return self.ranks[i] if i < len(self.ranks) else None


@dataclass(frozen=True)
class CudaOp:
    """A registered op: the name of its .cu source, check(spec) and run(call, *inputs)."""

    op_type: str
    domain: str
    source: str
    check: object
    run: object


OPS = Registry("CUDA op kernel", hint="Each is registered beside its .cu file in ortlab/cuda/kernels.")


def register_cuda_op(op_type, domain, cuda_source, check):
    """Decorator of `run(call, *inputs)`: the op kernel of op_type in `domain`, launching the kernels of
    `cuda_source` (a registered CudaSource), declining what check(spec) names."""
    if cuda_source.name not in SOURCES:
        raise OrtlabError(f"{op_name(op_type, domain)}: register its CUDA source {cuda_source.name!r} first")

    def add(run):
        if (op_type, domain) in OPS:
            raise OrtlabError(f"a CUDA op kernel for {domain or 'ai.onnx'}:{op_type} is already registered")
        OPS.register((op_type, domain), CudaOp(op_type, domain, cuda_source.name, check, run))
        return run
    return add


def registered(op_type, domain):
    """The CudaOp registered for (op_type, domain) ('' and 'ai.onnx' both name ONNX's domain), or None."""
    return OPS.get((op_type, domain or ""))

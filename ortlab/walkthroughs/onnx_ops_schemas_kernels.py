"""L0_04: which kernel registry runs an op, asked of the installed ORT and read from ORT's sources.

ORT's CPU EP merges three kernel registries (cpu_execution_provider.cc's RegisterCPUKernels):
the ONNX kernels (onnxruntime/core/providers/cpu/cpu_execution_provider.cc), the contrib kernels
(onnxruntime/contrib_ops/cpu/cpu_contrib_kernels.cc, built unless DISABLE_CONTRIB_OPS) and the
training kernels (orttraining/orttraining/training_ops/cpu/cpu_training_kernels.cc, built with
ENABLE_TRAINING_OPS); the CUDA EP has the same three (cuda_execution_provider.cc,
cuda_contrib_kernels.cc, cuda_training_kernels.cc). The Python wheel cannot list them:
`get_all_opkernel_def` is compiled only with onnxruntime_PYBIND_EXPORT_OPSCHEMA
(onnxruntime/python/onnxruntime_pybind_schema.cc), which release wheels leave out.

So `who_runs` asks the installed ORT what it does with a one-node model on the CPU EP, with every
graph optimization off: a kernel runs the node as it is; without one, ORT expands the op's function
body into other ops (the graph saved by optimized_model_filepath shows them) or refuses the model.
`REGISTRY_ROWS` says in which source file each op's kernel is registered, CPU and CUDA: that part is
read from ORT's sources (this wheel has no CUDA EP to ask).
"""
from dataclasses import dataclass

from onnx import TensorProto

from ortlab.errors import OrtlabError
from ortlab.onnx_defs import one_node_model
from ortlab.session import SessionError, optimized_model

F, D, I32, I64 = TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.INT32, TensorProto.INT64
MS = "com.microsoft"
# where each registry lives, CPU and CUDA (paths in the onnxruntime repository)
REGISTRY_FILES = {
    "ONNX": ("onnxruntime/core/providers/cpu/cpu_execution_provider.cc",
             "onnxruntime/core/providers/cuda/cuda_execution_provider.cc"),
    "contrib": ("onnxruntime/contrib_ops/cpu/cpu_contrib_kernels.cc",
                "onnxruntime/contrib_ops/cuda/cuda_contrib_kernels.cc"),
    "training": ("orttraining/orttraining/training_ops/cpu/cpu_training_kernels.cc",
                 "orttraining/orttraining/training_ops/cuda/cuda_training_kernels.cc"),
}


class RegistryError(OrtlabError):
    """An op was asked about with inputs a one-node model cannot be built from."""


@dataclass(frozen=True)
class Probe:
    """One op to ask about: its domain, the default-domain opset, the input types, attributes, outputs."""

    op: str
    domain: str = ""
    opset: int = 17
    inputs: tuple = (F,)
    attributes: tuple = ()
    outputs: int = 1

    def label(self):
        where = "ai.onnx" if not self.domain else self.domain
        types = ", ".join(TensorProto.DataType.Name(t).lower() for t in self.inputs)
        version = f"opset {self.opset}" if not self.domain else "version 1"
        return f"{self.op} ({where}, {version}; {types})"


# (registry whose source file registers the CPU kernel, probe, registry whose file registers the CUDA kernel)
REGISTRY_ROWS = [
    ("ONNX", Probe("MatMul", inputs=(F, F)), "ONNX"),
    ("ONNX", Probe("LayerNormalization", opset=17, inputs=(F, F, F)), "ONNX"),
    ("contrib", Probe("Gelu", MS), "contrib"),
    ("contrib", Probe("FusedMatMul", MS, inputs=(F, F)), "contrib"),
    ("contrib", Probe("LayerNormalization", opset=14, inputs=(F, F, F)), "contrib"),
    ("training", Probe("GeluGrad", MS, inputs=(F, F)), "training"),
    ("training", Probe("SoftmaxCrossEntropyLoss", opset=13, inputs=(F, I64)), "training"),
    ("training", Probe("SoftmaxCrossEntropyLossInternal", MS, inputs=(F, I64), outputs=2), "training"),
]


def _check(probe):
    if not isinstance(probe, Probe):
        raise RegistryError(f"who_runs takes a Probe(op, domain, opset, inputs, ...), not {type(probe).__name__}")
    names = {v for k, v in vars(TensorProto).items() if k.isupper() and isinstance(v, int)}
    bad = [t for t in probe.inputs if t not in names]
    if not probe.inputs or bad:
        raise RegistryError(f"{probe.op}: inputs must be a non-empty tuple of onnx.TensorProto element types "
                            f"(e.g. TensorProto.FLOAT), got {probe.inputs!r}")


def who_runs(probe):
    """What ORT's CPU EP does with a one-node model of `probe`, every graph optimization off.

    Returns ('kernel', [op]) when a registered kernel runs the node as it is, ('function body', [ops])
    when ORT expanded the op into the ops of its function body (no kernel for these types),
    ('no kernel', [ORT's message]) when ORT found no kernel for the node or for an op of its body, or
    ('invalid', [ORT's message]) when no schema accepts the node (an unknown op, a type it refuses).
    """
    _check(probe)
    model = one_node_model(probe.op, [(t, None) for t in probe.inputs], dict(probe.attributes), probe.domain,
                           probe.opset, probe.outputs)
    try:
        graph = optimized_model(model, level="disable", providers=["CPUExecutionProvider"]).graph
    except SessionError as exc:
        message = str(exc).strip()
        if "Could not find an implementation" in message:
            return "no kernel", [message.split(" : ")[-1].strip()]
        cut = message.index("No Op registered") if "No Op registered" in message else None
        return "invalid", [message[cut:] if cut is not None else message.split(" : ")[-1].strip()]
    ops = [node.op_type for node in graph.node]
    if ops == [probe.op]:
        return "kernel", ops
    return "function body", ops


def describe(probe):
    """who_runs in one line: a kernel, the function body's ops, or why ORT refused the node."""
    answer, detail = who_runs(probe)
    if answer == "kernel":
        return "a CPU kernel runs it"
    if answer == "function body":
        return f"no CPU kernel: expanded into its function body, {len(detail)} ops ({', '.join(detail[:4])}, ...)"
    if answer == "invalid":
        return f"refused before any kernel is looked for: {detail[0]}"
    if f"implementation for {probe.op}(" in detail[0]:
        return f"no CPU kernel: {detail[0]}"
    return f"no CPU kernel: ORT expanded its function body, then found no kernel for one of its ops: {detail[0]}"


def registry_rows(rows=REGISTRY_ROWS):
    """One row per op: what the installed ORT does on CPU, and the registry files (CPU, CUDA) it is in."""
    table = []
    for registry, probe, cuda in rows:
        answer, _ = who_runs(probe)
        table.append({"op": probe.label(), "CPU, asked of ORT 1.19.2": answer,
                      "CPU registry (source)": REGISTRY_FILES[registry][0].rsplit("/", 1)[-1],
                      "CUDA registry (source, not run)": REGISTRY_FILES[cuda][1].rsplit("/", 1)[-1]})
    return table

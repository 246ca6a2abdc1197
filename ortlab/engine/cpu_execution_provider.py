"""The CPU execution provider: every ai.onnx op through onnx.reference, every com.microsoft op
through ortlab's one numpy reference per op, and explicit kernels where ORT differs.

Mirrors onnxruntime/core/providers/cpu/cpu_execution_provider.cc (the CPU EP's kernel
registrations). A kernel registered with `@register_op_kernel(..., provider="CPUExecutionProvider")`
wins; otherwise the EP creates a ReferenceKernel around the op's onnx.reference implementation
(ortlab.ops.contrib_ops.CONTRIB_OPS for ORT's own ops). onnx.reference is not ORT: where
the two compute differently, ortlab.engine.cpu_kernels registers ORT's behaviour explicitly.
"""
import dataclasses
import functools

import numpy as np

from onnx.reference import ReferenceEvaluator
from onnx.reference.op_run import OpRun, RuntimeContextError
from onnx.reference.ops import load_op
from onnx.reference.ops._op import OpRunBinaryNum, OpRunBinaryNumpy
from onnx.reference.ops.aionnxml import load_op as load_ml_op

from ortlab.engine.execution_provider import ExecutionProvider, OrtDevice, register_execution_provider
from ortlab.ops.contrib_ops import CONTRIB_OPS
from ortlab.ops.kernel_def import KernelDef
from ortlab.engine.kernel_registry import CPU, KernelCreateInfo
from ortlab.engine.op_kernel import OpKernel
from ortlab.ir.tensor_value import bfloat16_in_int32_data
from ortlab.ops.kernel_declarations import ORT_CPU_KERNEL_DECLARATIONS, ort_declaration
from ortlab.transformers.session_transforms import FUNCTION_BODIES, has_function_body
from ortlab.onnx_defs import DEFAULT_OPSET, op_key

# What ORT's CPU kernels declare beyond types (Alias, MayInplace), by op and opset: one table, ORT's,
# shared with the allocation planner (ortlab.ops.kernel_declarations, which names the ORT files).
# ORT_CPU_DECLARATIONS is that table at the default opset, for display.
ORT_CPU_DECLARATIONS = {op: decl for (domain, op), ranges in ORT_CPU_KERNEL_DECLARATIONS.items() if domain == ""
                        for first, last, decl in ranges
                        if first <= DEFAULT_OPSET and (last is None or DEFAULT_OPSET <= last)}


def _run_params(opsets):
    """What onnx.reference gives an OpRun when it creates one (ReferenceEvaluator._init). Its new_ops are what
    the bodies of If, Loop and Scan run with: the contrib ops, and ORT's answers (REFERENCE_OVERRIDES) at these
    opsets, so that a node computes the same inside a subgraph as outside."""
    version = opsets.get("", opsets.get("ai.onnx", 0))
    overrides = {("", op): _named_for(op, cls) for (op, first, last), cls in REFERENCE_OVERRIDES.items()
                 if first <= version <= last}
    return {"log": lambda *args: None, "opsets": opsets, "verbose": 0,
            "new_ops": {**{(cls.op_domain, name): cls for (name, _), cls in CONTRIB_OPS.items()}, **overrides},
            "existing_functions": {}, "evaluator_cls": ReferenceEvaluator}


@functools.lru_cache(maxsize=None)
def _named_for(op_type, op_class):
    """`op_class` under the name `op_type` in ONNX's domain: onnx.reference keys a new op by its class name."""
    return type(op_type, (op_class,), {"op_domain": "", "__module__": op_class.__module__})


# (op_type, first opset, last opset) -> an OpRun class computing ORT's answer where onnx.reference's
# differs, for an ai.onnx op at those opsets only; the node keeps ORT's CPU KernelDef for its opset
# (ortlab.ops.kernel_declarations), as a kernel from register_op_kernel, fixed for every opset, would not.
REFERENCE_OVERRIDES = {}


def override_reference_op(op_type, first, last):
    """Decorator: an OpRun class replaces onnx.reference's for ai.onnx `op_type` at opsets first..last."""
    def add(op_class):
        REFERENCE_OVERRIDES[(op_type, first, last)] = op_class
        return op_class
    return add


def _override(node, opsets):
    """The override registered for `node`'s op at its opset, or None."""
    if node.domain not in ("", "ai.onnx"):
        return None
    version = opsets.get("", opsets.get("ai.onnx", 0))
    return next((cls for (op, first, last), cls in REFERENCE_OVERRIDES.items()
                 if op == node.op_type and first <= version <= last), None)


def reference_op_class(node, opsets, input_types=None):
    """The OpRun class onnx.reference would run for `node` (or ORT's answer, where overridden), or None."""
    found = CONTRIB_OPS.get(op_key(node.op_type, node.domain)) or _override(node, opsets)
    if found is not None:
        return found
    if node.domain == "ai.onnx.ml":
        try:
            return load_ml_op("ai.onnx.ml", node.op_type, opsets.get("ai.onnx.ml"), evaluator_cls=ReferenceEvaluator)
        except Exception:  # noqa: BLE001 (no such op or version)
            return None
    if node.domain not in ("", "ai.onnx"):
        return None
    try:
        return load_op("", node.op_type, opsets.get("", opsets.get("ai.onnx")), evaluator_cls=ReferenceEvaluator,
                       **({"node": node.to_proto(), "input_types": input_types} if input_types else {}))
    except RuntimeContextError:
        return None if input_types else _context_dependent(node, opsets)
    except Exception:  # noqa: BLE001 (onnx raises several types for "no such op or version")
        return None


def _context_dependent(node, opsets):
    """An op whose onnx.reference implementation depends on its input types (a function body)."""
    types = [node.graph.node_arg(a.name).type_proto if a.exists() else None for a in node.inputs]
    return None if any(t is None for t in types) else reference_op_class(node, opsets, types)


class ReferenceKernel(OpKernel):
    """A kernel that runs the node's onnx.reference implementation (created once, with the
    node's attributes bound, as onnx.reference's own evaluator does)."""

    def __init__(self, info, op_class=None):
        super().__init__(info)
        node = info.node
        opsets = dict(node.graph.opset_imports)
        op_class = op_class or reference_op_class(node, opsets)
        self.op = op_class(_bfloat16_readable(node.to_proto()), _run_params(opsets))
        self.needs_context = isinstance(self.op, OpRun) and self.op.need_context()
        self.run_op = op_runner(self.op)
        if getattr(self.op, "reads_output_shapes", False):  # as ORT's kernels read their OutputDefs' shapes
            self.op.output_shapes = [node.graph.node_arg(o.name).shape if o.exists() else None for o in node.outputs]

    def compute(self, ctx):
        args = ctx.inputs()
        return self.run_op(*args, context=ctx.implicit()) if self.needs_context else self.run_op(*args)


def op_runner(op):
    """How ReferenceKernel calls its OpRun `op` on every run: `op.run`, or the same without what op.run
    re-checks on every call although it is fixed for the session. OpRun.run checks each time whether the node
    needs a context, has linked attributes and has each of its attributes; here that is checked once, when the
    kernel is created (as ORT's kernels read and check their attributes in their constructor), and each run
    calls `_run` with the attributes, then checks its outputs (`_check_and_fix_outputs`). The binary numeric ops
    (Add, Mul, MatMul...) check their inputs' types on each run, as OpRunBinaryNum.run does; anything unusual
    (a custom element type, a type mismatch, a failure) goes through op.run itself, with its own message."""
    cls = type(op)
    if not isinstance(op, OpRun) or op.has_linked_attribute or op.has_subgraph:
        return op.run
    if cls.run is OpRunBinaryNum.run:
        return _binary_runner(op)
    names = tuple(getattr(op, "attributes_names_", ()))
    if cls.run is not OpRun.run or not all(hasattr(op, name) for name in names):
        return op.run
    plain_check = cls._check_and_fix_outputs is OpRun._check_and_fix_outputs

    def run(*args, context=None):
        kwargs = {name: getattr(op, name) for name in names}
        if context is not None:
            kwargs["context"] = context
        try:
            results = op._run(*args, **kwargs)
        except (TypeError, AttributeError) as exc:  # as OpRun.run reports them
            raise TypeError(f"Issues with types {[type(a) for a in args]} and attributes {sorted(kwargs)} and "
                            f"linked attributes=[] (operator {cls.__name__!r}).") from exc
        if plain_check and type(results) is tuple and len(results) == 1 and type(results[0]) is np.ndarray:
            return results  # one array: what _check_and_fix_outputs would return
        return op._check_and_fix_outputs(results)
    return run


def _binary_runner(op):
    """OpRunBinaryNum.run for plain numpy inputs of one type: `_run` (the numpy function itself for
    OpRunBinaryNumpy), the result checked to keep the inputs' type."""
    numpy_fct = op.numpy_fct if type(op)._run is OpRunBinaryNumpy._run else None

    def run(x, y):
        if x is None or y is None or x.dtype != y.dtype or x.dtype.kind not in "biufc" or x.dtype.names:
            return op.run(x, y)
        try:
            result = numpy_fct(x, y) if numpy_fct is not None else op._run(x, y)[0]
        except (TypeError, ValueError):
            return op.run(x, y)  # fails again, with onnx.reference's message
        if not isinstance(result, np.ndarray) or result.dtype != x.dtype:
            return op.run(x, y)
        return (result,)
    return run


def _bfloat16_readable(node_proto):
    """`node_proto` with every BFLOAT16 initializer of its subgraphs, nested ones included, in int32_data, which
    onnx.reference reads right (from raw_data it reads uninitialized memory, silently: ortlab.ir.tensor_value)."""
    for attribute in node_proto.attribute:
        for graph in [attribute.g] if attribute.type == attribute.GRAPH else attribute.graphs:
            for tensor in graph.initializer:
                readable = bfloat16_in_int32_data(tensor)
                if readable is not tensor:
                    tensor.CopyFrom(readable)
            for node in graph.node:
                _bfloat16_readable(node)
    return node_proto


@register_execution_provider
class CPUExecutionProvider(ExecutionProvider):
    """ORT's default EP: host memory, numpy arrays; always last in the provider list."""

    type = CPU
    ort_equivalent = CPU
    device = OrtDevice("CPU", 0, "host memory")

    def find_kernel(self, node, dtypes=()):
        missing = ort_lacks_kernel(node)
        if missing:
            return None, missing
        if has_function_body(node) and ((node.domain, node.op_type) in FUNCTION_BODIES or _input_types_known(node)):
            return None, "ORT's CPU EP has no kernel for it: the partitioner inlines its function body"
        found, why = self.kernel_registry().find(node, dtypes)  # (an ONNX function whose input types are
        if found is not None or why != "no kernel registered":  # unknown, which ONNX cannot build: run as is)
            return found, why
        op_class = reference_op_class(node, dict(node.graph.opset_imports))
        if op_class is None:
            return None, "neither a registered kernel nor an onnx.reference implementation"
        kernel_def = dataclasses.replace(ort_declaration(node), provider=CPU)
        return KernelCreateInfo(kernel_def, ReferenceKernel), None


# ORT 1.19.2's CPU EP registers these ai.onnx ops from this opset on only: their older forms (consumed_inputs
# before 6; the broadcast and axis attributes of the binary ops, and Gemm's, PRelu's and BatchNormalization's
# older forms, before 7) have no kernel, and ORT refuses the node (NOT_IMPLEMENTED) when it creates the session.
# onnx.reference runs them with the newest rule (Add(broadcast=1, axis=0) broadcast along the last axis).
# ORT: onnxruntime/core/providers/cpu/cpu_execution_provider.cc (the ONNX_CPU_OPERATOR_VERSIONED_KERNEL lists).
ORT_CPU_KERNELS_FROM = {
    **{op: 6 for op in ("Abs", "Ceil", "Elu", "Exp", "Floor", "HardSigmoid", "LeakyRelu", "Log", "Max", "Mean",
                        "Min", "Neg", "Reciprocal", "Relu", "Selu", "Sigmoid", "Sqrt", "Sum", "Tanh")},
    **{op: 7 for op in ("Add", "Sub", "Mul", "Div", "Pow", "Greater", "Less", "And", "Or", "Xor", "PRelu", "Gemm",
                        "BatchNormalization")},
}


def ort_lacks_kernel(node):
    """Why ORT's CPU EP has no kernel for `node` at its opset (ORT_CPU_KERNELS_FROM), or None."""
    first = ORT_CPU_KERNELS_FROM.get(node.op_type) if node.domain in ("", "ai.onnx") else None
    version = node.since_version if first else None
    if version is None or version >= first:
        return None
    return (f"ORT 1.19.2's CPU EP has no kernel for {node.op_type}({version}), the form before opset {first} "
            f"(ORT: 'Could not find an implementation for {node.op_type}({version}) node'); import opset {first} "
            "or later, where the node means what ONNX says today")


def _input_types_known(node):
    """True when the graph knows the type of every input of `node` (what ONNX needs to build its function body)."""
    args = [node.graph.node_arg(a.name) for a in node.inputs if a.exists()]
    return all(arg is not None and arg.type_proto is not None for arg in args)


def declaration(node):
    """The KernelDef ortlab's CPU EP gives `node`, for the allocation planner (`plan(..., declarations=
    declaration)`): what the engine would run, where ortlab.ops.kernel_declarations is ORT's table."""
    dtypes = tuple(node.graph.node_arg(a.name).dtype if a.exists() and node.graph.node_arg(a.name) else None
                   for a in node.inputs)
    found, _ = CPUExecutionProvider().find_kernel(node, dtypes)
    return KernelDef(node.op_type, node.domain) if found is None else found.kernel_def

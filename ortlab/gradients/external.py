"""Gradient definitions written in Python and registered into ORT's own C++ gradient builder.

Mirrors orttraining/orttraining/python/training/ortmodule/_custom_gradient_registry.py (the
tuple format) and GetExternalGradient in orttraining/orttraining/core/graph/gradient_builder.cc
(how ORT expands it). A definition is a list of node tuples
`(op_type or (op_type, domain), inputs, outputs, attributes)` whose inputs name the forward
node's values as "I(i)", "O(i)", "GO(i)" and whose outputs write "GI(i)"; other names are
intermediates. Attributes are `{name: {"value": v, "dtype": "int"|"float"|"string"|
"IElemType(i)"|"OElemType(i)", "is_tensor": bool}}`.

`gradient_definition(builder, ...)` traces an ortlab builder into that format, so one Python
function serves both builders; `register_ort_gradient` hands a definition to
`onnxruntime.capi._pybind_state.register_gradient_definition`. ORT checks such a registration
before its built-in builders, and keeps the first definition registered for an op in a process.
"""
import json
import re
from types import SimpleNamespace

import numpy as np
from onnx import AttributeProto, helper

from ortlab.env import quiet_import
from ortlab.gradients.builder_base import GradientBuilderBase
from ortlab.gradients.ort import OrtGradientError
from ortlab.gradients.registry import get_gradient_builder, stop_edges
from ortlab.onnx_defs import domain_of

_REGISTERED = {}  # "domain::op_type" -> the definition handed to ORT in this process


class _Arg(SimpleNamespace):
    def exists(self):
        return True


class _ForwardNode:
    """A stand-in forward node whose values are ORT's placeholders I(i) and O(i)."""

    def __init__(self, op_type, domain, num_inputs, num_outputs, attributes):
        self.op_type, self.domain, self.name, self.index = op_type, domain, op_type, 0
        self.inputs = [_Arg(name=f"I({i})") for i in range(num_inputs)]
        self.outputs = [_Arg(name=f"O({i})") for i in range(num_outputs)]
        self._attributes = dict(attributes or {})

    def attribute(self, name, default=None):
        return self._attributes.get(name, default)


class SymbolicGradientBuilder(GradientBuilderBase):
    """A builder's view in which nothing is known about shapes and types: what ORT's external
    gradient definitions can express. Shape-dependent helpers take their dynamic path."""

    def __init__(self, node):
        self.graph, self.node, self.emitted, self.initializers = None, node, [], {}
        self.prefix, self._counts = "", {}
        self._required = set(range(len(node.inputs))) - stop_edges(node.op_type, node.domain)

    def I(self, i):  # noqa: E743 (ORT's name)
        return f"I({i})"

    def O(self, i):  # noqa: E743 (ORT's name)
        return f"O({i})"

    def GO(self, i):
        return f"GO({i})" if i < len(self.node.outputs) else None

    def GI(self, i):
        return f"GI({i})"

    def IA(self, suffix):
        k = self._counts[suffix] = self._counts.get(suffix, -1) + 1
        return suffix if k == 0 else f"{suffix}_{k}"

    def shape(self, name):
        return None

    def elem_type(self, name):
        return None

    def constant(self, value, like=None, dtype=None):
        """A Constant node: a float scalar typed like `like`, or a 1-D int64 tensor (axes)."""
        value = np.asarray(value, dtype=dtype)
        match = re.fullmatch(r"(I|O|GO)\((\d+)\)", like or "")
        if value.dtype.kind in "iu":
            attr = {"value": [int(v) for v in value.ravel()] if value.ndim else int(value),
                    "dtype": "int", "is_tensor": True}
        elif value.ndim == 0:
            kind = "I" if match is None or match.group(1) == "I" else "O"
            index = match.group(2) if match else "0"
            attr = {"value": float(value), "dtype": f"{kind}ElemType({index})", "is_tensor": True}
        else:
            raise OrtGradientError("ORT's gradient definitions hold scalar float constants and "
                                   f"1-D int constants only, not a float tensor of shape {value.shape}")
        return self.emit("Constant", [], [self.IA("const")], _ort_value=attr)

    def emit(self, op_type, inputs, outputs=None, domain="", _ort_value=None, **attributes):
        unknown = [k for k, v in attributes.items() if v is None]
        if unknown or any(i is None for i in inputs):
            raise OrtGradientError(f"the {self.node.op_type} builder emits {op_type} with an input or "
                                   f"attribute {unknown or ''} that depends on static types or shapes, "
                                   "which ORT's gradient definitions cannot see")
        outputs = outputs or [self.IA(op_type.lower())]
        node = helper.make_node(op_type, list(inputs), list(outputs), domain=domain or None, **attributes)
        node.doc_string = json.dumps(_ort_value) if _ort_value else ""
        self.emitted.append(node)
        return outputs[0] if len(outputs) == 1 else outputs


def _attribute(attr):
    """An onnx AttributeProto in ORT's definition format."""
    value = helper.get_attribute_value(attr)
    kinds = {AttributeProto.INT: "int", AttributeProto.INTS: "int", AttributeProto.FLOAT: "float",
             AttributeProto.STRING: "string"}
    if attr.type not in kinds:
        raise OrtGradientError(f"attribute {attr.name!r} is a {AttributeProto.AttributeType.Name(attr.type)}; "
                               "ORT's gradient definitions hold int, ints, float and string attributes")
    if attr.type == AttributeProto.STRING:
        value = value.decode()
    elif attr.type == AttributeProto.INTS:
        value = [int(v) for v in value]
    return {"value": value, "dtype": kinds[attr.type]}


def _name_gradients(nodes, grads):
    """Make the builder's returned names the GI(i) outputs (renaming, or an Identity)."""
    for i, name in enumerate(grads):
        if name is None or name == f"GI({i})":
            continue
        producers = [n for n in nodes if name in n.output]
        read = any(name in n.input for n in nodes) or any(g == name for j, g in enumerate(grads) if j != i)
        if producers and not read:
            outputs = producers[0].output
            outputs[list(outputs).index(name)] = f"GI({i})"
        else:
            nodes.append(helper.make_node("Identity", [name], [f"GI({i})"]))


def gradient_definition(builder, op_type, domain="", num_inputs=1, num_outputs=1, attributes=None):
    """Trace `builder` (an ortlab builder function, or the name of a registered op) into ORT's
    gradient-definition format for a forward node with the given inputs, outputs, attributes."""
    if isinstance(builder, str):
        builder = get_gradient_builder(builder, domain)
    node = _ForwardNode(op_type, domain_of(domain), num_inputs, num_outputs, attributes)
    b = SymbolicGradientBuilder(node)
    try:
        grads = (list(builder(b) or []) + [None] * num_inputs)[:num_inputs]
    except (AttributeError, TypeError) as exc:
        raise OrtGradientError(f"the {op_type} builder needs what ORT's gradient definitions cannot "
                               f"see (static shapes, ranks, types or the opset): {exc}") from None
    _name_gradients(b.emitted, grads)
    definition = []
    for n in b.emitted:
        op = n.op_type if not n.domain else (n.op_type, n.domain)
        attrs = {"value": json.loads(n.doc_string)} if n.doc_string else {a.name: _attribute(a) for a in n.attribute}
        definition.append((op, list(n.input), list(n.output), attrs))
    return definition


def _node_definitions(capi, definition):
    """ORT's GradientNodeDefinition objects for a definition in tuple format."""
    result = []
    for entry in definition:
        op, inputs, outputs = entry[:3]
        node = capi.GradientNodeDefinition()
        node.op_type, node.domain = (op, "") if isinstance(op, str) else op
        node.inputs, node.outputs = list(inputs), list(outputs)
        attributes = []
        for name, spec in (entry[3] if len(entry) > 3 else {}).items():
            attr = capi.GradientNodeAttributeDefinition()
            attr.name, attr.value_json, attr.dtype = name, json.dumps(spec["value"]), spec["dtype"]
            attr.is_tensor = bool(spec.get("is_tensor", False))
            attributes.append(attr)
        node.attributes = attributes
        result.append(node)
    return result


def register_ort_gradient(op_type, definition, domain="", **trace):
    """Register a gradient for `op_type` into ORT's C++ gradient builder (this process only).

    `definition` is a list in ORT's tuple format or an ortlab builder function (traced with
    `gradient_definition(builder, op_type, domain, **trace)`). Returns the definition.
    """
    if callable(definition):
        definition = gradient_definition(definition, op_type, domain, **trace)
    key = f"{domain_of(domain)}::{op_type}"
    if key in _REGISTERED:
        if _REGISTERED[key] == definition:
            return definition
        raise OrtGradientError(
            f"a different gradient for {key} is already registered in ORT in this process, and ORT "
            "keeps the first one (its registry ignores later registrations): restart the kernel "
            "(Kernel > Restart) and register the corrected definition once")
    capi = quiet_import("onnxruntime.capi._pybind_state")
    capi.register_gradient_definition(key, _node_definitions(capi, definition))
    _REGISTERED[key] = definition
    return definition


def _check_definition(definition):
    """Say what is wrong with a hand-written definition before ORT sees it."""
    if not isinstance(definition, (list, tuple)) or not definition:
        raise OrtGradientError("a gradient definition is a non-empty list of node tuples, "
                               f"not {type(definition).__name__}")
    seen = set()
    for k, entry in enumerate(definition):
        if not isinstance(entry, (list, tuple)) or len(entry) not in (3, 4):
            raise OrtGradientError(f"node {k}: expected (op_type, inputs, outputs[, attributes]), got {entry!r}")
        inputs, outputs = entry[1], entry[2]
        if isinstance(inputs, str) or isinstance(outputs, str):
            raise OrtGradientError(f"node {k} ({entry[0]}): inputs and outputs are lists of strings, "
                                   f"e.g. ['GO(0)'], not {inputs!r} / {outputs!r}")
        for name in inputs:
            if name and not re.fullmatch(r"(I|O|GO)\(\d+\)", name) and name not in seen:
                raise OrtGradientError(f"node {k} ({entry[0]}) reads {name!r}, which is neither I(i), O(i), "
                                       "GO(i) nor the output of an earlier node of the definition")
        for name in outputs:
            if re.fullmatch(r"(I|O|GO)\(\d+\)", name):
                raise OrtGradientError(f"node {k} ({entry[0]}) writes {name!r}: a definition writes GI(i) "
                                       "(the gradients of the forward inputs) and intermediates only")
        seen.update(outputs)
    if not any(re.fullmatch(r"GI\(\d+\)", name) for entry in definition for name in entry[2]):
        raise OrtGradientError("no node writes a gradient: name an output 'GI(0)' (the gradient of input 0)")


def builder_from_definition(definition):
    """An ortlab builder that emits the nodes of a definition in ORT's format, so a hand-written
    definition can be checked with ortlab before it goes into ORT (where it cannot be replaced)."""
    _check_definition(definition)

    def builder(b):
        names, grads = {}, [None] * len(b.node.inputs)

        def placeholder(kind, index):
            count = len(b.node.inputs) if kind in ("I", "GI") else len(b.node.outputs)
            if index >= count:
                raise OrtGradientError(f"the definition names {kind}({index}), but {b.node.op_type} has "
                                       f"{count} {'input' if kind in ('I', 'GI') else 'output'}(s), counted from 0")
            return getattr(b, kind)(index)

        def value(name):
            kind, _, index = name.partition("(")
            if kind in ("I", "O", "GO") and index.endswith(")"):
                return placeholder(kind, int(index[:-1]))
            return names[name] if name else ""

        for entry in definition:
            op, inputs, outputs = entry[:3]
            op_type, domain = (op, "") if isinstance(op, str) else op
            attrs = entry[3] if len(entry) > 3 else {}
            targets = []
            for out in outputs:
                gi = re.fullmatch(r"GI\((\d+)\)", out)
                targets.append(placeholder("GI", int(gi.group(1))) if gi else b.IA(out))
                if gi:
                    grads[int(gi.group(1))] = targets[-1]
                else:
                    names[out] = targets[-1]
            if op_type == "Constant":
                spec = attrs["value"]
                typed = "ElemType" in spec["dtype"]
                like = value(re.sub(r"^(I|O)ElemType", r"\1", spec["dtype"])) if typed else None
                dtype = {"int": np.int64, "float": np.float32, "bool": np.bool_}.get(spec["dtype"])
                const = b.constant(np.asarray(spec["value"]).reshape(-1 if isinstance(spec["value"], list) else 1),
                                   like=like, dtype=dtype)
                b.emit("Identity", [const], targets)
                continue
            b.emit(op_type, [value(i) for i in inputs], targets, domain=domain,
                   **{k: v["value"] for k, v in attrs.items()})
        return grads

    return builder

"""The checks of lab04_op_schema (run where the learner's code cannot reach them).

The learner's schema comes back as data (ortlab.labs.lab04.schema_data) and is rebuilt here as an
onnx.defs.OpSchema; the function comes back as a FunctionProto's bytes.
"""
import numpy as np
import onnx
from onnx import defs, helper

from ortlab.labs.checks import compare
from ortlab.labs.judges.lab01 import run_in_ort
from ortlab.labs.lab04 import DOMAIN, OP, model_using, register, schema_data
from ortlab.labs.remote import Opaque, call


def rebuild_schema(data):
    """The OpSchema that ortlab.labs.lab04.schema_data described (or what was returned instead)."""
    if isinstance(data, Opaque) or not isinstance(data, dict):
        return data
    S = defs.OpSchema
    attributes = []
    for name, default, description, kind, required in data["attributes"]:
        if default is not None and default.type != onnx.AttributeProto.UNDEFINED:
            attributes.append(S.Attribute(name, default, description))
        else:
            attributes.append(S.Attribute(name, S.AttrType(kind), description, required=required))
    return S(data["name"], data["domain"], data["since_version"], data["doc"],
             inputs=[S.FormalParameter(n, t) for n, t in data["inputs"]],
             outputs=[S.FormalParameter(n, t) for n, t in data["outputs"]],
             type_constraints=[(p, list(types), d) for p, types, d in data["type_constraints"]],
             attributes=attributes)


def _schema(remote, make):
    return rebuild_schema(remote.call(schema_data, make))


def _accepts(model):
    try:
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:
        return str(exc).splitlines()[0]
    return None


def _check_schema(schema, version, attributes):
    if not isinstance(schema, defs.OpSchema):
        return f"expected an onnx.defs.OpSchema, got {type(schema).__name__}"
    if (schema.name, schema.domain, schema.since_version) != (OP, DOMAIN, version):
        # not registered: a wrong schema must not linger in onnx's process-wide registry
        return (f"the schema is {schema.domain}.{schema.name} version {schema.since_version}; "
                f"expected {DOMAIN}.{OP} version {version}")
    register(schema)
    if [p.name for p in schema.inputs] != ["X"] or [p.name for p in schema.outputs] != ["Y"]:
        return "the op takes one input X and has one output Y"
    defaults = {n: helper.get_attribute_value(a.default_value) for n, a in schema.attributes.items()}
    if defaults != attributes:
        return f"attributes and defaults should be {attributes}; the schema has {defaults}"
    for elem_type, ok in ((onnx.TensorProto.FLOAT, True), (onnx.TensorProto.DOUBLE, True),
                          (onnx.TensorProto.INT32, False)):
        why = _accepts(model_using(version, {"alpha": 2.0}, elem_type))
        if ok and why:
            return f"a {onnx.TensorProto.DataType.Name(elem_type)} input should be accepted: {why}"
        if not ok and not why:
            return "an INT32 input should be rejected: constrain T to float and double tensors"
    if not _accepts(model_using(version, {"delta": 1.0})):
        return "a node with an attribute the op does not declare ('delta') should be rejected"
    return None


def schema(remote, make_schema):
    """Exercise 'schema': make_schema() -> OpSchema of lab.ScaledTanh version 1 (alpha, beta; T float/double)."""
    return _check_schema(_schema(remote, make_schema), 1, {"alpha": 1.0, "beta": 1.0})


def function(remote, make_function):
    """Exercise 'function': make_function() -> FunctionProto computing alpha * tanh(beta * X)."""
    function = remote.call(call, make_function)
    if not isinstance(function, onnx.FunctionProto):
        return f"make_function() returned {type(function).__name__}, not an onnx.FunctionProto"
    if (function.domain, function.name) != (DOMAIN, OP):
        return f"the function is {function.domain}.{function.name}; it must define {DOMAIN}.{OP}"
    x = np.linspace(-2, 2, 6, dtype=np.float32).reshape(2, 3)
    for attrs in ({"alpha": 2.0, "beta": 0.5}, {"alpha": -1.5}, {}):
        model = model_using(1, attrs, functions=[function])
        (y,) = run_in_ort(model, {"x": x}, "make_function")
        expected = attrs.get("alpha", 1.0) * np.tanh(attrs.get("beta", 1.0) * x)
        reason = compare(y, expected, 1e-5, 1e-6, f"Y with attributes {attrs or 'left to their defaults'}")
        if reason:
            return reason
    return None


def schema_v2(remote, make_schema_v2, make_schema):
    """Exercise 'schema_v2': version 2 of the schema adds gamma (default 0.0); version 1 stays."""
    reason = _check_schema(_schema(remote, make_schema_v2), 2, {"alpha": 1.0, "beta": 1.0, "gamma": 0.0})
    if reason:
        return reason
    register(_schema(remote, make_schema))
    for opset, expected in ((1, 1), (2, 2), (5, 2)):
        picked = defs.get_schema(OP, opset, DOMAIN).since_version
        if picked != expected:
            return f"under lab opset {opset}, onnx picks ScaledTanh-{picked}; expected version {expected}"
    if not _accepts(model_using(1, {"gamma": 1.0})):
        return "gamma must not be accepted under opset 1 (version 1 has no gamma)"
    return None

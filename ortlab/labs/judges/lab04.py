"""Checks and helpers for lab04_op_schema: declare an op's schema, give it a function body,
then add a new version of the schema.

The op is lab.ScaledTanh: Y = alpha * tanh(beta * X) (+ gamma from version 2).
onnx's schema registry is process-wide, so `register` replaces an earlier
registration of the same (name, version, domain): a cell can be re-run.
"""
import numpy as np
import onnx
from onnx import defs, helper

from ortlab.onnx_defs import DEFAULT_OPSET, FUNCTION_IR_VERSION, ONNX_DOMAIN
from ortlab.labs.checks import CheckFailed, check, compare
from ortlab.labs.lab01 import run_in_ort

DOMAIN, OP = "lab", "ScaledTanh"


def register(schema):
    """Register an onnx.defs.OpSchema, replacing an earlier one with the same name, version, domain."""
    if not isinstance(schema, defs.OpSchema):
        raise CheckFailed(f"expected an onnx.defs.OpSchema, got {type(schema).__name__}")
    try:
        defs.deregister_schema(schema.name, schema.since_version, schema.domain)
    except Exception:
        pass  # nothing registered yet
    defs.register_schema(schema)
    return schema


def model_using(version, attributes, elem_type=onnx.TensorProto.FLOAT, shape=(2, 3), functions=()):
    """A one-node model calling lab.ScaledTanh under opset `version` of the lab domain."""
    node = helper.make_node(OP, ["x"], ["y"], domain=DOMAIN, name="scaled_tanh", **attributes)
    graph = helper.make_graph([node], "uses_scaled_tanh",
                              [helper.make_tensor_value_info("x", elem_type, list(shape))],
                              [helper.make_tensor_value_info("y", elem_type, list(shape))])
    return helper.make_model(graph, functions=list(functions), ir_version=FUNCTION_IR_VERSION,
                             opset_imports=[helper.make_opsetid(ONNX_DOMAIN, DEFAULT_OPSET),
                                            helper.make_opsetid(DOMAIN, version)])


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


def check_schema(make_schema):
    """Exercise 'schema': make_schema() -> OpSchema of lab.ScaledTanh version 1 (alpha, beta; T float/double)."""
    check("schema", lambda: _check_schema(make_schema(), 1, {"alpha": 1.0, "beta": 1.0}))


def check_function(make_function):
    """Exercise 'function': make_function() -> FunctionProto computing alpha * tanh(beta * X)."""
    def test():
        function = make_function()
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
    check("function", test)


def check_schema_v2(make_schema_v2, make_schema):
    """Exercise 'schema_v2': version 2 of the schema adds gamma (default 0.0); version 1 stays."""
    def test():
        reason = _check_schema(make_schema_v2(), 2, {"alpha": 1.0, "beta": 1.0, "gamma": 0.0})
        if reason:
            return reason
        register(make_schema())
        for opset, expected in ((1, 1), (2, 2), (5, 2)):
            picked = defs.get_schema(OP, opset, DOMAIN).since_version
            if picked != expected:
                return f"under lab opset {opset}, onnx picks ScaledTanh-{picked}; expected version {expected}"
        if not _accepts(model_using(1, {"gamma": 1.0})):
            return "gamma must not be accepted under opset 1 (version 1 has no gamma)"
        return None
    check("schema_v2", test)

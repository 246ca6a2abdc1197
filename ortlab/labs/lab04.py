"""Checks and helpers for lab04_op_schema: declare an op's schema, give it a function body,
then add a new version of the schema.

The op is lab.ScaledTanh: Y = alpha * tanh(beta * X) (+ gamma from version 2).
onnx's schema registry is process-wide, so `register` replaces an earlier
registration of the same (name, version, domain): a cell can be re-run.
The checks themselves live in ortlab.labs.judges.lab04 (no reference answers here).
"""
import onnx
from onnx import defs, helper

from ortlab.onnx_defs import DEFAULT_OPSET, FUNCTION_IR_VERSION, ONNX_DOMAIN
from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe

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


@probe
def schema_data(make_schema):
    """make_schema()'s OpSchema as data (name, domain, version, inputs, outputs, type constraints,
    attributes with their defaults), or what it returned when that is not an OpSchema."""
    schema = make_schema()
    if not isinstance(schema, defs.OpSchema):
        return schema
    return {"name": schema.name, "domain": schema.domain, "since_version": schema.since_version,
            "doc": schema.doc or "",
            "inputs": [(p.name, p.type_str) for p in schema.inputs],
            "outputs": [(p.name, p.type_str) for p in schema.outputs],
            "type_constraints": [(t.type_param_str, list(t.allowed_type_strs), t.description)
                                 for t in schema.type_constraints],
            "attributes": [(a.name, a.default_value if a.default_value.type else None, a.description,
                            int(a.type), bool(a.required)) for a in schema.attributes.values()]}


def check_schema(make_schema):
    """Exercise 'schema': make_schema() -> OpSchema of lab.ScaledTanh version 1 (alpha, beta; T float/double)."""
    judge("schema", "lab04.schema", learner(make_schema))


def check_function(make_function):
    """Exercise 'function': make_function() -> FunctionProto computing alpha * tanh(beta * X)."""
    judge("function", "lab04.function", learner(make_function))


def check_schema_v2(make_schema_v2, make_schema):
    """Exercise 'schema_v2': version 2 of the schema adds gamma (default 0.0); version 1 stays."""
    judge("schema_v2", "lab04.schema_v2", learner(make_schema_v2), learner(make_schema))

"""ORT's schemas that onnx does not have: ops ORT registers under the ONNX domain in its own C++.

    layer_norm_schema()             LayerNormalization-1 (contrib_defs.cc), what the op resolves to below opset 17
    simplified_layer_norm_schema()  SimplifiedLayerNormalization-1 (RMSNorm, contrib_defs.cc)
    pool_grad_schemas()             MaxPoolGrad-9, AveragePoolGrad-9 (training_op_defs.cc)
    install()                       register every one with onnx.defs unless it is there (idempotent)

Nothing is registered at import: onnx.defs is one registry for the whole process, so a schema added
there changes onnx.checker for every other piece of code. ortlab.ir's Graph.resolve calls install(),
as ORT's Graph::Resolve reads its own registry; `installed()` lists what is in place.
"""
from onnx import TensorProto, defs, helper


def layer_norm_schema():
    """ORT's own LayerNormalization schema (default domain, since version 1).

    Mirrors the schema ORT declares in onnxruntime/core/graph/contrib_ops/contrib_defs.cc
    (inputs X, scale, optional B; outputs Y and optional mean and inv_std_var; attributes
    axis, epsilon, stash_type). It is what a LayerNormalization node resolves to in a model
    importing ONNX opset 1 to 16; from 17 on, ONNX's own LayerNormalization-17 wins. The
    schema carries no shape inference (onnx 1.17's Python API cannot attach one), so the fused
    node's output keeps the type the replaced subgraph's output had, and LayerNormFusion types
    the saved mean and inverse std itself.
    """
    param, opt = defs.OpSchema.FormalParameter, defs.OpSchema.FormalParameterOption.Optional
    floats = ["tensor(float16)", "tensor(float)", "tensor(double)", "tensor(bfloat16)"]
    return defs.OpSchema(
        "LayerNormalization", "", 1, "ORT's LayerNormalization (a contrib op under the ONNX domain, "
        "registered by onnxruntime for opsets before ONNX's LayerNormalization-17)",
        inputs=[param("X", "T", "input"), param("scale", "T", "scale"), param("B", "T", "bias", param_option=opt)],
        outputs=[param("Y", "T", "output"), param("mean", "U", "saved mean", param_option=opt),
                 param("inv_std_var", "U", "saved inverse standard deviation", param_option=opt)],
        type_constraints=[("T", floats, "float tensors"), ("U", ["tensor(float)", "tensor(bfloat16)"],
                                                           "mean and inv_std_var")],
        attributes=[defs.OpSchema.Attribute("axis", helper.make_attribute("axis", -1), "first normalized axis"),
                    defs.OpSchema.Attribute("epsilon", helper.make_attribute("epsilon", 1e-5), "epsilon"),
                    defs.OpSchema.Attribute("stash_type", helper.make_attribute("stash_type", TensorProto.FLOAT),
                                            "element type of mean and inv_std_var")])


def simplified_layer_norm_schema():
    """ORT's SimplifiedLayerNormalization schema (ONNX domain, version 1). Inputs X and scale, outputs Y
    and the optional inv_std_var, attributes axis, epsilon, stash_type (contrib_defs.cc); no shape
    inference (see layer_norm_schema)."""
    param, opt = defs.OpSchema.FormalParameter, defs.OpSchema.FormalParameterOption.Optional
    floats = ["tensor(float16)", "tensor(float)", "tensor(double)", "tensor(bfloat16)"]
    return defs.OpSchema(
        "SimplifiedLayerNormalization", "", 1, "ORT's RMSNorm (a contrib op under the ONNX domain)",
        inputs=[param("X", "T", "input"), param("scale", "V", "scale")],
        outputs=[param("Y", "V", "output"), param("inv_std_var", "U", "saved inverse RMS", param_option=opt)],
        type_constraints=[("T", floats, "X"), ("V", floats, "scale and Y"),
                          ("U", ["tensor(float)", "tensor(double)"], "inv_std_var")],
        attributes=[defs.OpSchema.Attribute("axis", helper.make_attribute("axis", -1), "first normalized axis"),
                    defs.OpSchema.Attribute("epsilon", helper.make_attribute("epsilon", 1e-5), "epsilon"),
                    defs.OpSchema.Attribute("stash_type", helper.make_attribute("stash_type", TensorProto.FLOAT),
                                            "element type of inv_std_var")])


# What a pooling node may carry (onnx/defs/nn/defs.cc); ORT's schemas allow unchecked attributes and
# ortlab's gradient builders copy the forward node's onto its gradient.
POOL_ATTRIBUTES = {"auto_pad": "NOTSET", "ceil_mode": 0, "count_include_pad": 0, "dilations": None,
                   "kernel_shape": None, "pads": None, "storage_order": 0, "strides": None}


def pool_grad_schemas():
    """ORT's MaxPoolGrad(dY, Indices) -> dX and AveragePoolGrad(dY) -> dX schemas (ONNX domain,
    version 9; float tensors, int64 Indices). ORT: orttraining/orttraining/core/graph/training_op_defs.cc."""
    param, floats = defs.OpSchema.FormalParameter, ["tensor(float16)", "tensor(float)", "tensor(double)"]
    attrs = [defs.OpSchema.Attribute(name, helper.make_attribute(name, default), name) if default is not None
             else defs.OpSchema.Attribute(name, defs.OpSchema.AttrType.INTS, name, required=False)
             for name, default in POOL_ATTRIBUTES.items()]
    inputs = {"MaxPoolGrad": [param("dY", "T", "gradient of Y"), param("Indices", "I", "MaxPool's Indices")],
              "AveragePoolGrad": [param("dY", "T", "gradient of Y")]}
    schemas = []
    for name, ins in inputs.items():
        constraints = [("T", floats, "float tensors")] + ([("I", ["tensor(int64)"], "int64")] if len(ins) > 1 else [])
        schemas.append(defs.OpSchema(name, "", 9, f"ORT's {name} (a training op under the ONNX domain)",
                                     inputs=ins, outputs=[param("dX", "T", "gradient of X")],
                                     type_constraints=constraints, attributes=attrs))
    return schemas


def all_schemas():
    return [layer_norm_schema(), simplified_layer_norm_schema(), *pool_grad_schemas()]


def installed():
    """(name, domain, version) of ORT's schemas onnx.defs holds now."""
    return [(s.name, s.domain, s.since_version) for s in all_schemas() if _present(s)]


def _present(schema):
    try:
        return defs.get_schema(schema.name, schema.since_version, schema.domain).since_version == schema.since_version
    except defs.SchemaError:
        return False


def install():
    """Register ORT's schemas with onnx.defs, each unless one of that name and version is there; returns
    the names registered by this call (none the second time)."""
    added = []
    for schema in all_schemas():
        if not _present(schema):
            defs.register_schema(schema)
            added.append(schema.name)
    return added

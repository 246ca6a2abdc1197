"""ONNX constants, op keys and small model builders that every ortlab module shares.

Mirrors onnxruntime/core/graph/constants.h (kOnnxDomain, kMSDomain, ...) and the one-node
models of onnxruntime/test/providers/provider_test_utils.h (OpTester builds one node, its
inputs and outputs, and runs it). An op is keyed by (op type, domain) with the default
domain spelled "" (never "ai.onnx"), and printed one way: `Softmax`, `com.microsoft:Gelu`.
The constants and op keys need nothing but Python (the kernels' registry uses them on a GPU
machine without onnx); the model builders import onnx when called.
"""

ONNX_DOMAIN = ""  # kOnnxDomain; "ai.onnx" is an alias that op_key folds into ""
MS_DOMAIN = "com.microsoft"  # kMSDomain
IR_VERSION = 8  # the IR version ortlab stamps: what onnxruntime 1.19.2 reads comfortably
FUNCTION_IR_VERSION = 9  # model-local functions with attribute defaults need IR 9
DEFAULT_OPSET = 17  # the default-domain opset ortlab builds models at


def domain_of(domain):
    """The canonical spelling of a domain: "" for the ONNX domain (None, "", "ai.onnx")."""
    return ONNX_DOMAIN if domain in (None, "", "ai.onnx") else domain


def op_key(op_type, domain=""):
    """The registry key of an op: (op_type, canonical domain)."""
    return op_type, domain_of(domain)


def op_name(op_type, domain=""):
    """An op printed the one ortlab way: `Softmax` in the ONNX domain, `com.microsoft:Gelu` elsewhere."""
    domain = domain_of(domain)
    return f"{domain}:{op_type}" if domain else op_type


def node_op_name(node):
    """op_name of an onnx NodeProto or an ortlab Node."""
    return op_name(node.op_type, node.domain)


def op_counts(model):
    """{op printed as op_name: number of nodes} of a ModelProto's or GraphProto's main graph, in first-seen
    order (what ORT's graph dumps are compared by: 'com.microsoft:Gelu': 2)."""
    counts = {}
    for node in (model.graph if hasattr(model, "graph") else model).node:
        key = node_op_name(node)
        counts[key] = counts.get(key, 0) + 1
    return counts


def node_label(node):
    """How a node is named in messages: its name, else `op_name(first output)`."""
    outputs = list(node.output if hasattr(node, "output") else node.outputs)
    return node.name or f"{node_op_name(node)}({outputs[0] if outputs else ''})"


def opset_of(opset_imports, domain=""):
    """The opset a {domain: version} map imports for a domain ("" and "ai.onnx" are one)."""
    domain = domain_of(domain)
    if domain == ONNX_DOMAIN:
        return opset_imports.get("", opset_imports.get("ai.onnx"))
    return opset_imports.get(domain)


def make_model(graph, opset=DEFAULT_OPSET, domains=(MS_DOMAIN,), ir_version=IR_VERSION, **kwargs):
    """helper.make_model with ortlab's IR version and opset imports ({domain: 1} for each extra domain)."""
    from onnx import helper  # optional: the op keys work without onnx (GPU machines)

    imports = [helper.make_opsetid("", opset)] + [helper.make_opsetid(d, 1) for d in domains]
    model = helper.make_model(graph, opset_imports=imports, **kwargs)
    model.ir_version = ir_version
    return model


def one_node_model(op_type, inputs, attributes=None, domain="", opset=DEFAULT_OPSET, outputs=1,
                   prefixes=("x", "y"), name="one_node"):
    """A model of one node whose inputs are named x0, x1, ... and outputs y0, y1, ... (`prefixes`).

    `inputs` is a list of arrays (their dtype and shape type the graph inputs) or of
    (elem_type, shape) pairs; an input given as None is an omitted optional input ("").
    `outputs` is a count or a list of names; output types are left for ORT to infer.
    """
    from onnx import helper  # optional: the op keys work without onnx (GPU machines)

    names, graph_inputs = [], []
    for i, value in enumerate(inputs):
        names.append("" if value is None else f"{prefixes[0]}{i}")
        if value is not None:
            graph_inputs.append(helper.make_tensor_value_info(names[-1], *_type_of(value)))
    out_names = ([f"{prefixes[1]}{i}" for i in range(outputs)] if isinstance(outputs, int)
                 else list(outputs))
    node = helper.make_node(op_type, names, out_names, domain=domain_of(domain), **(attributes or {}))
    graph = helper.make_graph([node], name, graph_inputs,
                              [helper.make_empty_tensor_value_info(n) for n in out_names])
    extra = () if domain_of(domain) == ONNX_DOMAIN else (domain_of(domain),)
    return make_model(graph, opset=opset, domains=extra)


def _type_of(value):
    import numpy as np  # lazy: the op keys work without numpy (GPU machines)
    from onnx import helper  # optional: the op keys work without onnx (GPU machines)

    if isinstance(value, tuple) and len(value) == 2:
        return value
    value = np.asarray(value)
    return helper.np_dtype_to_tensor_dtype(value.dtype), list(value.shape)

"""A small ONNX model as text, as the walkthroughs' exercises show the model they ask about: one line per graph
input, initializer (a small one with its values), node (domain, attributes, a Cast's `to` as a type name) and
graph output (with the shape it declares, '?' when it declares none)."""
from onnx import helper, numpy_helper


def _type_name(elem_type):
    return helper.tensor_dtype_to_np_dtype(elem_type).name


def _dims(info):
    tensor = info.type.tensor_type
    return [d.dim_param or d.dim_value for d in tensor.shape.dim] if tensor.HasField("shape") else "?"


def _initializer(t):
    value = numpy_helper.to_array(t)
    return (f"initializer  {t.name} = {value.tolist()}" if value.size <= 4
            else f"initializer  {t.name}: {value.dtype}{list(value.shape)}")


def _node(node):
    attributes = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type == "Cast":
        attributes["to"] = _type_name(attributes["to"])
    op = f"{node.domain}:{node.op_type}" if node.domain else node.op_type
    return (f"node         {node.name}: {op}({', '.join(node.input)}) -> {', '.join(node.output)}"
            + (f"  {attributes}" if attributes else ""))


def describe(model):
    """`model` (a ModelProto) as text, one line per input, initializer, node and output."""
    graph = model.graph
    lines = [f"input        {i.name}: {_type_name(i.type.tensor_type.elem_type)}{_dims(i)}" for i in graph.input]
    lines += [_initializer(t) for t in graph.initializer]
    lines += [_node(n) for n in graph.node]
    lines += [f"output       {o.name}: {_dims(o)}" for o in graph.output]
    return "\n".join(lines)

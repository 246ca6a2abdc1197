"""Reference answers to the exercises of notebooks/L0_04_onnx_ops_schemas_kernels.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "reshape_shape": '''
shape = [input_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(target)]
if -1 in shape:
    known = int(np.prod([d for d in shape if d != -1]))
    shape[shape.index(-1)] = int(np.prod(input_shape)) // known
return shape
''',
    "function_op": '''
body = [helper.make_node("Sigmoid", ["X"], ["s"]), helper.make_node("Mul", ["X", "s"], ["Y"])]
swish = helper.make_function("lab", "Swish", ["X"], ["Y"], body, [helper.make_opsetid("", 17)])
graph = helper.make_graph([helper.make_node("Swish", ["x"], ["y"], domain="lab", name="swish")], "uses_swish",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
return helper.make_model(graph, functions=[swish],
                         opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("lab", 1)])
''',
}

_SWISH_GRAPH = '''
graph = helper.make_graph([helper.make_node("Swish", ["x"], ["y"], domain="lab")], "uses_swish",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
'''
_BODY = '''
body = [helper.make_node("Sigmoid", ["X"], ["s"]), helper.make_node("Mul", ["X", "s"], ["Y"])]
'''
_FUNCTION = '''
swish = helper.make_function("lab", "Swish", ["X"], ["Y"], body, [helper.make_opsetid("", 17)])
'''
_IMPORTS = '''
return helper.make_model(graph, functions=[swish],
                         opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("lab", 1)])
'''

MISTAKES = {
    "reshape_shape": [
        ('''
shape = list(target)  # a 0 kept as a size-0 dimension
if -1 in shape:
    known = int(np.prod([d for d in shape if d != -1]))
    shape[shape.index(-1)] = int(np.prod(input_shape)) // known if known else 0
return shape
''', "copies the input's dimension at the same index"),
        ('''
shape = [input_shape[i] if d == 0 else d for i, d in enumerate(target)]  # allowzero ignored
if -1 in shape:
    known = int(np.prod([d for d in shape if d != -1]))
    shape[shape.index(-1)] = int(np.prod(input_shape)) // known
return shape
''', "with allowzero=1 a 0 in the target is a dimension of size 0"),
        ('''
known = int(np.prod([d for d in target if d > 0]))  # the -1 from the target's own entries, before the copies
shape = [input_shape[i] if d == 0 and not allowzero else d for i, d in enumerate(target)]
if -1 in shape:
    shape[shape.index(-1)] = int(np.prod(input_shape)) // known
return shape
''', "the copied ones included"),
        ('''
return tuple(str(d) for d in target)
''', "each dimension is an int"),
    ],
    "function_op": [
        (_BODY + _FUNCTION + _SWISH_GRAPH + '''
return helper.make_model(graph, functions=[swish], opset_imports=[helper.make_opsetid("", 17)])
''', "must be imported by the model"),
        (_BODY + _FUNCTION + _SWISH_GRAPH + '''
return helper.make_model(graph, functions=[swish])
''', "supports ai.onnx up to opset 21"),
        (_BODY + '''
swish = helper.make_function("lab", "Swish", ["X"], ["Y"], body, [])
''' + _SWISH_GRAPH + _IMPORTS, "through its own opset_imports"),
        (_BODY + _FUNCTION + '''
graph = helper.make_graph([helper.make_node("Swish", ["x"], ["y"])], "uses_swish",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 4])])
''' + _IMPORTS, "domain='lab'"),
        ('''
body = [helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["Y"])]
''' + _FUNCTION + _SWISH_GRAPH + _IMPORTS, "names are its own"),
        ('''
body = [helper.make_node("Sigmoid", ["X"], ["Y"])]
''' + _FUNCTION + _SWISH_GRAPH + _IMPORTS, "Swish multiplies it by x"),
    ],
}

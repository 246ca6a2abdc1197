"""Reference answers to the exercises of notebooks/L1_01_graph_transformers.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "not_where": '''
not_ = graph.producer(where.input_names[0])
if not_ is None or not_.op_type != "Not" or not_.domain not in ("", "ai.onnx"):
    return False
flipped = not_.output_names[0]
readers = graph.consumers(flipped)
if any(r.op_type != "Where" or flipped in r.input_names[1:] for r in readers):
    return False
return flipped not in graph.outputs
''',
    "level_ops": '''
return {"basic": {"ReduceMean": 2, "Sub": 1, "Pow": 1, "Add": 4, "Sqrt": 1, "Div": 2, "Mul": 3, "MatMul": 1,
                  "Erf": 1, "Dropout": 1},
        "extended": {"LayerNormalization": 1, "MatMul": 1, "BiasGelu": 1, "Dropout": 1}}
''',
}

MISTAKES = {
    "not_where": [
        ('''
not_ = graph.producer(where.input_names[0])
return not_ is not None and not_.op_type == "Not" and not_.output_names[0] not in graph.outputs
''', "also read by"),
        ('''
not_ = graph.producer(where.input_names[0])
return not_ is not None and not_.op_type == "Not" and all(
    r.op_type == "Where" for r in graph.consumers(not_.output_names[0]))
''', "graph output"),
        ('''
return True
''', "produced by a Not"),
    ],
    "level_ops": [
        ('''
return {"basic": {"ReduceMean": 2, "Sub": 1, "Pow": 1, "Add": 4, "Sqrt": 1, "Div": 2, "Mul": 3, "MatMul": 1,
                  "Erf": 1},
        "extended": {"LayerNormalization": 1, "MatMul": 1, "BiasGelu": 1}}
''', "graph output"),
        ('''
return {"basic": {"ReduceMean": 2, "Sub": 1, "Pow": 1, "Add": 3, "Sqrt": 1, "Div": 2, "Mul": 3, "Gemm": 1,
                  "Erf": 1, "Dropout": 1},
        "extended": {"LayerNormalization": 1, "Gemm": 1, "Gelu": 1, "Dropout": 1}}
''', "only when A is 2-D"),
        ('''
return {"basic": {"LayerNormalization": 1, "MatMul": 1, "BiasGelu": 1, "Dropout": 1},
        "extended": {"LayerNormalization": 1, "MatMul": 1, "BiasGelu": 1, "Dropout": 1}}
''', "level 2, extended"),
        ('''
return {"basic": {"Identity": 1, "ReduceMean": 2, "Sub": 1, "Pow": 1, "Add": 4, "Sqrt": 1, "Div": 2, "Mul": 3,
                  "MatMul": 1, "Erf": 1, "Dropout": 1},
        "extended": {"LayerNormalization": 1, "MatMul": 1, "BiasGelu": 1, "Dropout": 1}}
''', "EliminateIdentity"),
        ('''
return {"basic": {"ReduceMean": 2, "Sub": 1, "Pow": 1, "Add": 4, "Sqrt": 1, "Div": 2, "Mul": 3, "MatMul": 1,
                  "Erf": 1, "Dropout": 1},
        "extended": {"LayerNormalization": 1, "MatMul": 1, "Add": 1, "Gelu": 1, "Dropout": 1}}
''', "BiasGeluFusion"),
    ],
}

"""Reference answers to the exercises of notebooks/L0_01_inference_session.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "needed_inputs": '''
return {"inputs": ["x", "unused"], "overridable": ["scale"]}
''',
    "output_shapes": '''
return {"r": ((5, 2, 3), "float32"), "t": ((5, 3, 2), "float32"), "summed": ((5, 2), "float32"),
        "best": ((5, 1), "int64"), "shape": ((2,), "int64"), "projected": ((5, 4), "float32")}
''',
}

MISTAKES = {
    "needed_inputs": [
        ('''
return {"inputs": ["x"], "overridable": ["scale"]}
''', "no node reads it"),
        ('''
return {"inputs": ["x", "scale", "unused"], "overridable": []}
''', "get_overridable_initializers(), not get_inputs()"),
        ('''
return {"inputs": ["x", "unused"], "overridable": ["scale", "w"]}
''', "cannot be fed"),
    ],
    "output_shapes": [
        ('''
return {"r": ((5, 2, 3), "float32"), "t": ((5, 3, 2), "float32"), "summed": ((5, 2), "float32"),
        "best": ((5,), "int64"), "shape": ((2,), "int64"), "projected": ((5, 4), "float32")}
''', "default is keepdims=1"),
        ('''
return {"r": ((5, 2, 3), "float32"), "t": ((5, 3, 2), "float32"), "summed": ((5, 2), "float32"),
        "best": ((5, 1), "int64"), "shape": ((2,), "float32"), "projected": ((5, 4), "float32")}
''', "one int64 per axis"),
        ('''
return {"r": ((5, 2, 3), "float32"), "t": ((5, 2, 3), "float32"), "summed": ((5, 3), "float32"),
        "best": ((5, 1), "int64"), "shape": ((2,), "int64"), "projected": ((5, 4), "float32")}
''', "swaps the last two axes"),
        ('''
return {"summed": ((5, 2), "float32"), "projected": ((5, 4), "float32")}
''', "returns every graph output"),
    ],
}

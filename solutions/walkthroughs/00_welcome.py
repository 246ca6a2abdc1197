"""Reference answers to the exercises of notebooks/00_welcome.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "relu": '''
return np.maximum(x, 0)
''',
    "ort_ops": '''
return ["Gemm", "Gelu", "Gemm"]  # the Constants became initializers, GeluFusion made one Gelu of the rest
''',
}

MISTAKES = {
    "relu": [
        ('''
return np.abs(x)
''', "you returned |x|"),
        ('''
x[x < 0] = 0
return x
''', "changed the array it was given"),
        ('''
return np.maximum(x, 0.0)
''', "input's element type"),
        ('''
return max(x, 0)
''', "truth value of an array"),
        ('''
return [max(v, 0) for v in x.ravel()]
''', "return a numpy array"),
    ],
    "ort_ops": [
        ('''
return ["Gemm", "Constant", "Div", "Erf", "Constant", "Add", "Mul", "Constant", "Mul", "Gemm"]
''', "turns each Constant into an initializer"),
        ('''
return ["Gemm", "Div", "Erf", "Add", "Mul", "Mul", "Gemm"]
''', "GeluFusion"),
        ('''
return ["Gemm", "GELU", "Gemm"]
''', "case and all"),
        ('''
return ["Linear", "Gelu", "Linear"]
''', "one Gemm node"),
    ],
}

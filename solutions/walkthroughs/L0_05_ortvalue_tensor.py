"""Reference answers to the exercises of notebooks/L0_05_ortvalue_tensor.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "wraps_without_copy": '''
return bool(array.flags["C_CONTIGUOUS"])  # dense and row-major (dimensions of size 1 may have any stride)
''',
    "shares_memory": '''
return {"from_numpy": True, "from_numpy_transposed": False, "numpy_of_value": True, "torch_from_dlpack": True,
        "torch_tensor": False, "from_torch_numpy": True, "astype_float32": False, "identity_output": False,
        "reshape_output": False}
''',
}

_RIGHT = {"from_numpy": True, "from_numpy_transposed": False, "numpy_of_value": True, "torch_from_dlpack": True,
          "torch_tensor": False, "from_torch_numpy": True, "astype_float32": False, "identity_output": False,
          "reshape_output": False}


def _with(**changed):
    return f"return {dict(_RIGHT, **changed)!r}\n"


MISTAKES = {
    "wraps_without_copy": [
        ("return True\n", "copied it into a new dense buffer"),
        ("return array.strides[-1] == array.itemsize  # only the last dimension looked at\n",
         "holding 20 bytes each"),
        ('''
expected, step = [], array.itemsize  # the strides a row-major layout would have, every dimension compared
for size in reversed(array.shape):
    expected.insert(0, step)
    step *= size
return list(array.strides) == expected
''', "ignores it"),
        ("return array.base is None  # 'a view is always copied'\n", "dense and row-major"),
    ],
    "shares_memory": [
        (_with(from_numpy_transposed=True), "new array"),
        (_with(identity_output=True, reshape_output=True), "graph output"),
        (_with(torch_tensor=True), "always copies"),
        (_with(astype_float32=True), "astype makes a new array"),
        ('return {"from_numpy": True}\n', "'from_numpy_transposed' is missing"),
    ],
}

"""Reference answers to the exercises of notebooks/D_03_debugging_knowhows.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

_BYTES = {"matmul": 128, "to_half": 64, "argmax": 32, "rowsum": 16, "positive": 32, "flatten": 128, "transpose": 128}


def _bytes(**changes):
    return f"return {dict(_BYTES, **changes)!r}\n"


ANSWERS = {
    "nan_birth": '''
made = set()
for node in dump:
    for name, value in node.inputs.items():
        if name not in made and not np.all(np.isfinite(value)):
            return name  # non-finite before any node ran: a feed or an initializer
    if any(not np.all(np.isfinite(value)) for value in node.outputs.values()):
        return node.name  # the first node that writes one from finite inputs
    made.update(node.outputs)
return None
''',
    "plan_bytes": _bytes(),  # shape x element size; Shape(h) is folded away and never runs
}

MISTAKES = {
    "nan_birth": [
        ('''
for node in dump:
    if any(np.isnan(value).any() for value in node.outputs.values()):
        return node.name
return None
''', "an inf is not finite either"),
        ('''
for node in dump:
    if any(not np.all(np.isfinite(value)) for value in node.outputs.values()):
        return node.name
return None
''', "already held it before any node ran"),
        ('''
found = None
for node in dump:
    if any(not np.all(np.isfinite(value)) for value in node.outputs.values()):
        found = node.name
return found
''', "where it is born, not where it ends up"),
        ('''
made = set()
for node in dump:
    for name, value in node.inputs.items():
        if name not in made and not np.all(np.isfinite(value)):
            return name
    for name, value in node.outputs.items():
        if not np.all(np.isfinite(value)):
            return name  # the value, not the node that wrote it
    made.update(node.outputs)
return None
''', "name the node that wrote it"),
        ('''
made = set()
for node in dump:
    for name, value in node.inputs.items():
        if name not in made and not np.all(np.isfinite(value)):
            return name
    if any(not np.all(np.isfinite(value)) for value in node.outputs.values()):
        return node.name
    made.update(node.outputs)
return dump[-1].name
''', "return None"),
    ],
    "plan_bytes": [
        (_bytes(shape=16), "does not run"),
        (f"return {dict.fromkeys(_BYTES, 256)!r}\n", "256-byte rounding"),
        (_bytes(to_half=128), "float16 takes 2 bytes"),
        (_bytes(positive=128), "1 byte per value"),
        (_bytes(argmax=16), "int64 indices, 8 bytes each"),
    ],
}

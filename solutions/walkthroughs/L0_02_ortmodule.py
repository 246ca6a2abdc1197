"""Reference answers to the exercises of notebooks/L0_02_ortmodule.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "graph_inputs": '''
def walk(name, value):
    if value is None or isinstance(value, str):      # a constant of the export, not an input
        return []
    if isinstance(value, (list, tuple)):
        return [n for i, item in enumerate(value) for n in walk(f"{name}_{i}", item)]
    if isinstance(value, dict):
        return [n for key, item in value.items() for n in walk(f"{name}_{key}", item)]
    return [name]                                     # a tensor, or a number fed as a tensor
names = []
for i, parameter in enumerate(parameters):           # the signature's order, not the call's
    if i < len(args):
        names += walk(parameter, args[i])
    elif parameter in kwargs:
        names += walk(parameter, kwargs[parameter])
return names
''',
    "re_export": '''
return [True,    # the first call
        False,   # only the batch size changed
        True,    # a list where there was a tuple
        True,    # None where there was a tensor
        True,    # extras by keyword now
        True,    # mode given now (a str, by value)
        False,   # only the batch size changed
        True,    # mode's value changed
        True]    # x's rank changed
''',
}

_WALK = '''
def walk(name, value):
    if value is None or isinstance(value, str):
        return []
    if isinstance(value, (list, tuple)):
        return [n for i, item in enumerate(value) for n in walk(f"{name}_{i}", item)]
    if isinstance(value, dict):
        return [n for key, item in value.items() for n in walk(f"{name}_{key}", item)]
    return [name]
'''

MISTAKES = {
    "graph_inputs": [
        ('''
def walk(name, value):
    if isinstance(value, (list, tuple)):
        return [n for i, item in enumerate(value) for n in walk(f"{name}_{i}", item)]
    if isinstance(value, dict):
        return [n for key, item in value.items() for n in walk(f"{name}_{key}", item)]
    return [name]  # None and str kept as inputs
names = []
for i, parameter in enumerate(parameters):
    if i < len(args):
        names += walk(parameter, args[i])
    elif parameter in kwargs:
        names += walk(parameter, kwargs[parameter])
return names
''', "a None or a str is no graph input"),
        ('''
def walk(name, value):
    if value is None or isinstance(value, (str, int, float, bool)):  # numbers left out too
        return []
    if isinstance(value, (list, tuple)):
        return [n for i, item in enumerate(value) for n in walk(f"{name}_{i}", item)]
    if isinstance(value, dict):
        return [n for key, item in value.items() for n in walk(f"{name}_{key}", item)]
    return [name]
names = []
for i, parameter in enumerate(parameters):
    if i < len(args):
        names += walk(parameter, args[i])
    elif parameter in kwargs:
        names += walk(parameter, kwargs[parameter])
return names
''', "turns a Python int, float or bool argument into a tensor"),
        (_WALK + '''
names = []
for parameter, value in zip(parameters, args):
    names += walk(parameter, value)
for parameter, value in kwargs.items():  # in the call's order
    names += walk(parameter, value)
return names
''', "whatever order the call wrote them in"),
        ('''
def walk(name, value):
    if value is None or isinstance(value, str):
        return []
    if isinstance(value, (list, tuple)):
        return [n for i, item in enumerate(value) for n in walk(f"{name}[{i}]", item)]
    if isinstance(value, dict):
        return [n for key, item in value.items() for n in walk(f"{name}[{key!r}]", item)]
    return [name]
names = []
for i, parameter in enumerate(parameters):
    if i < len(args):
        names += walk(parameter, args[i])
    elif parameter in kwargs:
        names += walk(parameter, kwargs[parameter])
return names
''', "joins the argument's name and each index or key with '_'"),
        ('''
return "x, pair_0, pair_1"
''', "as a list of str"),
    ],
    "re_export": [
        ('''
return [True] * 9  # every call exports again
''', "not its shape"),
        ('''
return [True, False, False, True, True, True, False, True, True]
''', "the type of each container"),
        ('''
return [True, False, True, True, False, True, False, True, True]
''', "schema and the keyword arguments' schema apart"),
        ('''
return [True, False, True, True, True, False, False, True, True]
''', "an argument left out is in no schema"),
        ('''
return [True, False, True, True, True, True, False, True, False]
''', "the rank is part of a tensor's schema"),
    ],
}

"""Reference answers to the exercises of notebooks/L2_01_execution_engine.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "released_after": '''
return {"h": 6, "r": 6, "a": 6, "b": 7, "c": 7}  # h, r, a share one buffer (Relu, Sigmoid write in place)
''',
    "needed_steps": '''
wanted, keep = set(fetch_names), []
for step in reversed(state.steps):  # from the last step back: a step is needed when it writes a wanted value
    if any(state.value_names[s] in wanted for s in step.outputs if s >= 0):
        keep.append(step)
        wanted.update(state.value_names[s] for s in step.inputs if s >= 0)
return keep[::-1]
''',
}

MISTAKES = {
    "released_after": [
        ('return {"h": 2, "r": 5, "a": 6, "b": 7, "c": 7}\n', "living in it"),  # each value's own last read
        ('return {"h": 6, "r": 6, "a": 6, "b": 7, "c": 7, "y": 7}\n', "graph output"),
        ('return {"h": 4, "r": 4, "a": 4, "b": 5, "c": 5}\n', "execution order"),  # the model's node indices
        ('return {"h": 6, "r": 6, "a": 6, "b": 7}\n', "'c' is missing"),
    ],
    "needed_steps": [
        ('''
return [s for s in state.steps if any(state.value_names[o] in fetch_names for o in s.outputs if o >= 0)]
''', "follow the inputs back"),
        ('''
wanted, keep = set(fetch_names), []
for step in reversed(state.steps):
    if any(state.value_names[s] in wanted for s in step.outputs):
        keep.append(step)
        wanted.update(state.value_names[s] for s in step.inputs)  # slot -1 (an input left out) read as a value
return keep[::-1]
''', "slots below 0"),
        ('''
wanted, keep = set(fetch_names), []
for step in reversed(state.steps):
    if any(state.value_names[s] in wanted for s in step.outputs if s >= 0):
        keep.append(step)
        wanted.update(state.value_names[s] for s in step.inputs if s >= 0)
return keep
''', "wrong order"),
        ('''
return list(state.steps)
''', "which no fetch needs"),
    ],
}

"""Reference answers to the exercises of notebooks/L1_05_gradient_graph_building.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "nodes_to_differentiate": '''
values, queue = set(x_names), list(x_names)
while queue:  # forward: what depends on an x through inputs that carry a gradient
    for node in graph.consumers(queue.pop()):
        if any(carries_gradient(node, i) and arg.name in values for i, arg in enumerate(node.inputs)):
            for out in node.outputs:
                if is_float(out) and out.name not in values:
                    values.add(out.name)
                    queue.append(out.name)
kept, queue = set(), [graph.producer(loss_name)]
while queue:  # backward: from the loss, along the inputs that carry a gradient of a reached value
    node = queue.pop()
    if node.name in kept:
        continue
    kept.add(node.name)
    for i, arg in enumerate(node.inputs):
        if carries_gradient(node, i) and arg.name in values and graph.producer(arg.name) is not None:
            queue.append(graph.producer(arg.name))
return kept
''',
    "sum_contributions": '''
return {"W": 2, "h": 2, "y": 2}
''',
}

MISTAKES = {
    "nodes_to_differentiate": [
        ('''
values, queue = set(x_names), list(x_names)
while queue:  # the forward walk only: everything that depends on an x
    for node in graph.consumers(queue.pop()):
        if any(carries_gradient(node, i) and arg.name in values for i, arg in enumerate(node.inputs)):
            for out in node.outputs:
                if is_float(out) and out.name not in values:
                    values.add(out.name)
                    queue.append(out.name)
return {n.name for n in graph.nodes()
        if any(carries_gradient(n, i) and a.name in values for i, a in enumerate(n.inputs))}
''', "never reach the loss"),
        ('''
kept, queue = set(), [graph.producer(loss_name)]
while queue:  # the backward walk only, without asking whether a value depends on an x
    node = queue.pop()
    if node.name not in kept:
        kept.add(node.name)
        queue += [graph.producer(a.name) for i, a in enumerate(node.inputs)
                  if carries_gradient(node, i) and graph.producer(a.name) is not None]
return kept
''', "depends on no x"),
        ('''
values, queue = set(x_names), list(x_names)
while queue:
    for node in graph.consumers(queue.pop()):
        for out in node.outputs:
            if out.exists() and out.name not in values:
                values.add(out.name)
                queue.append(out.name)
kept, queue = set(), [graph.producer(loss_name)]
while queue:  # stop-gradient edges ignored: Shape and Reshape's shape input are followed too
    node = queue.pop()
    if node.name not in kept:
        kept.add(node.name)
        queue += [graph.producer(a.name) for a in node.inputs
                  if a.name in values and graph.producer(a.name) is not None]
return kept
''', "stop-gradient edge"),
        ('''
return [n.index for n in graph.nodes()]
''', "node *names*"),
    ],
    "sum_contributions": [
        ('''
return {"W": 2, "h": 3, "y": 2}
''', "stop-gradient edge"),
        ('''
return {"W": 2, "h": 2}
''', "'y' is missing"),
        ('''
return {"W": 2, "h": 2, "y": 2, "r": 1}
''', "no Sum"),
    ],
}

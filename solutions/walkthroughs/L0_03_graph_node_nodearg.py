"""Reference answers to the exercises of notebooks/L0_03_graph_node_nodearg.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

ANSWERS = {
    "upstream_nodes": '''
found, queue = set(), [value_name]
while queue:
    producer = graph.producer(queue.pop())
    if producer is not None and producer.name not in found:
        found.add(producer.name)
        queue += [arg.name for arg in producer.inputs if arg.exists()]
return found
''',
    "topological_order": '''
def producers(node):
    return {graph.producer(a.name).name for a in node.inputs if a.exists() and graph.producer(a.name)}

waiting = {node.name: len(producers(node)) for node in graph.nodes()}
order, ready = [], [node for node in graph.nodes() if waiting[node.name] == 0]
while ready:
    node = ready.pop()
    order.append(node.name)
    readers = {c.name: c for out in node.outputs if out.exists() for c in graph.consumers(out.name)}
    for reader in readers.values():
        waiting[reader.name] -= 1
        if waiting[reader.name] == 0:
            ready.append(reader)
return order
''',
}

MISTAKES = {
    "upstream_nodes": [
        ('''
return {graph.producer(value_name).name}
''', "is missing"),
        ('''
found, queue = set(), [value_name]
while queue:  # forward, through the readers
    for reader in graph.consumers(queue.pop()):
        if reader.name not in found:
            found.add(reader.name)
            queue += [arg.name for arg in reader.outputs]
return found | {graph.producer(value_name).name}
''', "does not feed"),
        ('''
return [n.index for n in graph.nodes()]
''', "node *names*"),
    ],
    "topological_order": [
        ('''
return [node.name for node in graph.nodes()]
''', "comes before"),
        ('''
waiting = {n.name: sum(1 for a in n.inputs if a.exists() and graph.producer(a.name)) for n in graph.nodes()}
order, ready = [], [n for n in graph.nodes() if waiting[n.name] == 0]
while ready:
    node = ready.pop()
    order.append(node.name)
    for reader in {c.name: c for o in node.outputs for c in graph.consumers(o.name)}.values():
        waiting[reader.name] -= 1
        if waiting[reader.name] == 0:
            ready.append(reader)
return order
''', "reads 'clipped' twice"),
        ('''
waiting = {n.name: sum(1 for a in n.inputs if a.exists()) for n in graph.nodes()}
order, ready = [], [n for n in graph.nodes() if waiting[n.name] == 0]
while ready:
    node = ready.pop()
    order.append(node.name)
    for o in node.outputs:
        for reader in graph.consumers(o.name):
            waiting[reader.name] -= sum(1 for a in reader.inputs if a.name == o.name)
            if waiting[reader.name] == 0:
                ready.append(reader)
return order
''', "has no producer"),
    ],
}

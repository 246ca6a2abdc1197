"""The checks of L0_03's exercises (run where the learner's code cannot reach them).

'upstream_nodes' compares the learner's walk with the producers ortlab's Graph records (GetProducerNode of
onnxruntime/core/graph/graph.cc; the facts test checks them against onnx.utils.Extractor, which finds the
same nodes its own way); 'topological_order' accepts any order in which each node comes after the producers
of its inputs, the rule ORT's GraphViewer orders obey (the facts test checks ORT's own orders pass it).
"""
from ortlab.ir import Graph
from ortlab.labs.checks import CheckFailed
from ortlab.labs.l0_03 import diamond_model, ordered, shuffled_model, upstream


def needed(graph, value):
    """{node name: the value through which `value` reaches back to it}: every node `value` depends on."""
    found, queue = {}, [(value, value)]
    while queue:
        name, via = queue.pop()
        node = graph.producer(name) if name else None
        if node is None or node.name in found:
            continue
        found[node.name] = via
        queue += [(a.name, a.name) for a in node.inputs if a.exists()]
    return found


def upstream_nodes(remote, fn):
    model = diamond_model()
    graph = Graph.from_model(model)
    order = [n.name for n in graph.nodes()]
    for value in ("right", "Y", "joined", "Z", "h"):
        expected = needed(graph, value)
        got = remote.call(upstream, fn, model, value)
        if got and all(isinstance(g, int) for g in got):
            raise CheckFailed(f"for {value!r}: you returned numbers {got[:4]}; return node *names* (node.name)")
        unknown = sorted(str(g) for g in got if g not in order)
        if unknown:
            raise CheckFailed(f"for {value!r}: {unknown[0]!r} is not the name of a node of diamond_model()")
        missing = [name for name in order if name in set(expected) - set(got)]
        extra = [name for name in order if name in set(got) - set(expected)]
        if extra:
            name = extra[0]
            node = next(n for n in graph.nodes() if n.name == name)
            raise CheckFailed(f"for {value!r}: '{name}' ({node.op_type}) does not feed {value!r}: it is not "
                              f"on any path of producers back from it (a walk through consumers goes forward, "
                              "to the nodes that read a value, not to those it needs)")
        if missing:
            name = missing[0]
            node = next(n for n in graph.nodes() if n.name == name)
            raise CheckFailed(f"for {value!r}: '{name}' ({node.op_type}) is missing: it produces "
                              f"{expected[name]!r}, which {value!r} depends on (keep walking from each producer "
                              "to the producers of its inputs, not just one step)")
    return None


def order_problem(model, names):
    """Why `names` is not an order ORT could run `model`'s nodes in, or None when it is one."""
    graph = Graph.from_model(model)
    nodes = {n.name: n for n in graph.nodes()}
    if any(isinstance(g, int) for g in names):
        return f"you returned numbers {names[:4]}; return node *names* (node.name)"
    unknown = [g for g in names if g not in nodes]
    if unknown:
        return f"{unknown[0]!r} is not the name of a node of the model"
    twice = [g for g in nodes if names.count(g) > 1]
    if twice:
        return f"'{twice[0]}' appears {names.count(twice[0])} times; each node runs once"
    left = [name for name in nodes if name not in names]
    if left:
        node = nodes[left[0]]
        reads = [a.name for a in node.inputs if a.exists()]
        twice_read = [r for r in reads if reads.count(r) > 1]
        hint = (f"; it reads {twice_read[0]!r} twice, so counting its inputs and taking one off per producer "
                "never reaches zero: count distinct producers, or take one off per input slot") if twice_read \
            else ("; a graph input or an initializer (here "
                  f"{', '.join(repr(r) for r in reads if graph.producer(r) is None)}) has no producer, so it "
                  "is never 'done': count only inputs that some node produces") \
            if any(graph.producer(r) is None for r in reads) else ""
        return f"'{left[0]}' ({node.op_type}) is left out: every node must appear once{hint}"
    position = {name: i for i, name in enumerate(names)}
    for name in names:
        for arg in nodes[name].inputs:
            producer = graph.producer(arg.name) if arg.exists() else None
            if producer is not None and position[producer.name] > position[name]:
                return (f"'{name}' comes before '{producer.name}', which produces its input {arg.name!r}: "
                        "the order the nodes are stored in the file is not always one ORT can run")
    return None


def topological_order(remote, fn):
    for what, model in (("diamond_model()", diamond_model()), ("shuffled_model()", shuffled_model())):
        reason = order_problem(model, remote.call(ordered, fn, model))
        if reason:
            raise CheckFailed(f"on {what}: {reason}")
    return None

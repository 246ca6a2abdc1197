"""The checks of L1_05's exercises (run where the learner's code cannot reach them).

'nodes_to_differentiate' compares the learner's walk with ortlab's GradientGraphBuilder on models that
each need one part of the walk (ortlab's builder itself is checked against ORT's gradient graphs in the
tests); 'sum_contributions' reads the Sum nodes of ORT's own gradient graph (ort_gradient_graph), which
names each Sum's output after the value, `<value>_grad`.
"""
from ortlab.gradients import GradientGraphBuilder, ort_gradient_graph
from ortlab.gradients.registry import stop_edges
from ortlab.ir import Graph
from ortlab.labs.checks import CheckFailed
from ortlab.labs.l1_05 import branching_model, node_names, predicted, shared_values_model


def _truth(model, x_names, loss):
    builder = GradientGraphBuilder(model, x_names, loss)
    values = builder.reachable_values()
    chosen = builder.nodes_to_differentiate(values)
    return builder, values, {n.name for n in builder.graph.nodes() if n.index in chosen}


def _why_not(builder, values, name, loss):
    """Why node `name` gets no gradient: it depends on no x, or it does not lead to the loss."""
    node = next(n for n in builder.graph.nodes() if n.name == name)
    if not builder._differentiable_slots(node, values):
        stopped = [a.name for i, a in enumerate(node.inputs) if a.name in values and a.exists()]
        if stopped:
            return (f"'{name}' ({node.op_type}) reads {stopped[0]!r} only through an input that carries no "
                    f"gradient (a stop-gradient edge: stop_edges('{node.op_type}', '') = "
                    f"{sorted(stop_edges(node.op_type, node.domain))})")
        return f"'{name}' ({node.op_type}) depends on no x: no gradient flows into it"
    return f"'{name}' ({node.op_type}) depends on an x but its outputs never reach the loss {loss!r}"


def _cases():
    return [("a model with a side output, a constant path, a shape path and an integer path",
             branching_model(), ["W1", "W2"], "loss"),
            ("the same model differentiated with respect to W2 only", branching_model(), ["W2"], "loss"),
            ("the same model, differentiated with respect to the input X", branching_model(), ["X"], "loss"),
            ("shared_values_model()", shared_values_model(), ["W"], "loss")]


def nodes_to_differentiate(remote, fn):
    for what, model, x_names, loss in _cases():
        builder, values, expected = _truth(model, x_names, loss)
        got = remote.call(node_names, fn, model, x_names, loss)
        if got and all(isinstance(g, int) for g in got):
            raise CheckFailed(f"on {what}: you returned numbers {got[:4]}...; return node *names* (node.name)")
        got, order = set(got), [n.name for n in builder.graph.nodes()]
        extra = [name for name in order if name in got - expected]  # in the model's order
        missing = [name for name in order if name in expected - got]
        unknown = sorted(str(g) for g in got if g not in order)
        if unknown:
            raise CheckFailed(f"on {what}, x = {x_names}: {unknown[0]!r} is not the name of a node of the model")
        if extra:
            raise CheckFailed(f"on {what}, x = {x_names}: {_why_not(builder, values, extra[0], loss)}, so it "
                              "gets no gradient")
        if missing:
            raise CheckFailed(f"on {what}, x = {x_names}: '{missing[0]}' is missing: it depends on "
                              f"{' or '.join(x_names)} and leads to the loss (did your walk stop early?)")
    return None


def _reads(graph, value):
    """Each input that reads `value`: 'add (Add, input 1), square (Mul, input 0), ...'."""
    return ", ".join(f"{n.name} ({n.op_type}, input {i})" for n in graph.consumers(value)
                     for i, arg in enumerate(n.inputs) if arg.name == value)


def sum_contributions(remote, fn):
    got = remote.call(predicted, fn)
    model = shared_values_model()
    gradient_model = ort_gradient_graph(model, ["W"], "loss")
    expected = {n.output[0][:-len("_grad")]: len(n.input) for n in gradient_model.graph.node
                if n.op_type == "Sum" and n.output[0].endswith("_grad")}
    consumers = Graph.from_model(model)
    for value, count in sorted(expected.items()):
        if value not in got:
            raise CheckFailed(f"{value!r} is missing: its gradient adds {count} contributions (it is read by "
                              f"{_reads(consumers, value)}; count each input that carries a gradient)")
        if got[value] != count:
            raise CheckFailed(f"{value!r}: you said {got[value]}, ORT's Sum adds {count}; {value} is read by "
                              f"{_reads(consumers, value)}: an input that is a stop-gradient edge (Shape's, "
                              "Reshape's shape) sends nothing, and a node reading it twice sends two")
    extra = sorted(set(got) - set(expected))
    if extra:
        single = extra[0]
        raise CheckFailed(f"{single!r}: its gradient has a single contribution (or none), so there is no Sum "
                          "for it; list only values whose gradient adds two or more")
    return None

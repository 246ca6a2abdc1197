"""GraphAugmenter: a batch of node definitions, initializers, graph inputs and outputs added to a graph at once.

Mirrors orttraining/orttraining/core/graph/graph_augmenter.h/.cc. The gradient graph builder does not
edit the graph node by node: it collects what it emits in a GraphDefs, and AugmentGraph then
1. adds each initializer, unless the graph already has one of that name (a no-op, not an error);
2. adds each node, creating its NodeArgs (GetOrCreateNodeArg) with the type the definition carries;
3. appends the new graph inputs and outputs to the existing ones, skipping any already there (ORT logs
   "skipping addition of duplicate NodeArg" at INFO); a name that is no NodeArg of the graph is an error;
4. resolves the graph.
OverrideGraphOutputs replaces the outputs instead; there a duplicate is an error.
"""
from dataclasses import dataclass, field

from ortlab.errors import OrtlabError


class GraphAugmentError(OrtlabError):
    """A GraphDefs names an input or output the graph does not have, or repeats one it may not."""


@dataclass
class GraphDefs:
    """What an augmentation adds: onnx NodeProtos, {name: numpy array} initializers, value names."""

    node_defs: list = field(default_factory=list)
    initializers: dict = field(default_factory=dict)
    graph_inputs: list = field(default_factory=list)
    graph_outputs: list = field(default_factory=list)

    def __repr__(self):
        ops = {}
        for node in self.node_defs:
            ops[node.op_type] = ops.get(node.op_type, 0) + 1
        common = ", ".join(f"{op} {n}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1])[:5])
        return (f"GraphDefs({len(self.node_defs)} node defs ({common}{', ...' if len(ops) > 5 else ''}), "
                f"{len(self.initializers)} initializers, inputs +{_few(self.graph_inputs)}, "
                f"outputs +{_few(self.graph_outputs)})")


def _few(names, shown=3):
    """A list of names as [first, second, third, ...] (N) when it is longer than `shown`."""
    return str(names) if len(names) <= shown else f"{str(names[:shown])[:-1]}, ...] ({len(names)})"


def _appended(graph, existing, names, context, duplicates_allowed=True):
    """AddToExistingNodeArgs: `existing` then each of `names` not already in it."""
    result = list(existing)
    for name in names:
        if graph.node_arg(name) is None:
            raise GraphAugmentError(f"{context}: the graph has no value named {name!r}")
        if name in result:
            if not duplicates_allowed:
                raise GraphAugmentError(f"{context}: {name!r} is named twice")
            continue
        result.append(name)
    return result


def augment_graph(graph, defs, resolve=True):
    """GraphAugmenter::AugmentGraph on an ortlab.ir Graph (changed in place, and returned)."""
    for name, value in defs.initializers.items():
        if name not in graph.initializers:
            graph.add_initializer(name, value)
    for proto in defs.node_defs:
        graph.add_node(proto.op_type, list(proto.input), list(proto.output), name=proto.name,
                       domain=proto.domain, _attributes=proto.attribute)
    graph.inputs = _appended(graph, graph.inputs, defs.graph_inputs, "add graph inputs")
    graph.outputs = _appended(graph, graph.outputs, defs.graph_outputs, "add graph outputs")
    if resolve:
        graph.resolve(infer_shapes=False)
    return graph


def override_graph_outputs(graph, names):
    """GraphAugmenter::OverrideGraphOutputs: the graph's outputs become exactly `names`."""
    graph.outputs = _appended(graph, [], names, "override graph outputs", duplicates_allowed=False)
    return graph

"""Value indices, execution order and lifetimes: the bookkeeping the allocation planner starts from.

Mirrors onnxruntime/core/framework/ort_value_name_idx_map.h and SessionState::CreateGraphInfo
(onnxruntime/core/framework/session_state.cc: every graph input gets an index first, then, node by
node in index order, each input, implicit input and output the first time it is seen, then the graph
outputs), and the DeviceBasedPartitioner of onnxruntime/core/framework/allocation_planner.cc (one CPU
stream holding every node in GraphViewer::GetNodesInTopologicalOrder(execution_order)).
"""
from dataclasses import dataclass, field


def value_index_map(graph):
    """{value name: ML value index} in ORT's order (OrtValueNameIdxMap): the one map the allocation planner
    and ortlab.engine's SessionState both use."""
    names = {}

    def add(name):
        if name and name not in names:
            names[name] = len(names)

    for name in graph.inputs:
        add(name)
    for node in graph.nodes():
        for arg in node.inputs:
            add(arg.name)
        for name in node.implicit_input_names():
            add(name)
        for arg in node.outputs:
            add(arg.name)
    for name in graph.outputs:
        add(name)
    return names


@dataclass
class Lifetime:
    """Where a value is defined and last read in the execution order (program counters)."""

    name: str
    defined_at: int = None      # pc of its producer; None for inputs and initializers
    last_use: int = None        # pc of its last reader; None when no node reads it
    readers: list = field(default_factory=list)


def lifetimes(graph, order):
    """{value name: Lifetime} for every value a node of `order` reads or writes."""
    found = {}
    for pc, node in enumerate(order):
        for arg in node.inputs:
            if arg.exists():
                life = found.setdefault(arg.name, Lifetime(arg.name))
                life.last_use = pc
                life.readers.append(pc)
        for arg in node.outputs:
            if arg.exists():
                found.setdefault(arg.name, Lifetime(arg.name)).defined_at = pc
    return found

"""Value indices, execution order and lifetimes: the bookkeeping the allocation planner starts from.

Mirrors onnxruntime/core/framework/ort_value_name_idx_map.h and SessionState::CreateGraphInfo
(onnxruntime/core/framework/session_state.cc: every graph input gets an index first, then, node by
node in index order, each input, implicit input and output the first time it is seen, then the graph
outputs), and the DeviceBasedPartitioner of onnxruntime/core/framework/allocation_planner.cc (one CPU
stream holding every node in GraphViewer::GetNodesInTopologicalOrder(execution_order)).
"""
from typing import NamedTuple, Optional


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


class Lifetime(NamedTuple):
    """A value's life over the execution order, in program counters (steps): the one shape every part of
    the lab uses (ortlab.memory's plan rows, the engine walkthrough's frame view, lab09's exercise).

    defined_at: the step producing it (None: a feed or an initializer); last_use: the last step reading it,
    its subgraphs' outer-scope reads included (None: nobody reads it); size: bytes, when known."""

    defined_at: Optional[int]
    last_use: Optional[int]
    size: Optional[int] = None


def lifetimes(graph, order):
    """{value name: Lifetime} for every value a node of `order` reads or writes."""
    defined, last = {}, {}
    for pc, node in enumerate(order):
        for name in node_reads(node):
            last[name] = pc
        for arg in node.outputs:
            if arg.exists():
                defined[arg.name] = pc
    return {name: Lifetime(defined.get(name), last.get(name)) for name in {**last, **defined}}


def node_reads(node):
    """The values a node reads: its inputs, then the outer-scope values its subgraphs read (ORT's planner
    walks InputDefs and ImplicitInputDefs alike)."""
    return [a.name for a in node.inputs if a.exists()] + list(node.implicit_input_names())

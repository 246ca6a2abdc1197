"""Execution orders: ORT's default reverse-DFS order and its priority-based Kahn order.

Mirrors onnxruntime/core/graph/graph_viewer.cc (GraphViewer's constructor and
PriorityNodeCompare) and Graph::ReverseDFSFrom / Graph::KahnsTopologicalSort in
onnxruntime/core/graph/graph.cc. ORT picks one with SessionOptions.execution_order.
"""
import heapq

from ortlab.ir.errors import GraphCycleError, GraphError

ORDERS = ("default", "priority")
HIGH_PRIORITY_OPS = ("Shape", "Size")  # computed first: they unblock shape arithmetic early


def reverse_dfs_order(graph, training_build=True):
    """ORT's DEFAULT order: a reverse DFS from the leaf nodes, emitting each node on leave.

    Leaves (nodes whose outputs no node consumes) go on the stack in index order, so
    the walk starts from the last leaf; a node's producers are pushed in ascending
    index order, so the producer with the highest index is explored first. Training builds of ORT (ENABLE_TRAINING,
    like the onnxruntime-training wheel the lab uses) then move every Shape/Size
    node to right after the producer of its input, so that the input's memory can
    be released as early as possible.
    """
    nodes = graph.nodes()
    leaves = [n for n in nodes if not n.output_nodes()]
    if nodes and not leaves:
        raise GraphCycleError(_cycle_message(graph))
    stack = [(n, False) for n in leaves]
    visited, order = set(), []
    while stack:
        node, leaving = stack.pop()
        if leaving:
            order.append(node)
            continue
        if node.index in visited:
            continue
        visited.add(node.index)
        stack.append((node, True))
        for producer in sorted(node.input_nodes(), key=lambda n: n.index):
            if producer.index not in visited:
                stack.append((producer, False))
    if len(order) != len(nodes) or not is_topological(order):
        raise GraphCycleError(_cycle_message(graph))
    return _shape_size_after_parents(order) if training_build else order


def _shape_size_after_parents(order):
    """Move each Shape/Size node that has a producer to just after that producer."""
    followers = {}
    for node in sorted(order, key=lambda n: n.index):
        parents = node.input_nodes()
        if node.op_type in HIGH_PRIORITY_OPS and parents:
            followers.setdefault(min(p.index for p in parents), []).append(node)
    moved, result = {n.index for group in followers.values() for n in group}, []
    for node in order:
        if node.index in moved:
            continue
        result.append(node)
        result += followers.get(node.index, [])
    return result


def _priority_key(node):
    """Smaller first: Shape/Size, then forward before backward, then index. ORT compares
    Node::Priority() second (its memory optimizer raises it for recomputed nodes); ortlab
    nodes have no priority, i.e. all the default, so that comparison never decides."""
    backward = node.attribute("__backwardpass", 0) % 2 == 1
    return node.op_type not in HIGH_PRIORITY_OPS, backward, node.index


def priority_based_order(graph):
    """ORT's PRIORITY_BASED order: Kahn's sort with a priority queue (PriorityNodeCompare)."""
    nodes = graph.nodes()
    in_degree = {n.index: len(n.input_nodes()) for n in nodes}
    ready = [(_priority_key(n), n.index) for n in nodes if in_degree[n.index] == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, index = heapq.heappop(ready)
        node = graph.node(index)
        order.append(node)
        for consumer in node.output_nodes():  # one entry per edge, implicit inputs' too, as ORT's
            in_degree[consumer.index] -= 1
            if in_degree[consumer.index] == 0:
                heapq.heappush(ready, (_priority_key(consumer), consumer.index))
    if len(order) != len(nodes):
        raise GraphCycleError(_cycle_message(graph))
    return order


def topological_order(graph, kind="default"):
    """Nodes in ORT's `kind` order: 'default' (reverse DFS) or 'priority' (priority-based Kahn)."""
    if kind not in ORDERS:
        raise GraphError(f"unknown order {kind!r}; use one of {', '.join(ORDERS)} "
                          "(ORT's ExecutionOrder.DEFAULT and PRIORITY_BASED)")
    return reverse_dfs_order(graph) if kind == "default" else priority_based_order(graph)


def is_topological(order):
    """True when every node comes after the producers of all its inputs."""
    seen = set()
    for node in order:
        if any(p.index not in seen for p in node.input_nodes()):
            return False
        seen.add(node.index)
    return True


def find_cycle(graph):
    """Node indices along one cycle, or [] when the graph is acyclic."""
    colour, parent = {}, {}
    for start in graph.nodes():
        if colour.get(start.index):
            continue
        stack = [(start, iter(start.output_nodes()))]
        colour[start.index] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                colour[node.index] = 2
                stack.pop()
            elif colour.get(child.index) == 1:
                cycle, at = [child.index], node.index
                while at != child.index:
                    cycle.append(at)
                    at = parent[at]
                return cycle[::-1]
            elif not colour.get(child.index):
                colour[child.index], parent[child.index] = 1, node.index
                stack.append((child, iter(child.output_nodes())))
    return []


def _cycle_message(graph):
    cycle = find_cycle(graph)
    path = " -> ".join(_label(graph.node(i)) for i in cycle + cycle[:1])
    return (f"the graph has a cycle ({path}); a node's output feeds back into its own inputs. "
            "Break the loop: ONNX graphs must be acyclic (loops go in a Loop node's body)")


def _label(node):
    return f"{node.name or node.op_type}#{node.index}"

"""The checks of L1_02's exercises (run where the learner's code cannot reach them).

The onnxruntime installed here is a CPU build: it has no device EP, so it never partitions across devices and
never inserts a Memcpy node. Both checks therefore read the decisions of ortlab.engine's session, whose
partitioner mirrors onnxruntime/core/framework/graph_partitioner.cc (each EP in priority order claims the nodes
its kernel lookup finds a kernel for, first claim wins, the CPU EP takes the rest) and whose MemcpyTransformer
mirrors onnxruntime/core/optimizer/transformer_memcpy.cc. tests/labs/test_exercise_facts_l1_02.py checks both
against an independent reading of those rules, and the models' outputs against ORT's.
"""
from collections import Counter

from ortlab.labs.checks import CheckFailed
from ortlab.labs.l1_02 import (CPU, MEMCPY_MODELS, PLACEMENT_PROVIDERS, copies_made, memcpy_model, placed,
                               placement_model, predicted_placements)


def _session(model, providers):
    from ortlab.engine import InferenceSession, SessionOptions  # lazy: loaded only when this runs

    return InferenceSession(model, SessionOptions(graph_optimization_level=0, log_severity_level=3),
                            providers=list(providers))


def ortlab_copies(model):
    """[(kind, value)] for each Memcpy node ortlab.engine's session adds to `model` with the Triton EP first:
    a MemcpyFromHost copies its input, a MemcpyToHost writes the original name for the host readers."""
    sess = _session(model, ["TritonExecutionProvider"])
    return [(s.node.op_type, s.node.input_names[0] if s.node.op_type == "MemcpyFromHost" else s.node.output_names[0])
            for s in sess.state.steps if s.node.op_type.startswith("Memcpy")]


def _readers(graph, value):
    """[(node, reads it in device memory)] for every reader of `value`."""
    found = []
    for node in graph.nodes:
        for i, name in enumerate(node.inputs):
            if name == value:
                found.append((node, node.ep != CPU and i not in node.cpu_inputs))
    return found


def _producer(graph, value):
    return next((n for n in graph.nodes if value in n.outputs), None)


def _why_not(graph, kind, value):
    """Why ORT adds no (kind, value) copy: the rule the learner missed."""
    readers = _readers(graph, value)
    device_readers = [n.name for n, on_device in readers if on_device]
    host_readers = [n.name for n, on_device in readers if not on_device]
    producer = _producer(graph, value)
    if not readers and producer is None and value not in graph.inputs + graph.initializers:
        return f"{value!r} is no value of this graph"
    if kind == "MemcpyFromHost":
        cpu_readers = [n.name for n, on_device in readers if not on_device and n.ep != CPU]
        if cpu_readers and not device_readers:
            return (f"{cpu_readers[0]!r} runs on the device but reads {value!r} in CPU memory (its kernel declares "
                    f"InputMemoryType CPU for that input), so the value stays on the host: no copy")
        if value in graph.initializers:
            return (f"{value!r} is an initializer: the session places each initializer where its readers need it, "
                    f"and one read on both sides is duplicated for the device, with no node")
        if value in graph.inputs and not host_readers:
            return (f"graph input {value!r} is read on the device only: the run copies a feed to where it is read "
                    f"when it is fed (utils::CopyInputsAcrossDevices), with no node")
        if producer is not None and producer.ep != CPU:
            return f"{value!r} is made on the device by {producer.name!r}: it is already there"
        if not device_readers:
            return f"no node reads {value!r} in device memory"
    else:
        if producer is None or producer.ep == CPU:
            return f"{value!r} is made on the host, not on the device: nothing to copy back"
        if not host_readers and value in graph.outputs:
            return (f"{value!r} is a graph output made on the device, and no host node reads it: the run copies it "
                    f"to the fetch's device at the end (utils::CopyOutputsAcrossDevices), with no node")
        if not host_readers:
            return f"no node reads {value!r} on the host"
    return None


def _why_needed(graph, kind, value):
    readers = _readers(graph, value)
    if kind == "MemcpyFromHost":
        device = [n.name for n, on_device in readers if on_device]
        source = f"graph input {value!r}" if value in graph.inputs else f"{value!r}, made on the host,"
        return (f"{source} is read in device memory by {', '.join(device)}; ORT adds one MemcpyFromHost for it "
                f"(after {value}) and every device reader reads the copy")
    host = [n.name for n, on_device in readers if not on_device]
    return (f"{value!r}, made on the device by {_producer(graph, value).name!r}, is read on the host by "
            f"{', '.join(host)}; ORT adds one MemcpyToHost for it and every host reader reads the copy")


def memcpy_nodes(remote, fn):
    for name in MEMCPY_MODELS:
        model = memcpy_model(name)
        graph = placed(model)
        truth = Counter(ortlab_copies(model))
        got = Counter(tuple(pair) for pair in remote.call(copies_made, fn, graph))
        where = f"on model {name!r}"
        for pair, count in got.items():
            if count > 1 and truth[pair] == 1:
                readers = [n.name for n, _ in _readers(graph, pair[1])]
                raise CheckFailed(f"{where}: you copied {pair[1]!r} {count} times ({pair[0]}); ORT adds one copy per "
                                  f"value, not one per reader: all its readers ({', '.join(readers)}) read the "
                                  "same copy")
            if pair not in truth:
                why = _why_not(graph, *pair)
                raise CheckFailed(f"{where}: ORT adds no {pair[0]} for {pair[1]!r}: {why}")
        for pair in truth:
            if pair not in got:
                raise CheckFailed(f"{where}: a {pair[0]} for {pair[1]!r} is missing: {_why_needed(graph, *pair)}")
    return None


def ortlab_placements(providers):
    """{node name: EP} for placement_model() partitioned by ortlab.engine with `providers`."""
    sess = _session(placement_model(), providers)
    return {s.node.name: s.provider.type for s in sess.state.steps if not s.node.op_type.startswith("Memcpy")}


def _why_ep(node, ep, case):
    """Why `node` of placement_model() runs on `ep` in `case`."""
    if case == "cpu_first":
        return ("the CPU EP is first in this session's list, and the first EP that claims a node keeps it: the CPU EP "
                "has a kernel for every op here, so it claims every node before the Triton EP is asked")
    if node.op_type == "Softmax" and node.name == "softmax64":
        return ("its input is float64 (the Cast before it), and the Triton Softmax takes float32 only: the type "
                "constraint makes the Triton EP decline it, so the CPU EP, last, takes it")
    if node.op_type == "ReduceSum":
        return ("ReduceSum has a Triton kernel that takes float32 data; its axes are read in CPU memory "
                "(InputMemoryType), but that changes where one input lives, not which EP runs the node")
    if ep == CPU:
        return f"the Triton EP has no {node.op_type} kernel, so it declines the node and the CPU EP, last, takes it"
    return (f"the Triton EP, first in the list, has a {node.op_type} kernel for its float32 inputs, so it claims "
            "the node")


def placements(remote, fn):
    got = remote.call(predicted_placements, fn)
    model = placement_model()
    nodes = {n.name: n for n in model.graph.node}
    for case in PLACEMENT_PROVIDERS:
        if case not in got:
            raise CheckFailed(f"{case!r} is missing: give {{node name: EP}} for each of "
                              f"{', '.join(repr(c) for c in PLACEMENT_PROVIDERS)}")
    extra = [c for c in got if c not in PLACEMENT_PROVIDERS]
    if extra:
        raise CheckFailed(f"{extra[0]!r} is not one of the sessions; they are "
                          f"{', '.join(repr(c) for c in PLACEMENT_PROVIDERS)}")
    for case, providers in PLACEMENT_PROVIDERS.items():
        truth = ortlab_placements(providers)
        said = got[case]
        unknown = [k for k in said if k not in nodes]
        if unknown:
            raise CheckFailed(f"{case}: {unknown[0]!r} is not a node of the model; name its nodes only (the Memcpy "
                              f"nodes come afterwards, from the memcpy transformer): {', '.join(nodes)}")
        for name in nodes:
            if name not in said:
                raise CheckFailed(f"{case}: node {name!r} is missing: every node runs on some EP")
            if said[name] not in providers + [CPU]:
                raise CheckFailed(f"{case}: {said[name]!r} is not an EP of this session, which has "
                                  f"{', '.join(dict.fromkeys(providers + [CPU]))}")
        for name in nodes:
            if said[name] != truth[name]:
                raise CheckFailed(f"{case}: {name!r} runs on {truth[name]}, you said {said[name]}: "
                                  f"{_why_ep(nodes[name], truth[name], case)}")
    return None

"""Assign every node to an execution provider: ask each EP in priority order, first claim wins.

Mirrors onnxruntime/core/framework/graph_partitioner.cc (PartitionOnnxFormatModel: for each EP
in the session's order, GetCapability, then TryAssignSingleNode for each claimed node not yet
assigned). The CPU EP is last, so it takes whatever no other EP claimed; a node nobody claims
fails session initialization, as ORT's "Could not find an implementation for ..." does. Then what
TransformGraph runs after partitioning at every level: InsertCastTransformer
(ortlab.transformers.insert_cast_transformer) and its RemoveDuplicateCastTransformer.
"""
import numpy as np

from ortlab.engine.errors import NotImplementedKernel
from ortlab.engine.kernel_registry import CPU
from ortlab.onnx_defs import node_label, op_name
from ortlab.transformers.insert_cast_transformer import insert_casts
from ortlab.transformers.remove_duplicate_cast import remove_duplicate_casts as remove
from ortlab.transformers.session_transforms import has_function_body, inline_nodes


def input_dtypes(graph, node):
    """The numpy dtype name of each input of `node` (None where the graph does not know it)."""
    found = []
    for arg in node.inputs:
        found.append(graph.node_arg(arg.name).dtype if arg.exists() else None)
    return found


def kernel_lookup(provider, graph):
    """ORT's IKernelLookup for one EP: node -> KernelCreateInfo or None."""
    return lambda node: provider.find_kernel(node, input_dtypes(graph, node))[0]


def partition(graph, providers, logger):
    """{node index: EP type} for every node of `graph`; providers in priority order, CPU last. A node no
    EP claims whose op has a function body is replaced by the body, and the new nodes are partitioned
    in turn (ORT: InlineNodes, repeated while the graph changes)."""
    assignment = _assign(graph, providers, logger, {})
    while any(n.index not in assignment and has_function_body(n) for n in graph.nodes()):
        inlined = inline_nodes(graph)
        for op in inlined:
            logger.info("graph_partitioner.cc InlineNodes", f"Inlined the function body of {op}: no EP has a kernel")
        if not inlined:
            break
        graph.resolve()  # the new values' types, as ORT's Resolve after InlineNodes
        assignment = _assign(graph, providers, logger, assignment)
    missing = [n for n in graph.nodes() if n.index not in assignment]
    if missing:
        raise NotImplementedKernel(_missing_message(graph, missing[0], providers))
    for cast in insert_casts(graph, assignment):
        assignment[cast.index] = CPU
        logger.info("insert_cast_transformer.cc InsertCastTransformer", f"Inserted Cast node {cast.name}")
    remove_duplicate_casts(graph, logger)
    live = {n.index for n in graph.nodes()}
    return {index: ep for index, ep in assignment.items() if index in live}


def remove_duplicate_casts(graph, logger):
    """What TransformGraph runs next at every level: InsertCastTransformer's RemoveDuplicateCastTransformer
    (onnxruntime/core/optimizer/insert_cast_transformer.cc; ortlab.memory.session_graph mirrors it)."""
    for name in remove(graph):
        logger.info("insert_cast_transformer.cc RemoveDuplicateCastTransformer", f"Removed Cast node {name}")


def _assign(graph, providers, logger, assignment):
    """One pass of GetCapability over the EPs, in order; nodes already assigned keep their EP."""
    for provider in providers:
        try:
            claimed = provider.get_capability(graph, kernel_lookup(provider, graph))
        except Exception as exc:  # noqa: BLE001 (a learner's EP: name it)
            raise NotImplementedKernel(f"{provider.type}.get_capability raised {type(exc).__name__}: {exc}") from exc
        for index in _checked_claims(graph, provider, claimed):
            assignment.setdefault(index, provider.type)
        for node in graph.nodes():
            if node.index not in assignment and provider is not providers[-1]:
                _, why = provider.find_kernel(node, input_dtypes(graph, node))
                logger.info("GetCapability", f"{provider.type} kernel not found in registries for Op type: "
                            f"{node.op_type} node name: {node.name} ({why})")
    return assignment


def _checked_claims(graph, provider, claimed):
    """Node indices from what get_capability returned (ORT: ComputeCapability wrapping node indices)."""
    known = {n.index for n in graph.nodes()}
    if isinstance(claimed, (str, bytes, dict)) or not hasattr(claimed, "__iter__"):
        raise NotImplementedKernel(f"{provider.type}.get_capability returned {type(claimed).__name__} {claimed!r:.80}; "
                                   "it must return a list of the node indices it claims (node.index), [] for none "
                                   "(did it forget a return statement?)")
    indices = [c.index if hasattr(c, "op_type") else c for c in claimed]  # a Node is taken as its index
    indices = [int(i) if isinstance(i, np.integer) else i for i in indices]  # e.g. from np.flatnonzero
    bad = [i for i in indices if isinstance(i, bool) or not isinstance(i, int) or i not in known]
    if bad:
        raise NotImplementedKernel(f"{provider.type}.get_capability must return a list of node indices of the "
                                   f"graph (node.index), got {bad[0]!r} in {claimed!r}"[:400])
    return indices


def _missing_message(graph, node, providers):
    lines = [f"Could not find an implementation for {op_name(node.op_type, node.domain)} node "
             f"{node_label(node.to_proto())}. The execution providers asked, in order:"]
    for provider in providers:
        _, why = provider.find_kernel(node, input_dtypes(graph, node))
        known = provider.registered_ops()
        shown = ", ".join(known[:12]) + (f", ... ({len(known)} in all)" if len(known) > 12 else "")
        lines.append(f"  {provider.type}: {why}; it registers {shown or 'no explicit kernels'}")
    lines.append("Register a kernel with @ortlab.engine.register_op_kernel, or check the op's name and domain.")
    return "\n".join(lines)

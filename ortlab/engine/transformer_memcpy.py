"""Insert MemcpyFromHost / MemcpyToHost where a value crosses between host and a device EP.

Mirrors onnxruntime/core/optimizer/transformer_memcpy.cc (MemcpyTransformer::ApplyImpl runs
TransformerMemcpyImpl once per non-CPU EP, in the session's order). For that EP: every value one of its
nodes reads in device memory is a "provider input", every value another EP's node reads (or its own
node reads through an InputMemoryType CPU input) is a "non-provider input"; likewise for outputs. A
value passed between two device EPs thus goes through the host: a MemcpyToHost of the producer's EP,
then a MemcpyFromHost of the reader's. Then:
  - a host-produced value read by device nodes gets one MemcpyFromHost (all device readers rewired);
  - a device-produced value read on the host gets one MemcpyToHost (the device node now writes a new
    value; the copy writes the original name, so host readers keep it);
  - a graph output computed on the device gets no node: the run copies it to the fetch's device at the
    end (utils::CopyOutputsAcrossDevices). The file's overview comment says graph outputs count as
    non-provider references, but ModifyGraph never adds them;
  - a graph input read on both sides gets a MemcpyFromHost; read on the device only, it is copied
    when fed (utils::CopyInputsAcrossDevices), with no node;
  - an initializer read on both sides is duplicated for the device side, with no node.
"""
from ortlab.engine.errors import NotImplementedKernel
from ortlab.transformers.graph_utils import unique_value_name as _unique


def _node_name(graph, taken):
    name = "Memcpy" if "Memcpy" not in taken else f"Memcpy_token_{len(taken)}"
    taken.add(name)
    return name


class MemcpyTransformer:
    """Run once after partitioning; `apply` returns the number of Memcpy nodes added."""

    def __init__(self, providers, logger):
        self.device_eps = [p for p in providers if not p.is_cpu_based]
        self.device_ep = None  # the EP of the pass running now
        self.logger = logger

    def classify(self, graph, assignment, kernel_defs):
        """(provider inputs, non-provider inputs, provider outputs, non-provider outputs)."""
        ep = self.device_ep.type
        p_in, np_in, p_out, np_out = set(), set(), set(), set()
        for node in graph.nodes():
            on_device = assignment[node.index] == ep
            kdef = kernel_defs[node.index]
            for i, arg in enumerate(node.inputs):
                if arg.exists():
                    device_read = on_device and not kdef.is_input_on_cpu(i)
                    (p_in if device_read else np_in).add(arg.name)
            for i, arg in enumerate(node.outputs):
                if arg.exists():
                    device_write = on_device and not kdef.is_output_on_cpu(i)
                    (p_out if device_write else np_out).add(arg.name)
        return p_in, np_in, p_out, np_out

    def apply(self, graph, assignment, kernel_defs):
        added = 0
        for ep in self.device_eps:
            self.device_ep = ep
            added += self._apply_for_device_ep(graph, assignment, kernel_defs)
        return added

    def _apply_for_device_ep(self, graph, assignment, kernel_defs):
        p_in, np_in, p_out, np_out = self.classify(graph, assignment, kernel_defs)
        taken, added = {n.name for n in graph.nodes()}, 0
        for name in sorted(p_in):
            if name in graph.initializers:
                if name in np_in:
                    self._duplicate_initializer(graph, name, assignment, kernel_defs)
            elif (name in np_out) or (name in graph.inputs and name in np_in):
                added += self._from_host(graph, name, assignment, kernel_defs, taken)
        for name in sorted(p_out & np_in):
            added += self._to_host(graph, name, assignment, kernel_defs, taken)
        if added:
            self.logger.warning("transformer_memcpy.cc ApplyImpl",
                                f"{added} Memcpy nodes are added to the graph {graph.name} for "
                                f"{self.device_ep.type}. It might have negative impact on performance.")
        return added

    def _device_readers(self, graph, name, assignment, kernel_defs):
        """(node, input index) pairs reading `name` in device memory."""
        return [(node, i) for node in graph.consumers(name) for i, arg in enumerate(node.inputs)
                if arg.name == name and assignment[node.index] == self.device_ep.type
                and not kernel_defs[node.index].is_input_on_cpu(i)]

    def _from_host(self, graph, name, assignment, kernel_defs, taken):
        copy = self._device_value(graph, name, assignment, kernel_defs)
        node = graph.add_node("MemcpyFromHost", [name], [copy], name=_node_name(graph, taken))
        self._assign(node, assignment, kernel_defs)
        self.logger.info("transformer_memcpy.cc AddCopyNode",
                         f"Add MemcpyFromHost after {name} for {self.device_ep.type}")
        return 1

    def _to_host(self, graph, name, assignment, kernel_defs, taken):
        producer = graph.producer(name)
        device_copy = self._device_value(graph, name, assignment, kernel_defs)
        graph.replace_node_output(producer, producer.output_names.index(name), device_copy)
        node = graph.add_node("MemcpyToHost", [device_copy], [name], name=_node_name(graph, taken))
        self._assign(node, assignment, kernel_defs)
        self.logger.info("transformer_memcpy.cc AddCopyNode",
                         f"Add MemcpyToHost before {name} for {self.device_ep.type}")
        return 1

    def _device_value(self, graph, name, assignment, kernel_defs):
        """A new value of `name`'s type for the device side; every device reader now reads it."""
        copy = _unique(graph, f"{name}_device")
        graph.get_or_create_node_arg(copy, graph.node_arg(name).type_proto)
        for node, i in self._device_readers(graph, name, assignment, kernel_defs):
            graph.replace_node_input(node, i, copy)
        return copy

    def _duplicate_initializer(self, graph, name, assignment, kernel_defs):
        copy = _unique(graph, f"{name}_device")
        graph.add_initializer(copy, graph.initializer_value(name))
        for node, i in self._device_readers(graph, name, assignment, kernel_defs):
            graph.replace_node_input(node, i, copy)
        self.logger.info("transformer_memcpy.cc ProcessInitializers",
                         f"Duplicate initializer {name} as {copy} for {self.device_ep.type}")

    def _assign(self, node, assignment, kernel_defs):
        assignment[node.index] = self.device_ep.type
        found, _ = self.device_ep.find_kernel(node)
        if found is None:
            raise NotImplementedKernel(
                f"{self.device_ep.type} keeps tensors on {self.device_ep.device} but registers no {node.op_type} "
                f"kernel to copy values between host and device; register MemcpyFromHost and MemcpyToHost for it "
                f"(input_memory=(0,) and output_memory=(0,): see triton_execution_provider.py), or give it a CPU "
                f"device")
        kernel_defs[node.index] = found.kernel_def



"""SessionState: everything initialization prepares so that a run is only a loop.

Mirrors onnxruntime/core/framework/session_state.h/.cc: the OrtValueNameIdxMap (every value has
an index), one kernel per node created with its attributes bound (CreateKernels), the
initializers placed on the device of their readers (SaveInitializedTensors), and the
execution plan (onnxruntime/core/framework/sequential_execution_plan.h: the steps in execution
order and, for each step, the values released after it). The value-index map and the release plan are
the allocation planner's own (ortlab.memory: SessionState::CreateGraphInfo's OrtValueNameIdxMap, and
PlannerImpl::GenerateDeallocationPlan run on this very graph, order and kernels), so the engine frees
exactly where ORT's plan says.
"""
from dataclasses import dataclass, field

from onnx import StringStringEntryProto

from ortlab.engine.errors import EngineError
from ortlab.engine.op_kernel import OpKernelInfo
from ortlab.errors import OrtlabError
from ortlab.memory.allocation_planner import PlannerImpl
from ortlab.memory.lifetimes import value_index_map
from ortlab.onnx_defs import op_name


@dataclass
class ExecutionStep:
    """One node of the plan (ORT: LaunchKernelStep) with the frame indices it reads and writes."""

    node: object
    provider: object
    kernel: object
    inputs: list
    outputs: list
    implicit: list = field(default_factory=list)       # (name, index) of outer values a subgraph reads
    output_dtypes: list = field(default_factory=list)  # numpy dtype per output (None: unknown)
    output_shapes: list = field(default_factory=list)  # inferred dims per output (int, or None: any)
    output_providers: list = field(default_factory=list)  # the EP whose memory holds each output
    releases: list = field(default_factory=list)       # value indices freed after this step (the plan's)
    graph_outputs: list = field(default_factory=list)  # per output: a graph output (a shape mismatch warns)

    def label(self):
        node = self.node
        return f"{op_name(node.op_type, node.domain)} node '{node.name or node.output_names[0]}'"


def _expected_shape(arg):
    """The dims shape inference gave an output: a tuple of ints (known) and None (symbolic or
    unknown), or None when even the rank is unknown."""
    dims = None if arg is None else arg.shape
    return None if dims is None else tuple(d if isinstance(d, int) else None for d in dims)


class SessionState:
    """The graph as it will run: value indices, kernels, initializers and the plan."""

    def __init__(self, graph, assignment, providers, kernel_infos, order, logger, types=None, enable_mem_reuse=True):
        self.graph, self.assignment, self.logger = graph, assignment, logger
        self.providers = {p.type: p for p in providers}
        self.cpu = self.providers["CPUExecutionProvider"]
        self.index_of = value_index_map(graph)  # ORT's OrtValueNameIdxMap, the planner's own numbering
        for name in graph.initializers:  # an initializer no node reads (ORT drops it at load) still gets a slot
            self.index_of.setdefault(name, len(self.index_of))
        self.value_names = list(self.index_of)
        self.device_readers = self._device_readers(order, kernel_infos)
        self.kernel_defs = {node.index: kernel_infos[node.index].kernel_def for node in order}
        self.steps = [self._step(node, kernel_infos[node.index]) for node in order]
        self.initializers = {self.index_of[name]: self._place(name, graph.initializer_value(name))
                             for name in graph.initializers}
        self.feed_providers = {name: self._reader_provider(name) for name in graph.inputs}
        self.plan_releases(types or {}, enable_mem_reuse)

    def _device_readers(self, order, kernel_infos):
        """{value name: EP} for values read in a device EP's memory (never also on the host:
        the memcpy transformer made sure of that)."""
        found = {}
        for node in order:
            provider = self.providers[self.assignment[node.index]]
            if provider.is_cpu_based:
                continue
            for i, arg in enumerate(node.inputs):
                if arg.exists() and not kernel_infos[node.index].kernel_def.is_input_on_cpu(i):
                    found[arg.name] = provider
        return found

    def _reader_provider(self, name):
        return self.device_readers.get(name, self.cpu)

    def _place(self, name, value):
        """An initializer on the device of its readers (ORT: SaveInitializedTensors)."""
        provider = self._reader_provider(name)
        return value if provider.is_cpu_based else provider.from_host(value)

    def _step(self, node, create_info):
        provider = self.providers[self.assignment[node.index]]
        try:
            kernel = create_info.create(OpKernelInfo(node, create_info.kernel_def, provider.type))
        except OrtlabError:
            raise
        except Exception as exc:  # noqa: BLE001 (a learner's kernel class: say which and how it is built)
            raise EngineError(f"creating the {create_info.kernel_class.__name__} kernel for {node.op_type} node "
                              f"'{node.name}' failed: {type(exc).__name__}: {exc}. A kernel class is built as "
                              "cls(info) (OpKernelInfo: info.attribute(name, default), info.node)") from exc
        self.logger.verbose("session_state.cc CreateKernels", f"Created kernel {type(kernel).__name__} for "
                            f"{node.op_type} node '{node.name}' on {provider.type}")
        index = self.index_of
        args = [self.graph.node_arg(o.name) if o.exists() else None for o in node.outputs]
        kdef = create_info.kernel_def
        return ExecutionStep(
            node, provider, kernel,
            inputs=[index[a.name] if a.exists() else -1 for a in node.inputs],
            outputs=[index[o.name] if o.exists() else -1 for o in node.outputs],
            implicit=[(name, index[name]) for name in node.implicit_input_names() if name in index],
            output_dtypes=[a.np_dtype if a is not None else None for a in args],
            output_shapes=[_expected_shape(a) for a in args],
            graph_outputs=[o.name in self.graph.outputs for o in node.outputs],
            output_providers=[self.cpu if kdef.is_output_on_cpu(i) else provider for i in range(len(node.outputs))])

    def plan_releases(self, types, enable_mem_reuse=True):
        """The allocation plan of this graph (ORT: SequentialPlanner::CreatePlan, which SessionState runs at
        initialization): ortlab.memory's PlannerImpl over the engine's own order, index map, the created
        kernels' KernelDefs and each output's location; each step then releases what the plan's
        deallocation plan frees after it: a buffer at the last reader of any value living in it, with every
        value living there. A graph output, feed or initializer is never released; nor is a value nobody
        reads."""
        locations = {self.value_names[slot]: provider.type
                     for step in self.steps for slot, provider in zip(step.outputs, step.output_providers)
                     if slot >= 0 and not provider.is_cpu_based}
        self.allocation_plan = PlannerImpl(
            self.graph, [step.node for step in self.steps], self.index_of, types, enable_mem_reuse,
            declarations=lambda node: self.kernel_defs[node.index], locations=locations).create_plan()
        releases = self.allocation_plan.releases()
        for k, step in enumerate(self.steps):
            step.releases = releases.get(k, [])

    def placements(self):
        """{EP type: [nodes]} in plan order."""
        found = {}
        for step in self.steps:
            found.setdefault(step.provider.type, []).append(step.node)
        return found

    def partitioned_model(self):
        """The graph as it runs, as ONNX: each node records its EP (metadata_props
        'ortlab.execution_provider' and its doc string), for Netron and the graph doctor."""
        model = self.graph.to_model()
        by_name = {s.node.name: s.provider.type for s in self.steps if s.node.name}
        by_output = {s.node.output_names[0]: s.provider.type for s in self.steps if s.node.outputs}
        for node in model.graph.node:
            ep = by_name.get(node.name) or by_output.get(node.output[0] if node.output else "", "")
            node.doc_string = f"execution provider: {ep}"
            node.metadata_props.append(StringStringEntryProto(key="ortlab.execution_provider", value=ep))
        return model

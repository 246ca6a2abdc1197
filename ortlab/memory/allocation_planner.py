"""The allocation plan: which values get their own buffer, which reuse another's, and when each
buffer is released, exactly as ORT 1.19.2's PlannerImpl decides it on one CPU stream.

Mirrors onnxruntime/core/framework/allocation_planner.cc: ComputePlanForInputsAndWeights (graph
inputs kPreExisting, initializers kAllocateStatically), ComputeReuseCount (+1 per graph input,
initializer, reader, output slot and graph output), ComputeSingleStreamReusePlan (per output in
program order: graph output -> kAllocateOutput; FindReusableInput: the kernel's Alias, VariadicAlias,
then MayInplace only at the input's last use and with the same size; else FindReusableTensor: the
freelist, most recently freed first, same location, same element size and same (symbolic) shape, not
the same byte count, never for an output no node reads (unread_outputs); else kAllocate; then the use
counts of the buffers behind the node's inputs and outputs drop and a buffer reaching 0 is pushed to
the front of the freelist), GenerateDeallocationPlan (a kAllocate buffer is released after the last
node reading any value that lives in it) and, in training builds like this wheel,
CalculateProgramCounter (each kAllocate buffer's [start, end] interval over
node_execution_order_in_training; no reader: lives to the end). The kinds are
onnxruntime/core/framework/alloc_kind.h's.
"""
from dataclasses import dataclass, field

from onnx import TensorProto

from ortlab.ir.tensor_value import np_dtype
from ortlab.memory.lifetimes import node_reads as reads
from ortlab.ops.kernel_declarations import ort_declaration

K_ALLOCATE, K_REUSE, K_PRE_EXISTING = "kAllocate", "kReuse", "kPreExisting"
K_ALLOCATE_STATICALLY, K_ALLOCATE_OUTPUT = "kAllocateStatically", "kAllocateOutput"
K_ALLOCATED_EXTERNALLY, K_SHARE, K_NOT_SET = "kAllocatedExternally", "kShare", "kNotSet"


def element_size(type_proto):
    """Bytes per element of a tensor type (DataTypeImpl::Size); 0 when unknown or a string."""
    if type_proto is None or not type_proto.HasField("tensor_type") or not type_proto.tensor_type.elem_type:
        return 0
    elem = type_proto.tensor_type.elem_type
    if elem == TensorProto.STRING:
        return 0
    return np_dtype(elem).itemsize


def is_string(type_proto):
    return type_proto is not None and type_proto.HasField("tensor_type") and \
        type_proto.tensor_type.elem_type == TensorProto.STRING


def shape_of(type_proto):
    """The TensorShapeProto, or None when the value has no shape (NodeArg::Shape() == nullptr)."""
    if type_proto is None or not type_proto.HasField("tensor_type"):
        return None
    if not type_proto.tensor_type.HasField("shape"):
        return None
    return type_proto.tensor_type.shape


def same_shape(shape1, shape2):
    """PlannerImpl::SameShape: same rank; each dim equal known values or equal non-empty params."""
    if len(shape1.dim) != len(shape2.dim):
        return False
    for a, b in zip(shape1.dim, shape2.dim):
        if a.HasField("dim_value") and b.HasField("dim_value") and a.dim_value == b.dim_value:
            continue
        if a.HasField("dim_param") and b.HasField("dim_param") and a.dim_param and a.dim_param == b.dim_param:
            continue
        return False
    return True


def same_size(type1, type2):
    """PlannerImpl::SameSize: both shaped, neither a string, equal element sizes, SameShape."""
    s1, s2 = shape_of(type1), shape_of(type2)
    if s1 is None or s2 is None or is_string(type1) or is_string(type2):
        return False
    return element_size(type1) == element_size(type2) and same_shape(s1, s2)


def size_key(type_proto):
    """A key equal for two values exactly when same_size() holds: (element size, dims), each unknown
    dim a fresh object (it equals nothing); None for a value without shape or a string."""
    shape = shape_of(type_proto)
    if shape is None or is_string(type_proto):
        return None
    dims = tuple(("v", d.dim_value) if d.HasField("dim_value") else ("p", d.dim_param)
                 if d.HasField("dim_param") and d.dim_param else object() for d in shape.dim)
    return element_size(type_proto), dims


@dataclass
class AllocPlanPerValue:
    """One value's plan (sequential_execution_plan.h), plus what the planner knew about it."""

    index: int
    name: str
    kind: str = K_NOT_SET
    reused_buffer: int = None          # the original buffer's index for kReuse / kShare
    inplace: bool = False              # reused through Alias / MayInplace, not the freelist
    starts: list = field(default_factory=list)   # program counters (training builds)
    ends: list = field(default_factory=list)


@dataclass
class SequentialExecutionPlan:
    """What PlannerImpl::CreatePlan produces for one stream."""

    order: list                        # ortlab.ir Nodes in execution order
    index_of: dict                     # value name -> ML index
    values: list                       # AllocPlanPerValue by ML index
    types: dict                        # value name -> TypeProto (ORT's view)
    release_after: dict                # pc -> [ML index of the buffers released after that node]
    freelist_picks: list = field(default_factory=list)  # (pc, value, reused buffer) from the freelist

    def value(self, name):
        return self.values[self.index_of[name]]

    def buffer_of(self, index):
        """The ML index of the buffer value `index` lives in: its own, or the one it reuses."""
        value = self.values[index]
        return value.reused_buffer if value.kind == K_REUSE else index

    def releases(self):
        """{pc: [ML indices of the values gone after that node]}: each released buffer and every value
        living in it (ORT's node_release_list; a kReuse value goes with the buffer it lives in)."""
        residents = {}
        for value in self.values:
            residents.setdefault(self.buffer_of(value.index), []).append(value.index)
        return {pc: sorted(i for b in buffers for i in residents[b]) for pc, buffers in self.release_after.items()}


class PlannerImpl:
    """ORT's planner for one stream (no parallel execution; a subgraph's own values are planned by its
    own session, its outer-scope reads count here). `locations`: {value name: where its buffer lives}
    (ORT's OrtMemoryInfo; a value not named is on the CPU): the freelist only hands a buffer to a value
    of the same location."""

    def __init__(self, graph, order, index_of, types, enable_mem_reuse=True, declarations="ort", locations=None):
        self.graph, self.order, self.index_of, self.types = graph, order, index_of, types
        self.enable_mem_reuse = enable_mem_reuse
        self.locations = locations or {}
        self.declare = declarations if callable(declarations) else ort_declaration
        names = sorted(index_of, key=index_of.get)
        self.values = [AllocPlanPerValue(i, n) for i, n in enumerate(names)]
        self.buffer = list(range(len(names)))   # reused_buffer_index: initially its own
        self.use_count = [0] * len(names)
        self.defined = set()                    # values with a def site (ProcessDef)
        self.freelist = []                      # front = most recently freed
        self.freelist_picks = []
        self.keys = {}
        self.unread = self.unread_outputs()

    # --- helpers ------------------------------------------------------------------------------------
    def _type(self, name):
        return self.types.get(name)

    def _key(self, name):
        if name not in self.keys:
            self.keys[name] = size_key(self.types.get(name))
        return self.keys[name]

    def _same_size(self, name1, name2):
        key = self._key(name1)
        return key is not None and key == self._key(name2)

    def _reuse(self, reused, reused_for, kind=K_REUSE):
        """PlannerImpl::Reuse: chain to the original buffer and move the use count over."""
        original = self.buffer[reused]
        self.buffer[reused_for] = original
        self.use_count[original] += self.use_count[reused_for]
        plan = self.values[reused_for]
        plan.kind, plan.reused_buffer = kind, original

    def unread_outputs(self):
        """Node outputs that no node reads and that are not graph outputs (use count 1: the output slot).

        ORT 1.19.2 gives each of these a buffer of its own: measured, not read in its source. The stored
        allocation_planner.cc (PlannerImpl::ComputeSingleStreamReusePlan -> FindReusableTensor) would let
        such an output take a freed buffer, yet ORT's first arena request shows it does not (two chained
        Dropouts whose masks nobody reads: 6 MiB, not 5; two unread Neg outputs: two blocks), while a read
        output does take the buffer an unread one freed (tests/memory/test_memory.py, the unread-output tests)."""
        read = {name for n in self.order for name in reads(n)}
        outputs = set(self.graph.outputs)
        return {a.name for n in self.order for a in n.outputs
                if a.exists() and a.name not in read and a.name not in outputs}

    # --- steps --------------------------------------------------------------------------------------
    def graph_inputs(self):
        """GraphViewer::GetInputs: the graph inputs that are not initializers."""
        return [n for n in self.graph.inputs if n not in self.graph.initializers]

    def compute_plan_for_inputs_and_weights(self):
        used = {name for n in self.order for name in reads(n)}
        for name in self.graph_inputs():
            self.values[self.index_of[name]].kind = K_PRE_EXISTING
            self.defined.add(self.index_of[name])
        for name in self.graph.initializers:
            if name in self.index_of:
                self.defined.add(self.index_of[name])
                if name in used:
                    self.values[self.index_of[name]].kind = K_ALLOCATE_STATICALLY

    def compute_reuse_count(self):
        for name in self.graph_inputs():
            self.use_count[self.index_of[name]] += 1
        for name in self.graph.initializers:
            if name in self.index_of:
                self.use_count[self.index_of[name]] += 1
        for node in self.order:
            for name in reads(node):
                self.use_count[self.index_of[name]] += 1
            external = self.declare(node).external_outputs
            for arg in node.outputs:
                if arg.exists():
                    self.use_count[self.index_of[arg.name]] += 2 if external else 1
                    self.defined.add(self.index_of[arg.name])
        for name in self.graph.outputs:
            self.use_count[self.index_of[name]] += 1

    def find_reusable_input(self, node, declaration, out_num):
        """PlannerImpl::FindReusableInput: Alias, VariadicAlias, then MayInplace at last use."""
        inputs = node.inputs
        for i, o in declaration.alias:
            if o == out_num and 0 <= i < len(inputs) and inputs[i].exists():
                return self.index_of[inputs[i].name]
        if declaration.variadic_alias:
            in_offset, out_offset = declaration.variadic_alias
            i = out_num - out_offset + in_offset
            if 0 <= i < len(inputs) and inputs[i].exists():
                return self.index_of[inputs[i].name]
        for i, o in declaration.may_inplace:
            if o == out_num and 0 <= i < len(inputs) and inputs[i].exists():
                index = self.index_of[inputs[i].name]
                if self.use_count[self.buffer[index]] == 1 and \
                        self._same_size(inputs[i].name, node.outputs[out_num].name):
                    return index
        return None

    def find_reusable_tensor(self, output):
        """PlannerImpl::FindReusableTensor: the first freelist buffer of the same size."""
        if not self.enable_mem_reuse:
            return None
        required = self._key(output.name)
        if required is None or len(required[1]) == 0:
            return None
        where = self.locations.get(output.name, "CPU")
        for k, (index, _) in enumerate(self.freelist):
            name = self.values[index].name
            if self.locations.get(name, "CPU") == where and self._key(name) == required:
                del self.freelist[k]
                return index
        return None

    def _release(self, index, pc):
        original = self.buffer[index]
        self.use_count[original] -= 1
        if self.use_count[original] == 0:
            self.freelist.insert(0, (original, pc))

    def compute_single_stream_reuse_plan(self):
        graph_outputs = set(self.graph.outputs)
        for pc, node in enumerate(self.order):
            declaration = self.declare(node)
            for k, arg in enumerate(node.outputs):
                if not arg.exists():
                    continue
                current = self.index_of[arg.name]
                plan = self.values[current]
                tensor = self._type(arg.name) is None or self._type(arg.name).HasField("tensor_type")
                if declaration.external_outputs:
                    plan.kind = K_ALLOCATED_EXTERNALLY
                elif arg.name in graph_outputs:
                    plan.kind = K_ALLOCATE_OUTPUT
                elif (reused := self.find_reusable_input(node, declaration, k)) is not None:
                    self._reuse(reused, current)
                    plan.inplace = True
                elif not tensor:
                    plan.kind = K_ALLOCATE
                elif arg.name not in self.unread and (reused := self.find_reusable_tensor(arg)) is not None:
                    self._reuse(reused, current)
                    self.freelist_picks.append((pc, current, reused))
                else:
                    plan.kind = K_ALLOCATE
            for name in reads(node):
                self._release(self.index_of[name], pc)
            for arg in node.outputs:
                if arg.exists():
                    self._release(self.index_of[arg.name], pc)

    def generate_deallocation_plan(self):
        """{pc: [buffers released after that node]}: each kAllocate buffer at its last reader."""
        last_reader = {}
        for pc in range(len(self.order) - 1, -1, -1):
            for name in reads(self.order[pc]):
                origin = self.buffer[self.index_of[name]]
                if self.values[origin].kind == K_ALLOCATE:
                    last_reader.setdefault(origin, pc)
        release_after = {}
        for origin in sorted(last_reader):   # release_actions are made in value-index order
            release_after.setdefault(last_reader[origin], []).append(origin)
        return release_after

    def calculate_program_counter(self, release_after):
        """CalculateProgramCounter: [start, end] of each kAllocate buffer; no reader: to the end."""
        for pc, node in enumerate(self.order):
            for arg in node.outputs:
                if arg.exists() and self.values[self.index_of[arg.name]].kind == K_ALLOCATE:
                    self.values[self.index_of[arg.name]].starts.append(pc)
            for index in release_after.get(pc, []):
                self.values[index].ends.append(pc)
        for plan in self.values:
            if len(plan.starts) - len(plan.ends) == 1:
                plan.ends.append(len(self.order))

    def create_plan(self):
        self.compute_plan_for_inputs_and_weights()
        self.compute_reuse_count()
        self.compute_single_stream_reuse_plan()
        release_after = self.generate_deallocation_plan()
        self.calculate_program_counter(release_after)
        return SequentialExecutionPlan(self.order, self.index_of, self.values, self.types, release_after,
                                       self.freelist_picks)

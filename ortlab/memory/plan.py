"""plan(model, input_shapes): ORT 1.19.2's memory plan for a model, and the memory-pattern block size
ORT allocates on the first run, to the byte.

The steps are ORT's own, in its order: the graph as the session holds it (ortlab.memory.session_graph:
constants as initializers, function ops inlined, types and shapes from Graph::Resolve), the execution
order (ortlab.ir.Graph.topological_order: ORT's 'default' reverse DFS or 'priority' Kahn order), the
allocation plan (ortlab.memory.allocation_planner: kinds, in-place and freelist reuse, releases,
program-counter intervals), then the training build's static memory pattern
(ortlab.memory.mem_pattern_planner: dim_params from the feeds, best fit by offset). `Plan.peak_bytes` is
the pattern's block: ORT requests exactly that from its arena ("Extending BFCArena for Cpu ...
(requested) num_bytes: N" when it does not fit in the arena's free space).
"""
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import onnx

from ortlab.errors import OrtlabError
from ortlab.memory.allocation_planner import (K_ALLOCATE, K_ALLOCATE_OUTPUT, K_REUSE, PlannerImpl,
                                              element_size, shape_of)
from ortlab.memory.lifetimes import lifetimes, value_index_map
from ortlab.memory.mem_pattern_planner import generate_pattern_group_cache, resolve_dim_params
from ortlab.memory.session_graph import SessionGraph, session_graph
from ortlab.viz import Table

ORDERS = ("default", "priority")


class PlanError(OrtlabError):
    """plan() was given something it cannot plan; the message says what to give instead."""


@dataclass
class ValuePlan:
    """One value of the plan, as a row of Plan.table()."""

    index: int                 # ORT's ML value index
    name: str
    kind: str                  # ORT's AllocKind name
    reuses: str = None         # the value whose buffer it lives in (kReuse), by name
    inplace: bool = False      # reused through the kernel's Alias / MayInplace (else the freelist)
    dtype: str = None
    shape: tuple = None        # ORT's symbolic shape: ints, dim_param names, None for unknown
    resolved: tuple = None     # the shape with the feeds' sizes, when ORT can resolve it
    size: int = None           # bytes, 256-aligned (CalcMemSizeForArrayWithAlignment<256>)
    defined_at: int = None     # program counter of its producer
    last_use: int = None       # program counter of its last reader
    start: int = None          # the buffer's interval (kAllocate buffers: the whole reuse chain)
    end: int = None
    offset: int = None         # offset in the memory-pattern block (planned values)
    note: str = ""             # why a value is outside the pattern

    @property
    def planned(self):
        return self.offset is not None


@dataclass
class Plan:
    """ORT's memory plan of one model for one set of input shapes (see plan())."""

    order: list                       # ortlab.ir Nodes in execution order
    values: list                      # ValuePlan by ML index
    peak_bytes: int                   # the memory-pattern block
    lower_bound_bytes: int            # most bytes of planned buffers live at one program counter
    unresolved: list                  # ML indices ORT logs "Could not resolve shape" for
    dims: dict                        # dim_param -> size
    execution_order: str = "default"
    enable_mem_reuse: bool = True
    graph: object = None
    execution_plan: object = None
    input_shapes: dict = None
    _by_name: dict = field(default_factory=dict, repr=False)

    def value(self, name):
        """The ValuePlan of the value called `name`."""
        if name not in self._by_name:
            raise PlanError(f"no value named {name!r} in the plan; names are the model's value names "
                            f"(e.g. {[v.name for v in self.values[:3]]})")
        return self._by_name[name]

    def planned(self):
        """The values placed in the memory-pattern block, by offset."""
        return sorted((v for v in self.values if v.planned), key=lambda v: (v.offset, v.start))

    def log_lines(self):
        """The INFO lines ORT's session logger writes while planning statically."""
        return [f"[Static memory planning] Could not resolve shape for tensor with ML index {i}, "
                "will allocate dynamically." for i in self.unresolved]

    def table(self, kinds=None):
        """One row per value (optionally only the given AllocKind names), in ML index order."""
        rows = []
        for v in self.values:
            if kinds is not None and v.kind not in kinds:
                continue
            shape = "?" if v.shape is None else \
                "[" + ", ".join("?" if d is None else str(d) for d in v.shape) + "]"
            rows.append((v.index, v.name, v.kind, v.reuses or "", v.dtype or "", shape,
                         "" if v.size is None else v.size, "" if v.defined_at is None else v.defined_at,
                         "" if v.last_use is None else v.last_use,
                         "" if v.start is None else f"[{v.start}, {v.end}]",
                         "" if v.offset is None else v.offset, v.note))
        return Table(("index", "value", "kind", "reuses", "dtype", "shape", "bytes", "defined", "last use",
                      "buffer pcs", "offset", "note"), rows)

    def plot(self, ax=None, title=None):
        """The pattern: program counter across, offset up, one rectangle per planned buffer, with
        the values that reuse it (in place or from the freelist) drawn inside it; returns the Axes."""
        import matplotlib.pyplot as plt  # heavy: matplotlib
        from matplotlib.patches import Rectangle  # heavy: matplotlib

        if ax is None:
            _, ax = plt.subplots(figsize=(10, 4.5))
        colours = plt.get_cmap("tab20")
        kib = 1024
        for k, v in enumerate(self.planned()):
            ax.add_patch(Rectangle((v.start, v.offset / kib), v.end - v.start + 1, v.size / kib,
                                   facecolor=colours(k % 20), edgecolor="black", linewidth=0.4, alpha=0.8))
        by_index = {v.index: v for v in self.values}
        for v in self.values:
            reused = self.execution_plan.values[v.index].reused_buffer
            origin = by_index.get(reused) if v.kind == K_REUSE else None
            if origin is not None and origin.planned and v.defined_at is not None:
                end = v.last_use if v.last_use is not None else v.defined_at
                ax.add_patch(Rectangle((v.defined_at, origin.offset / kib), end - v.defined_at + 1,
                                       origin.size / kib, fill=False, hatch="//" if v.inplace else "..",
                                       edgecolor="black", linewidth=0.3))
        ax.axhline(self.peak_bytes / kib, color="red", linewidth=1, label=f"block: {self.peak_bytes:,} B")
        ax.axhline(self.lower_bound_bytes / kib, color="grey", linestyle="--", linewidth=1,
                   label=f"most live at once: {self.lower_bound_bytes:,} B")
        ax.set_xlim(0, len(self.order) + 1)
        ax.set_ylim(0, max(self.peak_bytes, 1) / kib * 1.08)
        ax.set_xlabel("program counter (node in execution order)")
        ax.set_ylabel("offset in the block (KiB)")
        ax.set_title(title or f"memory pattern ({self.execution_order} order, reuse "
                     f"{'on' if self.enable_mem_reuse else 'off'}); hatched: values reusing a buffer")
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
        ax.figure.tight_layout()
        return ax

    def runtime_shapes(self):
        """{value name: dims} the run will produce, by onnx's shape inference on the session graph with
        the feeds' concrete sizes and data propagation (what ORT itself learns only at run time)."""
        model = self.graph.to_model()
        for vi in model.graph.input:
            if vi.name in self.input_shapes:
                vi.type.tensor_type.shape.Clear()
                for d in self.input_shapes[vi.name]:
                    vi.type.tensor_type.shape.dim.add().dim_value = d
        for vi in model.graph.value_info:  # ORT's symbolic dims would shadow the concrete ones
            vi.type.tensor_type.ClearField("shape")
        try:
            inferred = onnx.shape_inference.infer_shapes(model, data_prop=True)
        except Exception as exc:  # noqa: BLE001
            raise PlanError(f"onnx's shape inference failed on the session graph ({exc}); pass "
                            "concrete_shapes={name: dims}") from None
        found = {}
        for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
            dims = _dims(shape_of(vi.type))
            if dims is not None and all(isinstance(d, int) for d in dims):
                found[vi.name] = dims
        return found

    def allocation_trace(self, pattern=True, concrete_shapes=None):
        """The arena requests ORT's run makes, in order: ('alloc', bytes) and ('free', k), k the
        position of the freed alloc in the trace. pattern=True: the block first, then what is outside
        it; pattern=False (enable_mem_pattern off): every kAllocate / kAllocateOutput value by its exact
        byte count (Tensor storage is not aligned; the arena rounds). Kernels' scratch allocations are
        not modelled. concrete_shapes: {value name: dims} for values whose shape ORT cannot resolve
        (default: onnx's shape inference with the feeds' sizes, runtime_shapes())."""
        concrete_shapes = self.runtime_shapes() if concrete_shapes is None else concrete_shapes
        trace, live = [], {}
        if pattern and self.peak_bytes:
            trace.append(("alloc", self.peak_bytes))
        release = self.execution_plan.release_after
        for pc, node in enumerate(self.order):
            for arg in node.outputs:
                if not arg.exists():
                    continue
                v = self.value(arg.name)
                if v.kind not in (K_ALLOCATE, K_ALLOCATE_OUTPUT) or (pattern and v.planned):
                    continue
                dims = v.resolved if v.resolved is not None else (concrete_shapes or {}).get(v.name)
                if dims is None:
                    raise PlanError(f"value '{v.name}' has no shape ORT can resolve before running; pass its "
                                    "runtime shape in concrete_shapes={name: dims}, or run the model on "
                                    "ortlab.engine.InferenceSession, whose last_run.allocation_trace (replayed by "
                                    "session.arena()) holds the sizes the run allocated")
                elem = element_size(self.graph.node_arg(v.name).type_proto)
                nbytes = math.prod(dims) * elem
                if nbytes:
                    live[v.index] = len(trace)
                    trace.append(("alloc", nbytes))
            for index in release.get(pc, []):
                if index in live:
                    trace.append(("free", live.pop(index)))
        return trace


def session_graph_for(model):
    if isinstance(model, SessionGraph):
        return model
    if isinstance(model, (str, Path)):
        if not Path(model).is_file():
            raise PlanError(f"{model}: no such model file")
        model = onnx.load(str(model))
    if not isinstance(model, onnx.ModelProto):
        raise PlanError(f"plan() takes an onnx.ModelProto, a path to one or "
                        f"ortlab.memory.session_graph(model), not {type(model).__name__}")
    return session_graph(model)


INT64_MAX = (1 << 63) - 1  # TensorShape::Size() counts elements in an int64 (SafeInt: an overflow throws)


def _shapes(input_shapes):
    if not isinstance(input_shapes, dict):
        raise PlanError("input_shapes must be a dict {graph input name: shape (a tuple of ints) or an "
                        f"array}}, not {type(input_shapes).__name__}")
    found = {}
    for name, value in input_shapes.items():
        dims = getattr(value, "shape", value)
        if not isinstance(dims, (tuple, list)) or any(
                isinstance(d, bool) or not isinstance(d, (int, np.integer)) or d < 0 for d in dims):
            raise PlanError(f"input_shapes[{name!r}] must be a shape (a tuple of ints >= 0) or an array, "
                            f"not {value!r}")
        found[name] = tuple(int(d) for d in dims)
        if math.prod(found[name]) > INT64_MAX:
            raise PlanError(f"input_shapes[{name!r}] {list(found[name])} has {math.prod(found[name]):,} elements, more "
                            "than ORT's TensorShape::Size() counts in an int64 (2**63 - 1): no such feed exists; "
                            "give the shape of a tensor that can be fed")
    return found


def _check_shapes(graph, shapes):
    """Every given name a graph input, with its declared rank and fixed dims (ORT refuses a feed that
    contradicts them)."""
    inputs = [n for n in graph.inputs if n not in graph.initializers]
    for name, dims in shapes.items():
        if name not in graph.inputs:
            raise PlanError(f"input_shapes names {name!r}, which is not a graph input; the inputs are {inputs}")
        declared = graph.node_arg(name).shape
        if declared is None:
            continue
        if len(declared) != len(dims):
            raise PlanError(f"input_shapes[{name!r}] is {list(dims)}, but the graph input is declared with rank "
                            f"{len(declared)} ({declared}): give the shape the model takes")
        if any(isinstance(d, int) and d != n for d, n in zip(declared, dims)):
            raise PlanError(f"input_shapes[{name!r}] is {list(dims)}, but the graph declares {declared}: "
                            "give the shape the model takes")


def _dims(shape):
    if shape is None:
        return None
    return tuple(d.dim_value if d.HasField("dim_value") else d.dim_param if d.HasField("dim_param") else None
                 for d in shape.dim)


def _lower_bound(values, steps):
    """Most bytes of planned buffers live at one program counter (Python ints: no int64 overflow)."""
    change = [0] * (steps + 3)
    for v in values:
        if v.planned and v.size:
            change[v.start] += v.size
            change[v.end + 1] -= v.size
    live = most = 0
    for delta in change:
        live += delta
        most = max(most, live)
    return most


def plan(model, input_shapes, order="default", enable_mem_reuse=True, declarations="ort"):
    """ORT's memory plan for `model` fed `input_shapes` ({input name: shape or array}).

    model: an onnx.ModelProto, a path, or session_graph(model) (the graph as ORT holds it, worth
    keeping when planning one model several ways);
    order: 'default' or 'priority' (SessionOptions.execution_order); enable_mem_reuse:
    SessionOptions.enable_mem_reuse (the freelist; in-place reuse stays on either way, as in ORT);
    declarations: 'ort' (ORT's CPU kernels' Alias/MayInplace, ortlab.ops.kernel_declarations), or a
    function node -> KernelDef (e.g. ortlab.engine's CPU EP, `cpu_execution_provider.declaration`).
    Returns a Plan.
    """
    if order not in ORDERS:
        raise PlanError(f"order must be one of {ORDERS} (ORT's ExecutionOrder.DEFAULT / PRIORITY_BASED), "
                        f"not {order!r}")
    if not isinstance(enable_mem_reuse, (bool, np.bool_)):
        raise PlanError(f"enable_mem_reuse takes True or False (SessionOptions.enable_mem_reuse), not "
                        f"{enable_mem_reuse!r}: a str such as 'no' would count as True")
    enable_mem_reuse = bool(enable_mem_reuse)
    if not callable(declarations) and declarations != "ort":
        raise PlanError(f"declarations must be 'ort' or a function node -> KernelDef (for the engine's CPU EP: "
                        f"ortlab.engine.cpu_execution_provider.declaration), not {declarations!r}")
    input_shapes = _shapes(input_shapes)  # before any planning: a bad argument fails at once
    graph, types, _ = session_graph_for(model)
    nested = [n for n in graph.nodes()
              if any(a.type in (a.GRAPH, a.GRAPHS) for a in n.attribute_protos.values())]
    if nested:
        node = nested[0]
        raise PlanError(f"node '{node.name or node.op_type}' ({node.op_type}) holds a subgraph; "
                        "ortlab.memory mirrors the planner for one graph level only (no Loop/If/Scan bodies, "
                        "whose outer-scope values ORT plans separately)")
    nodes = graph.topological_order(order)
    index_of = value_index_map(graph)
    _check_shapes(graph, input_shapes)
    execution = PlannerImpl(graph, nodes, index_of, types, enable_mem_reuse, declarations).create_plan()
    dims = resolve_dim_params(graph, types, input_shapes)
    pattern = generate_pattern_group_cache(execution, dims)
    lives = lifetimes(graph, nodes)
    names = {i: n for n, i in index_of.items()}
    rows = []
    for value in execution.values:
        type_proto = types.get(value.name)
        life = lives.get(value.name)
        row = ValuePlan(value.index, value.name, value.kind, inplace=value.inplace,
                        reuses=names.get(value.reused_buffer) if value.kind == K_REUSE else None,
                        dtype=graph.node_arg(value.name).dtype if graph.node_arg(value.name) else None,
                        shape=_dims(shape_of(type_proto)), resolved=pattern.resolved.get(value.index),
                        defined_at=life.defined_at if life else None,
                        last_use=life.last_use if life else None)
        if value.starts:
            row.start, row.end = value.starts[0], value.ends[0]
        if value.index in pattern.sizes:
            row.size, row.offset = pattern.sizes[value.index], pattern.blocks[value.index].offset
        elif value.kind == K_ALLOCATE:
            row.note = ("shape has a symbol no input defines: allocated dynamically"
                        if value.index in pattern.unresolved else "shape unknown: allocated dynamically")
        elif value.kind == K_ALLOCATE_OUTPUT:
            row.note = "graph output: allocated at run time, never in the pattern"
        if row.size is None and row.resolved is not None and element_size(type_proto):
            row.size = math.prod(row.resolved) * element_size(type_proto)
            row.size = (row.size + 255) // 256 * 256
        rows.append(row)
    result = Plan(nodes, rows, pattern.peak, _lower_bound(rows, len(nodes)), pattern.unresolved, dims,
                  order, enable_mem_reuse, graph, execution, input_shapes)
    result._by_name = {v.name: v for v in rows}
    return result

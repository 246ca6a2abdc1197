"""Tables and pictures of ortlab.memory's plans and arenas, for the L2_02 walkthrough.

Nothing here plans or allocates: each view reads a Plan (ortlab.memory.plan) or a BFCArena
(ortlab.memory.bfc_arena) that the mirrored machinery produced, or ORT's own log.

    rules_model()                     a small graph where each of the planner's rules decides once
    random_dag(seed)                  (model, feeds): a random DAG of 2-D tensors (shapes, dtypes, in-place ops vary)
    training_step(name, batch, seq)   the zoo model's training graph (forward + backward) and feeds
    ort_first_run_log(model, feeds)   ORT 1.19.2's log lines of its first run (the reference)
    arena_requests(lines) / arena_growth(lines)   what ORT's arena was asked for when it grew, and by how much
    arena_lines(lines)                ORT's arena messages, comparable with BFCArena().lines()
                                      (the log and its readers: ortlab.memory.ort_arena_log's, imported here)
    use_count_table(plan)             ComputeReuseCount's starting counts, and where each +1 came from
    decision_table(plan)              one row per node output in execution order: what the planner chose
    freelist_table(plan)              each freelist reuse, and how long the buffer sat idle before it
    live_bytes(plan) / plot_live_bytes({label: plan})   bytes of planned buffers live at each program counter
    chunk_table(arena) / snapshot(arena) / plot_arena(snapshots)   the arena's chunks, as text or bars
    passthrough_model()               a graph whose com.microsoft PassThrough declares VariadicAlias(0, 0) in ORT
    without_declaration(op_type)      ORT's CPU declarations with one op's taken away (declarations=)
    readable(table)                   the same Table with its integers printed with thousands separators
"""
import numpy as np
import onnx
from onnx import TensorProto, helper

from ortlab.memory.allocation_planner import K_REUSE
from ortlab.memory.bfc_arena import bin_num_for_size
from ortlab.memory.ort_arena_log import (  # noqa: F401 (ORT's log readers, read here by the notebook)
    arena_growth, arena_lines, arena_requests, log_message, ort_first_run_log, unresolved_indices)
from ortlab.ops.kernel_declarations import ort_declaration
from ortlab.ops.kernel_def import KernelDef
from ortlab.viz import Table

KIB = 1024


# --- the example and the reference -----------------------------------------------------------------
def training_step(name="gpt", batch=64, seq=16, builder="ortlab", **model_kwargs):
    """(training model, feeds): the zoo model (dropout 0) exported for training at [batch, seq], its
    gradient graph by `builder` ('ortlab' or 'ort'), fed its example inputs and a loss gradient of 1."""
    from ortlab import models  # heavy: ortlab.models imports torch
    from ortlab.training.training_manager import GRAD_OUTPUT, build_training_graph  # heavy: imports torch

    module = models.get(name, dropout=0.0, **model_kwargs)
    inputs = module.example_inputs(batch) if name == "mlp" else module.example_inputs(batch, seq)
    exported = models.export(module, inputs, training=True)
    weights = [t.name for t in exported.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    training, differentiable = build_training_graph(exported, [o.name for o in exported.graph.output],
                                                    weights, builder)
    feeds = dict(zip([i.name for i in exported.graph.input], (t.numpy() for t in inputs)))
    feeds.update({GRAD_OUTPUT.format(o): np.ones((), np.float32) for o in differentiable})
    return training, feeds


def rules_model():
    """The small graph of the walkthrough, x: float [n, 8] (n symbolic):

        e = Exp(x); r = Relu(e)      e is read again by the Add, so Relu may not write into it
        g = Neg(r); t = Transpose(g) [8, n]: a dead [n, 8] buffer is not the same shape
        u = Relu(t)                  t's last use: in place (MayInplace)
        v = Transpose(u)             [n, 8] again: a dead [n, 8] buffer from the freelist
        w = Add(v, e); z = Reshape(w, [-1])   Reshape aliases its input (Alias)
        y = Exp(z)                   a graph output: allocated at run time
    """
    f = TensorProto.FLOAT
    steps = [("exp", "Exp", ["x"], "e"), ("relu", "Relu", ["e"], "r"), ("neg", "Neg", ["r"], "g"),
             ("transpose", "Transpose", ["g"], "t"), ("relu_t", "Relu", ["t"], "u"),
             ("transpose_back", "Transpose", ["u"], "v"), ("add", "Add", ["v", "e"], "w"),
             ("flatten", "Reshape", ["w", "flat"], "z"), ("exp_out", "Exp", ["z"], "y")]
    nodes = [helper.make_node(op, inputs, [out], name=name) for name, op, inputs, out in steps]
    graph = helper.make_graph(nodes, "rules", [helper.make_tensor_value_info("x", f, ["n", 8])],
                              [helper.make_tensor_value_info("y", f, None)],
                              [helper.make_tensor("flat", TensorProto.INT64, [1], [-1])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


RANDOM_UNARY = ("Relu", "Neg", "Sigmoid", "Tanh", "Abs")
RANDOM_BINARY = ("Add", "Mul", "Sub")
RANDOM_WIDTHS = (16, 32, 48, 64, 128)


def random_dag(seed, nodes=16, rows=8192):
    """(model, feeds): a random DAG of 2-D tensors for planning, the same for the same seed.

    x: float [n, 32] (n symbolic, fed `rows`). Each node reads earlier values: element-wise unary ops
    (some run in place), binary ops on two values of one shape, a MatMul that changes the width, a
    Transpose ([n, w] -> [w, n]: the same bytes, another shape), a Concat, a ReduceSum to [n, 1], and a
    Cast to double and back (another element size, so another freelist). Values no node reads are the
    graph outputs. With `rows` in the thousands the block exceeds the arena's first 1 MiB region, so ORT
    logs its request."""
    rng = np.random.RandomState(seed)
    dtypes = {"float": TensorProto.FLOAT, "double": TensorProto.DOUBLE}
    values = {"x": ("float", ("n", 32))}   # name -> (dtype, shape)
    made, inits = [], []

    def pick(where=None):
        names = [v for v in values if where is None or where(values[v])]
        return names[rng.randint(len(names))] if names else None

    for i in range(nodes):
        a = pick()
        dtype, shape = values[a]
        kind = rng.choice(["unary", "unary", "binary", "matmul", "transpose", "concat", "reduce", "cast"])
        out, name = f"v{i}", f"n{i}"
        if kind == "binary" and pick(lambda v: v == values[a]) is not None:
            op = RANDOM_BINARY[rng.randint(len(RANDOM_BINARY))]
            made.append(helper.make_node(op, [a, pick(lambda v: v == values[a])], [out], name=f"{name}_{op}"))
        elif kind == "matmul" and shape[0] == "n":
            width = int(RANDOM_WIDTHS[rng.randint(len(RANDOM_WIDTHS))])
            weight = rng.randn(shape[1], width).astype(np.float32 if dtype == "float" else np.float64) * 0.1
            inits.append(helper.make_tensor(f"w{i}", dtypes[dtype], weight.shape, weight.ravel().tolist()))
            made.append(helper.make_node("MatMul", [a, f"w{i}"], [out], name=f"{name}_MatMul"))
            shape = ("n", width)
        elif kind == "transpose":
            made.append(helper.make_node("Transpose", [a], [out], perm=[1, 0], name=f"{name}_Transpose"))
            shape = shape[::-1]
        elif kind == "concat" and shape[0] == "n":
            b = pick(lambda v: v[0] == dtype and v[1][0] == "n")
            made.append(helper.make_node("Concat", [a, b], [out], axis=1, name=f"{name}_Concat"))
            shape = ("n", shape[1] + values[b][1][1])
        elif kind == "reduce" and shape[0] == "n":
            inits.append(helper.make_tensor(f"axes{i}", TensorProto.INT64, [1], [1]))
            made.append(helper.make_node("ReduceSum", [a, f"axes{i}"], [out], keepdims=1, name=f"{name}_ReduceSum"))
            shape = ("n", 1)
        elif kind == "cast":
            dtype = "double" if dtype == "float" else "float"
            made.append(helper.make_node("Cast", [a], [out], to=dtypes[dtype], name=f"{name}_Cast"))
        else:
            op = RANDOM_UNARY[rng.randint(len(RANDOM_UNARY))]
            made.append(helper.make_node(op, [a], [out], name=f"{name}_{op}"))
        values[out] = (dtype, shape)
    read = {i for node in made for i in node.input}
    outputs = [helper.make_tensor_value_info(v, dtypes[values[v][0]], list(values[v][1])) for v in values
               if v != "x" and v not in read] or [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 32])]
    graph = helper.make_graph(made, f"random_dag_{seed}",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 32])], outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    feeds = {"x": np.random.RandomState(seed).rand(rows, 32).astype(np.float32)}
    return model, feeds

# --- the allocation plan ---------------------------------------------------------------------------
def use_count_table(plan):
    """One row per value: the use count PlannerImpl::ComputeReuseCount starts it with, split into
    +1 as a graph input or initializer, +1 per reading node, +1 for its output slot, +1 as a graph output
    (allocation_planner.cc). Counted here from the graph, the way that function counts."""
    graph, order = plan.graph, plan.order
    readers = {}
    for node in order:
        for arg in node.inputs:
            if arg.exists():
                readers[arg.name] = readers.get(arg.name, 0) + 1
    produced = {a.name for n in order for a in n.outputs if a.exists()}
    inputs = set(graph.inputs) | set(graph.initializers)
    rows = []
    for v in plan.values:
        parts = (int(v.name in inputs), readers.get(v.name, 0), int(v.name in produced),
                 int(v.name in graph.outputs))
        rows.append((v.name, *parts, sum(parts)))
    return Table(("value", "input/initializer", "readers", "output slot", "graph output", "use count"), rows)


def _how(plan, node, value):
    declaration = ort_declaration(node)
    if value.kind != K_REUSE:
        return ""
    if not value.inplace:
        return "freelist"
    k = [a.name for a in node.outputs].index(value.name)
    return "Alias" if any(o == k for _, o in declaration.alias) else "MayInplace"


def decision_table(plan):
    """One row per node output, in execution order: the node, its kernel's Alias/MayInplace
    declaration (ORT's CPU kernels), the output's symbolic shape, the AllocKind chosen, the buffer it
    reuses and how (Alias, MayInplace or the freelist), and, for an in-place candidate, the program
    counter at which the candidate input is read for the last time."""
    declare = ort_declaration
    rows = []
    for pc, node in enumerate(plan.order):
        declaration = declare(node)
        for k, arg in enumerate(node.outputs):
            if not arg.exists():
                continue
            v = plan.value(arg.name)
            candidates = [i for i, o in declaration.alias + declaration.may_inplace if o == k]
            last = ""
            if candidates and candidates[0] < len(node.inputs):
                last = plan.value(node.inputs[candidates[0]].name).last_use
            dims = "?" if v.shape is None else ", ".join("?" if d is None else str(d) for d in v.shape)
            shape = dims if v.shape is None else f"[{dims}]"
            rows.append((pc, node.name or node.op_type, node.op_type, declaration.describe(), v.name, shape,
                         v.kind, v.reuses or "", _how(plan, node, v), last))
    return Table(("pc", "node", "op", "declares", "output", "shape", "kind", "reuses", "how",
                  "candidate input last read at"), rows)


def holders(plan, original):
    """The values living in buffer `original` (the buffer's own value and every kReuse of it)."""
    reused = plan.execution_plan.values
    return [v for v in plan.values if v.index == original or
            (v.kind == K_REUSE and reused[v.index].reused_buffer == original)]


def freelist_table(plan):
    """One row per freelist reuse (FindReusableTensor), in program order: the value, the buffer it
    took, the program counter after which that buffer was freed (its previous holder's last read),
    the program counters it sat idle in between, and its bytes. In the pattern the buffer is one
    block for its whole [start, end], idle counters included."""
    rows = []
    for pc, current, original in plan.execution_plan.freelist_picks:
        before = [h for h in holders(plan, original) if h.defined_at is not None and h.defined_at < pc]
        freed = max(h.last_use if h.last_use is not None else h.defined_at for h in before)
        buffer = plan.values[original]
        rows.append((pc, plan.values[current].name, buffer.name, freed, pc - freed - 1,
                     "" if buffer.size is None else buffer.size))
    return Table(("pc", "value", "takes the buffer of", "freed after pc", "idle pcs", "bytes"), rows)


def live_bytes(plan):
    """Bytes of the pattern's buffers whose [start, end] holds each program counter (an array; its
    maximum is plan.lower_bound_bytes)."""
    live = np.zeros(len(plan.order) + 1, dtype=np.int64)
    for v in plan.planned():
        live[v.start:v.end + 1] += v.size
    return live


def plot_live_bytes(plans, ax=None, marks=None, title="bytes of the pattern's buffers live at each step"):
    """One curve of live_bytes per {label: Plan}, each with its block as a dotted line of the same
    colour; `marks` {label: program counter} draws vertical lines; returns the Axes."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    if ax is None:
        _, ax = plt.subplots(figsize=(10, 3))
    mib = 1 << 20
    for k, (label, plan) in enumerate(plans.items()):
        colour = f"C{k}"
        ax.plot(live_bytes(plan) / mib, color=colour, linewidth=1.2, label=f"{label}: live")
        ax.axhline(plan.peak_bytes / mib, color=colour, linestyle=":", linewidth=1,
                   label=f"{label}: block {plan.peak_bytes:,} B")
    for label, pc in (marks or {}).items():
        ax.axvline(pc, color="grey", linewidth=0.8)
        ax.text(pc, ax.get_ylim()[1] * 0.02, f" {label}", fontsize=8, color="grey")
    ax.set_xlabel("program counter (node in execution order)")
    ax.set_ylabel("MiB")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8)
    ax.figure.tight_layout()
    return ax


def kind_counts(plan):
    """A Table: how many values got each AllocKind, and how many of them sit in the pattern."""
    kinds = {}
    for v in plan.values:
        count, planned = kinds.get(v.kind, (0, 0))
        kinds[v.kind] = (count + 1, planned + int(v.planned))
    return Table(("kind", "values", "in the pattern"), [(k, *kinds[k]) for k in sorted(kinds)])


def readable(table):
    """`table` with every integer cell written with thousands separators (7806208 -> '7,806,208'), as
    the prose quotes byte counts; other cells as they are."""
    def cell(c):
        return f"{c:,}" if isinstance(c, (int, np.integer)) and not isinstance(c, (bool, np.bool_)) else c
    return Table(table.header, [tuple(cell(c) for c in row) for row in table.rows])


def without_declaration(op_type):
    """A `declarations=` function for ortlab.memory.plan: ORT's CPU declarations (ort_declaration), except that
    nodes of `op_type` declare nothing, to see what the planner would do if that kernel made no promise."""
    def declare(node):
        return KernelDef(node.op_type, node.domain) if node.op_type == op_type else ort_declaration(node)
    return declare


def passthrough_model():
    """x: float [n, 8] (n symbolic) -> a = Exp(x), b = Neg(x) -> (a2, b2) = com.microsoft PassThrough(a, b)
    -> s = Add(a2, b2) -> y = Exp(s). PassThrough copies nothing: with VariadicAlias(0, 0) its outputs are its
    inputs' buffers (a2 is a, b2 is b). Shapes of a2, b2, s are given as value_info (ONNX shape inference does
    not know the com.microsoft op)."""
    f = TensorProto.FLOAT
    nodes = [helper.make_node("Exp", ["x"], ["a"], name="exp_a"), helper.make_node("Neg", ["x"], ["b"], name="neg_b"),
             helper.make_node("PassThrough", ["a", "b"], ["a2", "b2"], name="pass", domain="com.microsoft"),
             helper.make_node("Add", ["a2", "b2"], ["s"], name="add"),
             helper.make_node("Exp", ["s"], ["y"], name="exp_out")]
    graph = helper.make_graph(nodes, "passthrough", [helper.make_tensor_value_info("x", f, ["n", 8])],
                              [helper.make_tensor_value_info("y", f, None)],
                              value_info=[helper.make_tensor_value_info(v, f, ["n", 8]) for v in ("a2", "b2", "s")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17),
                                                    helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    return model


# --- the arena -------------------------------------------------------------------------------------
def snapshot(arena):
    """The arena's chunks in address order: (region, offset in the region, bytes, in use, bytes the
    chunk's user asked for (0 when free))."""
    bases = [base for base, _ in arena.regions]
    return [(c.region, c.ptr - bases[c.region], c.size, c.in_use(), c.requested if c.in_use() else 0)
            for c in sorted(arena.chunks.values(), key=lambda c: c.ptr)]


def chunk_table(arena):
    """One row per chunk in address order: region, offset and size in KiB, in use (with the bytes
    asked for) or free, and the bin a free chunk waits in (bin b: chunks of at least 256 << b bytes)."""
    rows = [(region, offset // KIB, size // KIB, "in use" if used else "free",
             f"{requested / KIB:g}" if used else "", "" if used else bin_num_for_size(size))
            for region, offset, size, used, requested in snapshot(arena)]
    return Table(("region", "offset KiB", "KiB", "state", "requested KiB", "bin"), rows)


def plot_arena(snapshots, title="BFCArena chunks"):
    """One row of bars per (label, snapshot(arena)): each region side by side, chunks in use filled
    (the KiB asked for written inside), free chunks hatched; returns the Figure."""
    import matplotlib.pyplot as plt  # heavy: matplotlib
    from matplotlib.patches import Rectangle  # heavy: matplotlib

    figure, ax = plt.subplots(figsize=(10, 0.55 * len(snapshots) + 1.2))
    gap = 128
    for row, (_, chunks) in enumerate(snapshots):
        y = len(snapshots) - 1 - row
        starts, x = {}, 0
        for region in sorted({c[0] for c in chunks}):
            starts[region] = x
            x += sum(c[2] for c in chunks if c[0] == region) // KIB + gap
        for region, offset, size, used, requested in chunks:
            left = starts[region] + offset // KIB
            ax.add_patch(Rectangle((left, y + 0.1), size // KIB, 0.8, edgecolor="black", linewidth=0.6,
                                   facecolor="tab:blue" if used else "white", hatch="" if used else "//"))
            if used:
                ax.text(left + size / KIB / 2, y + 0.5, f"{requested / KIB:g}", ha="center", va="center",
                        fontsize=7, color="white")
    width = max(sum(c[2] for c in chunks) // KIB + gap * len({c[0] for c in chunks})
                for _, chunks in snapshots)
    ax.set_xlim(0, width)
    ax.set_ylim(0, len(snapshots))
    ax.set_yticks([len(snapshots) - 0.5 - row for row in range(len(snapshots))],
                  [label for label, _ in snapshots], fontsize=8)
    ax.set_xlabel("KiB (regions side by side); filled: in use (KiB asked for inside), hatched: free")
    ax.set_title(title)
    figure.tight_layout()
    return figure

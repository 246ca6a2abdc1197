"""Exercises of the walkthrough L1_02_execution_providers: where the memcpy transformer puts its copies, and
which EP the partitioner gives each node.

The models the exercises are about are built here, so the notebook can show them; the checks live in
ortlab.labs.judges.l1_02, which compares with what ortlab.engine's session decides (its partitioner mirrors
onnxruntime/core/framework/graph_partitioner.cc, its MemcpyTransformer onnxruntime/core/optimizer/
transformer_memcpy.cc: the CPU-only ORT installed here has no device EP to ask), and the reference answers in
solutions/walkthroughs/L1_02_execution_providers.py, outside the package.
"""
from collections import namedtuple

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe, register_tuple
from ortlab.labs.model_text import describe  # noqa: F401 - the notebook shows its models with it
from ortlab.onnx_defs import MS_DOMAIN, make_model

F, D = TensorProto.FLOAT, TensorProto.DOUBLE
CPU, TRITON = "CPUExecutionProvider", "TritonExecutionProvider"
COPY_KINDS = ("MemcpyFromHost", "MemcpyToHost")

PlacedNode = register_tuple(namedtuple("PlacedNode", "name op inputs outputs ep cpu_inputs"))
PlacedNode.__doc__ = """One node after partitioning: its name, op, input and output value names ('' for an optional
input left out), the EP it was given, and the indices of the inputs its kernel reads in CPU memory."""
PlacedGraph = register_tuple(namedtuple("PlacedGraph", "nodes inputs outputs initializers"))
PlacedGraph.__doc__ = """A partitioned graph before the memcpy transformer runs: its PlacedNodes (in the model's
order) and the names of its graph inputs, graph outputs and initializers."""


def _value(name, elem=F, shape=None):
    return helper.make_tensor_value_info(name, elem, shape)


def _model(nodes, inputs, outputs, initializers=(), name="model"):
    inits = [numpy_helper.from_array(v, k) for k, v in initializers]
    return make_model(helper.make_graph(nodes, name, inputs, outputs, inits))


# --- exercise 'memcpy_nodes': the models -------------------------------------------------------------------
def _chain():
    """x -> Softmax -> Relu -> Softmax -> y (the notebook's chain3)."""
    n = helper.make_node
    nodes = [n("Softmax", ["x"], ["v0"], name="n0", axis=-1), n("Relu", ["v0"], ["v1"], name="n1"),
             n("Softmax", ["v1"], ["y"], name="n2", axis=-1)]
    return _model(nodes, [_value("x", F, [3, 5])], [_value("y", F, [3, 5])], name="chain")


def _reduce():
    """The notebook's reduce model: ReduceSum on the device reads r (from Relu) and axes (from Unsqueeze)."""
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["r"], name="relu"), n("Unsqueeze", ["axis", "zero"], ["axes"], name="unsqueeze"),
             n("ReduceSum", ["r", "axes"], ["y"], name="sum", keepdims=0)]
    return _model(nodes, [_value("x", F, [3, 5]), _value("axis", TensorProto.INT64, [])], [_value("y", F, [3])],
                  [("zero", np.array([0], np.int64))], name="reduce")


def _fan():
    """A host value read by two device nodes, a device value read by two host nodes, a device graph output."""
    n = helper.make_node
    nodes = [n("Relu", ["x"], ["r"], name="relu"),
             n("Softmax", ["r"], ["rows"], name="softmax_rows", axis=-1),
             n("Softmax", ["r"], ["cols"], name="softmax_cols", axis=0),
             n("Neg", ["rows"], ["a"], name="neg"), n("Abs", ["rows"], ["b"], name="abs")]
    return _model(nodes, [_value("x", F, [3, 5])], [_value(o, F, [3, 5]) for o in ("a", "b", "cols")], name="fan")


def _shared():
    """A graph input and an initializer each read on both sides; a device output that is both a graph output
    and read on the host; ReduceSum's axes an initializer read in CPU memory."""
    n = helper.make_node
    nodes = [n("LayerNormalization", ["x", "scale", "shift"], ["ln"], name="layer_norm", axis=-1),
             n("Mul", ["x", "scale"], ["m"], name="mul"),
             n("Softmax", ["ln"], ["s"], name="softmax", axis=-1),
             n("Sub", ["s", "m"], ["d"], name="sub"),
             n("ReduceSum", ["d", "axes"], ["total"], name="sum", keepdims=0)]
    inits = [("scale", np.linspace(0.5, 1.5, 5).astype(np.float32)), ("shift", np.zeros(5, np.float32)),
             ("axes", np.array([1], np.int64))]
    return _model(nodes, [_value("x", F, [3, 5])], [_value("s", F, [3, 5]), _value("total", F, [3])], inits,
                  name="shared")


def _between():
    """Two device islands joined by one host node, whose outputs are both read on the device and fetched."""
    n = helper.make_node
    nodes = [n("Softmax", ["x"], ["s"], name="first", axis=-1), n("Exp", ["s"], ["e"], name="exp"),
             n("Softmax", ["e"], ["t"], name="second", axis=0), n("ReduceSum", ["e", "axes"], ["y"], name="sum",
                                                                    keepdims=1)]
    return _model(nodes, [_value("x", F, [3, 5])], [_value(o, F, None) for o in ("t", "y", "e")],
                  [("axes", np.array([0], np.int64))], name="between")


MEMCPY_MODELS = {"chain": _chain, "reduce": _reduce, "fan": _fan, "shared": _shared, "between": _between}


def memcpy_model(name):
    """One of the exercise's models: 'chain' and 'reduce' are the notebook's, the check adds the others."""
    return MEMCPY_MODELS[name]()


def placed(source, providers=(TRITON,)):
    """The PlacedGraph of a model (or of the model of one of ortlab.engine's sessions): the EP ortlab.engine's
    partitioner gives each node with `providers`, graph optimizations off, before any Memcpy node is added."""
    from ortlab.engine import InferenceSession, SessionOptions  # lazy: loaded only when this runs

    model = source if not hasattr(source, "state") else source.state.partitioned_model()
    nodes = [n for n in model.graph.node if not n.op_type.startswith("Memcpy")]
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0, log_severity_level=3),
                            providers=list(providers))
    steps = {s.node.name: s for s in sess.state.steps}
    placed_nodes = []
    for node in nodes:
        step = steps[node.name]
        cpu = tuple(i for i in range(len(node.input)) if step.kernel.kernel_def.is_input_on_cpu(i))
        placed_nodes.append(PlacedNode(node.name, node.op_type, list(node.input), list(node.output),
                                       step.provider.type, cpu))
    initializers = [t.name for t in model.graph.initializer]
    return PlacedGraph(placed_nodes, [i.name for i in model.graph.input if i.name not in initializers],
                       [o.name for o in model.graph.output], initializers)


def show_placed(graph):
    """A PlacedGraph as text: one line per node with its EP and its CPU-memory inputs."""
    lines = [f"graph inputs: {', '.join(graph.inputs)}", f"initializers: {', '.join(graph.initializers) or '-'}"]
    for node in graph.nodes:
        cpu = f"   reads in CPU memory: {', '.join(node.inputs[i] for i in node.cpu_inputs)}" if node.cpu_inputs else ""
        lines.append(f"{node.name:>12}: {node.op}({', '.join(node.inputs)}) -> {', '.join(node.outputs)}"
                     f"   on {node.ep}{cpu}")
    lines.append(f"graph outputs: {', '.join(graph.outputs)}")
    return "\n".join(lines)


@probe
def copies_made(fn, graph):
    """The learner's fn(graph), as a list of (kind, value name) pairs."""
    found = fn(graph)
    if isinstance(found, (str, bytes, dict)) or not hasattr(found, "__iter__"):
        raise CheckFailed(f"return a list of (kind, value name) pairs such as ('MemcpyFromHost', 'v1'), "
                          f"not {type(found).__name__}")
    pairs = []
    for item in found:
        if not (isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(p, str) for p in item)):
            raise CheckFailed(f"each copy is a pair (kind, value name) such as ('MemcpyToHost', 'v0'), not {item!r}")
        if item[0] not in COPY_KINDS:
            raise CheckFailed(f"{item[0]!r} is no copy ORT inserts: the kinds are 'MemcpyFromHost' (host to device) "
                              "and 'MemcpyToHost' (device to host)")
        pairs.append((item[0], item[1]))
    return pairs


def check_memcpy_nodes(fn):
    """Exercise 'memcpy_nodes': fn(PlacedGraph) -> [(kind, value)], one per Memcpy node the memcpy transformer
    adds, checked on each model of MEMCPY_MODELS against ortlab.engine's MemcpyTransformer."""
    judge("memcpy_nodes", "l1_02.memcpy_nodes", learner(fn))


# --- exercise 'placements': the model ----------------------------------------------------------------------
PLACEMENT_PROVIDERS = {"triton_first": [TRITON], "cpu_first": [CPU, TRITON]}


def placement_model():
    """x [3, 5] -> MatMul -> BiasGelu -> LayerNormalization -> Softmax, then ReduceSum of it, and Relu -> Cast
    to double -> Softmax over axis 0; outputs `total` (float) and `y64` (double)."""
    n = helper.make_node
    rng = np.random.default_rng(0)
    nodes = [n("MatMul", ["x", "W"], ["h"], name="matmul"),
             n("BiasGelu", ["h", "b"], ["g"], name="bias_gelu", domain=MS_DOMAIN),
             n("LayerNormalization", ["g", "scale", "shift"], ["ln"], name="layer_norm", axis=-1),
             n("Softmax", ["ln"], ["s"], name="softmax", axis=-1),
             n("ReduceSum", ["s", "axes"], ["total"], name="reduce_sum", keepdims=0),
             n("Relu", ["s"], ["r"], name="relu"),
             n("Cast", ["r"], ["r64"], name="cast", to=D),
             n("Softmax", ["r64"], ["y64"], name="softmax64", axis=0)]
    inits = [("W", rng.standard_normal((5, 4)).astype(np.float32)), ("b", rng.standard_normal(4).astype(np.float32)),
             ("scale", np.ones(4, np.float32)), ("shift", np.zeros(4, np.float32)), ("axes", np.array([1], np.int64))]
    return _model(nodes, [_value("x", F, [3, 5])], [_value("total", F, None), _value("y64", D, None)], inits,
                  name="placements")


def placement_feeds():
    return {"x": np.random.default_rng(1).standard_normal((3, 5)).astype(np.float32)}


def triton_kernels():
    """The ops ortlab's Triton EP has kernels for, printed as ORT prints an op ('Softmax', 'com.microsoft:BiasGelu'),
    with the types each kernel takes for each input."""
    from ortlab.triton_kernels.registry import KERNELS, load_builtin_kernels  # lazy: loaded only when this runs
    from ortlab.onnx_defs import op_name  # lazy: loaded when this runs, not when the notebook imports the exercises

    load_builtin_kernels()
    rows = []
    for (op, domain), cls in sorted(KERNELS.items(), key=lambda kv: op_name(*kv[0])):
        args = ", ".join(f"{arg.name}: {'|'.join(arg.types) if arg.types else 'any'}" for arg in cls.inputs)
        rows.append(f"{op_name(op, domain)}({args})")
    return "\n".join(rows)




@probe
def predicted_placements(fn):
    """The learner's fn(), as {case: {node name: EP}}."""
    found = fn()
    if not isinstance(found, dict):
        raise CheckFailed(f"return a dict {{'triton_first': {{node: EP}}, 'cpu_first': {{node: EP}}}}, not "
                          f"{type(found).__name__}")
    out = {}
    for case, eps in found.items():
        if not isinstance(eps, dict):
            raise CheckFailed(f"under {case!r} give a dict {{node name: EP name}}, not {type(eps).__name__}")
        out[str(case)] = {str(k): (v if isinstance(v, str) else repr(v)) for k, v in eps.items()}
    return out


def check_placements(fn):
    """Exercise 'placements': fn() -> {case: {node: EP}} for placement_model() with each provider list of
    PLACEMENT_PROVIDERS, checked against ortlab.engine's partitioner."""
    judge("placements", "l1_02.placements", learner(fn))

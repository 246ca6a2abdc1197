"""Small hand-built models holding one pattern each, in a variant that should fuse and ones that must not;
and ortlab's optimizer next to ORT's on the same model (op counts, outputs), for L1_01. Also: CSE and constant
folding walked node by node (cse_steps, folding_steps), ORT with one transformer alone (ort_only), and the
graphs ORT's two transformer lists make, the InferenceSession's and ORTModule's pre-training one
(inference_vs_training, ort_pre_gradient_graph).

Used by the notebook, lab02 and the tests; every model is float32 with a fixed seed, and
`feeds(model)` makes inputs for it. Each builder takes keyword switches that break the
pattern the way real graphs do (a shared intermediate, another axis, another constant).
"""
import tempfile
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortlab import session
from ortlab.env import capi
from ortlab.ir import Graph
from ortlab.onnx_defs import make_model, op_counts, op_name  # noqa: F401 (op_counts: the labs read it here)
from ortlab.ortmodule.training_agent import builder_config
from ortlab.transformers import graph_utils as gu
from ortlab.transformers import registry
from ortlab.transformers.constant_folding import NON_DETERMINISTIC, ConstantFolding
from ortlab.transformers.manager import optimize
from ortlab.transformers.pre_training import optimize_for_training
from ortlab.viz import Table

F = TensorProto.FLOAT


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "example", inputs, outputs,
                              [numpy_helper.from_array(np.asarray(v), n) for n, v in inits])
    return make_model(graph, opset=opset, domains=())


def _in(name, shape, elem=F):
    return helper.make_tensor_value_info(name, elem, shape)


def _out(name, elem=F):
    return helper.make_tensor_value_info(name, elem, None)


def _rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def feeds(model, seed=0):
    """Random inputs for a model's graph inputs (static shapes; symbolic dims become 2)."""
    rng = np.random.default_rng(seed)
    out = {}
    for vi in model.graph.input:
        dims = [d.dim_value if d.HasField("dim_value") else 2 for d in vi.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        out[vi.name] = rng.standard_normal(dims).astype(dtype)
    return out


def layer_norm(axis=-1, shared_sub=False, eps_dtype=np.float32, eps_as_input=False, scale_2d=False):
    """torch's LayerNorm export: (x - mean) / sqrt(var + eps) * w + b over `axis` of a [2, 3, 4] x."""
    eps = ("eps", np.array(1e-5, dtype=eps_dtype))
    inits = [("axes_unused", np.array([0], np.int64)), ("two", np.array(2.0, np.float32)),
             ("w", _rand(3, 4, seed=1) if scale_2d else _rand(4, seed=1)), ("b", _rand(4, seed=2))]
    nodes = [helper.make_node("ReduceMean", ["x"], ["mean"], axes=[axis]),
             helper.make_node("Sub", ["x", "mean"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["d2"]),
             helper.make_node("ReduceMean", ["d2"], ["var"], axes=[axis]),
             helper.make_node("Add", ["var", "eps"], ["var_eps"]),
             helper.make_node("Sqrt", ["var_eps"], ["std"]),
             helper.make_node("Div", ["d", "std"], ["n"]),
             helper.make_node("Mul", ["n", "w"], ["nw"]),
             helper.make_node("Add", ["nw", "b"], ["y"])]
    inputs, outputs = [_in("x", [2, 3, 4])], [_out("y")]
    if eps_as_input:
        inputs.append(_in("eps", [], helper.np_dtype_to_tensor_dtype(np.dtype(eps_dtype))))
    else:
        inits.append(eps)
    if shared_sub:
        outputs.append(_out("d"))
    return _model(nodes, inputs, outputs, inits[1:])


def gelu(form="torch", constant=1.4142135, shared_erf=False, bias=None):
    """Erf GELU on a [2, 3, 4] x: form 'torch' (x*(1+erf))*0.5, 'half_first' (0.5*x)*(1+erf),
    'mul' (x*0.7071 instead of x/1.4142). bias='1d'|'2d' puts Add(x0, bias) in front (for BiasGelu)."""
    nodes, inits, x = [], [("c", np.array(constant, np.float32)), ("one", np.array(1.0, np.float32)),
                           ("half", np.array(0.5, np.float32))], "x"
    if bias:
        inits.append(("bias", _rand(4, seed=3) if bias == "1d" else _rand(3, 4, seed=3)))
        nodes.append(helper.make_node("Add", ["x0", "bias"], ["x"]))
    if form == "mul":
        inits[0] = ("c", np.array(1 / constant, np.float32))
    nodes += [helper.make_node("Mul" if form == "mul" else "Div", [x, "c"], ["s"]),
              helper.make_node("Erf", ["s"], ["e"]), helper.make_node("Add", ["e", "one"], ["e1"])]
    if form == "half_first":
        nodes += [helper.make_node("Mul", [x, "half"], ["xh"]), helper.make_node("Mul", ["xh", "e1"], ["y"])]
    else:
        nodes += [helper.make_node("Mul", [x, "e1"], ["xe"]), helper.make_node("Mul", ["xe", "half"], ["y"])]
    outputs = [_out("y")] + ([_out("e")] if shared_erf else [])
    return _model(nodes, [_in("x0" if bias else "x", [2, 3, 4])], outputs, inits)


def matmul_add(a_shape=(3, 4), bias_shape=(5,), extra_consumer=False, activation=None):
    """Add(MatMul(A, W), bias) with W [4, 5]; activation puts Relu/... after it."""
    inits = [("w", _rand(4, 5, seed=4)), ("bias", _rand(*bias_shape, seed=5))]
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["y"])]
    outputs = [_out("y")] + ([_out("m")] if extra_consumer else [])
    if activation:
        nodes[-1].output[0] = "pre"
        nodes.append(helper.make_node(activation, ["pre"], ["y"]))
    return _model(nodes, [_in("a", list(a_shape))], outputs, inits)


def matmul_transpose(perm=(0, 2, 1), scale=None, scale_position="after"):
    """MatMul(Transpose(A, perm), B) for A [2, 4, 3] (perm (0, 2, 1) swaps the last two axes),
    with an optional scalar Mul (scale) before or after."""
    nodes = [helper.make_node("Transpose", ["a"], ["at"], perm=list(perm))]
    inits = []
    a_name = "at"
    if scale is not None and scale_position == "before":
        inits.append(("s", np.array(scale, np.float32)))
        nodes.append(helper.make_node("Mul", ["at", "s"], ["ats"]))
        a_name = "ats"
    matmul_output = "m" if scale is not None and scale_position == "after" else "y"
    nodes.append(helper.make_node("MatMul", [a_name, "b"], [matmul_output]))
    if scale is not None and scale_position == "after":
        inits.append(("s", np.array(scale, np.float32)))
        nodes.append(helper.make_node("Div", ["m", "s"], ["y"]))
    a_shape = [2, 4, 3]
    transposed = [a_shape[p] for p in perm]
    b_shape = transposed[:-2] + [transposed[-1], 5]
    return _model(nodes, [_in("a", a_shape), _in("b", b_shape)], [_out("y")], inits)


def bias_softmax(bias_shape=(1, 1, 4, 4), axis=-1):
    """Softmax(Add(scores [2, 2, 4, 4], bias), axis) as an attention mask adds it."""
    nodes = [helper.make_node("Add", ["scores", "mask"], ["masked"]),
             helper.make_node("Softmax", ["masked"], ["y"], axis=axis)]
    return _model(nodes, [_in("scores", [2, 2, 4, 4])], [_out("y")], [("mask", _rand(*bias_shape, seed=6))])


def bias_dropout(residual=True, bias_shape=(4,), training=False, ratio=0.1):
    """Dropout(Add(x [2, 3, 4], bias)) [+ residual], training_mode a constant."""
    inits = [("bias", _rand(*bias_shape, seed=7)), ("ratio", np.array(ratio, np.float32)),
             ("training_mode", np.array(training))]
    nodes = [helper.make_node("Add", ["x", "bias"], ["xb"]),
             helper.make_node("Dropout", ["xb", "ratio", "training_mode"], ["dropped" if residual else "y"])]
    inputs = [_in("x", [2, 3, 4])]
    if residual:
        nodes.append(helper.make_node("Add", ["dropped", "skip"], ["y"]))
        inputs.append(_in("skip", [2, 3, 4]))
    return _model(nodes, inputs, [_out("y")], inits)


def elimination(kind):
    """Relu(x) -> <one node that does nothing> -> Relu, for kind in: identity, identity_output,
    identity_input_to_output, dropout, dropout_training, dropout_ratio0_training, dropout_mask_used,
    cast_same, cast_real, reshape_same, reshape_other."""
    inits, outputs, mid = [], [_out("y")], None
    nodes = [helper.make_node("Relu", ["x"], ["r"])]
    if kind == "identity":
        mid = helper.make_node("Identity", ["r"], ["m"])
    elif kind == "identity_output":
        return _model(nodes + [helper.make_node("Identity", ["r"], ["y"])], [_in("x", [2, 3])], outputs)
    elif kind == "identity_input_to_output":
        return _model([helper.make_node("Identity", ["x"], ["y"])], [_in("x", [2, 3])], outputs)
    elif kind.startswith("dropout"):
        training = kind in ("dropout_training", "dropout_ratio0_training", "dropout_mask_used")
        ratio = 0.0 if kind == "dropout_ratio0_training" else 0.3
        inits = [("ratio", np.array(ratio, np.float32)), ("mode", np.array(training))]
        outs = ["m", "mask"] if kind == "dropout_mask_used" else ["m"]
        mid = helper.make_node("Dropout", ["r", "ratio", "mode"], outs, seed=1)
        if kind == "dropout_mask_used":
            outputs.append(_out("mask", TensorProto.BOOL))
    elif kind.startswith("cast"):
        mid = helper.make_node("Cast", ["r"], ["m"], to=F if kind == "cast_same" else TensorProto.DOUBLE)
    elif kind.startswith("reshape"):
        inits = [("shape", np.array([2, 3] if kind == "reshape_same" else [3, 2], np.int64))]
        mid = helper.make_node("Reshape", ["r", "shape"], ["m"])
    last = helper.make_node("Relu", ["m"], ["y"])
    if kind == "cast_real":
        outputs = [_out("y", TensorProto.DOUBLE)]
    return _model(nodes + [mid, last], [_in("x", [2, 3])], outputs, inits)


def constants_and_duplicates():
    """Relu(x) twice (CSE) and Add(c1, c2) of two constants (ConstantFolding), summed."""
    nodes = [helper.make_node("Relu", ["x"], ["r1"]), helper.make_node("Relu", ["x"], ["r2"]),
             helper.make_node("Add", ["c1", "c2"], ["c"]), helper.make_node("Add", ["r1", "r2"], ["s"]),
             helper.make_node("Mul", ["s", "c"], ["y"])]
    return _model(nodes, [_in("x", [2, 3])], [_out("y")],
                  [("c1", _rand(3, seed=8)), ("c2", _rand(3, seed=9))])


def order_matters():
    """Gelu(Add(MatMul(A, W), bias)) for 2-D A: MatMulAddFusion wants the Add for a Gemm,
    BiasGeluFusion wants it for a BiasGelu; whichever runs first takes it."""
    nodes = [helper.make_node("MatMul", ["a", "w"], ["m"]), helper.make_node("Add", ["m", "bias"], ["x"]),
             helper.make_node("Div", ["x", "c"], ["s"]), helper.make_node("Erf", ["s"], ["e"]),
             helper.make_node("Add", ["e", "one"], ["e1"]), helper.make_node("Mul", ["x", "e1"], ["xe"]),
             helper.make_node("Mul", ["xe", "half"], ["y"])]
    inits = [("w", _rand(4, 5, seed=10)), ("bias", _rand(5, seed=11)), ("c", np.array(1.4142135, np.float32)),
             ("one", np.array(1.0, np.float32)), ("half", np.array(0.5, np.float32))]
    return _model(nodes, [_in("a", [3, 4])], [_out("y")], inits)


# ortlab's optimizer next to ORT's: ORT's side is the graph an InferenceSession writes to
# SessionOptions.optimized_model_filepath (onnxruntime/core/session/inference_session.cc, TransformGraph).
ORT_LEVEL = {1: "basic", 2: "extended", 3: "all"}


def side_by_side(model, level=2, changed_only=True):
    """A Table of op counts: the original, ortlab's optimize(level) and ORT's own (CPU EP)."""
    ours = optimize(model, level=level, providers=["CPUExecutionProvider"])
    theirs = session.optimized_model(model, ORT_LEVEL[level], providers=["CPUExecutionProvider"])
    counts = [op_counts(m) for m in (model, ours, theirs)]
    ops = sorted(set().union(*counts))
    rows = [(op, *(c.get(op, 0) for c in counts)) for op in ops
            if not changed_only or len({c.get(op, 0) for c in counts}) > 1]
    rows.append(("all nodes", *(len(m.graph.node) for m in (model, ours, theirs))))
    return Table(("op", "original", f"ortlab level {level}", f"ORT {ORT_LEVEL[level]}"), rows)


def largest_difference(model, optimized, feeds):
    """The largest |difference| between the two models' outputs when ORT runs both."""
    a, b = session.run_model(model, feeds), session.run_model(optimized, feeds)
    return max(float(np.max(np.abs(a[n].astype(np.float64) - b[n]))) for n in a)


def levels_table():
    """Every registered transformer and rule: level, kind, EPs, and the first line of its docstring."""
    rows = [(level, f"{registry.rule_transformer_name(level)}: {cls.__name__}", "rule", "all",
             (cls.__doc__ or "").strip().splitlines()[0]) for level, cls in registry.in_ort_order(registry.RULES)]
    rows += [(level, cls.__name__, "transformer", ", ".join(eps) if eps else "all",
              (cls.__doc__ or "").strip().splitlines()[0]) for level, cls, eps in registry.in_ort_order()]
    rows.sort(key=lambda r: r[0])
    return Table(("level", "name", "kind", "EPs", "rewrite"), rows)


# CSE and constant folding step by step, ORT with one transformer, and ORT's two transformer lists.

def cse_model():
    """Relu(x) twice, Exp of each, and Softmax(x) over axis 0 and over axis 1, summed in pairs: value
    numbering finds the second Relu, then (only because of that) the second Exp, and keeps both Softmax
    nodes (same op and input, different attribute)."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu_1"),
             helper.make_node("Relu", ["x"], ["b"], name="relu_2"),
             helper.make_node("Exp", ["a"], ["ea"], name="exp_1"), helper.make_node("Exp", ["b"], ["eb"], name="exp_2"),
             helper.make_node("Softmax", ["x"], ["s0"], name="softmax_axis0", axis=0),
             helper.make_node("Softmax", ["x"], ["s1"], name="softmax_axis1", axis=1),
             helper.make_node("Add", ["ea", "eb"], ["y"], name="add_exps"),
             helper.make_node("Add", ["s0", "s1"], ["z"], name="add_softmaxes")]
    return _model(nodes, [_in("x", [2, 3])], [_out("y"), _out("z")])


def cse_steps(model):
    """CommonSubexpressionElimination's walk as a Table, one row per node in topological order
    (onnxruntime/core/optimizer/common_subexpression_elimination.cc): a node's key is its op, its
    attributes and the value numbers of its inputs; a key seen before means the same value, so the node
    goes and its readers read the first node's output, whose number its own outputs take."""
    graph = Graph.from_model(model)
    graph.resolve()
    number, seen, rows = {}, {}, []
    for node in graph.topological_order():
        inputs = tuple(number.get(n, n) for n in node.input_names)
        attrs = ", ".join(f"{k}={node.attribute(k)}" for k in sorted(node.attribute_protos))
        key = (node.op_type, node.domain, inputs, attrs)
        shown = f"{node.op_type}({', '.join(inputs)}{'; ' + attrs if attrs else ''})"
        first = seen.setdefault(key, node)
        if first is node or node.op_type in NON_DETERMINISTIC or any(o in graph.outputs for o in node.output_names):
            number.update({o: o for o in node.output_names})
            verdict = "new value" if first is node else f"same key as {first.name}, kept: it is not deterministic " \
                "or it produces a graph output"
            rows.append((node.name, shown, ", ".join(node.output_names), verdict))
            continue
        number.update({mine: number[theirs] for mine, theirs in zip(node.output_names, first.output_names)})
        rows.append((node.name, shown, ", ".join(number[o] for o in node.output_names),
                     f"same key as {first.name}: removed, its readers read {', '.join(first.output_names)}"))
    return Table(("node", "key (inputs by value number)", "value", "CSE"), rows)


def folding_model():
    """y = Reshape(MatMul(x, Transpose(W)) + Neg(b * 2), Shape(that sum)) for x [2, 4]: three nodes read
    only initializers (the Neg only once the Mul is folded), one Shape reads a value whose shape is known."""
    nodes = [helper.make_node("Transpose", ["W"], ["Wt"], name="transpose_W", perm=[1, 0]),
             helper.make_node("Mul", ["b", "two"], ["b2"], name="mul_b"),
             helper.make_node("Neg", ["b2"], ["nb"], name="neg_b2"),
             helper.make_node("MatMul", ["x", "Wt"], ["h"], name="matmul"),
             helper.make_node("Add", ["h", "nb"], ["y0"], name="add_bias"),
             helper.make_node("Shape", ["y0"], ["s"], name="shape"),
             helper.make_node("Reshape", ["y0", "s"], ["y"], name="reshape")]
    inits = [("W", _rand(3, 4, seed=12)), ("b", _rand(3, seed=13)), ("two", np.array(2.0, np.float32))]
    return _model(nodes, [_in("x", [2, 4])], [_out("y")], inits)


def folding_steps(model, excluded=()):
    """ConstantFolding's walk as a Table, one row per node in topological order
    (onnxruntime/core/optimizer/constant_folding.cc): a node whose inputs are all constant initializers
    (not graph inputs, not `excluded`, the weights to train) is computed once and its outputs become
    initializers, so a later node reading them can fold too; a Shape folds when its input's shape is
    known. Uses ortlab's ConstantFolding.fold for each decision."""
    folding = ConstantFolding(excluded)
    graph = Graph.from_model(model)
    graph.resolve()
    rows = []
    for node in graph.topological_order():
        values = folding.fold(graph, node)
        if values is None:
            blocker = next((n for n in node.input_names if n and gu.constant(graph, n, folding.excluded) is None), "")
            why = ("a weight to train" if blocker in folding.excluded else
                   "a graph input" if blocker in graph.inputs else "computed at run time")
            rows.append((node.name, f"{node.op_type}({', '.join(node.input_names)})", f"kept: reads {blocker}, {why}"))
            continue
        graph.remove_node(node)
        for name, value in zip(node.output_names, values):
            graph.add_initializer(name, value)
        how = "its input's shape is known" if node.op_type == "Shape" else "all inputs constant"
        rows.append((node.name, f"{node.op_type}({', '.join(node.input_names)})",
                     f"folded ({how}): {', '.join(_shown(n, v) for n, v in zip(node.output_names, values))}"))
    return Table(("node", "reads", "ConstantFolding"), rows)


def _shown(name, value):
    """`name = [values]` for a few numbers (2 decimals), `name: dtype[shape]` for more."""
    value = np.asarray(value)
    if value.size > 4:
        return f"{name}: {value.dtype}{list(value.shape)}"
    shown = value.tolist() if value.dtype.kind in "iub" else np.round(value.astype(np.float64), 2).tolist()
    return f"{name} = {shown}"


def ort_only(model, transformer, level="basic"):
    """The graph ORT makes of `model` with one of its transformers switched on at `level` (CPU EP): the
    session's verbose log names every transformer it runs there, and the rest are passed to
    InferenceSession(disabled_optimizers=...), ORT's FilterEnabledOptimizers
    (onnxruntime/core/session/inference_session.h)."""
    ran = {line.split("GraphTransformer ")[1].split(" modified")[0]
           for line in session.grep(session.initialization_log(model, level=level, providers=["CPUExecutionProvider"]),
                                    "GraphTransformer ")}
    if transformer not in ran:
        raise ValueError(f"ORT runs no transformer named {transformer!r} at level {level!r}; it runs {sorted(ran)}")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "optimized.onnx"
        options = session.session_options(level, optimized_model_filepath=str(path))
        session.ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"],
                             disabled_optimizers=sorted(ran - {transformer}))
        return onnx.load(str(path))


def node_lines(model):
    """Each node of a model as `Op(inputs) -> outputs`, in the model's order."""
    return [f"{op_name(n.op_type, n.domain)}({', '.join(n.input)}) -> {', '.join(n.output)}" for n in model.graph.node]


def beside(**models):
    """A Table with one column per model (keyword = column title), one node per row (node_lines)."""
    columns = [node_lines(m) for m in models.values()]
    rows = [tuple(c[i] if i < len(c) else "" for c in columns) for i in range(max(map(len, columns)))]
    return Table(tuple(models), rows)


def training_model():
    """Gelu(MatMul(x, Transpose(W)) + bias), the Erf form torch exports, for x [2, 3, 4] and W [5, 4] as
    torch's Linear stores it: one graph on which ORT's inference list and its pre-training list differ."""
    nodes = [helper.make_node("Transpose", ["W"], ["Wt"], name="transpose_W", perm=[1, 0]),
             helper.make_node("MatMul", ["x", "Wt"], ["h"], name="matmul"),
             helper.make_node("Add", ["h", "bias"], ["pre"], name="add_bias"),
             helper.make_node("Div", ["pre", "sqrt2"], ["s"], name="gelu_div"),
             helper.make_node("Erf", ["s"], ["e"], name="gelu_erf"),
             helper.make_node("Add", ["e", "one"], ["e1"], name="gelu_add"),
             helper.make_node("Mul", ["pre", "e1"], ["pe"], name="gelu_mul"),
             helper.make_node("Mul", ["pe", "half"], ["y"], name="gelu_half")]
    inits = [("W", _rand(5, 4, seed=14)), ("bias", _rand(5, seed=15)), ("sqrt2", np.array(1.4142135, np.float32)),
             ("one", np.array(1.0, np.float32)), ("half", np.array(0.5, np.float32))]
    return _model(nodes, [_in("x", [2, 3, 4])], [_out("y")], inits)


def ort_pre_gradient_graph(model, weights_to_train):
    """The forward graph after ORT's pre-training transformers, as ORTModule's graph builder makes it
    before it builds the gradient graph: OrtModuleGraphBuilder (orttraining/orttraining/core/framework/
    ortmodule_graph_builder.cc, OptimizeInferenceGraph) registers GeneratePreTrainingTransformers'
    list (orttraining/orttraining/core/optimizer/graph_transformer_utils.cc), with `weights_to_train`
    as the names to keep trainable, into a GraphTransformerManager of its own and applies it. The builder
    runs them only on its way to the gradient graph, so this builds that too and returns its forward part
    (get_forward_model)."""
    C = capi()
    config = builder_config([i.name for i in model.graph.input], list(weights_to_train))
    builder = C.OrtModuleGraphBuilder()
    builder.initialize(model.SerializeToString(), config)
    builder.build(C.TrainingGraphTransformerConfiguration())
    return onnx.load_from_string(builder.get_forward_model())


def inference_vs_training(model, weights_to_train):
    """A Table: the graph each of ORT's two transformer lists makes of `model` (the InferenceSession's at
    basic and extended, CPU EP; the pre-training list of ORTModule's graph builder), and ortlab's
    optimize(level) and optimize_for_training beside each; one row per list, the ops in graph order."""
    def ops(m):
        return ", ".join(op_name(n.op_type, n.domain) for n in m.graph.node)

    rows = [("InferenceSession, basic (GenerateTransformers, level 1)",
             ops(session.optimized_model(model, "basic", providers=["CPUExecutionProvider"])),
             ops(optimize(model, level=1, providers=["CPUExecutionProvider"]))),
            ("InferenceSession, extended (levels 1 and 2)",
             ops(session.optimized_model(model, "extended", providers=["CPUExecutionProvider"])),
             ops(optimize(model, level=2, providers=["CPUExecutionProvider"]))),
            (f"ORTModule's graph builder, before the gradient (GeneratePreTrainingTransformers, "
             f"{', '.join(weights_to_train)} to train)",
             ops(ort_pre_gradient_graph(model, weights_to_train)),
             ops(optimize_for_training(model, list(weights_to_train))[0]))]
    return Table(("transformer list", "ORT's graph", "ortlab's graph"), rows)

"""Small hand-built models holding one pattern each, in a variant that should fuse and ones that must not;
and ortlab's optimizer next to ORT's on the same model (op counts, outputs), for L1_01.

Used by the notebook, lab02 and the tests; every model is float32 with a fixed seed, and
`feeds(model)` makes inputs for it. Each builder takes keyword switches that break the
pattern the way real graphs do (a shared intermediate, another axis, another constant).
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper

from ortlab import session
from ortlab.onnx_defs import make_model, op_counts, op_name  # noqa: F401 (op_counts: the labs read it here)
from ortlab.transformers import registry
from ortlab.transformers.manager import optimize
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

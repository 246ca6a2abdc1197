"""The engine's kernels give ORT 1.19.2's CPU results, bit for bit, on special values.

Special values: ties, NaN, +-0.0, +-inf, float32 denormals, empty tensors, int32/int64 extremes,
broadcasting edge cases. Every comparison runs the same one-node model in ORT (CPU EP,
ORT_DISABLE_ALL, one thread) and in ortlab.engine, and asks for the same element type, shape and
bits: NaN where ORT has NaN (any payload), the sign of every zero, equal indices. ORT is the
reference, not the ONNX spec: where they disagree, the engine mirrors ORT and
ortlab.engine.cpu_kernels_ordering.ORT_VS_SPEC lists the difference.

Part 1: the kernels fixed here (TopK, ArgMax/ArgMin, ReduceMax/ReduceMin, Relu, Sqrt) on inputs
chosen to hit each of ORT's code paths. Part 2: a generated sweep over every op the engine runs
through onnx.reference (test_sweep_*). Part 3: inputs ORT refuses or dies on.
"""
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlab.errors import OrtlabError

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")

NP_TO_ONNX = {np.dtype(k): v for k, v in {
    np.float32: TensorProto.FLOAT, np.float64: TensorProto.DOUBLE, np.float16: TensorProto.FLOAT16,
    np.int8: TensorProto.INT8, np.int16: TensorProto.INT16, np.int32: TensorProto.INT32,
    np.int64: TensorProto.INT64, np.uint8: TensorProto.UINT8, np.uint16: TensorProto.UINT16,
    np.uint32: TensorProto.UINT32, np.uint64: TensorProto.UINT64, np.bool_: TensorProto.BOOL}.items()}


# ----------------------------------------------------------------------------------------------
# Running one node in both runtimes, comparing bits
# ----------------------------------------------------------------------------------------------
def node_model(op, feeds, n_out=1, opset=21, **attrs):
    """A model of one `op` node reading `feeds` (name -> array; None leaves an optional input out),
    outputs y0.. typed by onnx's shape inference."""
    names = [name if value is not None else "" for name, value in feeds.items()]
    inputs = [helper.make_tensor_value_info(n, NP_TO_ONNX[v.dtype], None) for n, v in feeds.items() if v is not None]
    outputs = [helper.make_tensor_value_info(f"y{i}", TensorProto.UNDEFINED, None) for i in range(n_out)]
    node = helper.make_node(op, names, [f"y{i}" for i in range(n_out)], **attrs)
    model = helper.make_model(helper.make_graph([node], op, inputs, outputs),
                              opset_imports=[helper.make_opsetid("", opset)], ir_version=10)
    inferred = onnx.shape_inference.infer_shapes(model, strict_mode=False)
    values = list(inferred.graph.value_info) + list(inferred.graph.output)
    types = {v.name: v.type.tensor_type.elem_type for v in values}
    for output in model.graph.output:
        output.type.tensor_type.elem_type = types.get(output.name, 0)
    return model


def run_ort(model, feeds):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 4
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {k: v for k, v in feeds.items() if v is not None})


def run_engine(model, feeds):
    from ortlab.engine import InferenceSession, SessionOptions

    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=0))
    return sess.run(None, {k: v for k, v in feeds.items() if v is not None})


def bit_difference(expected, got):
    """None when `got` is `expected` bit for bit (NaN equal to NaN, zeros by sign), else what differs."""
    expected, got = np.asarray(expected), np.asarray(got)
    if expected.dtype != got.dtype:
        return f"dtype: ORT {expected.dtype}, engine {got.dtype}"
    if expected.shape != got.shape:
        return f"shape: ORT {list(expected.shape)}, engine {list(got.shape)}"
    if expected.dtype.kind == "f":
        nan_e, nan_g = np.isnan(expected), np.isnan(got)
        bad = (nan_e != nan_g) | (~nan_e & ((expected != got) | (np.signbit(expected) != np.signbit(got))))
    elif expected.dtype == object:
        bad = expected != got
    else:
        bad = expected != got
    if not np.any(bad):
        return None
    where = np.argwhere(bad)[:3]
    shown = ", ".join(f"at {tuple(int(i) for i in w)}: ORT {expected[tuple(w)]!r}, engine {got[tuple(w)]!r}"
                      for w in where)
    return f"{int(np.sum(bad))} of {expected.size} elements differ ({shown})"


def assert_same_as_ort(model, feeds):
    expected, got = run_ort(model, feeds), run_engine(model, feeds)
    assert len(got) == len(expected)
    for i, (e, g) in enumerate(zip(expected, got)):
        difference = bit_difference(e, g)
        assert difference is None, f"output {i}: {difference}"


# ----------------------------------------------------------------------------------------------
# Part 1: the fixed kernels
# ----------------------------------------------------------------------------------------------
NAN, INF = np.nan, np.inf


def _rows_with_specials(rng, shape, dtype=np.float32, nan=0.2, zeros=0.15, inf=0.05, low=-3, high=4):
    """Small integers (many ties) with NaN, -0.0, 0.0 and +-inf sprinkled in."""
    x = rng.integers(low, high, shape).astype(dtype)
    x[rng.random(shape) < zeros] = -0.0
    x[rng.random(shape) < zeros] = 0.0
    x[rng.random(shape) < inf] = INF
    x[rng.random(shape) < inf] = -INF
    x[rng.random(shape) < nan] = NAN
    return x


@pytest.mark.parametrize("largest", [1, 0])
def test_topk_ties_lower_index_first(largest):
    """Ties (0.0 and -0.0 included) come lower index first, as ORT's comparator says and the spec
    asks; onnx.reference ordered -0.0 before 0.0 by position in numpy's sort."""
    x = np.array([[1, 3, 3, -0.0, 0.0, -0.0, 1, 3, 0.0, 2]], np.float32)
    feeds = {"x": x, "k": np.array([8], np.int64)}
    assert_same_as_ort(node_model("TopK", feeds, 2, axis=1, largest=largest), feeds)


# k=1 (scan), k=2 (heap), k=3 of 4 (heap), k=6 of 8 (nth_element), k=20 of 33 (introsort), all.
TOPK_SIZES = [(1, 9), (2, 9), (3, 4), (6, 8), (20, 33), (33, 33), (0, 5)]


@pytest.mark.parametrize("k, n", TOPK_SIZES)
@pytest.mark.parametrize("largest, sorted_", [(1, 1), (0, 1), (1, 0), (0, 0)])
def test_topk_nan_and_unsorted_match_ort(k, n, largest, sorted_):
    """NaN (which compares false) lands where ORT's path puts it, and sorted=0 gives ORT's order
    (heap order, or std::nth_element's), along each axis; onnx.reference placed NaN by numpy's
    sort and refused sorted=0."""
    rng = np.random.default_rng(k * 100 + n + 7 * largest + 3 * sorted_)
    x = _rows_with_specials(rng, (4, n, 3), nan=0.3)
    for axis in (1, -2):
        feeds = {"x": x, "k": np.array([k], np.int64)}
        assert_same_as_ort(node_model("TopK", feeds, 2, axis=axis, largest=largest, sorted=sorted_), feeds)


def test_topk_integer_extremes_match_ort():
    """int32/int64 extremes and ties keep ORT's order (no overflow from negating the values)."""
    for dtype in (np.int32, np.int64):
        info = np.iinfo(dtype)
        x = np.array([[info.min, info.max, 0, info.min, -1, info.max, 1]], dtype)
        for largest in (0, 1):
            feeds = {"x": x, "k": np.array([7], np.int64)}
            assert_same_as_ort(node_model("TopK", feeds, 2, axis=1, largest=largest), feeds)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
@pytest.mark.parametrize("last", [0, 1])
def test_argmax_argmin_nan_match_ort(op, last):
    """NaN never wins (it is skipped) unless it is the first element, with and without
    select_last_index; onnx.reference (numpy) returned the first NaN."""
    rng = np.random.default_rng(11 + last)
    x = _rows_with_specials(rng, (5, 9, 4), nan=0.3)
    x[0, 0, :] = NAN
    for axis in (0, 1, 2, -1):
        for keepdims in (0, 1):
            feeds = {"x": x}
            assert_same_as_ort(node_model(op, feeds, axis=axis, keepdims=keepdims, select_last_index=last), feeds)


# Shapes and axes hitting each of ORT's reduction paths: all (R), last (KR), first (RK),
# middle (KRK, with 1 and with several outer blocks), outer two (RKR) and a generic layout.
REDUCE_LAYOUTS = [((7, 13), []), ((7, 13), [1]), ((9, 6), [0]), ((3, 9, 5), [1]), ((1, 9, 5), [1]),
                  ((3, 6, 7), [0, 2]), ((1, 6, 7), [0, 2]), ((2, 3, 4, 5), [0, 2]), ((5, 1, 3), [1])]


@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape, axes", REDUCE_LAYOUTS, ids=[f"{s}-{a}" for s, a in REDUCE_LAYOUTS])
def test_reduce_max_min_nan_match_ort(op, dtype, shape, axes):
    """NaN and signed zeros reduce as ORT's Eigen code does: NaN kept only where it enters first
    (in its row, or in its SSE lane), zeros keep the sign of the one met first; onnx.reference
    (numpy) returned NaN for every row holding one."""
    rng = np.random.default_rng(len(shape) * 31 + sum(shape))
    x = _rows_with_specials(rng, shape, dtype, nan=0.25, zeros=0.2)
    feeds = {"x": x, "axes": np.array(axes, np.int64)}
    for keepdims in (0, 1):
        assert_same_as_ort(node_model(op, feeds, opset=18, keepdims=keepdims), feeds)
    old = {"x": x}
    assert_same_as_ort(node_model(op, old, opset=13, keepdims=1, **({"axes": axes} if axes else {})), old)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_relu_keeps_negative_zero_like_ort(dtype):
    """Relu(-0.0) is -0.0 in ORT (x < 0 ? 0 : x); onnx.reference gave 0.0."""
    x = np.array([-0.0, 0.0, -1.0, 2.0, NAN, -INF, INF, -1e-45], dtype)
    assert_same_as_ort(node_model("Relu", {"x": x}), {"x": x})


@pytest.mark.parametrize("n", [1, 3, 4, 5, 8, 11, 16])
def test_sqrt_float32_special_values_match_ort(n):
    """float32 Sqrt in 4-lane packets: -0.0 and denormals give +0.0, +inf gives NaN (Eigen's fast
    sqrt); the last n % 4 elements take IEEE sqrt (-0.0 stays -0.0, inf stays inf). onnx.reference
    gave IEEE sqrt everywhere."""
    specials = np.array([-0.0, 1e-40, INF, 0.0, NAN, -1.0, 1e-45, 4.0, -0.0, INF, 2e-39, 9.0,
                         -INF, -0.0, 16.0, INF], np.float32)
    x = np.resize(specials, n) if n <= specials.size else specials
    assert_same_as_ort(node_model("Sqrt", {"x": x}), {"x": x})
    assert_same_as_ort(node_model("Sqrt", {"x": x[::-1].copy()}), {"x": x[::-1].copy()})


def test_sqrt_float64_is_ieee_like_ort():
    x = np.array([-0.0, 1e-310, INF, 0.0, NAN, -1.0, 2.0, 1e-300], np.float64)
    assert_same_as_ort(node_model("Sqrt", {"x": x}), {"x": x})


def test_ort_vs_spec_table_names_each_fixed_op():
    """ORT_VS_SPEC, the one list a notebook can show, has a row for each op mirrored here."""
    from ortlab.engine.cpu_kernels_ordering import ORT_VS_SPEC

    named = " ".join(row[0] for row in ORT_VS_SPEC)
    for op in ("TopK", "ArgMax", "ReduceMax", "Relu", "Sqrt"):
        assert op in named
    assert all(len(row) == 5 and all(isinstance(f, str) and f for f in row) for row in ORT_VS_SPEC)


# ----------------------------------------------------------------------------------------------
# Part 2: a generated sweep over every op the engine runs through onnx.reference
# ----------------------------------------------------------------------------------------------
# Templates: onnx's backend node test cases (one node, ai.onnx / ai.onnx.ml, opset <= 21, tensors
# of numpy types), the first CASES_PER_OP of each op, sorted by name. Variants of each template:
#   specials  float data inputs with NaN, +-0.0, +-inf and repeated values (ties) mixed in;
#   extremes  integer data inputs with the type's min and max, 0 and -1 mixed in;
#   empty     each data input with a 0-sized first axis (one-input ops);
#   broadcast [2,3]+[3], [2,1]+[1,3], []+[2,3], [0,3]+[1,3], [2,0]+[2,1] (elementwise binary ops).
# "Data" inputs are those whose type is an output's type variable (not indices, shapes, axes).
# A variant ORT refuses is not compared here (Part 3 looks at refusals).
CASES_PER_OP = 1
ORT_MAX_OPSET = 21
BINARY_ELEMENTWISE = {"Add", "Sub", "Mul", "Div", "Pow", "Mod", "Max", "Min", "Mean", "Sum", "Equal", "Less",
                      "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "BitShift",
                      "BitwiseAnd", "BitwiseOr", "BitwiseXor", "PRelu"}
BROADCAST_SHAPES = [((2, 3), (3,)), ((2, 1), (1, 3)), ((), (2, 3)), ((0, 3), (1, 3)), ((2, 0), (2, 1))]


def runs_on_cpu_kernels(domain, op):
    """True for an op the engine's CPU EP runs itself, through an cpu_kernels kernel or
    onnx.reference (everything but a function body the partitioner inlines first,
    CPUExecutionProvider.find_kernel's order)."""
    from ortlab.transformers.session_transforms import FUNCTION_BODIES

    return (domain, op) not in FUNCTION_BODIES


NODE_CASES = Path(onnx.__file__).parent / "backend" / "test" / "data" / "node"
RANDOM_OPS = {"Bernoulli", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
              "Multinomial", "Dropout"}
SIZE_FROM_DATA = {"Range", "Loop"}  # data inputs size the output or the trip count: inf / INT64_MAX never end
INTEGER_DIVISION = {"Div", "Mod"}


def _opset(model, domain):
    domains = (domain,) if domain else ("", "ai.onnx")
    return max((o.version for o in model.opset_import if (o.domain or "") in domains),
               default=0)


def _template(case_dir):
    """(model, feeds) of a one-node case whose values are all numpy tensors, else None."""
    model = onnx.load(str(case_dir / "model.onnx"))
    if len(model.graph.node) != 1 or _opset(model, "") > ORT_MAX_OPSET:
        return None
    node = model.graph.node[0]
    if (node.domain or "") not in ("", "ai.onnx.ml") or node.op_type in RANDOM_OPS | SIZE_FROM_DATA:
        return None
    initialized = {t.name for t in model.graph.initializer}
    feeds = {}
    for i, value in enumerate(v for v in model.graph.input if v.name not in initialized):
        path = case_dir / "test_data_set_0" / f"input_{i}.pb"
        if not value.type.HasField("tensor_type") or not path.exists():
            return None
        array = numpy_helper.to_array(onnx.load_tensor(str(path)))
        if array.dtype not in NP_TO_ONNX:
            return None
        feeds[value.name] = array
    numpy_types = set(NP_TO_ONNX.values())
    if any(not o.type.HasField("tensor_type") or o.type.tensor_type.elem_type not in numpy_types
           for o in model.graph.output):
        return None
    return model, feeds


def sweep_templates():
    """{(domain, op): [(case name, model, feeds)]}: the first CASES_PER_OP usable cases of each
    op the engine's CPU EP runs."""
    found = {}
    for case_dir in sorted(NODE_CASES.iterdir()):
        if not (case_dir / "model.onnx").exists():
            continue
        template = _template(case_dir)
        if template is None:
            continue
        node = template[0].graph.node[0]
        key = (node.domain or "", node.op_type)
        if runs_on_cpu_kernels(*key) and len(found.setdefault(key, [])) < CASES_PER_OP:
            found[key].append((case_dir.name, *template))
    return {k: v for k, v in found.items() if v}


def data_inputs(model):
    """Names of the node's data inputs: typed by a type variable an output also has, or by input
    0's type variable (Equal's B); not indices, shapes, axes or fixed-type parameters."""
    node = model.graph.node[0]
    schema = onnx.defs.get_schema(node.op_type, _opset(model, node.domain or ""), node.domain or "")
    outputs = {o.type_str for o in schema.outputs}
    first = schema.inputs[0].type_str if schema.inputs else None
    names = []
    for i, name in enumerate(node.input):
        formal = schema.inputs[min(i, len(schema.inputs) - 1)]
        variable = not formal.type_str.startswith("tensor(")
        if name and variable and (formal.type_str in outputs or formal.type_str == first):
            names.append(name)
    return names


def _untyped_shapes(model):
    """The model with its inputs' and outputs' shapes dropped (variants change them)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for value in list(model.graph.input) + list(model.graph.output):
        value.type.tensor_type.ClearField("shape")
    return model


def _with_specials(x, rng):
    """x with NaN, +-0.0, +-inf and copies of x's first value (ties) at ~40% of its positions."""
    x = x.copy()
    if x.size:
        picks = np.array([np.nan, -0.0, 0.0, np.inf, -np.inf, x.flat[0]], np.float64)
        mask = rng.random(x.shape) < 0.4
        x[mask] = picks[rng.integers(0, picks.size, int(mask.sum()))].astype(x.dtype)
    return x


def _with_extremes(x, rng, divisor=False):
    """x with its type's min and max, 0, 1 and -1 (signed) at ~40% of its positions; a divisor
    gets no 0 or -1 (ORT dies of SIGFPE on x / 0 and INT_MIN / -1: see Part 3)."""
    x = x.copy()
    if x.size:
        info = np.iinfo(x.dtype)
        picks = [info.min, info.max, 1] if divisor else [info.min, info.max, 0, 1] + ([-1] if info.min < 0 else [])
        picks = np.array(picks, dtype=x.dtype)
        mask = rng.random(x.shape) < 0.4
        x[mask] = picks[rng.integers(0, picks.size, int(mask.sum()))]
    return x


def sweep_variants(model, feeds, seed=0):
    """[(variant name, model, feeds)] for one template (see the list above)."""
    rng = np.random.default_rng(seed)
    data = [name for name in data_inputs(model) if name in feeds]
    loose = _untyped_shapes(model)
    variants = []
    floats = [n for n in data if feeds[n].dtype.kind == "f"]
    ints = [n for n in data if feeds[n].dtype.kind in "iu"]
    if floats:
        variants.append(("specials", loose, {**feeds, **{n: _with_specials(feeds[n], rng) for n in floats}}))
    if ints:
        divisor = model.graph.node[0].op_type in INTEGER_DIVISION and ints[-1:] == data[1:2]
        changed = {n: _with_extremes(feeds[n], rng, divisor and n == data[1]) for n in ints}
        variants.append(("extremes", loose, {**feeds, **changed}))
    if len(data) == 1 and feeds[data[0]].ndim >= 1:
        x = feeds[data[0]]
        variants.append(("empty", loose, {**feeds, data[0]: np.zeros((0,) + x.shape[1:], x.dtype)}))
    node = model.graph.node[0]
    if node.op_type in BINARY_ELEMENTWISE and len(data) == 2 and feeds[data[0]].dtype == feeds[data[1]].dtype:
        a, b = data
        for sa, sb in BROADCAST_SHAPES:
            make = lambda shape, name: np.resize(feeds[name], shape).astype(feeds[name].dtype)  # noqa: E731
            va, vb = make(sa, a), make(sb, b)
            variants.append((f"broadcast{list(sa)}{list(sb)}", loose, {**feeds, a: va, b: vb}))
    return variants


# Ops whose finite results ORT computes with other roundings (MLAS / Eigen polynomial
# approximations, float32 accumulation orders): finite nonzero values are compared within this many
# ulp; NaN, inf, zeros and their signs, dtype and shape still bit for bit.
ULP_OPS = {
    **{op: (4, "MLAS's vectorized exp/log/tanh/logistic/erf polynomials (core/mlas/lib/*.cpp) round "
               "differently from numpy's libm") for op in ("Exp", "Log", "Tanh", "Sigmoid", "Erf", "Pow", "Softmax",
                                                         "LogSoftmax")},
    "Sqrt": (2, "float32 packets: Eigen's fast sqrt (the CPU's rsqrt and one Newton step) is within 1 ulp "
                "of IEEE; which ulp depends on the CPU (cpu_kernels_elementwise.eigen_fast_sqrt_float32)"),
    "Resize": (4, "cubic coefficients and sums in float32 in ORT (upsample.cc), float64 in the reference"),
    "BatchNormalization": (32, "ORT folds scale / sqrt(var + epsilon) and the bias in float32 (Eigen) before "
                               "applying them; the reference normalizes first"),
    **{op: (8, "float32 sums, means and variances accumulated in ORT's order (Eigen / MLAS), numpy's "
               "pairwise order in the reference") for op in ("LayerNormalization",
                                                              "GroupNormalization", "LRN", "AffineGrid")},
    **{op: (16, "window cosines computed in float32 by ORT (signal/window_functions.cc), in float64 and "
                "rounded by the reference") for op in ("HammingWindow", "HannWindow", "BlackmanWindow")},
}
# Differences the engine still has (strict: the test fails once fixed, so the entry goes).
SWEEP_OPEN = {
    ("BlackmanWindow", "*"): "ORT's float32 window gives 1.49e-08 where the reference's is 0.0 (element 0): "
                             "not mirrored (signal/window_functions.cc computes a0 - a1 cos + a2 cos in float32)",
    ("MeanVarianceNormalization", "*"): "engine bug (ortlab/ir/load_rules.py check_inference): onnx's strict "
                                        "shape inference fails inside the op's function body and the engine "
                                        "refuses the model; ORT runs its own kernel",
    ("AffineGrid", "empty"): "ORT sizes the grid from `size` (N=2) and reads theta past its 0 rows "
                             "(uninitialized memory): nothing to mirror",
    ("LRN", "specials"): "NaN / inf inputs: ORT's square-sum window gives other NaN/inf/zero positions than "
                         "the reference (nn/lrn.cc, not analysed yet)",
    ("PRelu", "specials"): "with a broadcast slope holding inf/NaN, ORT gives NaN where the engine gives inf "
                           "(element_wise_ops.cc PRelu's broadcast lambdas; the same-shape case is mirrored)",
    ("STFT", "specials"): "inf in a frame: ORT's std::complex products give inf where the engine's give NaN "
                          "(signal/dft.cc; OrtSTFT mirrors the finite case)",
    ("Resize", "empty"): "onnx.reference's Resize fails on an empty input ('could not broadcast ... into shape "
                         "(0,)'); ORT gives an empty output (not mirrored yet)",
    ("Col2Im", "empty"): "onnx.reference's Col2Im returns None for an empty input; ORT gives an empty tensor "
                         "(not mirrored yet)",
}


def ulp_difference(expected, got, max_ulp):
    """None when `got` equals `expected` as bit_difference asks, except finite nonzero floats, which
    may be up to `max_ulp` units in the last place apart; else what differs."""
    expected, got = np.asarray(expected), np.asarray(got)
    strict = bit_difference(expected, got)
    if strict is None or expected.dtype.kind != "f" or expected.dtype != got.dtype or expected.shape != got.shape:
        return strict
    loose = np.isfinite(expected) & np.isfinite(got) & (expected != 0) & (got != 0) & \
        (np.signbit(expected) == np.signbit(got))
    as_int = {2: np.int16, 4: np.int32, 8: np.int64}[expected.dtype.itemsize]
    apart = np.abs(expected.view(as_int).astype(np.int64) - got.view(as_int).astype(np.int64))
    bad = np.where(loose, apart > max_ulp, (expected != got) & ~(np.isnan(expected) & np.isnan(got)) |
                   (np.signbit(expected) != np.signbit(got)) & ~np.isnan(expected))
    if not bad.any():
        return None
    worst = int(apart[loose].max()) if loose.any() else 0
    return f"{int(bad.sum())} elements beyond {max_ulp} ulp or special (worst {worst} ulp): {strict}"


# Variants that kill ORT's process (not run in-process: the test run would die with it).
SWEEP_ORT_DIES = {
    ("TopK", "empty"): "ORT 1.19.2 dies with SIGFPE: 0 rows before the axis make top_k.cc divide size by rows "
                       "(0 / 0); the engine refuses it (test_topk_with_no_rows_is_refused)",
}


def _cpu_has_avx512():
    try:
        with open("/proc/cpuinfo") as info:
            return " avx512f" in info.read()
    except OSError:
        return False


# Variants whose ORT result follows MLAS's kernel for the CPU at hand (picked at run time, platform.cpp):
# the engine mirrors the AVX-512 path measured here; elsewhere ORT may differ in the last n % 4 elements.
SWEEP_CPU_DEPENDENT = {
    ("QuantizeLinear", "specials"): "NaN quantizes to the type's minimum in MLAS's AVX-512 and SSE vector code, "
                                    "to 0 in its scalar tail; the engine mirrors an AVX-512 CPU and this one has none",
}


def _open_reason(op, variant):
    return SWEEP_OPEN.get((op, variant)) or SWEEP_OPEN.get((op, "*"))


def _sweep_params():
    params = []
    for (domain, op), cases in sorted(sweep_templates().items()):
        for case, model, feeds in cases:
            for variant, vmodel, vfeeds in [("template", model, feeds)] + sweep_variants(model, feeds):
                reason = _open_reason(op, variant.split("[")[0]) or _open_reason(op, variant)
                marks = [pytest.mark.xfail(reason=reason, strict=True, raises=(AssertionError, OrtlabError))] \
                    if reason else []
                dependent = SWEEP_CPU_DEPENDENT.get((op, variant.split("[")[0]))
                if dependent and not _cpu_has_avx512():
                    marks = [pytest.mark.xfail(reason=dependent, strict=False)]
                if (op, variant) in SWEEP_ORT_DIES:
                    marks = [pytest.mark.skip(reason=SWEEP_ORT_DIES[op, variant])]
                params.append(pytest.param(vmodel, vfeeds, id=f"{op}/{case[len('test_'):]}/{variant}", marks=marks))
    return params


@pytest.mark.parametrize("model, feeds", _sweep_params())
def test_sweep_matches_ort(model, feeds):
    """One op on generated special values: the engine's outputs are ORT's, bit for bit (within
    ULP_OPS's allowance for finite values of the listed ops). A variant ORT refuses is skipped."""
    try:
        expected = run_ort(model, feeds)
    except Exception as exc:  # noqa: BLE001 (ORT's refusal: nothing to compare here)
        pytest.skip(f"ORT 1.19.2 refuses it: {str(exc)[:120]}")
    got = run_engine(model, feeds)
    op = model.graph.node[0].op_type
    max_ulp = ULP_OPS.get(op, (0, ""))[0]
    assert len(got) == len(expected)
    for i, (e, g) in enumerate(zip(expected, got)):
        difference = ulp_difference(e, g, max_ulp) if max_ulp else bit_difference(e, g)
        assert difference is None, f"{op} output {i}: {difference}"


# ----------------------------------------------------------------------------------------------
# Part 3: inputs ORT refuses or dies on
# ----------------------------------------------------------------------------------------------
_CHILD = """
import sys
import numpy as np
import onnx
import onnxruntime as ort
model = onnx.load_from_string(bytes.fromhex(sys.argv[1]))
a, b = (np.array(v, dtype=sys.argv[2]) for v in eval(sys.argv[3]))
so = ort.SessionOptions()
so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"]).run(None, {"a": a, "b": b})
print("ran")
"""


@pytest.mark.parametrize("op, dtype, a, b", [("Div", "int32", [7, 1], [0, 2]), ("Mod", "int32", [7, 1], [0, 2]),
                                             ("Div", "int64", [-(2 ** 63), 4], [-1, 2])])
def test_integer_division_trap_is_a_clear_error(op, dtype, a, b):
    """ORT's process dies with SIGFPE on integer x / 0 and INT_MIN / -1 (checked in a child process);
    the engine raises an OrtlabError that says so, instead of numpy's INT_MIN/0 with a warning."""
    import signal
    import subprocess
    import sys

    feeds = {"a": np.array(a, dtype), "b": np.array(b, dtype)}
    model = node_model(op, feeds)
    child = subprocess.run([sys.executable, "-c", _CHILD, model.SerializeToString().hex(), dtype, repr((a, b))],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGFPE, (child.returncode, child.stderr[-300:])
    with pytest.raises(OrtlabError, match="SIGFPE") as caught:
        run_engine(model, feeds)
    assert op in str(caught.value) and dtype in str(caught.value)


def test_broadcast_error_names_node_op_and_shapes():
    """Add of [3, 5] and [4, 5]: ORT says 'Attempting to broadcast an axis by a dimension other than
    1. 3 by 4'; the engine says the same, with the node, the op and both shapes (not 'Issues with
    types ndarray, ndarray')."""
    feeds = {"a": np.ones((3, 5), np.float32), "b": np.ones((4, 5), np.float32)}
    model = node_model("Add", feeds)
    with pytest.raises(Exception, match="other than 1. 3 by 4"):
        run_ort(model, feeds)
    with pytest.raises(OrtlabError) as caught:
        run_engine(model, feeds)
    message = str(caught.value)
    for part in ("Add node", "other than 1. 3 by 4", "[3, 5]", "[4, 5]"):
        assert part in message, message


def test_topk_k_larger_than_axis_is_refused_like_ort():
    feeds = {"x": np.ones((2, 3), np.float32), "k": np.array([4], np.int64)}
    model = node_model("TopK", feeds, 2, axis=1)
    with pytest.raises(Exception, match=r"k argument \[4\] should not be greater than specified axis dim value \[3\]"):
        run_ort(model, feeds)
    with pytest.raises(OrtlabError,
                       match=r"k argument \[4\] should not be greater than specified axis dim value \[3\]"):
        run_engine(model, feeds)


# The kernels cpu_kernels_ordering.py and cpu_kernels_elementwise.py register for special values, by name (the
# registry guard in test_registry.py looks for each registered op's name in a test).
SPECIAL_VALUE_KERNELS = ["TopK", "ArgMax", "ArgMin", "ReduceMax", "ReduceMin", "Relu", "Sqrt", "Ceil", "Floor",
                         "PRelu", "OneHot", "Erf", "Gelu", "Softmax", "LogSoftmax", "Hardmax", "QuantizeLinear",
                         "ReduceMean", "Compress", "DynamicQuantizeLinear", "Add", "Sub", "Mul", "Div", "Mod", "Pow",
                         "And", "Or", "Xor", "Equal", "Less", "Greater", "LessOrEqual", "GreaterOrEqual",
                         "BitShift", "BitwiseAnd", "BitwiseOr", "BitwiseXor"]


def test_every_special_value_kernel_is_registered_and_swept():
    from ortlab.engine import kernel_registry

    registered = {op for op, _ in kernel_registry("CPUExecutionProvider").kernels}
    assert set(SPECIAL_VALUE_KERNELS) <= registered, set(SPECIAL_VALUE_KERNELS) - registered
    swept = {op for _, op in sweep_templates()}
    assert set(SPECIAL_VALUE_KERNELS) - swept <= {"BitwiseAnd", "BitwiseOr", "BitwiseXor"} | swept, \
        set(SPECIAL_VALUE_KERNELS) - swept


def test_topk_with_no_rows_is_refused():
    """TopK of a [0, 4] tensor along axis 1 kills ORT's process (SIGFPE, seen in the sweep); the
    engine says so in an OrtlabError instead of returning an empty result ORT never gives."""
    feeds = {"x": np.zeros((0, 4), np.float32), "k": np.array([2], np.int64)}
    with pytest.raises(OrtlabError, match="SIGFPE"):
        run_engine(node_model("TopK", feeds, 2, axis=1), feeds)

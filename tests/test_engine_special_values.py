"""The engine's kernels give ORT 1.19.2's CPU results, bit for bit, on special values.

Special values: ties, NaN, +-0.0, +-inf, float32 denormals, empty tensors, int32/int64 extremes,
broadcasting edge cases. Every comparison runs the same one-node model in ORT (CPU EP,
ORT_DISABLE_ALL, one thread) and in ortlab.engine, and asks for the same element type, shape and
bits: NaN where ORT has NaN (any payload), the sign of every zero, equal indices. ORT is the
reference, not the ONNX spec: where they disagree, the engine mirrors ORT and
ortlab.engine.ort_cpu_kernels.ORT_VS_SPEC lists the difference.

Part 1: the kernels fixed here (TopK, ArgMax/ArgMin, ReduceMax/ReduceMin, Relu, Sqrt) on inputs
chosen to hit each of ORT's code paths. Part 2: a generated sweep over every op the engine runs
through onnx.reference (test_sweep_*). Part 3: inputs ORT refuses or dies on.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

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
    types = {v.name: v.type.tensor_type.elem_type for v in list(inferred.graph.value_info) + list(inferred.graph.output)}
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
    from ortlab.engine.ort_cpu_kernels import ORT_VS_SPEC

    named = " ".join(row[0] for row in ORT_VS_SPEC)
    for op in ("TopK", "ArgMax", "ReduceMax", "Relu", "Sqrt"):
        assert op in named
    assert all(len(row) == 5 and all(isinstance(f, str) and f for f in row) for row in ORT_VS_SPEC)

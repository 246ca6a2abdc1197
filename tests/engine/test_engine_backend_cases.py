"""onnx's backend node test cases give the same outputs in ORT 1.19.2 and in ortlab.engine.

Every case under onnx/backend/test/data/node that ORT 1.19.2 loads and runs (opset <= 21, CPU EP,
ORT_DISABLE_ALL) runs in ortlab.engine.InferenceSession(model, SessionOptions(graph_optimization_level=0));
each output must have ORT's element type and shape and be close to ORT's (rtol 1e-5, atol 1e-6, NaN
equal to NaN; integers, booleans and strings exactly). ORT is the reference, not the stored outputs:
where ORT differs from onnx.reference, ortlab/engine/cpu_kernels.py mirrors ORT.

Test ids read `<op group>/<case>` (the group: the case's op types joined with +, as the probe
names them). Loading and comparing reuse tools/probe_reference_vs_ort.py (imported from its path).
Both runtimes get the same model: inputs of types numpy lacks (bfloat16, float8, int4) become
initializers, as the probe gives them to ORT. Cases ORT refuses for their opset run again stamped
with a lower one (test_case_stamped_lower_matches_ort). Random ops are compared by invariants.
Cases not compared are in EXCEPTIONS and RULES, each with its reason; a case ORT cannot run is
skipped with ORT's error. The kernel conversions the engine cannot carry through a graph (Cast to
bfloat16 / float8) and ORT's Loop scan outputs have their own tests at the end.
"""
import fnmatch
import importlib.util
import os
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlab.errors import OrtlabError
from repo_paths import ROOT

ORT_MAX_OPSET = 21
# Empty-set reductions: numpy warns about log(0) and inf - inf, which are the expected values.
pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")


def _load_probe():
    spec = importlib.util.spec_from_file_location("probe_reference_vs_ort",
                                                  ROOT / "tools" / "probe_reference_vs_ort.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, module)
    spec.loader.exec_module(module)
    return module


probe = _load_probe()

# Element types the engine holds in another numpy dtype (ortlab/ir/node_arg.py NodeArg.dtype is
# onnx.helper.tensor_dtype_to_np_dtype): int4 / uint4 values live in int8 / uint8 arrays.
ENGINE_STAND_IN = {TensorProto.INT4: TensorProto.INT8, TensorProto.UINT4: TensorProto.UINT8}
NO_NUMPY_FLOAT = {TensorProto.BFLOAT16, TensorProto.FLOAT8E4M3FN, TensorProto.FLOAT8E4M3FNUZ,
                  TensorProto.FLOAT8E5M2, TensorProto.FLOAT8E5M2FNUZ}
# Ops whose outputs are random: ORT's generator is not numpy's, so they are compared by invariants.
RANDOM_OPS = {"Bernoulli", "RandomNormal", "RandomNormalLike", "RandomUniform", "RandomUniformLike",
              "Multinomial"}

# Cases not compared: (action, reason). "skip": nothing to compare here; "xfail": an engine bug
# (strict: the test fails once it is fixed, so that the entry goes); "xfail-lenient": an engine bug
# a few cases survive by accident. Names may be globs.
EXCEPTIONS = {
    "test_mvn": ("xfail", "engine bug: ortlab/ir/load_rules.py check_inference: onnx's strict shape "
                          "inference fails inside MeanVarianceNormalization's function body (a Constant "
                          "whose value refers to the absent 'axes' attribute) and the engine says 'ORT "
                          "refuses the model'; ORT runs its own kernel"),
    "test_scan_sum": ("skip", "opset-8 Scan (batch axis, sequence_lens): onnx.reference cannot run it and "
                              "the engine has no kernel of its own for this deprecated form"),
    "test_regex_full_match_*": ("skip", "environment: onnx.reference's RegexFullMatch needs google-re2, "
                                        "which is not installed (ORT runs it)"),
}
# Rules by what a case holds (checked in this order, after EXCEPTIONS).
RULES = {
    "no_numpy_float_output": ("skip", "engine limitation: a bfloat16/float8 output's graph dtype is float32 "
                                      "(onnx.helper.tensor_dtype_to_np_dtype) while kernels produce onnx's "
                                      "custom dtypes, which OpKernelContext.output refuses; the Cast "
                                      "kernel's conversions are compared with ORT's in "
                                      "test_cast_kernel_conversion_matches_ort instead"),
}
# Cases run stamped with a lower opset that still differ.
STAMPED_EXCEPTIONS = {
    "test_maxpool_2d_ceil_output_size_reduce_by_one": (
        "xfail", "ceil_mode window starting past the input along an outer spatial axis: ORT's MLAS pooling "
                 "fills it from the input ([[1, lowest], [3, lowest]] for a 2x2 input, kernel 1, stride 2); "
                 "cpu_kernels.OrtMaxPool gets ORT's shape but puts the lowest value there"),
}


# ----------------------------------------------------------------------------------------------
# Cases
# ----------------------------------------------------------------------------------------------
def _rule(name, model, case_dir):
    """(action, reason) when a case is not compared, else None."""
    for pattern, found in EXCEPTIONS.items():
        if fnmatch.fnmatch(name, pattern):
            return found
    graph = model.graph
    inputs = [v for v in graph.input if v.name not in {t.name for t in graph.initializer}]
    elem = {v.name: v.type.tensor_type.elem_type for v in inputs + list(graph.output)
            if v.type.HasField("tensor_type")}
    checks = [
        ("no_numpy_float_output", any(elem.get(v.name) in NO_NUMPY_FLOAT for v in graph.output)),
    ]
    return next((RULES[key] for key, hit in checks if hit), None)


def _marks(found):
    if not found:
        return []
    action, reason = found
    if action == "skip":
        return [pytest.mark.skip(reason=reason)]
    return [pytest.mark.xfail(reason=reason, strict=action == "xfail", raises=(AssertionError, OrtlabError))]


def _case_id(model, name):
    return f"{probe.group_op(model)}/{name[len('test_'):]}"


def _case_params():
    """Every case; those above opset 21 are skipped here (see _stamped_params)."""
    params = []
    for case_dir in probe.list_cases(None):
        name = os.path.basename(case_dir)
        model = onnx.load(os.path.join(case_dir, "model.onnx"))
        opset = probe.ai_onnx_opset(model)
        if opset > ORT_MAX_OPSET:
            marks = [pytest.mark.skip(reason=f"opset {opset}: ORT 1.19.2 refuses models above opset "
                                             f"{ORT_MAX_OPSET} (see test_case_stamped_lower_matches_ort)")]
        else:
            marks = _marks(_rule(name, model, case_dir))
        params.append(pytest.param(case_dir, id=_case_id(model, name), marks=marks))
    return params


def _stamped_params():
    """Cases ORT refuses for their opset, to be stamped with opset 21 (else 20) where their ops have
    the same attributes and inputs there, as the probe's retry does (probe.downgrade): every opset-22
    case, and the opset-21 QLinearMatMul cases (ORT 1.19.2 registers QLinearMatMul up to opset 20).
    Parameters: (case folder, the opsets to try)."""
    params = []
    for case_dir in probe.list_cases(None):
        name = os.path.basename(case_dir)
        model = onnx.load(os.path.join(case_dir, "model.onnx"))
        opset = probe.ai_onnx_opset(model)
        refused = opset > ORT_MAX_OPSET or name.startswith("test_qlinearmatmul_")
        if probe.foreign_domains(model) or not refused:
            continue
        targets = [t for t in (ORT_MAX_OPSET, ORT_MAX_OPSET - 1)
                   if t < opset and probe.downgrade(model, t) is not None]
        if targets:
            found = STAMPED_EXCEPTIONS.get(name) or _rule(name, model, case_dir)
            params.append(pytest.param(case_dir, targets, id=_case_id(model, name), marks=_marks(found)))
    return params


# ----------------------------------------------------------------------------------------------
# Loading, running, comparing
# ----------------------------------------------------------------------------------------------
def load_value(path, type_proto):
    """A stored value as ORT's Python API takes it: an array, a list (sequence), None (empty optional)."""
    kind = type_proto.WhichOneof("value")
    if kind in ("sequence_type", "optional_type"):
        proto = onnx.SequenceProto() if kind == "sequence_type" else onnx.OptionalProto()
        proto.ParseFromString(Path(path).read_bytes())
        return numpy_helper.to_list(proto) if kind == "sequence_type" else numpy_helper.to_optional(proto)
    return numpy_helper.to_array(onnx.load_tensor(path))


def load_case(case_dir):
    """(the model both runtimes get, feeds {name: value}) of a case's test_data_set_0."""
    model = onnx.load(os.path.join(case_dir, "model.onnx"))
    data = os.path.join(case_dir, "test_data_set_0")
    graph_inputs = [v for v in model.graph.input if v.name not in {t.name for t in model.graph.initializer}]
    tensors, others = [], {}
    for i, value in enumerate(graph_inputs):
        path = os.path.join(data, f"input_{i}.pb")
        if not os.path.exists(path):
            break
        if value.type.HasField("tensor_type"):
            tensor = onnx.load_tensor(path)
            tensors.append((value.name, tensor, value.type.tensor_type.elem_type or tensor.data_type))
        else:
            others[value.name] = load_value(path, value.type)
    model_bytes, feeds = probe.ort_model_bytes(model, tensors)  # special types become initializers
    feeds = {name: numpy_helper.to_array(t) for name, t, _ in feeds}
    return onnx.load_from_string(model_bytes), {**feeds, **others}


def run_ort(model, feeds):
    """ORT 1.19.2's outputs (CPU EP, ORT_DISABLE_ALL, one thread); special types as (type, values)."""
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    so.intra_op_num_threads = so.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    if not any(probe.declared_type(model, n) in probe.SPECIAL_TYPES for n in names):
        return sess.run(names, feeds)
    ort_feeds = {n: ort.OrtValue.ortvalue_from_numpy(v) for n, v in feeds.items()}
    values = sess.run_with_ort_values(names, ort_feeds)
    return [probe.value_from_ortvalue(v) for v in values]


def run_engine(model, feeds):
    from ortlab.engine import InferenceSession, SessionOptions

    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=0))
    return sess.run(None, feeds)


def typed(value):
    """(element type, natural values) of an output as the probe compares them."""
    return value if isinstance(value, tuple) else probe.value_from_array(np.asarray(value))


def assert_same(ort_value, engine_value, where):
    """Same structure, element type, shape and (close) values; sequences element by element."""
    if isinstance(ort_value, list) or ort_value is None:
        assert type(engine_value) is type(ort_value), \
            f"{where}: ORT gives {type(ort_value).__name__}, the engine {type(engine_value).__name__}"
        assert len(ort_value or []) == len(engine_value or []), f"{where}: sequence lengths differ"
        for k, (o, e) in enumerate(zip(ort_value or [], engine_value or [])):
            assert_same(o, e, f"{where}[{k}]")
        return
    o, e = typed(ort_value), typed(engine_value)
    if ENGINE_STAND_IN.get(o[0]) == e[0]:
        e = (o[0], e[1])  # int4/uint4 held in int8/uint8 (see ENGINE_STAND_IN): the values decide
    result = probe.compare(o, e)
    assert result["close"], (f"{where}: ORT {probe.type_name(o[0])}{list(np.shape(o[1]))}, engine "
                             f"{probe.type_name(e[0])}{list(np.shape(e[1]))}: {result}; "
                             f"ORT {np.ravel(o[1])[:6]}, engine {np.ravel(e[1])[:6]}")


def random_kind(model, feeds):
    """'bernoulli', 'dropout' (training mode) or 'random' when outputs are random draws, else None."""
    ops = {n.op_type for n in model.graph.node}
    if "Bernoulli" in ops or {"RandomUniformLike", "Greater", "Cast"} <= ops:
        return "bernoulli"
    dropout = next((n for n in model.graph.node if n.op_type == "Dropout"), None)
    if dropout is not None and len(dropout.input) > 2 and bool(feeds.get(dropout.input[2], False)):
        return "dropout"
    return "random" if ops & RANDOM_OPS else None


def assert_random_invariants(kind, model, feeds, expected, got):
    """Same types and shapes as ORT's; Bernoulli draws are 0 or 1; training Dropout gives
    y = x / (1 - ratio) where kept and 0 elsewhere, its mask (when asked) marking the kept ones."""
    for o, e in zip(expected, got):
        (eo, vo), (ee, ve) = typed(o), typed(e)
        assert (eo, np.shape(vo)) == (ee, np.shape(ve)), \
            f"ORT {probe.type_name(eo)}{np.shape(vo)}, engine {probe.type_name(ee)}{np.shape(ve)}"
    if kind == "bernoulli":
        assert all(np.isin(np.asarray(e), [0, 1]).all() for e in got), "Bernoulli draws are 0 or 1"
    if kind == "dropout":
        node = next(n for n in model.graph.node if n.op_type == "Dropout")
        x = feeds[node.input[0]]
        ratio = float(feeds[node.input[1]]) if node.input[1] else 0.5
        y = np.asarray(got[0])
        kept = y != 0
        np.testing.assert_allclose(y[kept], (x / (1 - ratio))[kept], rtol=1e-5)
        if len(got) > 1:
            assert ((np.asarray(got[1]) == kept) | (x == 0)).all(), "the mask marks the kept elements"


def check_case(model, feeds):
    """Run ORT (skip when it cannot run the case) and the engine; their outputs agree."""
    try:
        expected = run_ort(model, feeds)
    except Exception as exc:  # noqa: BLE001 (ORT's own refusal decides: nothing to compare)
        pytest.skip(f"ORT 1.19.2 cannot run it: {probe.short_error(exc)[:160]}")
    got = run_engine(model, feeds)
    assert len(got) == len(expected), f"ORT gives {len(expected)} outputs, the engine {len(got)}"
    kind = random_kind(model, feeds)
    if kind:
        assert_random_invariants(kind, model, feeds, expected, got)
        return
    for name, o, e in zip([o.name for o in model.graph.output], expected, got):
        assert_same(o, e, f"output {name!r}")


# ----------------------------------------------------------------------------------------------
# The node test cases
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case_dir", _case_params())
def test_case_matches_ort(case_dir):
    """One node test case: the engine's outputs equal ORT's."""
    check_case(*load_case(case_dir))


@pytest.mark.parametrize("case_dir, opsets", _stamped_params())
def test_case_stamped_lower_matches_ort(case_dir, opsets):
    """A case ORT refuses for its opset runs stamped with opset 21, or 20 where ORT cannot run it
    at 21. The outputs' declared shapes are dropped: they follow opset 22's rules (MaxPool's
    ceil_mode), which the engine enforces where ORT only warns."""
    model, feeds = load_case(case_dir)
    for opset in opsets:
        stamped = probe.downgrade(model, opset)
        for output in stamped.graph.output:
            output.type.tensor_type.ClearField("shape")
        if opset != opsets[-1]:
            try:
                run_ort(stamped, feeds)
            except Exception:  # noqa: BLE001 (no ORT kernel at this opset: try the next)
                continue
        check_case(stamped, feeds)
        return


# ----------------------------------------------------------------------------------------------
# Cast to bfloat16 / float8 / string: the kernel's conversions against ORT's
# ----------------------------------------------------------------------------------------------
def _awkward_floats():
    """float32 values that exercise rounding: every binade from 2^-149 to 2^127 with random mantissas
    and both signs, ties, zeros, infinities, NaN, float8 underflow and overflow."""
    rng = np.random.default_rng(0)
    exponents = rng.integers(-149, 128, 4000).astype(np.float64)
    values = ((rng.random(4000) + 1) * np.exp2(exponents) * rng.choice([-1, 1], 4000)).astype(np.float32)
    ties = np.array([1 + 2.0 ** -8, 1 + 3 * 2.0 ** -8, 1 + 2.0 ** -4, 1 + 3 * 2.0 ** -4], np.float32)
    special = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1e-10, -1e-10, 2.0 ** -20, -(2.0 ** -20),
                        448, -448, 464, 57344, -57344, 61440, 3.4e38, -3.4e38, 1e-45, -1e-45], np.float32)
    return np.concatenate([values, ties, -ties, special]).astype(np.float32)


def _cast_model(source, target, saturate=None):
    attrs = {"to": target, **({"saturate": saturate} if saturate is not None else {})}
    graph = helper.make_graph([helper.make_node("Cast", ["x"], ["y"], **attrs)], "cast",
                              [helper.make_tensor_value_info("x", source, None)],
                              [helper.make_tensor_value_info("y", target, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("source", [TensorProto.FLOAT, TensorProto.FLOAT16])
@pytest.mark.parametrize("target, saturate", [
    (TensorProto.BFLOAT16, None), (TensorProto.FLOAT8E4M3FNUZ, 1), (TensorProto.FLOAT8E4M3FNUZ, 0),
    (TensorProto.FLOAT8E5M2FNUZ, 1), (TensorProto.FLOAT8E5M2FNUZ, 0), (TensorProto.FLOAT8E4M3FN, 1),
    (TensorProto.FLOAT8E5M2, 0)])
def test_cast_kernel_conversion_matches_ort(source, target, saturate):
    """The Cast kernel's bfloat16 and float8 values equal ORT's on awkward inputs, bit for bit (NaN
    for NaN). The engine cannot hold these types as graph values, so the conversion is compared
    directly."""
    from onnx.reference.ops.op_cast import cast_to

    from ortlab.engine.cpu_kernels import FNUZ_TYPES, float_to_bfloat16, keep_fnuz_negative_underflow

    x = _awkward_floats().astype(np.float16 if source == TensorProto.FLOAT16 else np.float32)
    ort_type, ort_values = run_ort(_cast_model(source, target, saturate), {"x": x})[0]
    if target == TensorProto.BFLOAT16:
        mine = float_to_bfloat16(x)
    else:
        mine = cast_to(x, target, bool(saturate))
        mine = keep_fnuz_negative_underflow(x, mine) if target in FNUZ_TYPES else mine
    ours = probe.natural(target, mine)
    bad = ~((ours == ort_values) | (np.isnan(ours) & np.isnan(ort_values)))
    assert ort_type == target
    assert not bad.any(), (f"{bad.sum()} of {x.size} differ, e.g. x={x[bad][:4]} ORT={ort_values[bad][:4]} "
                           f"kernel={ours[bad][:4]}")


@pytest.mark.parametrize("dtype, elem", [(np.float32, TensorProto.FLOAT), (np.float64, TensorProto.DOUBLE),
                                         (np.int64, TensorProto.INT64), (np.bool_, TensorProto.BOOL)])
def test_cast_to_string_matches_ort(dtype, elem):
    """To string through the engine: ORT's '%.8g', 'NaN', 'INF', '-INF' and std::to_string."""
    if dtype in (np.int64, np.bool_):
        x = np.array([0, 1, -7, 2 ** 40, -(2 ** 62)], np.int64).astype(dtype)
    else:
        x = _awkward_floats()[::40].astype(dtype)
    model = _cast_model(elem, TensorProto.STRING)
    assert_same(run_ort(model, {"x": x})[0], run_engine(model, {"x": x})[0], f"{dtype.__name__} -> string")


# ----------------------------------------------------------------------------------------------
# Loop: ORT's scan outputs
# ----------------------------------------------------------------------------------------------
def _loop_model():
    """Loop(M, cond omitted, v): v += 1 per trip; scan outputs v (a scalar) and v * ones(2, 3)."""
    f, b = TensorProto.FLOAT, TensorProto.BOOL
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]),
         helper.make_node("Constant", [], ["one"], value=numpy_helper.from_array(np.float32(1))),
         helper.make_node("Add", ["v_in", "one"], ["v_out"]),
         helper.make_node("Identity", ["v_out"], ["scan_scalar"]),
         helper.make_node("Constant", [], ["ones"],
                          value=numpy_helper.from_array(np.ones((2, 3), np.float32))),
         helper.make_node("Mul", ["ones", "v_out"], ["scan_matrix"])],
        "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []),
         helper.make_tensor_value_info("cond_in", b, []), helper.make_tensor_value_info("v_in", f, [])],
        [helper.make_tensor_value_info("cond_out", b, []), helper.make_tensor_value_info("v_out", f, []),
         helper.make_tensor_value_info("scan_scalar", f, []),
         helper.make_tensor_value_info("scan_matrix", f, [2, 3])])
    loop = helper.make_node("Loop", ["M", "", "v"], ["v_final", "scalars", "matrices"], body=body)
    graph = helper.make_graph(
        [loop], "loop",
        [helper.make_tensor_value_info("M", TensorProto.INT64, []),
         helper.make_tensor_value_info("v", f, [])],
        [helper.make_tensor_value_info(n, f, None) for n in ("v_final", "scalars", "matrices")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)


@pytest.mark.parametrize("trips", [3, 0])
def test_loop_scan_outputs_match_ort(trips):
    """Scalars stack to [N] (onnx.reference: [N, 1]), matrices to [N, 2, 3] (reference: [N*2, 3]);
    an omitted condition is true (reference: no trip); zero trips give [0] and [0, 2, 3] (loop.cc)."""
    feeds = {"M": np.array(trips, np.int64), "v": np.array(0.5, np.float32)}
    model = _loop_model()
    names = ("v_final", "scalars", "matrices")
    for name, o, e in zip(names, run_ort(model, feeds), run_engine(model, feeds)):
        assert_same(o, e, name)


# ----------------------------------------------------------------------------------------------
# What the engine cannot run fails with an ortlab error
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", [
    "test_cast_FLOAT_to_BFLOAT16",
    "test_mvn", "test_scan_sum"])
def test_unrunnable_case_raises_an_ortlab_error(case):
    """A case the engine cannot run raises an OrtlabError subclass naming the input, output or node, not a raw
    numpy or onnx exception."""
    model, feeds = load_case(os.path.join(probe.node_test_dir(), case))
    with pytest.raises(OrtlabError) as info:
        run_engine(model, feeds)
    names = [v.name for v in (*model.graph.input, *model.graph.output)] + ["node", "Could not find an implementation"]
    assert any(n in str(info.value) for n in names), str(info.value)


# ----------------------------------------------------------------------------------------------
# SoftmaxCrossEntropyLoss: ORT's float32 sums beyond the node tests' shapes
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("shape, reduction, weighted, ignore_index", [
    ((64, 10), "mean", False, None), ((64, 10), "sum", True, 3), ((8, 7, 33), "mean", True, None),
    ((8, 7, 33), "none", True, 2), ((4, 5, 6, 37), "mean", False, 1), ((4, 5, 6, 37), "sum", False, None),
    ((32, 10, 64, 32), "mean", True, None), ((32, 10, 64, 32), "sum", False, 0)])
def test_softmax_cross_entropy_matches_ort(shape, reduction, weighted, ignore_index):
    """Loss and log_prob equal ORT's for each reduction, with and without weights and ignore_index
    (ORT's kernel: float32 log_prob, Eigen's vectorized float32 sum, a float32 running weight sum)."""
    rng = np.random.default_rng(sum(shape))
    scores = (rng.standard_normal(shape) * 3).astype(np.float32)
    labels = rng.integers(0, shape[1], (shape[0],) + shape[2:]).astype(np.int64)
    inputs = [helper.make_tensor_value_info("scores", TensorProto.FLOAT, list(shape)),
              helper.make_tensor_value_info("labels", TensorProto.INT64, list(labels.shape))]
    feeds = {"scores": scores, "labels": labels}
    if weighted:
        inputs.append(helper.make_tensor_value_info("weights", TensorProto.FLOAT, [shape[1]]))
        feeds["weights"] = rng.random(shape[1]).astype(np.float32)
    attrs = {"reduction": reduction, **({"ignore_index": ignore_index} if ignore_index is not None else {})}
    node = helper.make_node("SoftmaxCrossEntropyLoss", list(feeds), ["loss", "log_prob"], **attrs)
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("loss", "log_prob")]
    graph = helper.make_graph([node], "sce", inputs, outputs)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21)], ir_version=10)
    for name, o, e in zip(("loss", "log_prob"), run_ort(model, feeds), run_engine(model, feeds)):
        assert_same(o, e, name)


# Each ORT-behaviour kernel of ortlab/engine/cpu_kernels.py, by name, with the backend cases that
# exercise it (the registry guard in test_registry.py looks for each registered op's name in a test).
ORT_BEHAVIOUR_KERNELS = ["Cast", "CastLike", "DFT", "Loop", "MaxPool", "MaxUnpool", "QLinearMatMul", "Resize",
                         "STFT", "Scatter", "SoftmaxCrossEntropyLoss"]


def test_every_ort_behaviour_kernel_is_registered_and_has_backend_cases():
    from ortlab.engine import kernel_registry

    registered = {op for op, _ in kernel_registry("CPUExecutionProvider").kernels}
    assert set(ORT_BEHAVIOUR_KERNELS) <= registered, set(ORT_BEHAVIOUR_KERNELS) - registered
    covered = {node.op_type for case_dir in probe.list_cases(None)
               for node in onnx.load(os.path.join(case_dir, "model.onnx")).graph.node}
    assert set(ORT_BEHAVIOUR_KERNELS) <= covered, set(ORT_BEHAVIOUR_KERNELS) - covered

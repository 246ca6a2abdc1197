"""The ops ortlab's newer fusions and gradient builders emit, run by ortlab (reference_run and the
engine) against ORT 1.19.2's CPU kernels: SkipLayerNormalization, SimplifiedLayerNormalization,
MaxPoolGrad, AveragePoolGrad; then a BERT-style Add + LayerNormalization fused by ortlab's level-2
optimizer into SkipLayerNormalization, run in ortlab's engine and in ORT.
"""
import numpy as np
import pytest
import torch
from onnx import TensorProto, helper

from ortlab import session
from ortlab.onnx_defs import MS_DOMAIN, make_model, one_node_model
from ortlab.ops.contrib_ops import ContribOpError, reference_run

rng = np.random.default_rng(11)


def f(*shape, dtype=np.float32, scale=1.0, shift=0.0):
    return (rng.standard_normal(shape) * scale + shift).astype(dtype)


def node_model(op, domain, inputs, attrs, outputs, out_shapes=None):
    """One node; omitted outputs ("") left out of the graph; out_shapes types outputs (float)."""
    model = one_node_model(op, inputs, attrs, domain=domain, outputs=list(outputs))
    kept = [o for o in model.graph.output if o.name]
    del model.graph.output[:]
    if out_shapes is None:
        model.graph.output.extend(kept)
    else:
        model.graph.output.extend(helper.make_tensor_value_info(o.name, TensorProto.FLOAT, s)
                                  for o, s in zip(kept, out_shapes))
    feeds = {f"x{i}": np.asarray(v) for i, v in enumerate(inputs) if v is not None}
    return model, feeds


def engine_run(model, feeds):
    """ortlab's engine (CPU EP) on the model."""
    from ortlab.engine import InferenceSession

    sess = InferenceSession(model, providers=["CPUExecutionProvider"])
    names = [o.name for o in model.graph.output]
    return dict(zip(names, sess.run(None, feeds)))


MAX_DIFF = {}


def assert_close(got, want, what, rtol=1e-5, atol=1e-6):
    got, want = np.asarray(got), np.asarray(want)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), f"{what}: {got.dtype}{got.shape} vs {want.dtype}" \
                                                                f"{want.shape}"
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)
    diff = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if got.size else 0.0
    op = what.split()[0]
    MAX_DIFF[op] = max(MAX_DIFF.get(op, 0.0), diff)


def check_both(op, domain, inputs, attrs, outputs, out_shapes=None, rtol=1e-5, atol=1e-6):
    model, feeds = node_model(op, domain, inputs, attrs, outputs, out_shapes)
    want = session.run_model(model, feeds)
    for runner, label in ((reference_run, "reference"), (engine_run, "engine")):
        got = runner(model, feeds)
        assert sorted(got) == sorted(want), label
        for name in want:
            assert_close(got[name], want[name], f"{op} {label} {name}", rtol, atol)


# -- SkipLayerNormalization (com.microsoft) ----------------------------------------------------
SKIP_CASES = [
    pytest.param([f(2, 3, 8), f(2, 3, 8), f(8), f(8), f(8)], {"epsilon": 1e-5}, ["y"], id="all-inputs"),
    pytest.param([f(2, 3, 8), f(2, 3, 8), f(8)], {}, ["y"], id="no-beta-no-bias-default-epsilon"),
    pytest.param([f(2, 3, 8), f(2, 3, 8), f(8), None, f(8)], {"epsilon": 1e-5}, ["y"], id="bias-without-beta"),
    pytest.param([f(2, 5, 7), f(5, 7), f(7), f(7)], {"epsilon": 1e-5}, ["y"], id="skip-2d-broadcast-odd-hidden"),
    pytest.param([f(3, 5, 7), f(1, 5, 7), f(7), f(7)], {"epsilon": 1e-5}, ["y"], id="skip-batch-1"),
    pytest.param([f(4, 3, 5), f(2, 3, 5), f(5), f(5)], {"epsilon": 1e-5}, ["y"], id="skip-batch-2-read-modulo"),
    pytest.param([f(2, 3, 8), f(2, 3, 8), f(8), f(8), f(8)], {"epsilon": 1e-5}, ["y", "", "", "sum"],
                 id="input_skip_bias_sum"),
    pytest.param([f(2, 3, 8), f(2, 3, 8), f(8)], {"epsilon": 1e-5}, ["y", "", "", "sum"], id="sum-without-bias"),
    pytest.param([f(6, 33), f(6, 33), f(33), f(33)], {"epsilon": 1e-3}, ["y"], id="2d-input-tail"),
    pytest.param([f(2, 3, 8, shift=50.0), f(2, 3, 8), f(8), f(8)], {"epsilon": 1e-5}, ["y"],
                 id="large-mean-cancellation"),
    pytest.param([f(1, 2, 768), f(1, 2, 768), f(768), f(768), f(768)], {"epsilon": 1e-12}, ["y", "", "", "s"],
                 id="bert-hidden-768"),
]


@pytest.mark.parametrize("inputs, attrs, outputs", SKIP_CASES)
def test_skip_layer_norm_matches_ort(inputs, attrs, outputs):
    check_both("SkipLayerNormalization", MS_DOMAIN, inputs, attrs, outputs)


SKIP_REFUSED = [
    pytest.param([f(2, 3, 2, 4), f(2, 3, 2, 4), f(4)], ["y"], id="4d"),
    pytest.param([f(2, 3, 4), f(4), f(4)], ["y"], id="skip-1d"),
    pytest.param([f(2, 3, 4), f(2, 3, 4), f(1, 4)], ["y"], id="gamma-2d"),
    pytest.param([f(2, 3, 4), f(2, 2, 4), f(4)], ["y"], id="skip-rows-differ"),
    pytest.param([f(2, 3, 4), f(2, 3, 4), f(4), f(3)], ["y"], id="beta-wrong-size"),
]


@pytest.mark.parametrize("inputs, outputs", SKIP_REFUSED)
def test_skip_layer_norm_refuses_what_ort_refuses(inputs, outputs):
    model, feeds = node_model("SkipLayerNormalization", MS_DOMAIN, inputs, {"epsilon": 1e-5}, outputs)
    with pytest.raises(session.SessionError):
        session.run_model(model, feeds)
    with pytest.raises(ContribOpError, match="SkipLayerNormalization"):
        reference_run(model, feeds)


def test_skip_layer_norm_mean_and_inv_std_outputs_where_ort_writes_none():
    """ORT 1.19.2's CPU kernel hands back no value for outputs 1 and 2; its output 0 does not change
    when they are named. ortlab gives them as LayerNormalization's saved statistics (numpy, float64
    maths), so that its engine runs a fused node that keeps a LayerNormalization's saved outputs."""
    import onnxruntime

    x, skip, gamma, beta = f(2, 3, 8), f(2, 3, 8), f(8), f(8)
    model, feeds = node_model("SkipLayerNormalization", MS_DOMAIN, [x, skip, gamma, beta], {"epsilon": 1e-5},
                              ["y", "mean", "inv", ""])
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    y, mean, inv = onnxruntime.InferenceSession(model.SerializeToString(), options,
                                                providers=["CPUExecutionProvider"]).run(None, feeds)
    assert mean is None and inv is None
    total = (x + skip).astype(np.float64)
    want_mean = total.mean(axis=-1, keepdims=True)
    want_inv = 1 / np.sqrt(total.var(axis=-1, keepdims=True) + 1e-5)
    for runner, label in ((reference_run, "reference"), (engine_run, "engine")):
        got = runner(model, feeds)
        assert_close(got["y"], y, f"SkipLayerNormalization {label} y-with-stats-named")
        assert_close(got["mean"], want_mean.astype(np.float32), f"SkipLayerNormalization-stats {label} mean",
                     atol=1e-6)
        assert_close(got["inv"], want_inv.astype(np.float32), f"SkipLayerNormalization-stats {label} inv",
                     rtol=1e-5)


# -- SimplifiedLayerNormalization (ONNX domain in ORT) -----------------------------------------
SIMPLIFIED_CASES = [
    pytest.param([f(2, 3, 8), f(8)], {"axis": -1, "epsilon": 1e-5}, ["y"], id="last-axis"),
    pytest.param([f(2, 3, 8), f(8)], {"axis": -1, "epsilon": 1e-5}, ["y", "inv"], id="inv_std_var"),
    pytest.param([f(2, 3, 5), f(3, 5)], {"axis": 1, "epsilon": 1e-5}, ["y", "inv"], id="axis1-flattens-tail"),
    pytest.param([f(4, 33), f(33)], {}, ["y", "inv"], id="defaults-odd-size"),
    pytest.param([f(2, 3, 8, dtype=np.float64), f(8, dtype=np.float64)], {"epsilon": 1e-5}, ["y"], id="double"),
    pytest.param([f(2, 3, 8, scale=1e-3), f(8)], {"epsilon": 1e-2}, ["y", "inv"], id="epsilon-dominates"),
]


@pytest.mark.parametrize("inputs, attrs, outputs", SIMPLIFIED_CASES)
def test_simplified_layer_norm_matches_ort(inputs, attrs, outputs):
    check_both("SimplifiedLayerNormalization", "", inputs, attrs, outputs)


def test_simplified_layer_norm_double_with_inv_std_var_is_refused_as_ort_has_no_kernel():
    model, feeds = node_model("SimplifiedLayerNormalization", "", [f(2, 4, dtype=np.float64), f(4, dtype=np.float64)],
                              {}, ["y", "inv"])
    with pytest.raises(session.SessionError):
        session.run_model(model, feeds)
    with pytest.raises(ContribOpError, match="no CPU kernel"):
        reference_run(model, feeds)


# -- MaxPoolGrad / AveragePoolGrad (ONNX domain in ORT; dX's shape from the graph) --------------
def maxpool_indices(x, attrs):
    """MaxPool's Indices output for x, from ORT."""
    model = one_node_model("MaxPool", [x], attrs, outputs=["y", "i"])
    out = session.run_model(model, {"x0": x})
    return out["y"].shape, out["i"]


MAXPOOL_CASES = [
    pytest.param((2, 3, 7, 6), {"kernel_shape": [3, 3], "strides": [1, 1]}, id="2d-overlapping"),
    pytest.param((2, 3, 7, 5), {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 0, 0]},
                 id="2d-pads-tails"),
    pytest.param((2, 2, 9), {"kernel_shape": [3], "strides": [2]}, id="1d"),
    pytest.param((1, 2, 4, 5, 3), {"kernel_shape": [2, 2, 2], "strides": [1, 2, 1]}, id="3d"),
]


@pytest.mark.parametrize("shape, attrs", MAXPOOL_CASES)
def test_maxpool_grad_matches_ort(shape, attrs):
    x = f(*shape)
    y_shape, indices = maxpool_indices(x, attrs)
    check_both("MaxPoolGrad", "", [f(*y_shape), indices], attrs, ["dx"], out_shapes=[list(shape)])


def test_maxpool_grad_takes_the_batch_from_dy_as_ort_does():
    """dX's graph shape with a symbolic batch: ORT (and ortlab) take the batch from dY."""
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    x = f(3, 2, 4, 4)
    y_shape, indices = maxpool_indices(x, attrs)
    check_both("MaxPoolGrad", "", [f(*y_shape), indices], attrs, ["dx"], out_shapes=[["N", 2, 4, 4]])


def test_maxpool_grad_refuses_indices_that_do_not_fit():
    """dY and Indices of different shapes: ORT refuses too. An index past dX: ORT would write out of
    bounds (not run here); ortlab refuses."""
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    model, feeds = node_model("MaxPoolGrad", "", [f(1, 1, 1, 2), np.array([[[[1]]]], np.int64)], attrs, ["dx"],
                              out_shapes=[[1, 1, 2, 4]])
    with pytest.raises(session.SessionError):
        session.run_model(model, feeds)
    with pytest.raises(ContribOpError, match="one shape"):
        reference_run(model, feeds)
    model, feeds = node_model("MaxPoolGrad", "", [f(1, 1, 1, 2), np.array([[[[1, 8]]]], np.int64)], attrs, ["dx"],
                              out_shapes=[[1, 1, 2, 4]])
    with pytest.raises(ContribOpError, match=r"\[0, 8\)"):
        reference_run(model, feeds)


AVGPOOL_CASES = [
    pytest.param((2, 3, 7, 6), {"kernel_shape": [3, 3], "strides": [1, 1]}, id="2d-overlapping"),
    pytest.param((2, 3, 7, 5), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 0]},
                 id="2d-pads-exclude-pad"),
    pytest.param((2, 3, 7, 5), {"kernel_shape": [3, 2], "strides": [2, 2], "pads": [1, 1, 1, 0],
                                "count_include_pad": 1}, id="2d-pads-include-pad"),
    pytest.param((2, 2, 10), {"kernel_shape": [3], "strides": [3]}, id="1d-tail-dropped"),
    pytest.param((2, 2, 9), {"kernel_shape": [4], "strides": [2], "pads": [2, 1], "count_include_pad": 1},
                 id="1d-pads-include"),
    pytest.param((1, 2, 4, 4, 4), {"kernel_shape": [2, 2, 2], "strides": [2, 2, 2]}, id="3d-non-overlapping"),
]


def avgpool_out_shape(shape, attrs):
    model = one_node_model("AveragePool", [f(*shape)], attrs, outputs=["y"])
    return session.run_model(model, {"x0": f(*shape)})["y"].shape


@pytest.mark.parametrize("shape, attrs", AVGPOOL_CASES)
def test_averagepool_grad_matches_ort(shape, attrs):
    dy = f(*avgpool_out_shape(shape, attrs))
    check_both("AveragePoolGrad", "", [dy], attrs, ["dx"], out_shapes=[list(shape)])


def test_averagepool_grad_3d_overlapping_adds_as_torch_autograd():
    """Overlapping 3-D windows: the gradient adds (torch autograd); ORT's 3-D kernel assigns instead."""
    shape, attrs = (1, 2, 4, 5, 4), {"kernel_shape": [2, 2, 2], "strides": [1, 1, 1]}
    x = torch.tensor(f(*shape), requires_grad=True)
    y = torch.nn.functional.avg_pool3d(x, 2, 1)
    dy = f(*y.shape)
    y.backward(torch.tensor(dy))
    model, feeds = node_model("AveragePoolGrad", "", [dy], attrs, ["dx"], out_shapes=[list(shape)])
    for runner in (reference_run, engine_run):
        assert_close(runner(model, feeds)["dx"], x.grad.numpy(), "AveragePoolGrad 3d torch", 1e-5, 1e-6)


def test_pool_grads_refuse_a_symbolic_dx_shape():
    """ORT 1.19.2 returns an empty dX there; ortlab says what is missing."""
    model, feeds = node_model("AveragePoolGrad", "", [f(1, 1, 2, 2)], {"kernel_shape": [2, 2], "strides": [2, 2]},
                              ["dx"], out_shapes=[[1, 1, "H", 4]])
    with pytest.raises(ContribOpError, match="static shape"):
        reference_run(model, feeds)
    with pytest.raises(Exception, match="static shape"):
        engine_run(model, feeds)


# -- ortlab's pooling gradient graphs in ortlab's engine -----------------------------------------
def all_minus_inf_corner():
    x = f(1, 2, 4, 4)
    x[:, :, :2, :2] = -np.inf
    return x


def with_nan():
    x = f(1, 2, 5, 5)
    x[0, 0, 1, 1] = x[0, 1, :2, :2] = np.nan
    return x


MAXPOOL_INDICES = [
    pytest.param(with_nan(), {"kernel_shape": [2, 2], "strides": [1, 1]}, id="nan-never-wins"),
    pytest.param(f(2, 3, 7, 7), {"kernel_shape": [3, 3]}, id="2d-overlapping-batch-channels"),
    pytest.param(f(2, 3, 7, 6), {"kernel_shape": [3, 3], "storage_order": 1}, id="storage_order-1"),
    pytest.param(f(1, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 0, 1, 1]}, id="pads"),
    pytest.param(f(1, 2, 8, 8), {"kernel_shape": [2, 2], "dilations": [2, 2]}, id="dilations"),
    pytest.param(f(1, 2, 7, 6), {"kernel_shape": [3, 3], "strides": [2, 2], "auto_pad": "SAME_UPPER"},
                 id="same-upper"),
    pytest.param(f(1, 2, 7, 6), {"kernel_shape": [2, 2], "auto_pad": "SAME_LOWER"}, id="same-lower"),
    pytest.param(f(1, 2, 7, 6), {"kernel_shape": [3, 2], "strides": [2, 2], "auto_pad": "VALID"}, id="valid"),
    pytest.param(f(1, 2, 7, 6), {"kernel_shape": [2, 2], "strides": [2, 2], "ceil_mode": 1}, id="ceil-mode"),
    pytest.param(f(2, 2, 9), {"kernel_shape": [3], "strides": [1]}, id="1d"),
    pytest.param(f(1, 2, 4, 5, 4), {"kernel_shape": [2, 2, 2]}, id="3d"),
    pytest.param(all_minus_inf_corner(), {"kernel_shape": [2, 2], "strides": [2, 2]}, id="window-all-minus-inf"),
]


@pytest.mark.parametrize("x, attrs", MAXPOOL_INDICES)
def test_maxpool_indices_in_the_engine_are_orts_flat_indices(x, attrs):
    """The engine's Indices are ORT's (onnx.reference's leave out the (batch, channel) offset and
    pick other positions where windows overlap)."""
    model = one_node_model("MaxPool", [x], attrs, outputs=["y", "i"])
    want = session.run_model(model, {"x0": x})
    got = engine_run(model, {"x0": x})
    np.testing.assert_array_equal(got["i"], want["i"])
    np.testing.assert_array_equal(got["y"], want["y"])


POOL_GRAPHS = [
    pytest.param("MaxPool", lambda a: torch.nn.functional.max_pool2d(a, 3, 1), {"kernel_shape": [3, 3]},
                 id="MaxPool-overlap"),
    pytest.param("MaxPool", lambda a: torch.nn.functional.max_pool2d(a, 2, 2, padding=1),
                 {"kernel_shape": [2, 2], "strides": [2, 2], "pads": [1, 1, 1, 1]}, id="MaxPool-pads"),
    pytest.param("AveragePool", lambda a: torch.nn.functional.avg_pool2d(a, 3, 2, padding=1, count_include_pad=False),
                 {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, id="AveragePool-pads"),
]


@pytest.mark.parametrize("op, torch_fn, attrs", POOL_GRAPHS)
def test_ortlabs_pool_gradient_graph_runs_in_ortlabs_engine(op, torch_fn, attrs):
    """ortlab's gradient builder's graph (MaxPoolGrad / AveragePoolGrad) in ortlab's engine: dX equals
    torch autograd's and ORT's run of the same graph."""
    from gradient_cases import Case

    from ortlab.gradients import build_gradient_graph

    case = Case(op, [(f(2, 3, 7, 7), True)], torch_fn, attrs)
    ours = build_gradient_graph(case.model(), ["in0"], "loss")
    want = session.run_model(ours, case.feeds)["in0_grad"]
    got = engine_run(ours, case.feeds)["in0_grad"]
    assert_close(got, want, f"{op}-graph engine-vs-ORT")
    np.testing.assert_allclose(got, case.torch_gradients()["in0"], rtol=1e-4, atol=1e-5)


# -- End to end: BERT's Add + LayerNormalization fused at level 2, run in ortlab's engine -------
def bert_add_layernorm_model(hidden=16):
    """(hidden + residual) -> LayerNormalization(axis -1), as a BERT layer ends."""
    gamma, beta = f(hidden), f(hidden)
    nodes = [helper.make_node("Add", ["h", "r"], ["s"]),
             helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["y"], axis=-1, epsilon=1e-12)]
    graph = helper.make_graph(
        nodes, "bert_add_ln",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 5, hidden]) for n in ("h", "r")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, hidden])],
        [helper.make_tensor("gamma", TensorProto.FLOAT, [hidden], gamma),
         helper.make_tensor("beta", TensorProto.FLOAT, [hidden], beta)])
    return make_model(graph)


def test_bert_add_layernorm_fused_by_ortlab_runs_in_ortlab_engine_as_in_ort():
    from ortlab.transformers import optimize

    model = bert_add_layernorm_model()
    fused = optimize(model, level=2)
    ops = [n.op_type for n in fused.graph.node]
    assert "SkipLayerNormalization" in ops and "LayerNormalization" not in ops, ops
    feeds = {"h": f(2, 5, 16), "r": f(2, 5, 16)}
    want = session.run_model(model, feeds)["y"]
    want_fused = session.run_model(fused, feeds)["y"]
    got = engine_run(fused, feeds)["y"]
    assert_close(got, want_fused, "e2e-bert-add-ln vs-ORT-on-the-fused-graph")
    assert_close(got, want, "e2e-bert-add-ln vs-ORT-on-the-original", rtol=1e-4, atol=1e-5)


def decomposed_add_layernorm_model(hidden=16):
    """(h + r) -> ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div/Mul/Add: LayerNorm as an exporter writes it."""
    inits = [helper.make_tensor("two", TensorProto.FLOAT, [], [2.0]),
             helper.make_tensor("eps", TensorProto.FLOAT, [], [1e-5]),
             helper.make_tensor("gamma", TensorProto.FLOAT, [hidden], f(hidden)),
             helper.make_tensor("beta", TensorProto.FLOAT, [hidden], f(hidden))]
    nodes = [helper.make_node("Add", ["h", "r"], ["s"]),
             helper.make_node("ReduceMean", ["s"], ["m"], axes=[-1]), helper.make_node("Sub", ["s", "m"], ["d"]),
             helper.make_node("Pow", ["d", "two"], ["p"]), helper.make_node("ReduceMean", ["p"], ["v"], axes=[-1]),
             helper.make_node("Add", ["v", "eps"], ["ve"]), helper.make_node("Sqrt", ["ve"], ["sd"]),
             helper.make_node("Div", ["d", "sd"], ["n"]), helper.make_node("Mul", ["n", "gamma"], ["ng"]),
             helper.make_node("Add", ["ng", "beta"], ["y"])]
    graph = helper.make_graph(
        nodes, "decomposed_add_ln",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2, 5, hidden]) for n in ("h", "r")],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 5, hidden])], inits)
    return make_model(graph, opset=17)


def test_decomposed_layernorm_fused_twice_runs_in_ortlab_engine_as_in_ort():
    """LayerNormFusion, then SkipLayerNormFusion on its result (which keeps the saved mean and
    inv_std_var outputs): ortlab's engine runs it, output equal to ORT's on the same fused graph."""
    from ortlab.transformers import optimize

    model = decomposed_add_layernorm_model()
    fused = optimize(model, level=2)
    ops = [n.op_type for n in fused.graph.node]
    assert ops == ["SkipLayerNormalization"], ops
    feeds = {"h": f(2, 5, 16), "r": f(2, 5, 16)}
    want = session.run_model(fused, feeds)["y"]
    assert_close(engine_run(fused, feeds)["y"], want, "e2e-decomposed vs-ORT-on-the-fused-graph")
    assert_close(engine_run(fused, feeds)["y"], session.run_model(model, feeds)["y"],
                 "e2e-decomposed vs-ORT-on-the-original", rtol=1e-4, atol=1e-5)


def teardown_module():
    """Prints the largest difference from ORT seen per op (run with -s to read it); a report, not a test:
    each comparison asserted its own tolerance where it was made."""
    print("\nmax |ortlab - ORT| per op:", {k: f"{v:.3g}" for k, v in sorted(MAX_DIFF.items())})

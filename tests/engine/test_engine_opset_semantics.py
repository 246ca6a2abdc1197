"""Ops whose meaning changed between ONNX opsets, run at their old and new opsets in ORT 1.19.2 and in
ortlab's engine: each must give ORT's answer (checked against numpy too where the rule is simple) or a
clear OrtlabError, never onnx.reference's newest-opset reading of an old node.

Facts from ORT (asserted on the real session below): Softmax, LogSoftmax before opset 13 coerce the
input to 2-D [prod(shape[:axis]), prod(shape[axis:])] (default axis 1; softmax.cc); Reduce* at opset 18
with an empty axes input and noop_with_empty_axes=1 return the input; LpNormalization p=1 divides by
sum |x|; BatchNormalization 7 and 9 in inference use the given mean and variance; Pad with negative
pads crops; Resize with an empty roi runs; Upsample (7, 9) and Resize 10 scale with the asymmetric
transform (x_in = x_out / scale), nearest taking the floor.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper

from ortlab.engine import InferenceSession
from ortlab.errors import OrtlabError

RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)
X4 = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
NP2T = {np.dtype(np.float32): T.FLOAT, np.dtype(np.int64): T.INT64, np.dtype(np.int32): T.INT32,
        np.dtype(np.uint8): T.UINT8}


def model(nodes, feeds, outputs=("y",), opset=18, inits=None, out_type=T.FLOAT):
    inputs = [h.make_tensor_value_info(k, NP2T[v.dtype], list(v.shape)) for k, v in feeds.items()]
    outs = [h.make_tensor_value_info(o, out_type, None) for o in outputs]
    inits = [numpy_helper.from_array(v, k) for k, v in (inits or {}).items()]
    m = h.make_model(h.make_graph(nodes, "g", inputs, outs, initializer=inits),
                     opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 7
    return m


def ort_run(m, feeds):
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)


def both(m, feeds):
    return InferenceSession(m).run(None, feeds), ort_run(m, feeds)


def same_or_both_refuse(m, feeds, atol=1e-5):
    """ORT's answer, or an OrtlabError where ORT refuses the model."""
    try:
        theirs = ort_run(m, feeds)
    except Exception:  # noqa: BLE001 (ORT's own exception types)
        with pytest.raises(OrtlabError):
            InferenceSession(m).run(None, feeds)
        return
    assert_close(InferenceSession(m).run(None, feeds), theirs, atol=atol)


def assert_close(ours, theirs, atol=1e-6):
    assert len(ours) == len(theirs)
    for a, b in zip(ours, theirs):
        assert a.dtype == b.dtype and a.shape == b.shape
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=atol)


def softmax_2d(x, axis):
    rows = x.reshape(int(np.prod(x.shape[:axis])), -1).astype(np.float64)
    e = np.exp(rows - rows.max(axis=1, keepdims=True))
    return (e / e.sum(axis=1, keepdims=True)).reshape(x.shape)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("opset", [1, 11])
@pytest.mark.parametrize("axis", [None, 0, 1, 2, -1, -2])
def test_softmax_before_opset_13_coerces_to_2d_as_ort(op, opset, axis):
    kw = {} if axis is None else {"axis": axis}
    m = model([h.make_node(op, ["x"], ["y"], **kw)], {"x": X}, opset=opset)
    ours, theirs = both(m, {"x": X})
    expected = softmax_2d(X, (1 if axis is None else axis) % X.ndim)
    expected = np.log(expected) if op == "LogSoftmax" else expected
    np.testing.assert_allclose(theirs[0], expected, rtol=1e-5, atol=1e-6)  # the rule, independently of ORT
    assert_close(ours, theirs)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_softmax_opset_11_inside_a_loop_body_coerces_as_ort(op):
    body = h.make_graph([h.make_node(op, ["x"], ["s"], axis=1), h.make_node("Identity", ["c"], ["c2"])], "body",
                        [h.make_tensor_value_info("i", T.INT64, []), h.make_tensor_value_info("c", T.BOOL, [])],
                        [h.make_tensor_value_info("c2", T.BOOL, []), h.make_tensor_value_info("s", T.FLOAT, None)])
    m = model([h.make_node("Loop", ["n", ""], ["y"], body=body)], {"x": X}, opset=11,
              inits={"n": np.array(2, np.int64)})
    ours, theirs = both(m, {"x": X})
    assert_close(ours, theirs)


def test_log_softmax_of_a_far_tail_is_finite_as_ort():
    x = np.array([[0.0, -200.0, -1e4]], np.float32)
    for opset in (11, 13):
        m = model([h.make_node("LogSoftmax", ["x"], ["y"])], {"x": x}, opset=opset)
        ours, theirs = both(m, {"x": x})
        np.testing.assert_allclose(theirs[0], x)  # x - max - log(sum exp): no -inf
        assert_close(ours, theirs)


REDUCE_OPS = ["ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
              "ReduceLogSumExp", "ReduceSumSquare", "ReduceSum"]


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_with_no_axes_input_and_noop_as_ort(op):
    m = model([h.make_node(op, ["x"], ["y"], noop_with_empty_axes=1)], {"x": X}, opset=18)
    same_or_both_refuse(m, {"x": X})


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_with_empty_axes_and_noop_returns_the_input_as_ort(op, keepdims):
    x = np.abs(X) + 0.5
    m = model([h.make_node(op, ["x", "a"], ["y"], keepdims=keepdims, noop_with_empty_axes=1)], {"x": x},
              inits={"a": np.array([], np.int64)})
    ours, theirs = both(m, {"x": x})
    assert theirs[0].shape == x.shape
    assert_close(ours, theirs)


@pytest.mark.parametrize("p, axis", [(1, 1), (1, -1), (2, 0), (1, 0)])
def test_lp_normalization_divides_by_the_p_norm_as_ort(p, axis):
    m = model([h.make_node("LpNormalization", ["x"], ["y"], p=p, axis=axis)], {"x": X}, opset=1)
    ours, theirs = both(m, {"x": X})
    norm = np.linalg.norm(X.astype(np.float64), ord=p, axis=axis, keepdims=True)
    np.testing.assert_allclose(theirs[0], X / norm, rtol=1e-5)
    assert_close(ours, theirs)


BN = {"s": np.array([1, 2], np.float32), "b": np.array([0.1, 0.2], np.float32),
      "mu": np.array([0.5, -0.5], np.float32), "v": np.array([1, 4], np.float32)}


@pytest.mark.parametrize("opset", [7, 9, 14])
def test_batch_normalization_in_inference_uses_the_given_statistics_as_ort(opset):
    m = model([h.make_node("BatchNormalization", ["x", "s", "b", "mu", "v"], ["y"], epsilon=1e-3)], {"x": X4},
              opset=opset, inits=BN)
    ours, theirs = both(m, {"x": X4})
    shape = (1, 2, 1, 1)
    expected = BN["s"].reshape(shape) * (X4 - BN["mu"].reshape(shape)) / np.sqrt(BN["v"].reshape(shape) + 1e-3) \
        + BN["b"].reshape(shape)
    np.testing.assert_allclose(theirs[0], expected, rtol=1e-5, atol=1e-6)
    assert_close(ours, theirs)


@pytest.mark.parametrize("opset, outputs", [(7, 5), (9, 5), (9, 1)])
def test_batch_normalization_before_14_with_optional_outputs_trains_as_ort(opset, outputs):
    names = ["y", "m", "var", "sm", "sv"][:outputs]
    m = model([h.make_node("BatchNormalization", ["x", "s", "b", "mu", "v"], names, momentum=0.8)], {"x": X4},
              outputs=names, opset=opset, inits=BN)
    ours, theirs = both(m, {"x": X4})
    if outputs > 1:
        batch_mean = X4.mean(axis=(0, 2, 3))
        np.testing.assert_allclose(theirs[3], batch_mean, rtol=1e-5, atol=1e-6)  # saved mean: the batch's
        np.testing.assert_allclose(theirs[1], 0.8 * BN["mu"] + 0.2 * batch_mean, rtol=1e-5, atol=1e-6)
    assert_close(ours, theirs, atol=1e-5)


def test_batch_normalization_7_with_spatial_0_uses_per_element_statistics_as_ort():
    stats = {"s": np.full((2, 3, 4), 2, np.float32), "b": np.ones((2, 3, 4), np.float32),
             "mu": np.zeros((2, 3, 4), np.float32), "v": np.ones((2, 3, 4), np.float32)}
    m = model([h.make_node("BatchNormalization", ["x", "s", "b", "mu", "v"], ["y"], spatial=0)], {"x": X4},
              opset=7, inits=stats)
    ours, theirs = both(m, {"x": X4})
    np.testing.assert_allclose(theirs[0], 2 * X4 / np.sqrt(1 + 1e-5) + 1, rtol=1e-5)
    assert_close(ours, theirs)


@pytest.mark.parametrize("opset", [11, 13, 18])
@pytest.mark.parametrize("pads", [[0, -1, 0, 0, 1, -2], [0, 0, -2, 0, 0, -2], [-1, 1, 1, 0, -1, 1]])
def test_pad_with_negative_pads_crops_as_ort(opset, pads):
    m = model([h.make_node("Pad", ["x", "p"], ["y"], mode="constant")], {"x": X}, opset=opset,
              inits={"p": np.array(pads, np.int64)})
    ours, theirs = both(m, {"x": X})
    assert_close(ours, theirs)


def test_pad_with_negative_pads_in_reflect_mode_crops_as_ort():
    m = model([h.make_node("Pad", ["x", "p"], ["y"], mode="reflect")], {"x": X}, opset=13,
              inits={"p": np.array([0, -1, 1, 0, 0, 2], np.int64)})
    ours, theirs = both(m, {"x": X})
    assert_close(ours, theirs)


@pytest.mark.parametrize("opset", [11, 13, 19])
@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
def test_resize_with_an_empty_roi_runs_as_ort(opset, mode):
    m = model([h.make_node("Resize", ["x", "roi", "s"], ["y"], mode=mode)], {"x": X4}, opset=opset,
              inits={"roi": np.array([], np.float32), "s": np.array([1, 1, 1.7, 0.6], np.float32)})
    ours, theirs = both(m, {"x": X4})
    assert_close(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("op, opset", [("Upsample", 9), ("Resize", 10), ("Upsample", 7)])
@pytest.mark.parametrize("mode", ["nearest", "linear"])
@pytest.mark.parametrize("scales", [[1, 1, 2, 1.5], [1, 1, 0.6, 0.5], [1, 2, 3, 1]])
def test_upsample_and_resize_10_scale_as_ort(op, opset, mode, scales):
    scales = np.array(scales, np.float32)
    if opset == 7:
        m = model([h.make_node(op, ["x"], ["y"], mode=mode, scales=scales.tolist())], {"x": X4}, opset=opset)
    else:
        m = model([h.make_node(op, ["x", "s"], ["y"], mode=mode)], {"x": X4}, opset=opset, inits={"s": scales})
    same_or_both_refuse(m, {"x": X4})


@pytest.mark.parametrize("shape, scales", [((3, 4), [2, 1.5]), ((2, 3, 4), [2, 1, 2.5]), ((1, 2, 3, 4), [1, 2, 2, 1]),
                                           ((1, 1, 2, 3, 2), [1, 1, 2, 2, 2]), ((1, 2, 3, 4, 2), [2, 1, 1, 1, 1])])
def test_upsample_linear_in_the_ranks_ort_takes(shape, scales):
    x = RNG.standard_normal(shape).astype(np.float32)
    m = model([h.make_node("Upsample", ["x", "s"], ["y"], mode="linear")], {"x": x}, opset=9,
              inits={"s": np.array(scales, np.float32)})
    same_or_both_refuse(m, {"x": x})


def test_upsample_nearest_upscale_is_floor_of_the_asymmetric_coordinate():
    x = np.arange(6, dtype=np.float32).reshape(1, 1, 2, 3)
    m = model([h.make_node("Upsample", ["x", "s"], ["y"], mode="nearest")], {"x": x}, opset=9,
              inits={"s": np.array([1, 1, 2, 2], np.float32)})
    ours, theirs = both(m, {"x": x})
    np.testing.assert_array_equal(theirs[0], x.repeat(2, axis=2).repeat(2, axis=3))
    assert_close(ours, theirs)


def test_upsample_with_a_bad_scale_count_is_refused_clearly():
    m = model([h.make_node("Upsample", ["x", "s"], ["y"], mode="nearest")], {"x": X4}, opset=9,
              inits={"s": np.array([1, 2], np.float32)})
    with pytest.raises(OrtlabError, match="scales"):
        InferenceSession(m).run(None, {"x": X4})


@pytest.mark.parametrize("opset", [1, 11, 13])
@pytest.mark.parametrize("axes", [[3, 0], [0, 3], [-1, 1], [4, 2]])
def test_unsqueeze_axes_name_output_positions_in_any_order_as_ort(opset, axes):
    if opset == 1 and min(axes) < 0:
        pytest.skip("opset 1 takes no negative axes")
    if opset < 13:
        m = model([h.make_node("Unsqueeze", ["x"], ["y"], axes=axes)], {"x": X}, opset=opset)
    else:
        m = model([h.make_node("Unsqueeze", ["x", "a"], ["y"])], {"x": X}, opset=opset,
                  inits={"a": np.array(axes, np.int64)})
    ours, theirs = both(m, {"x": X})
    shape = list(X.shape)
    for a in sorted(a % (X.ndim + len(axes)) for a in axes):
        shape.insert(a, 1)
    assert theirs[0].shape == tuple(shape)
    assert_close(ours, theirs)


def test_unsqueeze_with_a_repeated_axis_is_refused_clearly():
    m = model([h.make_node("Unsqueeze", ["x", "a"], ["y"])], {"x": X}, opset=13,
              inits={"a": np.array([1, 1], np.int64)})
    same_or_both_refuse(m, {"x": X})


ROIS = np.array([[0.5, 0.5, 3.2, 3.7], [1, 0, 4, 2]], np.float32)
X5 = RNG.standard_normal((1, 2, 5, 5)).astype(np.float32)


@pytest.mark.parametrize("opset, attributes", [(10, {}), (10, {"mode": "max"}), (16, {}),
                                               (16, {"coordinate_transformation_mode": "output_half_pixel"})])
def test_roi_align_before_16_maps_corners_without_the_half_pixel_as_ort(opset, attributes):
    m = model([h.make_node("RoiAlign", ["x", "r", "b"], ["y"], output_height=2, output_width=2, sampling_ratio=2,
                           **attributes)], {"x": X5, "r": ROIS, "b": np.zeros(2, np.int64)}, opset=opset)
    ours, theirs = both(m, {"x": X5, "r": ROIS, "b": np.zeros(2, np.int64)})
    assert_close(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("opset, mode", [(16, "bicubic"), (16, "bilinear"), (16, "nearest"), (20, "cubic")])
def test_grid_sample_mode_names_of_each_opset_as_ort(opset, mode):
    grid = (RNG.random((1, 3, 3, 2)) * 2.4 - 1.2).astype(np.float32)
    m = model([h.make_node("GridSample", ["x", "g"], ["y"], mode=mode)], {"x": X5, "g": grid}, opset=opset)
    ours, theirs = both(m, {"x": X5, "g": grid})
    assert_close(ours, theirs, atol=1e-5)


@pytest.mark.parametrize("opset, axis, scale, zero", [(10, None, [0.1], 3), (13, 1, [0.1, 0.2, 0.3], [1, 2, 3]),
                                                      (18, 0, [0.5, 2.0], [0, 7])])
def test_dequantize_linear_before_opset_19_runs_as_ort(opset, axis, scale, zero):
    x = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    kw = {} if axis is None else {"axis": axis}
    inits = {"s": np.array(scale, np.float32).reshape(() if axis is None else -1),
             "z": np.array(zero, np.uint8).reshape(() if axis is None else -1)}
    m = model([h.make_node("DequantizeLinear", ["x", "s", "z"], ["y"], **kw)], {"x": x}, opset=opset, inits=inits)
    ours, theirs = both(m, {"x": x})
    assert_close(ours, theirs)


@pytest.mark.parametrize("opset", [1, 13])
@pytest.mark.parametrize("size", [1, 2, 3, 5])
@pytest.mark.parametrize("batch", [1, 2])
def test_lrn_normalises_every_channel_as_ort(opset, size, batch):
    x = RNG.standard_normal((batch, 5, 2, 3)).astype(np.float32)
    m = model([h.make_node("LRN", ["x"], ["y"], size=size, alpha=0.5, beta=0.75, bias=1.0)], {"x": x}, opset=opset)
    if size % 2 == 0:  # ORT takes odd sizes only
        same_or_both_refuse(m, {"x": x})
        return
    ours, theirs = both(m, {"x": x})
    squares, half = x.astype(np.float64) ** 2, (size - 1) // 2
    total = np.stack([squares[:, max(0, c - half):c + half + 1].sum(axis=1) for c in range(5)], axis=1)
    np.testing.assert_allclose(theirs[0], x / (1 + 0.5 / size * total) ** 0.75, rtol=1e-5, atol=1e-6)
    assert_close(ours, theirs)


def test_lrn_of_a_3d_input_is_refused_as_ort():
    x = RNG.standard_normal((2, 5, 3)).astype(np.float32)
    m = model([h.make_node("LRN", ["x"], ["y"], size=3)], {"x": x}, opset=13)
    same_or_both_refuse(m, {"x": x})


@pytest.mark.parametrize("op, opset, attributes, inputs", [
    ("Add", 6, {"broadcast": 1, "axis": 0}, 2), ("Mul", 1, {"broadcast": 1, "axis": 0}, 2), ("Add", 6, {}, 2),
    ("Gemm", 6, {}, 3), ("PRelu", 6, {}, 2), ("Relu", 5, {}, 1), ("Sum", 5, {}, 2), ("Exp", 1, {}, 1)])
def test_a_node_form_ort_has_no_cpu_kernel_for_is_refused_as_ort(op, opset, attributes, inputs):
    """Add(broadcast=1, axis=0) of [2, 2] and [2] would add along the first axis by its opset's rule; onnx.reference
    added along the last, silently. ORT registers no kernel for these forms; neither does the engine."""
    a = np.arange(4, dtype=np.float32).reshape(2, 2) + 1
    feeds = dict(zip(["a", "b", "c"], [a, a[0].copy() if attributes else a, a][:inputs]))
    m = model([h.make_node(op, list(feeds), ["y"], **attributes)], feeds, opset=opset)
    with pytest.raises(Exception, match="NOT_IMPLEMENTED"):
        ort_run(m, feeds)
    with pytest.raises(OrtlabError, match=rf"no kernel for {op}\("):
        InferenceSession(m)


@pytest.mark.parametrize("op", ["Sum", "Max", "Min", "Mean"])
@pytest.mark.parametrize("opset, same", [(6, True), (7, False), (8, False)])
def test_variadic_ops_broadcast_from_opset_8_only_as_ort(op, opset, same):
    a = np.arange(4, dtype=np.float32).reshape(2, 2)
    feeds = {"a": a, "b": (a * 2 if same else a[0] * 2)}
    m = model([h.make_node(op, ["a", "b"], ["y"])], feeds, opset=opset)
    same_or_both_refuse(m, feeds)


@pytest.mark.parametrize("opset", [1, 4])
@pytest.mark.parametrize("shape", [[6], [3, -1], [0, 3], [2, 0, 1], [-1], [4, -1], [5], [-1, -1]])
def test_reshape_before_opset_5_takes_its_shape_attribute_as_ort(opset, shape):
    feeds = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}
    same_or_both_refuse(model([h.make_node("Reshape", ["x"], ["y"], shape=shape)], feeds, opset=opset), feeds)

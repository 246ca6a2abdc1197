"""A seeded Dropout draws a new mask every run of one session and the same masks in every new session, as
ORT 1.19.2's CPU kernel does (dropout_op.h makes its generator once, from the seed, when the kernel is made)."""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx.reference import ReferenceEvaluator

from ortlab.engine import InferenceSession

SHAPE = (8, 64)


def dropout_model(seed, opset=13, ratio=0.25):
    attributes = {} if seed is None else {"seed": seed}
    graph = h.make_graph(
        [h.make_node("Dropout", ["x", "r", "t"], ["y", "mask"], **attributes)], "g",
        [h.make_tensor_value_info("x", T.FLOAT, list(SHAPE))],
        [h.make_tensor_value_info("y", T.FLOAT, list(SHAPE)), h.make_tensor_value_info("mask", T.BOOL, list(SHAPE))],
        initializer=[h.make_tensor("r", T.FLOAT, [], [ratio]), h.make_tensor("t", T.BOOL, [], [True])])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)])


X = np.random.default_rng(0).standard_normal(SHAPE).astype(np.float32)


def masks(session, runs=3):
    return [session.run(None, {"x": X})[1] for _ in range(runs)]


def sessions(model):
    return {"ORT": lambda: ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]),
            "ortlab": lambda: InferenceSession(model)}


@pytest.mark.parametrize("opset", [12, 13, 17])
@pytest.mark.parametrize("seed", [5, None])
def test_each_run_draws_a_new_mask(seed, opset):
    for name, make in sessions(dropout_model(seed, opset)).items():
        first, second, third = masks(make())
        if not (name == "ORT" and seed is None):  # see test_ort_after_set_seed_repeats_an_unseeded_first_mask
            assert not (first == second).all(), name
        assert not (second == third).all(), name
        for mask in (first, second, third):
            assert abs(mask.mean() - 0.75) < 0.1, name  # 1 - ratio of the elements kept


def test_ort_after_set_seed_repeats_an_unseeded_first_mask():
    """ORT 1.19.2, pinned: after onnxruntime.set_seed, a Dropout without a seed gives the same mask on its first
    two runs, then new ones (seen at opsets 12 and 13). ortlab does not copy this: every run draws anew."""
    ort.set_seed(0)
    first, second, third = masks(sessions(dropout_model(None))["ORT"]())
    assert (first == second).all() and not (second == third).all()


def test_an_unseeded_dropout_is_reproducible_once_numpy_is_seeded():
    """What ortlab.env.seed_everything seeds (np.random.seed) decides an unseeded node's masks."""
    runs = []
    for _ in range(2):
        np.random.seed(3)
        runs.append(masks(InferenceSession(dropout_model(None))))
    for a, b in zip(*runs):
        np.testing.assert_array_equal(a, b)
    assert not (runs[0][0] == runs[0][1]).all()


def test_a_new_session_draws_the_same_masks_in_the_same_order():
    for name, make in sessions(dropout_model(5)).items():
        for a, b in zip(masks(make()), masks(make())):
            np.testing.assert_array_equal(a, b, err_msg=name)


def test_y_is_x_over_keep_probability_where_kept():
    session = InferenceSession(dropout_model(5))
    for _ in range(2):
        y, mask = session.run(None, {"x": X})
        np.testing.assert_allclose(y, np.where(mask, X / np.float32(0.75), 0), rtol=1e-6)


def test_the_first_mask_is_onnx_references():
    model = dropout_model(5)
    expected = ReferenceEvaluator(model).run(None, {"x": X})[1]
    np.testing.assert_array_equal(InferenceSession(model).run(None, {"x": X})[1], expected)


@pytest.mark.parametrize("provider", ["TritonExecutionProvider", "CUDAExecutionProvider"])
def test_the_device_eps_draw_a_new_mask_every_run_too(provider):
    """ORT's CUDA Dropout advances its PhiloxGenerator per run (cuda/nn/dropout.cc); ortlab's Triton kernel and
    CUDA C++ kernel, run by their EPs, do the same: new masks run to run, the same masks in a new session."""
    model = dropout_model(5)

    def make():
        session = InferenceSession(model, providers=[provider, "CPUExecutionProvider"])
        assert any(provider in ep for ep in session.state.placements()), session
        return session

    first = masks(make())
    assert not (first[0] == first[1]).all() and not (first[1] == first[2]).all()
    for a, b in zip(first, masks(make())):
        np.testing.assert_array_equal(a, b)

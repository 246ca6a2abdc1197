"""BFLOAT16 initializers stored in raw_data: onnx 1.17's numpy_helper.to_array returns uninitialized memory for
them; ortlab.ir.tensor_value.to_array reads them, and the engine's results equal ORT 1.19.2's."""
import numpy as np
import onnxruntime as ort
from onnx import TensorProto as T
from onnx import helper as h

from ortlab.engine import InferenceSession
from ortlab.ir.tensor_value import to_array

VALUES = np.array([1.5, -2.0, 0.15625, 2.0**100, -0.0, 1024.0], np.float32)  # each exact in bfloat16
BITS = (VALUES.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16 is float32's upper half


def bf16_raw(name, bits=BITS, dims=None):
    return h.make_tensor(name, T.BFLOAT16, list(dims or bits.shape), bits.tobytes(), raw=True)


def test_raw_bfloat16_is_read_bit_for_bit():
    values = to_array(bf16_raw("w"))
    assert values.shape == BITS.shape
    np.testing.assert_array_equal(values.view(np.uint16), BITS)


def test_int32_data_bfloat16_is_still_read():
    tensor = T(name="w", data_type=T.BFLOAT16, dims=[BITS.size])
    tensor.int32_data.extend(BITS.astype(np.int32).tolist())  # the bit patterns, one per int32 (onnx.proto)
    np.testing.assert_array_equal(to_array(tensor).view(np.uint16), BITS)


def test_shape_kept_and_other_types_unchanged():
    assert to_array(bf16_raw("w", BITS, (2, 3))).shape == (2, 3)
    f = h.make_tensor("f", T.FLOAT, [6], VALUES.tobytes(), raw=True)
    np.testing.assert_array_equal(to_array(f), VALUES)


def test_the_values_are_exact_in_bfloat16():
    np.testing.assert_array_equal((BITS.astype(np.uint32) << 16).view(np.float32), VALUES)


def test_a_bfloat16_initializer_cast_to_float_gives_orts_values():
    """Values no other test allocates (uninitialized memory may hold a freed array of the same size)."""
    bits = np.random.default_rng(7).integers(0x3000, 0x5000, size=1000).astype(np.uint16)  # finite, normal
    values = (bits.astype(np.uint32) << 16).view(np.float32)
    graph = h.make_graph([h.make_node("Cast", ["w"], ["y"], to=T.FLOAT), h.make_node("Add", ["y", "x"], ["z"])],
                         "g", [h.make_tensor_value_info("x", T.FLOAT, [1000])],
                         [h.make_tensor_value_info("z", T.FLOAT, [1000])], initializer=[bf16_raw("w", bits)])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    x = np.linspace(-1, 1, 1000, dtype=np.float32)
    theirs = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    ours = InferenceSession(model).run(None, {"x": x})
    np.testing.assert_array_equal(theirs[0], values + x)
    np.testing.assert_array_equal(ours[0], theirs[0])

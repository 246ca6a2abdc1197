"""Element types numpy lacks (bfloat16, float8, int4) as the engine's graph types them.

onnx's helper.tensor_dtype_to_np_dtype gives float32 for BFLOAT16 and the FLOAT8 types and int8 for INT4. When
the engine took that for the graph's type of a value, a bfloat16 value was sized as 4 bytes, a float32 kernel of
a device EP matched a bfloat16 node, a float32 array was taken for a bfloat16 input, and a bfloat16 output was
refused as "the wrong type". The facts checked here: the ONNX spec's widths (bfloat16 16 bits, float8 8 bits),
ORT 1.19.2's own refusals (run live), and ORT's CPU EP having no bfloat16 Softmax kernel.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from ortlab.engine import InferenceSession, KernelFailure
from ortlab.ir.node_arg import NodeArg
from ortlab.memory.allocation_planner import element_size

NARROW = [(T.BFLOAT16, "bfloat16", 2), (T.FLOAT8E4M3FN, "float8e4m3fn", 1), (T.FLOAT8E4M3FNUZ, "float8e4m3fnuz", 1),
          (T.FLOAT8E5M2, "float8e5m2", 1), (T.FLOAT8E5M2FNUZ, "float8e5m2fnuz", 1)]


def model(nodes, inputs, outputs, opset=17):
    graph = h.make_graph(nodes, "g", inputs, outputs)
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=9)


def run_both(m, feeds):
    """[(who, outputs or the error's text)] for ORT's CPU EP and the engine."""
    found = []
    for who, make in (("ort", lambda: ort.InferenceSession(m.SerializeToString(),
                                                           providers=["CPUExecutionProvider"])),
                      ("ortlab", lambda: InferenceSession(m))):
        try:
            found.append((who, make().run(None, feeds)))
        except Exception as exc:  # noqa: BLE001 (the text is what is compared)
            found.append((who, str(exc)))
    return found


@pytest.mark.parametrize("elem, name, width", NARROW)
def test_a_narrow_float_is_named_and_sized_as_stored_not_as_computed(elem, name, width):
    arg = NodeArg("v", h.make_tensor_type_proto(elem, [3]))
    assert arg.dtype == name
    assert arg.np_dtype.itemsize == width
    assert element_size(arg.type_proto) == width  # the memory planner's bytes per element


def test_int4_is_named_as_its_own_type_not_int8():
    assert NodeArg("v", h.make_tensor_type_proto(T.INT4, [3])).dtype == "int4"
    assert NodeArg("v", h.make_tensor_type_proto(T.UINT4, [3])).dtype == "uint4"


@pytest.mark.parametrize("feed", [np.array([1.5, 2.25], np.float32), np.array([0x3FC0, 0x4010], np.uint16)],
                         ids=["float32", "uint16"])
def test_a_numpy_feed_for_a_bfloat16_input_is_refused_as_ort_refuses_it(feed):
    m = model([h.make_node("Cast", ["x"], ["y"], to=T.FLOAT)], [h.make_tensor_value_info("x", T.BFLOAT16, [2])],
              [h.make_tensor_value_info("y", T.FLOAT, [2])])
    (_, theirs), (_, ours) = run_both(m, {"x": feed})
    assert isinstance(theirs, str) and isinstance(ours, str), (theirs, ours)
    expected = theirs.split("INVALID_ARGUMENT : ")[1]
    assert ours.startswith(expected)
    assert "Cast inside the graph" in ours  # says what to do


def test_a_bfloat16_output_is_refused_as_ort_refuses_it_and_its_cast_to_float_equals_ort():
    x = np.array([1.0, 1.00390625, 1.01171875, -3.3e38, 3.4e38], np.float32)  # ties, and overflow to inf
    inputs, out = [h.make_tensor_value_info("x", T.FLOAT, [5])], h.make_tensor_value_info
    narrow = model([h.make_node("Cast", ["x"], ["y"], to=T.BFLOAT16)], inputs, [out("y", T.BFLOAT16, [5])])
    (_, theirs), (_, ours) = run_both(narrow, {"x": x})
    assert theirs == "No corresponding Numpy type for Tensor Type."
    assert isinstance(ours, str) and ours.startswith(theirs) and "Cast it to float" in ours
    back = model([h.make_node("Cast", ["x"], ["b"], to=T.BFLOAT16), h.make_node("Cast", ["b"], ["y"], to=T.FLOAT)],
                 inputs, [out("y", T.FLOAT, [5]), out("b", T.BFLOAT16, [5])])
    (_, theirs), (_, ours) = run_both(back, {"x": x})
    assert theirs == "No corresponding Numpy type for Tensor Type." and ours.startswith(theirs)  # for output b
    back.graph.output.pop()
    (_, theirs), (_, ours) = run_both(back, {"x": x})
    np.testing.assert_array_equal(ours[0], theirs[0])


def test_a_bfloat16_node_is_not_given_to_a_float32_kernel_of_another_ep():
    """The Triton EP's Softmax takes float32 only; a bfloat16 Softmax stays off it (before, the graph typed it
    float32 and the Triton EP claimed it)."""
    nodes = [h.make_node("Cast", ["x"], ["b"], to=T.BFLOAT16, name="to_bf16"),
             h.make_node("Softmax", ["b"], ["s"], name="softmax"),
             h.make_node("Cast", ["s"], ["y"], to=T.FLOAT, name="back")]
    m = model(nodes, [h.make_tensor_value_info("x", T.FLOAT, [2, 3])], [h.make_tensor_value_info("y", T.FLOAT,
                                                                                                  [2, 3])])
    sess = InferenceSession(m, providers=["TritonExecutionProvider"])
    placed = {s.node.name: s.provider.type for s in sess.state.steps}
    assert placed["softmax"] == "CPUExecutionProvider"
    with pytest.raises(KernelFailure, match="Softmax node 'softmax'.*bfloat16"):  # onnx.reference computes
        sess.run(None, {"x": np.ones((2, 3), np.float32)})  # none in bfloat16 without ml_dtypes: loud
    # nor has ORT's CPU EP (it inlines Softmax-13, then finds no bfloat16 ReduceMax)
    with pytest.raises(Exception, match="Could not find an implementation for"):
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])

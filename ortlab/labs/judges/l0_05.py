"""The checks of L0_05's exercises (run where the learner's code cannot reach them).

Both ask the real onnxruntime: 'wraps_without_copy' calls OrtValue.ortvalue_from_numpy on each array
(onnxruntime/python/onnxruntime_pybind_ortvalue.cc) and compares its data pointer with the array's bytes;
'shares_memory' does each conversion with onnxruntime and torch and compares data pointers.
"""
import numpy as np
from onnx import TensorProto, helper

from ortlab.labs.checks import CheckFailed, same_keys
from ortlab.labs.l0_05 import ARRAYS, CONVERSIONS, array, ort_wraps, predicted, wraps

WHY = {
    "from_numpy": "a dense float32 array is wrapped: the OrtValue's Tensor points into a's buffer",
    "from_numpy_transposed": "np.ascontiguousarray(a.T) is a new array (a.T is not row-major), so the value "
                             "points into that copy, not into a",
    "numpy_of_value": ".numpy() on a CPU OrtValue is a view of its buffer",
    "torch_from_dlpack": "dlpack hands the pointer over: no copy",
    "torch_tensor": "torch.tensor(...) always copies its data; torch.from_numpy and torch.from_dlpack share it",
    "from_torch_numpy": "t.numpy() is a view of the torch tensor's memory, and the OrtValue wraps that view",
    "astype_float32": "astype makes a new array even when the dtype is already float32 (unless copy=False)",
    "identity_output": "a graph output gets a buffer of its own (kAllocateOutput): Identity, which may alias "
                       "its input inside a graph, copies into it",
    "reshape_output": "a graph output gets a buffer of its own (kAllocateOutput): Reshape, which aliases its "
                      "input inside a graph, copies into it",
}


def wraps_without_copy(remote, fn):
    for label, _, why in ARRAYS:
        arr = array(label)
        truth = ort_wraps(arr)
        got = remote.call(wraps, fn, label)
        if got != truth:
            did = "wraps it without a copy" if truth else "copied it into a new dense buffer"
            raise CheckFailed(f"for {label} (shape {arr.shape}, strides {arr.strides}): ORT {did}, you said "
                              f"{got}: {why}")
    return None


def _one_op_model(op, initializers=()):

    inputs = ["x"] + [t.name for t in initializers]
    graph = helper.make_graph([helper.make_node(op, inputs, ["y"])], op.lower(),
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _inside(pointer, owner_pointer, nbytes):
    return bool(owner_pointer <= pointer < owner_pointer + nbytes)


def _truth(label):
    """Does the conversion `label` share its source's memory? Done with onnxruntime and torch."""
    import onnxruntime as ort  # heavy: onnxruntime
    import torch  # heavy: torch

    from ortlab import session  # lazy: loaded when the check runs (every judge is imported before a learner's cell)

    a = np.arange(6, dtype=np.float32).reshape(2, 3)
    value = ort.OrtValue.ortvalue_from_numpy(a)
    if label == "from_numpy":
        return _inside(value.data_ptr(), a.ctypes.data, a.nbytes)
    if label == "from_numpy_transposed":
        return _inside(ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(a.T)).data_ptr(), a.ctypes.data, a.nbytes)
    if label == "numpy_of_value":
        return _inside(value.numpy().ctypes.data, value.data_ptr(), a.nbytes)
    if label == "torch_from_dlpack":
        return _inside(torch.from_dlpack(value._ortvalue).data_ptr(), value.data_ptr(), a.nbytes)
    if label == "torch_tensor":
        return _inside(torch.tensor(value.numpy()).data_ptr(), value.data_ptr(), a.nbytes)
    if label == "from_torch_numpy":
        t = torch.arange(6, dtype=torch.float32)
        return _inside(ort.OrtValue.ortvalue_from_numpy(t.numpy()).data_ptr(), t.data_ptr(), 24)
    if label == "astype_float32":
        return _inside(ort.OrtValue.ortvalue_from_numpy(a.astype(np.float32)).data_ptr(), a.ctypes.data, a.nbytes)
    shape = helper.make_tensor("shape", TensorProto.INT64, [1], [-1])
    model = _one_op_model("Identity") if label == "identity_output" else _one_op_model("Reshape", [shape])
    (y,) = session.create(model, providers=["CPUExecutionProvider"]).run_with_ort_values(None, {"x": value})
    return _inside(y.data_ptr(), value.data_ptr(), a.nbytes)


def shares_memory(remote, fn):
    got = remote.call(predicted, fn)
    labels = [label for label, _ in CONVERSIONS]
    same_keys(got, labels, "conversion", "True or False")
    for label in labels:
        truth = _truth(label)
        if got[label] != truth:
            shares = "shares" if truth else "does not share"
            raise CheckFailed(f"{label}: you said {got[label]}, but the result {shares} its source's memory: "
                              f"{WHY[label]}")
    return None

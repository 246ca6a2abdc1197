"""A TensorProto's values as a numpy array: onnx.numpy_helper.to_array, with onnx 1.17's BFLOAT16 fixed.

onnx 1.17's to_array reads a BFLOAT16 tensor's int32_data only; a tensor stored in raw_data (how onnx's
backend cases, torch's exporter and ORT store them) comes back as uninitialized memory, silently. Here raw_data
is read as bfloat16 bit patterns, in onnx.reference's own bfloat16 dtype (onnx._custom_element_types), which is
what the engine's kernels take. ORT reads both fields (onnxruntime/core/framework/tensorprotoutils.cc,
UnpackTensor<BFloat16>).
"""
import numpy as np
from onnx import TensorProto, numpy_helper
from onnx import _custom_element_types as custom
from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data


def to_array(tensor, base_dir=""):
    """The values of `tensor` (a TensorProto) as a numpy array."""
    if tensor.data_type == TensorProto.BFLOAT16:
        if uses_external_data(tensor):
            load_external_data_for_tensor(tensor, base_dir)
        if tensor.HasField("raw_data"):
            bits = np.frombuffer(tensor.raw_data, dtype="<u2").astype(np.uint16)
            return bits.view(custom.bfloat16).reshape(tuple(tensor.dims))
    return numpy_helper.to_array(tensor, base_dir)

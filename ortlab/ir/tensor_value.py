"""A TensorProto's values as a numpy array: onnx.numpy_helper.to_array, with onnx 1.17's BFLOAT16 fixed.

onnx 1.17's to_array reads a BFLOAT16 tensor's int32_data only; a tensor stored in raw_data (how onnx's
backend cases, torch's exporter and ORT store them) comes back as uninitialized memory, silently. Here raw_data
is read as bfloat16 bit patterns, in onnx.reference's own bfloat16 dtype (onnx._custom_element_types), which is
what the engine's kernels take. ORT reads both fields (onnxruntime/core/framework/tensorprotoutils.cc,
UnpackTensor<BFloat16>).

Also the one map from an element type to the numpy dtype its values are held in (`np_dtype`) and to its
name (`dtype_name`). onnx's own `helper.tensor_dtype_to_np_dtype` gives float32 for BFLOAT16 and the FLOAT8
types and int8 for INT4: the type they are *computed* in, not the one they are stored in; here they are
onnx.reference's stand-ins (2 bytes for bfloat16, 1 for float8), named as TensorProto names them.
"""
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from onnx import _custom_element_types as custom
from onnx.external_data_helper import load_external_data_for_tensor, uses_external_data

# element types numpy lacks: onnx.reference's structured stand-ins (onnx._custom_element_types)
STAND_INS = {TensorProto.BFLOAT16: custom.bfloat16, TensorProto.FLOAT8E4M3FN: custom.float8e4m3fn,
             TensorProto.FLOAT8E4M3FNUZ: custom.float8e4m3fnuz, TensorProto.FLOAT8E5M2: custom.float8e5m2,
             TensorProto.FLOAT8E5M2FNUZ: custom.float8e5m2fnuz, TensorProto.UINT4: custom.uint4,
             TensorProto.INT4: custom.int4}


def np_dtype(elem_type):
    """The numpy dtype values of `elem_type` (a TensorProto enum value) are held in: onnx's, or its
    stand-in for a type numpy lacks (e.g. bfloat16: (uint16, [('bfloat16', '<u2')]), 2 bytes)."""
    return STAND_INS.get(elem_type) or np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def dtype_name(elem_type):
    """`elem_type`'s name as the engine's kernels are matched by: numpy's ('float32', 'int64'), or TensorProto's
    in lower case for a type numpy lacks ('bfloat16', 'float8e4m3fn', 'int4')."""
    if elem_type in STAND_INS:
        return TensorProto.DataType.Name(elem_type).lower()
    return str(np_dtype(elem_type))


def to_array(tensor, base_dir=""):
    """The values of `tensor` (a TensorProto) as a numpy array."""
    if tensor.data_type == TensorProto.BFLOAT16:
        if uses_external_data(tensor):
            load_external_data_for_tensor(tensor, base_dir)
        if tensor.HasField("raw_data"):
            bits = np.frombuffer(tensor.raw_data, dtype="<u2").astype(np.uint16)
            return bits.view(custom.bfloat16).reshape(tuple(tensor.dims))
    return numpy_helper.to_array(tensor, base_dir)


def bfloat16_in_int32_data(tensor):
    """`tensor` with BFLOAT16 values held in int32_data (one bit pattern per element) instead of raw_data: the
    same tensor, in the one field onnx 1.17's to_array (and so onnx.reference, reading a subgraph's
    initializers) reads right. Any other tensor is returned as it is."""
    if tensor.data_type != TensorProto.BFLOAT16 or not tensor.HasField("raw_data"):
        return tensor
    bits = np.frombuffer(tensor.raw_data, dtype="<u2")
    moved = TensorProto()
    moved.CopyFrom(tensor)
    moved.ClearField("raw_data")
    moved.int32_data.extend(int(b) for b in bits)
    return moved

"""onnx's backend node test cases for tools/probe_reference_vs_ort.py: where they are, what a case tests
(its ops, opset, domains), and their values as (onnx element type, numpy array of natural values), so that
ORT's outputs, onnx.reference's and the stored ones compare alike (compare: same type, same shape, close).

tests/engine/test_engine_backend_cases.py reuses them through the probe's module, which imports them from here.
"""
from __future__ import annotations

import fnmatch
import os

RTOL, ATOL = 1e-5, 1e-6
ORT_MAX_OPSET = 21
ALLOWED_DOMAINS = ("", "ai.onnx", "ai.onnx.ml")

# ONNX element types ORT's Python binding cannot carry as numpy arrays: (name, raw numpy dtype).
SPECIAL_TYPES = {16: ("bfloat16", "uint16"), 17: ("float8e4m3fn", "uint8"),
                 18: ("float8e4m3fnuz", "uint8"), 19: ("float8e5m2", "uint8"),
                 20: ("float8e5m2fnuz", "uint8"), 21: ("uint4", "uint8"), 22: ("int4", "int8")}
FLOAT_TYPES = {1, 10, 11, 16, 17, 18, 19, 20}


# ----------------------------------------------------------------------------------------------
# Locating and describing cases
# ----------------------------------------------------------------------------------------------

def node_test_dir() -> str:
    """Return the folder of onnx's backend node test cases."""
    import onnx
    return os.path.join(os.path.dirname(onnx.__file__), "backend", "test", "data", "node")


def list_cases(pattern: str | None) -> list[str]:
    """Return the case folders, optionally those whose name matches a glob pattern."""
    root = node_test_dir()
    names = sorted(n for n in os.listdir(root) if os.path.isfile(os.path.join(root, n, "model.onnx")))
    if pattern:
        names = [n for n in names if fnmatch.fnmatch(n, pattern)]
    return [os.path.join(root, n) for n in names]


def case_ops(model) -> list[str]:
    """Return the op types of a model's top-level nodes, in order, without repeats."""
    seen: list[str] = []
    for node in model.graph.node:
        name = node.op_type if node.domain in ("", "ai.onnx") else f"{node.domain}.{node.op_type}"
        if name not in seen:
            seen.append(name)
    return seen


def group_op(model) -> str:
    """Return the op a case tests: its single non-Constant node's type, else the types joined by +."""
    ops = [o for o in case_ops(model) if o != "Constant"] or case_ops(model)
    return ops[0] if len(ops) == 1 else "+".join(ops)


def ai_onnx_opset(model) -> int:
    """Return the model's ai.onnx opset version (0 when it imports none)."""
    return max([o.version for o in model.opset_import if o.domain in ("", "ai.onnx")] or [0])


def foreign_domains(model) -> list[str]:
    """Return the node domains of a model other than ai.onnx and ai.onnx.ml."""
    doms = {n.domain for n in model.graph.node} | {o.domain for o in model.opset_import}
    return sorted(d for d in doms if d not in ALLOWED_DOMAINS)


def non_tensor_values(model) -> list[str]:
    """Return 'name:kind' for each graph input or output that is not a tensor."""
    out = []
    for v in list(model.graph.input) + list(model.graph.output):
        kind = v.type.WhichOneof("value")
        if kind != "tensor_type":
            out.append(f"{v.name}:{kind}")
    return out


# ----------------------------------------------------------------------------------------------
# Values: (onnx element type, numpy array of natural values) so that every source compares alike
# ----------------------------------------------------------------------------------------------

def type_name(elem: int) -> str:
    """Return the ONNX name of an element type, e.g. FLOAT."""
    import onnx
    try:
        return onnx.TensorProto.DataType.Name(elem)
    except ValueError:
        return f"type{elem}"


def natural(elem: int, arr):
    """Return an array's values as numbers numpy can compare: special floats as float32, int4 as int8."""
    import numpy as np
    from onnx import numpy_helper
    if elem not in SPECIAL_TYPES:
        return arr
    raw = np.ascontiguousarray(arr).view(SPECIAL_TYPES[elem][1])
    if elem == 16:
        return (raw.astype(np.uint32) << 16).view(np.float32)
    if elem in (17, 18):
        return numpy_helper.float8e4m3_to_float32(raw, fn=True, uz=elem == 18).astype(np.float32)
    if elem in (19, 20):
        return numpy_helper.float8e5m2_to_float32(raw, fn=elem == 20, uz=elem == 20).astype(np.float32)
    return raw.astype(np.int8)


def elem_of_array(arr) -> int:
    """Return the ONNX element type of a numpy array, onnx's custom dtypes included."""
    import numpy as np
    from onnx import helper
    if arr.dtype.names:
        name = arr.dtype.names[0]
        for elem, (custom, _) in SPECIAL_TYPES.items():
            if custom == name or custom.replace("float8", "") == name:
                return elem
    if arr.dtype.kind in "OUS":
        return 8
    return helper.np_dtype_to_tensor_dtype(np.dtype(arr.dtype))


def value_from_array(arr) -> tuple[int, object]:
    """Return (element type, natural values) of a numpy array or scalar from onnx.reference."""
    import numpy as np
    if not isinstance(arr, np.ndarray):
        arr = np.asarray(arr)
    elem = elem_of_array(arr)
    return elem, natural(elem, arr)


def stored_array(tensor, elem: int):
    """Return a stored tensor's values as a numpy array of its declared element type.

    onnx stores bfloat16 test data as UINT16 (raw bits); onnx 1.17's to_array reads only int32_data
    for BFLOAT16, so the bits are read under the stored type and then viewed as the declared one.
    """
    from onnx import numpy_helper
    from onnx import _custom_element_types as custom
    arr = numpy_helper.to_array(tensor)
    if elem == 16 and not arr.dtype.names:
        arr = arr.view(custom.bfloat16)
    return arr


def value_from_stored(tensor, elem: int) -> tuple[int, object]:
    """Return (element type, natural values) of a stored output, as its graph output declares it."""
    elem = elem or tensor.data_type
    return elem, natural(elem, stored_array(tensor, elem))


def declared_type(model, name: str) -> int:
    """Return the element type a graph input or output declares (0 when it declares none)."""
    for v in list(model.graph.input) + list(model.graph.output):
        if v.name == name and v.type.WhichOneof("value") == "tensor_type":
            return v.type.tensor_type.elem_type
    return 0


def value_from_ortvalue(ov) -> tuple[int, object]:
    """Return (element type, natural values) of an OrtValue, reading special types from raw memory."""
    import ctypes
    import numpy as np
    from onnx import helper
    from onnx import numpy_helper
    type_str = ov.data_type()                       # e.g. 'tensor(bfloat16)'
    elem_name = type_str[len("tensor("):-1]
    mapping = {"float": 1, "uint8": 2, "int8": 3, "uint16": 4, "int16": 5, "int32": 6, "int64": 7,
               "string": 8, "bool": 9, "float16": 10, "double": 11, "uint32": 12, "uint64": 13,
               "bfloat16": 16, "float8e4m3fn": 17, "float8e4m3fnuz": 18, "float8e5m2": 19,
               "float8e5m2fnuz": 20, "uint4": 21, "int4": 22}
    elem = mapping.get(elem_name.lower(), -1)
    if elem not in SPECIAL_TYPES:
        arr = ov.numpy()
        return (elem if elem > 0 else helper.np_dtype_to_tensor_dtype(arr.dtype)), arr
    shape = list(ov.shape())
    count = int(np.prod(shape)) if shape else 1
    nbytes = (count + 1) // 2 if elem in (21, 22) else count * np.dtype(SPECIAL_TYPES[elem][1]).itemsize
    raw = np.frombuffer(ctypes.string_at(ov.data_ptr(), nbytes), dtype=np.uint8).copy() if nbytes else \
        np.zeros(0, np.uint8)
    if elem in (21, 22):
        arr = numpy_helper.unpack_int4(raw, shape, signed=elem == 22)
        return elem, np.asarray(arr).astype(np.int8).reshape(shape)
    return elem, natural(elem, raw.view(SPECIAL_TYPES[elem][1]).reshape(shape))


def compare(a, b) -> dict:
    """Compare two (element type, values) pairs: same type, same shape, close (rtol 1e-5, atol 1e-6)."""
    import numpy as np
    (ea, va), (eb, vb) = a, b
    va, vb = np.asarray(va), np.asarray(vb)
    out = {"same_type": ea == eb, "same_shape": tuple(va.shape) == tuple(vb.shape),
           "max_abs_diff": None, "mismatches": None, "close": False}
    if not out["same_shape"]:
        return out
    if va.dtype.kind in "OUS" or vb.dtype.kind in "OUS":
        eq = np.array([x == y for x, y in zip(va.ravel().tolist(), vb.ravel().tolist())], dtype=bool)
        out["mismatches"] = int((~eq).sum())
        out["close"] = out["same_type"] and bool(eq.all())
        return out
    floaty = ea in FLOAT_TYPES or eb in FLOAT_TYPES or va.dtype.kind in "fc" or vb.dtype.kind in "fc"
    if floaty:
        fa, fb = va.astype(np.float64), vb.astype(np.float64)
        ok = np.isclose(fa, fb, rtol=RTOL, atol=ATOL, equal_nan=True)
        diff = np.where(np.isnan(fa) & np.isnan(fb), 0.0, np.abs(fa - fb))
        diff = np.where(fa == fb, 0.0, diff)                    # equal infinities
    else:
        ok = va.astype(object) == vb.astype(object)            # exact, no int64 -> float64 rounding
        ok = np.asarray(ok, dtype=bool)
        diff = np.abs(va.astype(np.float64) - vb.astype(np.float64))
    out["mismatches"] = int((~ok).sum())
    out["max_abs_diff"] = float(np.nanmax(np.where(np.isnan(diff), np.inf, diff))) if diff.size else 0.0
    out["close"] = out["same_type"] and bool(ok.all())
    return out

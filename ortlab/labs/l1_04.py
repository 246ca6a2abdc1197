"""Exercises of the walkthrough L1_04_pybind: which calls into the pybind11 module a Python call makes, and filling
the OrtValueVector that TrainingAgent.run_forward takes, as ORTModule does.

The calls and tensors the exercises are about are written here, so the notebook can show them; the checks live
in ortlab.labs.judges.l1_04, which traces each call on onnxruntime 1.19.2 itself (ortlab.walkthroughs.pybind's
trace_capi over onnxruntime_inference_collection.py and the module onnxruntime_pybind_state.cc builds) and builds
the vector with ORTModule's own steps (orttraining/orttraining/python/training/ortmodule/_training_manager.py,
forward), and the reference answers in solutions/walkthroughs/L1_04_pybind.py, outside the package.
No exercise compiles anything.
"""
import numpy as np
from onnx import TensorProto

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe

# --- exercise 'c_calls' ----------------------------------------------------------------------------------
SETUP = '''model = one_node_model("Relu", [(TensorProto.FLOAT, ["n"])])  # x0 -> Relu -> y0
sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
x = np.array([-1.0, 0.5, 2.0], dtype=np.float32)
value = ort.OrtValue.ortvalue_from_numpy(x)
binding = sess.io_binding()
binding.bind_cpu_input("x0", x)
binding.bind_output("y0")'''

CALLS = [  # (label, the one Python call the trace records)
    ("get_providers", 'sess.get_providers()'),
    ("bind_cpu_input", 'binding.bind_cpu_input("x0", x)'),
    ("bind_output", 'binding.bind_output("y0", "cpu")'),
    ("run_with_iobinding", 'sess.run_with_iobinding(binding)'),
    ("numpy", 'value.numpy()'),
    ("set_providers", 'sess.set_providers(["CPUExecutionProvider"])'),
]
CALL_LABELS = [label for label, _ in CALLS]


def show_calls():
    """The setup and the calls, as code."""
    lines = [f"# setup (a new session for each call)\n{SETUP}\n", "# the calls, each traced alone"]
    lines += [f"{code:48} # {label}" for label, code in CALLS]
    return "\n".join(lines)


def traced_calls(label):
    """The calls into the pybind11 module ('C.Class.method', in order) that CALLS[label] makes on onnxruntime
    1.19.2, recorded by ortlab.walkthroughs.pybind.trace_capi after SETUP ran on a new session."""

    import onnxruntime as ort  # heavy: onnxruntime
    from ortlab.onnx_defs import one_node_model  # lazy: loaded only when this runs
    from ortlab.walkthroughs import pybind as pbv  # lazy: loaded only when this runs

    namespace = {"np": np, "ort": ort, "TensorProto": TensorProto, "one_node_model": one_node_model}
    exec(SETUP, namespace)  # noqa: S102 - the setup above
    with pbv.trace_capi() as trace:
        exec(dict(CALLS)[label], namespace)  # noqa: S102 - one call of CALLS
    return trace.names("pybind")


@probe
def predicted_calls(fn):
    """The learner's fn(), as {label: [call names]}."""
    found = fn()
    if not isinstance(found, dict):
        raise CheckFailed(f"return a dict {{call label: [the pybind calls it makes, in order]}}, not "
                          f"{type(found).__name__}")
    out = {}
    for label, names in found.items():
        if isinstance(names, str) or not isinstance(names, (list, tuple)):
            raise CheckFailed(f"for {label!r} give a list of names such as ['C.InferenceSession.run'] ([] for none), "
                              f"not {names!r}")
        if not all(isinstance(n, str) for n in names):
            raise CheckFailed(f"for {label!r} give the calls as strings such as 'C.InferenceSession.run'")
        out[str(label)] = [str(n) for n in names]
    return out


def check_c_calls(fn):
    """Exercise 'c_calls': fn() -> {label: the pybind11 calls CALLS[label] makes, in order}, checked against
    trace_capi on onnxruntime 1.19.2."""
    judge("c_calls", "l1_04.c_calls", learner(fn))


# --- exercise 'forward_inputs' -----------------------------------------------------------------------------
def forward_tensors(case):
    """The torch tensors of one case of the check: (names, tensors). Case 0 is the one the notebook shows."""
    import torch  # heavy: torch

    made = {
        "batch": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 4,
        "labels": torch.tensor([2, 0, 1]),
        "mask": torch.tensor([[True, False, True, True], [False, False, True, False], [True, True, True, False]]),
        "scale": torch.tensor(0.5),
        "transposed": (torch.arange(12, dtype=torch.float32).reshape(4, 3) - 6).t(),  # a view: not contiguous
    }
    names = [["batch", "labels", "mask", "scale", "transposed"], ["mask", "transposed", "batch"],
             ["labels", "scale"]][case]
    return names, [made[n] for n in names]


FORWARD_CASES = (0, 1, 2)


def describe_tensors(tensors):
    """One line per tensor: dtype, shape, strides, contiguous."""
    return "\n".join(f"{i}: {str(t.dtype).replace('torch.', ''):8} shape {list(t.shape)!s:8} strides {t.stride()!s:8} "
                     f"contiguous {t.is_contiguous()}" for i, t in enumerate(tensors))


def _element(vector, index, tensor):
    """What element `index` of a C.OrtValueVector holds: ONNX element type, shape, values, and whether it shares
    `tensor`'s memory."""
    import torch  # heavy: torch

    elem_type = int(vector.element_type_at(index))
    view = torch.utils.dlpack.from_dlpack(vector.dlpack_at(index))  # a bool element comes back as uint8
    start = view.data_ptr()
    storage = tensor.untyped_storage()
    low, high = storage.data_ptr(), storage.data_ptr() + storage.nbytes()
    return {"type": elem_type, "shape": [int(d) for d in view.shape], "values": view.numpy().copy(),
            "shares": bool(view.numel() and low <= start < high)}


def _dlpack_refusal(exc):
    text = str(exc)
    if "dlpack_converter" not in text:
        return None
    if "Unsupported code" in text:
        return ("ORT 1.19.2 refused a DLPack capsule of a bool tensor ('Unsupported code 6': torch 2.6 marks bool as "
                "DLPack's kDLBool, which ORT's converter does not know): pass it as uint8, t.to(torch.uint8), and "
                "tell push_back it is bool, push_back(capsule, True)")
    if "IsContiguousTensor" in text:
        return ("ORT 1.19.2 refused a DLPack capsule of a non-contiguous tensor ('ORT only supports contiguous tensor "
                "for now'): a strided view must become dense first, t.contiguous(), a copy ORTModule makes too")
    return f"ORT refused a DLPack capsule: {text.strip().splitlines()[0][-200:]}"


def ortvalue_vector_report(vector, tensors):
    """[element dicts] of a C.OrtValueVector built from `tensors` (or CheckFailed saying what to return)."""
    from onnxruntime.capi import _pybind_state as C  # heavy: onnxruntime

    if not isinstance(vector, C.OrtValueVector):
        raise CheckFailed(f"return a C.OrtValueVector (what TrainingAgent.run_forward takes: "
                          f"vector = C.OrtValueVector(), then vector.push_back(...)), not {type(vector).__name__}")
    return {"length": len(vector), "elements": [_element(vector, i, t) for i, t in enumerate(tensors)
                                                if i < len(vector)]}


@probe
def vector_built(fn, case):
    """The learner's fn(tensors of `case`), as data: the vector's elements, or {"refused": why} when ORT refused a
    DLPack capsule the learner's code gave it."""
    _, tensors = forward_tensors(case)
    try:
        vector = fn(list(tensors))
    except RuntimeError as exc:
        why = _dlpack_refusal(exc)
        if why:
            return {"refused": why}
        raise
    return ortvalue_vector_report(vector, tensors)


def check_forward_inputs(fn):
    """Exercise 'forward_inputs': fn(tensors) -> a C.OrtValueVector of them as run_forward takes it, checked against
    the vector ORTModule's TrainingManager.forward builds from the same tensors."""
    judge("forward_inputs", "l1_04.forward_inputs", learner(fn))

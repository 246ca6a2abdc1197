"""The checks of L1_04's exercises (run where the learner's code cannot reach them).

'c_calls' traces each call on onnxruntime 1.19.2 itself (ortlab.walkthroughs.pybind.trace_capi: sys.setprofile's
'c_call' events for the pybind11 module's functions, and its classes' constructors); the reasons are read in the
installed onnxruntime/capi/onnxruntime_inference_collection.py. 'forward_inputs' builds the vector with the steps of
ORTModule's TrainingManager.forward (orttraining/orttraining/python/training/ortmodule/_training_manager.py: a
non-contiguous input made contiguous, _utils._torch_tensor_to_dlpack, push_back(capsule, is bool)) and compares
each element with the learner's.
"""
import numpy as np

from ortlab.labs.checks import CheckFailed, same_keys
from ortlab.labs.l1_04 import (CALL_LABELS, FORWARD_CASES, forward_tensors, ortvalue_vector_report, predicted_calls,
                               traced_calls, vector_built)

WHY = {
    "get_providers": "get_providers() makes no C call: Session.__init__ asked the C session once, when it was built "
                     "(self._providers = self._sess.get_providers()), and get_providers returns that list",
    "bind_cpu_input": "the Python method bind_cpu_input is one call of the C binding's bind_input "
                      "(self._iobinding.bind_input(name, arr_on_cpu))",
    "bind_output": "bind_output(name, 'cpu') with no buffer first builds a C.OrtDevice: "
                   "get_ort_device_type('cpu') returns C.OrtDevice.cpu(), then C.OrtDevice.default_memory(), then the "
                   "C.OrtDevice constructor, and then the C binding's bind_output(name, device)",
    "run_with_iobinding": "run_with_iobinding is one C call, C.InferenceSession.run_with_iobinding, on the C "
                          "binding (self._sess.run_with_iobinding(iobinding._iobinding, run_options))",
    "numpy": "OrtValue.numpy() is one C call, C.OrtValue.numpy, on the C value the Python OrtValue keeps",
    "set_providers": "set_providers rebuilds the C session (_reset_session -> _create_inference_session): the same "
                     "calls as building the session, from C.get_available_providers to "
                     "C.InferenceSession.get_provider_options",
}


def _c_functions():
    """Every 'C.Class.method' and 'C.function' of the pybind11 module."""
    from ortlab.walkthroughs import pybind as pbv  # lazy: loaded only when this runs

    found = set(pbv.pybind_names().values())
    found.update(f"C.{cls.__name__}.__init__" for cls in pbv._pybind_classes())
    return found


def _methods_of(name):
    cls = name.split(".")[1] if name.count(".") >= 2 else None
    return sorted(n.split(".")[2] for n in _c_functions() if cls and n.startswith(f"C.{cls}.") and n.count(".") == 2)


def c_calls(remote, fn):
    got = remote.call(predicted_calls, fn)
    same_keys(got, CALL_LABELS, "call", "the list of pybind calls (or [])")
    known = _c_functions()
    for label in CALL_LABELS:
        said, truth = got[label], traced_calls(label)
        for name in said:
            if not name.startswith("C."):
                raise CheckFailed(f"{label}: {name!r} is not a call into the pybind11 module; name each as the trace "
                                  "prints it, 'C.Class.method' (C is onnxruntime.capi._pybind_state), never the "
                                  "Python layer's methods")
            if name not in known:
                methods = _methods_of(name)
                listed = f" (C.{name.split('.')[1]} has {', '.join(methods)})" if methods else ""
                raise CheckFailed(f"{label}: the pybind11 module has no {name}{listed}: {WHY[label]}")
        if said == truth:
            continue
        if sorted(said) == sorted(truth):
            raise CheckFailed(f"{label}: the right calls in the wrong order; ORT makes them as {truth}")
        extra = [n for n in said if n not in truth]
        missing = [n for n in truth if n not in said]
        if extra:
            raise CheckFailed(f"{label}: {_listed(extra)} {'is' if len(extra) == 1 else 'are'} not among the calls "
                              f"it makes ({truth or 'none'}): "
                              f"{WHY[label]}")
        if missing:
            raise CheckFailed(f"{label}: {_listed(missing)} {'is' if len(missing) == 1 else 'are'} missing "
                              f"({len(truth)} calls: {truth}): {WHY[label]}")
        raise CheckFailed(f"{label}: ORT makes {truth}, each as many times as listed; you said {said}")
    return None


def _listed(names):
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


TYPE_NAMES = {1: "float", 7: "int64", 9: "bool", 2: "uint8"}


def ortmodule_vector(tensors):
    """The C.OrtValueVector ORTModule's TrainingManager.forward builds from `tensors` (ORT's own helpers)."""
    import torch  # heavy: torch
    from onnxruntime.capi import _pybind_state as C  # heavy: onnxruntime
    from onnxruntime.training.ortmodule import _utils  # heavy: onnxruntime

    vector = C.OrtValueVector()
    vector.reserve(len(tensors))
    for tensor in tensors:
        if not tensor.is_contiguous():
            tensor = tensor.contiguous()
        vector.push_back(_utils._torch_tensor_to_dlpack(tensor), tensor.dtype == torch.bool)
    return vector


def forward_inputs(remote, fn):
    for case in FORWARD_CASES:
        names, tensors = forward_tensors(case)
        truth = ortvalue_vector_report(ortmodule_vector(tensors), tensors)
        got = remote.call(vector_built, fn, case)
        where = f"tensors {names}"
        if "refused" in got:
            raise CheckFailed(f"{where}: {got['refused']}")
        if got["length"] != truth["length"]:
            raise CheckFailed(f"{where}: your vector holds {got['length']} OrtValues; run_forward needs one per "
                              f"tensor, in order: {truth['length']}")
        for index, (name, mine, want) in enumerate(zip(names, got["elements"], truth["elements"])):
            at = f"{where}: element {index} ({name})"
            if mine["type"] != want["type"]:
                said, wanted = TYPE_NAMES.get(mine["type"], mine["type"]), TYPE_NAMES.get(want["type"], want["type"])
                hint = (": a bool tensor goes through DLPack as uint8, and push_back(capsule, True) tells ORT to read "
                        "those bytes as bool (ORTModule passes input.dtype == torch.bool)"
                        if wanted == "bool" else "")
                raise CheckFailed(f"{at}: ORT reads it as {said}, ORTModule's vector as {wanted}{hint}")
            if mine["shape"] != want["shape"] or not np.array_equal(mine["values"], want["values"]):
                raise CheckFailed(f"{at}: holds shape {mine['shape']} and values other than the tensor's (ORTModule's "
                                  f"holds shape {want['shape']}): one OrtValue per tensor, in the order given")
            if want["shares"] and not mine["shares"]:
                raise CheckFailed(f"{at} is a copy: ORTModule's OrtValue shares the tensor's memory (a DLPack capsule "
                                  "of a dense tensor hands its pointer to ORT); a copy per step costs memory and time")
    return None

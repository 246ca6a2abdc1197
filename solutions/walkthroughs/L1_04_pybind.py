"""Reference answers to the exercises of notebooks/L1_04_pybind.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

_CALLS = {
    "get_providers": [],  # answered from the list Session.__init__ kept
    "bind_cpu_input": ["C.SessionIOBinding.bind_input"],
    "bind_output": ["C.OrtDevice.cpu", "C.OrtDevice.default_memory", "C.OrtDevice.__init__",
                    "C.SessionIOBinding.bind_output"],
    "run_with_iobinding": ["C.InferenceSession.run_with_iobinding"],
    "numpy": ["C.OrtValue.numpy"],
    "set_providers": ["C.get_available_providers", "C.get_default_session_options", "C.InferenceSession.__init__",
                      "C.InferenceSession.initialize_session", "C.InferenceSession.get_providers",
                      "C.InferenceSession.get_provider_options"],  # the session is built again
}


def _calls(**changes):
    return "return {\n" + "".join(f"    {k!r}: {v!r},\n" for k, v in dict(_CALLS, **changes).items()) + "}\n"


_VECTOR = '''
vector = C.OrtValueVector()
for t in tensors:
    {contiguous}
    is_bool = t.dtype == torch.bool
    vector.push_back({capsule}, {flag})
return vector
'''


def _vector(contiguous="t = t if t.is_contiguous() else t.contiguous()  # ORT reads dense memory only: a copy",
            capsule="torch.utils.dlpack.to_dlpack(t.to(torch.uint8) if is_bool else t)",
            flag="is_bool"):
    return _VECTOR.format(contiguous=contiguous, capsule=capsule, flag=flag)


ANSWERS = {
    "c_calls": _calls(),
    "forward_inputs": _vector(),  # DLPack shares each dense tensor's memory; bool goes as uint8, flagged
}

MISTAKES = {
    "c_calls": [
        (_calls(get_providers=["C.InferenceSession.get_providers"]), "makes no C call"),
        (_calls(bind_cpu_input=["C.SessionIOBinding.bind_cpu_input"]), "is one call of the C binding's bind_input"),
        (_calls(bind_output=["C.SessionIOBinding.bind_output"]), "builds a C.OrtDevice"),
        (_calls(bind_output=["C.OrtDevice.__init__", "C.OrtDevice.cpu", "C.OrtDevice.default_memory",
                             "C.SessionIOBinding.bind_output"]), "wrong order"),
        (_calls(run_with_iobinding=["Session.run_with_iobinding"]), "not a call into the pybind11 module"),
        (_calls(set_providers=["C.InferenceSession.set_providers"]), "rebuilds the C session"),
    ],
    "forward_inputs": [
        (_vector(flag="False"), "push_back(capsule, True) tells ORT"),
        (_vector(capsule="torch.utils.dlpack.to_dlpack(t)"), "pass it as uint8"),
        (_vector(contiguous="pass  # the tensor as it lies"), "t.contiguous()"),
        (_vector(capsule="torch.utils.dlpack.to_dlpack((t.to(torch.uint8) if is_bool else t).clone())"),
         "is a copy"),
        ('''
return [C.OrtValue.from_dlpack(torch.utils.dlpack.to_dlpack(t.contiguous().to(torch.uint8) if t.dtype == torch.bool
                                                            else t.contiguous()), t.dtype == torch.bool)
        for t in tensors]  # a list of OrtValues
''', "return a C.OrtValueVector"),
    ],
}

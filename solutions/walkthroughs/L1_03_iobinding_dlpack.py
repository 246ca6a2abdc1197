"""Reference answers to the exercises of notebooks/L1_03_iobinding_dlpack.ipynb (ortlab.labs.answers).

Each answer replaces its exercise's stub line, at the stub's indentation. Each MISTAKES entry is a usual
wrong answer and words its check must say about it (tests/labs check both).
"""

_RIGHT = {"kept_get_outputs": False, "kept_copy": True, "strided_input": False, "ortvalue_input": True,
          "float64_buffer": "error", "batch_grows": "error", "rebound_by_device": False}


def _outcomes(**changes):
    return f"return {dict(_RIGHT, **changes)!r}\n"


ANSWERS = {
    "binding_outcomes": _outcomes(),
    "bind_torch": '''
binding = sess.io_binding()
binding.bind_input("X", "cpu", 0, np.float32, list(t_x.shape), t_x.data_ptr())  # t_x's own memory, no copy
binding.bind_output("Y", "cpu", 0, np.float32, list(t_y.shape), t_y.data_ptr())  # ORT writes Y into t_y
return binding
''',
}

MISTAKES = {
    "binding_outcomes": [
        (_outcomes(kept_get_outputs=True), "writes over it"),
        (_outcomes(strided_input=True), "not C-contiguous"),
        (_outcomes(float64_buffer=False), "Unexpected output data type"),
        (_outcomes(batch_grows=True), "shape verification failed"),
        (_outcomes(rebound_by_device=True), "replaces what the binding held"),
    ],
    "bind_torch": [
        ('''
binding = sess.io_binding()
binding.bind_input("X", "cpu", 0, np.float32, list(t_x.shape), t_x.data_ptr())
binding.bind_output("Y", "cpu")
return binding
''', "t_y was not written"),
        ('''
binding = sess.io_binding()
binding.bind_cpu_input("X", t_x.numpy().copy())
binding.bind_output("Y", "cpu", 0, np.float32, list(t_y.shape), t_y.data_ptr())
return binding
''', "a copy of t_x made when you bound it"),
        ('''
binding = sess.io_binding()
binding.bind_cpu_input("X", t_x.numpy())
binding.bind_output("Y", "cpu", 0, np.float32, [4, 8], t_y.data_ptr())
return binding
''', "take the shape from the tensor"),
        ('''
binding = sess.io_binding()
binding.bind_input("X", "cpu", 0, np.float32, [4, 8], t_x.data_ptr())
binding.bind_output("Y", "cpu", 0, np.float32, [4, 8], t_y.data_ptr())
return binding
''', "wrote past the end of t_y"),
        ('''
binding = sess.io_binding()
binding.bind_input("X", "cpu", 0, np.float32, list(t_x.shape), t_x.data_ptr())
binding.bind_output("Y", "cpu", 0, np.float32, list(t_y.shape), t_y.data_ptr())
sess.run_with_iobinding(binding)
return binding.copy_outputs_to_cpu()
''', "return the binding itself"),
    ],
}

"""ortlab.walkthroughs.pybind: the trace of calls into onnxruntime's Python layer and pybind11 module
(checked against ORT 1.19.2's own Python source), the layer table, the training views against torch
and the C++ extension's views against ORT's GeluGrad.

test_a_broken_build_fails_once_and_its_message_is_kept compiles a broken source in the real cache folder
the first time on a machine (~30-40 s on 2 cores), so that the L1_04 notebook reads the message back.
"""
import inspect
import re
import sys

import numpy as np
import pytest
import torch
from onnx import TensorProto

from ortlab import models
from ortlab.env import quiet_import
from ortlab.onnx_defs import one_node_model
from ortlab.walkthroughs import pybind as pbv

ort = quiet_import("onnxruntime")
C = quiet_import("onnxruntime.capi._pybind_state")
collection = quiet_import("onnxruntime.capi.onnxruntime_inference_collection")


def _relu_bytes():
    return one_node_model("Relu", [(TensorProto.FLOAT, ["n"])]).SerializeToString()


def _session():
    return ort.InferenceSession(_relu_bytes(), providers=["CPUExecutionProvider"])


def _under(calls, parent, child):
    """True when `child` is recorded inside the call `parent` (deeper, before the parent returns)."""
    names = [c.name for c in calls]
    start = names.index(parent)
    depth = calls[start].depth
    for call in calls[start + 1:]:
        if call.depth <= depth:
            return False
        if call.name == child:
            return True
    return False


# --- the trace ------------------------------------------------------------------------------------------
def test_construction_calls_the_c_session_as_orts_python_source_says():
    source = inspect.getsource(collection.InferenceSession._create_inference_session)
    assert "C.InferenceSession(" in source and ".initialize_session(" in source  # the reference
    with pbv.trace_capi() as trace:
        sess = _session()
    names = trace.names()
    assert names[0] == "onnxruntime_inference_collection.InferenceSession.__init__"
    create = "onnxruntime_inference_collection.InferenceSession._create_inference_session"
    assert _under(trace.calls, create, "C.InferenceSession.__init__")
    assert _under(trace.calls, create, "C.InferenceSession.initialize_session")
    assert names.index("C.InferenceSession.__init__") < names.index("C.InferenceSession.initialize_session")
    assert type(sess._sess) is C.InferenceSession
    assert "C.get_available_providers" in trace.names("pybind")
    assert all(n.startswith("onnxruntime_inference_collection.") for n in trace.names("python"))


def test_run_goes_through_session_run_to_the_c_run():
    sess = _session()
    assert "self._sess.run(" in inspect.getsource(collection.Session.run)
    with pbv.trace_capi() as trace:
        (y,) = sess.run(None, {"x0": np.array([-1.0, 2.0], np.float32)})
    np.testing.assert_array_equal(y, [0.0, 2.0])
    assert _under(trace.calls, "onnxruntime_inference_collection.Session.run", "C.InferenceSession.run")
    assert trace.names("pybind") == ["C.InferenceSession.run"]
    assert "    C.InferenceSession.run" in trace.text().splitlines()


def test_the_trace_records_c_calls_made_directly_and_leaves_everything_as_it_was():
    before_profile, init = sys.getprofile(), vars(C.InferenceSession)["__init__"]
    sess = _session()
    with pytest.raises(RuntimeError):
        with pbv.trace_capi() as trace:
            sess._sess.get_providers()
            C.OrtValueVector()
            raise RuntimeError("inside the block")
    assert trace.names() == ["C.InferenceSession.get_providers", "C.OrtValueVector.__init__"]
    assert [c.depth for c in trace.calls] == [0, 0]
    assert sys.getprofile() is before_profile and vars(C.InferenceSession)["__init__"] is init
    assert _session().run(None, {"x0": np.ones(2, np.float32)})[0].tolist() == [1.0, 1.0]


def test_pybind_names_name_each_method_by_its_class():
    names = pbv.pybind_names()
    assert names[id(vars(C.InferenceSession)["run"].__func__)] == "C.InferenceSession.run"
    assert names[id(vars(C.TrainingAgent)["run_forward"].__func__)] == "C.TrainingAgent.run_forward"
    assert names[id(C.get_available_providers)] == "C.get_available_providers"


# --- the layers ------------------------------------------------------------------------------------------
def test_layer_table_names_the_python_file_and_the_c_class_behind_it():
    sess = _session()
    binding = sess.io_binding()
    table = pbv.layer_table(sess=sess, binding=binding)
    rows = {r[0]: r for r in table.rows}
    python_file = inspect.getsourcefile(ort.InferenceSession)
    assert python_file.endswith(rows["sess"][2]) and rows["sess"][2].startswith("onnxruntime/capi/")
    assert rows["sess._sess"][1:3] == ("C.InferenceSession", "onnxruntime/python/onnxruntime_pybind_state.cc")
    assert rows["binding._iobinding"][1] == "C.SessionIOBinding"
    assert type(binding._iobinding) is C.SessionIOBinding
    assert pbv.layer_table(agent_state=C.PartialGraphExecutionState()).rows[0][2].startswith("orttraining/")
    with pytest.raises(pbv.PybindViewError, match="keeps no pybind11 object"):
        pbv.c_object(np.ones(2))


def test_every_mapped_name_is_a_class_of_the_pybind_module():
    assert all(getattr(C, name).__module__ == pbv.PYBIND_MODULE for name in pbv.PYBIND_SOURCES)
    assert C.InferenceSession.__module__ == pbv.PYBIND_MODULE


def test_pybind_methods_cover_what_the_python_session_calls_on_sess():
    called = set(re.findall(r"self\._sess\.(\w+)\(", inspect.getsource(collection)))
    methods = pbv.pybind_methods(_session()._sess)
    assert {"run", "initialize_session", "run_with_iobinding"} <= set(methods)
    assert called - {"get_profiling_start_time_ns"} <= set(methods) | {
        n for n, m in vars(C.InferenceSession).items() if isinstance(m, property)}
    with pytest.raises(pbv.PybindViewError, match="pass sess._sess"):
        pbv.pybind_methods(_session())


# --- the training classes --------------------------------------------------------------------------------
def test_gradient_table_is_within_the_bound_for_the_training_agent_and_shows_a_gap_over_it():
    from ortlab.ortmodule.training_agent import ModuleTrainingAgent, torch_gradients

    mlp = models.get("mlp", dropout=0.0)
    x, labels = mlp.example_inputs()
    _, grads = ModuleTrainingAgent(mlp, x, labels).gradients(x, labels)
    _, reference = torch_gradients(mlp, x, labels)
    table = pbv.gradient_table(grads, reference)
    assert [r[0] for r in table.rows] == [n for n, _ in mlp.named_parameters()]
    assert all(r[2] == "< 1e-05" for r in table.rows) and pbv.max_gap(grads, reference) < 1e-5
    assert table.rows[0][1] == tuple(mlp.net[0].weight.shape)
    off = dict(grads)
    name = next(iter(off))
    off[name] = off[name] + 1e-3
    assert pbv.gradient_table(off, reference).rows[0][2] == "1.0e-03 (over 1e-05)"
    with pytest.raises(pbv.PybindViewError, match="only ours \\[\\]"):
        pbv.gradient_table({}, reference)


def test_memory_pattern_table_shows_the_loss_overwritten_only_with_the_pattern_on():
    from ortlab.ortmodule.training_agent import torch_gradients

    mlp = models.get("mlp", dropout=0.0)
    x, labels = mlp.example_inputs()
    loss = f"{float(torch_gradients(mlp, x, labels)[0][0]):.4f}"
    table = pbv.memory_pattern_table(mlp, x, labels)
    off, on = (dict(zip(table.header, r)) for r in table.rows)
    assert off["after run_forward"] == on["after run_forward"] == off["after run_backward"] == loss
    assert off["still the loss"] is True and on["still the loss"] is False
    assert on["after run_backward"] != loss


# --- the C++ extension ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def ext():
    from ortlab.engine import cpp_extension as cpp

    return cpp.build()


def test_gelu_grad_check_is_within_the_bound_of_numpy_and_ort(ext):
    table = pbv.gelu_grad_check(n=512)
    assert [r[0] for r in table.rows] == ["numpy reference (float64)", "ORT 1.19.2 GeluGrad (CPU)"]
    assert all(r[1] == 512 and r[2] == "< 1e-06" for r in table.rows)


def test_zero_copy_table_compares_the_addresses_python_and_cpp_see(ext):
    array = np.ones(16, np.float32)
    tensor = torch.from_numpy(array[8:])  # a view: its own address, 32 bytes further
    table = pbv.zero_copy_table(array=array, tensor=tensor)
    assert table.rows == [("array", "numpy", "ctypes.data", True), ("tensor", "torch", "data_ptr()", True)]
    from ortlab.engine import cpp_extension as cpp

    assert cpp.data_pointer(tensor) - cpp.data_pointer(array) == 32


def test_refusal_shows_the_error_a_learner_meets_and_refuses_a_call_that_works(ext):
    from ortlab.engine import cpp_extension as cpp

    x = np.ones(4, np.float32)
    message = pbv.refusal(cpp.gelu_grad, x, x.astype(np.float64))
    assert message.startswith("CppExtensionError: C++ gelu_grad refused: x has buffer format 'd'")
    with pytest.raises(pbv.PybindViewError, match="accepted its arguments"):
        pbv.refusal(cpp.gelu_grad, x, x)


def test_a_broken_build_fails_once_and_its_message_is_kept():
    first = pbv.build_failure()
    message = first.message
    assert re.search(r"<cache>/ortlab_broken_<hash>/main\.cpp:2:35: error: 'vv' was not declared in this scope",
                     message)
    assert "2 | float twice(float v) { return 2 * vv; }" in message and "Fix the source" in message
    assert "\u2018" not in message and "\u2019" not in message
    again = pbv.build_failure()
    assert again.cached and again.message == message and again.seconds < 1.0


def test_plot_gelu_grad_times_draws_three_curves(monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    monkeypatch.setattr(plt, "show", lambda: None)
    rows = [{"size": n, "cpp_us": n / 100, "numpy_us": n / 10, "ort_us": 5 + n / 50} for n in (1024, 4096)]
    pbv.plot_gelu_grad_times(rows)
    axes = plt.gcf().axes[0]
    assert len(axes.lines) == 3 and axes.get_xscale() == "log"
    plt.close("all")
    with pytest.raises(pbv.PybindViewError, match="no timing rows"):
        pbv.plot_gelu_grad_times([])


def test_text_collapses_a_call_repeated_right_after_itself_and_cuts_at_a_depth():
    g = pbv.Call("pybind", "C.g", 1)
    trace = pbv.CapiTrace([pbv.Call("python", "f", 0), g, g, pbv.Call("pybind", "C.h", 1), g])
    assert trace.text() == "f\n    C.g  (x2)\n    C.h\n    C.g"
    assert trace.text(collapse=False).count("C.g") == 3 and trace.text(max_depth=0) == "f"

"""L1_04's exercises are judged by onnxruntime 1.19.2 itself: 'c_calls' by tracing each call, 'forward_inputs' by the
vector ORTModule's steps build. Here the trace is checked against the Python layer's source read statically (each
C function traced is named in the source of the method called, and exists in the pybind11 module; set_providers
makes exactly the calls of building a session), and ORTModule's vector against torch's own view of each tensor and
against ortlab's TrainingAgent driver, which builds its feeds its own way.
"""
import inspect

import numpy as np
import onnx
import pytest
import torch

from ortlab.env import quiet_import
from ortlab.labs import l1_04
from ortlab.labs.judges.l1_04 import _c_functions, ortmodule_vector
from ortlab.walkthroughs import pybind as pbv

ort = quiet_import("onnxruntime")

PYTHON_METHODS = {"get_providers": ort.InferenceSession.get_providers,
                  "bind_cpu_input": ort.IOBinding.bind_cpu_input, "bind_output": ort.IOBinding.bind_output,
                  "run_with_iobinding": ort.InferenceSession.run_with_iobinding, "numpy": ort.OrtValue.numpy}


@pytest.mark.parametrize("label", l1_04.CALL_LABELS)
def test_every_traced_call_is_a_function_of_the_pybind_module(label):
    assert set(l1_04.traced_calls(label)) <= _c_functions()


@pytest.mark.parametrize("label", list(PYTHON_METHODS))
def test_each_traced_method_is_named_in_the_python_source_and_nothing_else_is_called_on_the_c_object(label):
    source = inspect.getsource(PYTHON_METHODS[label])
    traced = [name for name in l1_04.traced_calls(label) if not name.startswith("C.OrtDevice")]
    for name in traced:
        assert f".{name.rsplit('.', 1)[1]}(" in source, (name, source)
    c_object_calls = [line for line in source.splitlines() if "self._sess." in line or "self._iobinding." in line
                      or "self._ortvalue." in line]
    assert bool(c_object_calls) == bool(traced), c_object_calls


def test_bind_output_to_a_device_builds_the_ortdevice_its_source_names():
    source = inspect.getsource(ort.IOBinding.bind_output)
    assert "C.OrtDevice(" in source and "C.OrtDevice.default_memory()" in source
    collection = quiet_import("onnxruntime.capi.onnxruntime_inference_collection")
    assert "C.OrtDevice.cpu()" in inspect.getsource(collection.get_ort_device_type)


def test_set_providers_makes_the_calls_of_building_a_session():
    from onnx import TensorProto

    from ortlab.onnx_defs import one_node_model

    model = one_node_model("Relu", [(TensorProto.FLOAT, ["n"])])
    with pbv.trace_capi() as built:
        ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert l1_04.traced_calls("set_providers") == built.names("pybind")


ONNX_TYPE = {torch.float32: onnx.TensorProto.FLOAT, torch.int64: onnx.TensorProto.INT64,
             torch.bool: onnx.TensorProto.BOOL}


@pytest.mark.parametrize("case", l1_04.FORWARD_CASES)
def test_ortmodules_vector_holds_each_tensor_sharing_memory_when_dense_and_not_bool(case):
    _, tensors = l1_04.forward_tensors(case)
    report = l1_04.ortvalue_vector_report(ortmodule_vector(tensors), tensors)
    assert report["length"] == len(tensors)
    for tensor, element in zip(tensors, report["elements"]):
        assert element["type"] == ONNX_TYPE[tensor.dtype]
        assert element["shape"] == list(tensor.shape)
        np.testing.assert_array_equal(element["values"], tensor.numpy().astype(element["values"].dtype))
        assert element["shares"] == (tensor.is_contiguous() and tensor.dtype != torch.bool)


@pytest.mark.parametrize("case", l1_04.FORWARD_CASES)
def test_ortmodules_vector_is_the_one_ortlabs_training_agent_feeds(case):
    from ortlab.ortmodule.training_agent import _ortvalues

    _, tensors = l1_04.forward_tensors(case)
    ours = l1_04.ortvalue_vector_report(_ortvalues(tensors), tensors)
    theirs = l1_04.ortvalue_vector_report(ortmodule_vector(tensors), tensors)
    for mine, want in zip(ours["elements"], theirs["elements"]):
        assert (mine["type"], mine["shape"], mine["shares"]) == (want["type"], want["shape"], want["shares"])
        np.testing.assert_array_equal(mine["values"], want["values"])

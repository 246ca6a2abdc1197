"""L1_03's exercises are judged by onnxruntime 1.19.2 itself. Here what ORT does is checked independently:
'binding_outcomes' against ortlab.engine's io_binding (ORT's semantics, written from IOBinding.cc and
execution_frame.cc) run on the same scenarios, and the refusals against the words the check quotes;
'bind_torch' against numpy's Y for each batch, with the ORTModule way (a dlpack OrtValue) accepted as well.
"""
import contextlib
import io

import numpy as np
import pytest

from ortlab.engine import InferenceSession, SessionOptions
from ortlab.labs import l1_03
from ortlab.labs.judges.l1_03 import WHY, _ort_y, bind_torch_batches
from ortlab.walkthroughs import iobinding_dlpack as bv


def _ortlab_session(model):
    return InferenceSession(model, SessionOptions(graph_optimization_level=0))


def _run(code, sess):
    namespace = {"np": np, "bv": bv, "ort": __import__("onnxruntime")}
    exec(l1_03.SETUP, namespace)
    namespace["sess"] = sess
    exec(code, namespace)
    return namespace


@pytest.mark.parametrize("label", l1_03.LABELS)
def test_each_scenario_ends_on_ort_as_on_ortlabs_binding(label):
    # ortlab's get_outputs() returns the arrays themselves (ORT: OrtValues viewing the binding's slots)
    code = dict(l1_03.SCENARIOS)[label].replace("b.get_outputs()[0].numpy()", "b.get_outputs()[0]")
    try:
        mirrored = bool(_run(code, _ortlab_session(bv.mlp_model()))["answer"])
    except Exception:
        mirrored = "error"
    assert l1_03.scenario_outcome(label) == mirrored


@pytest.mark.parametrize("label, quoted", [("float64_buffer", "Unexpected output data type"),
                                           ("batch_grows", "OrtValue shape verification failed")])
def test_the_refusals_say_what_the_check_quotes(label, quoted):
    assert f"'{quoted}'" in WHY[label]
    with pytest.raises(Exception) as raised:
        _run(dict(l1_03.SCENARIOS)[label], bv.ort_session(bv.mlp_model()))
    assert quoted in str(raised.value)


def test_a_kept_get_outputs_view_holds_run_twos_values_and_the_strided_bind_read_the_old_ones():
    ns = _run(dict(l1_03.SCENARIOS)["kept_get_outputs"], bv.ort_session(bv.mlp_model()))
    np.testing.assert_allclose(ns["kept"], bv.mlp_reference(2 * ns["x"])[0], atol=1e-5)
    ns = _run(dict(l1_03.SCENARIOS)["strided_input"], bv.ort_session(bv.mlp_model()))
    np.testing.assert_allclose(ns["b"].copy_outputs_to_cpu()[0], bv.mlp_reference(ns["x"])[0], atol=1e-5)


@pytest.mark.parametrize("rows", [3, 5])
def test_orts_y_for_the_checks_batches_is_numpys(rows):
    for batch in bind_torch_batches(rows, runs=2, seed=rows):
        np.testing.assert_allclose(_ort_y(batch), bv.mlp_reference(batch)[0], rtol=1e-5, atol=1e-5)


def _verdict(fn):
    shown = io.StringIO()
    with contextlib.redirect_stdout(shown):
        l1_03.check_bind_torch(fn)
    return shown.getvalue().strip()


def test_the_ortmodule_way_passes_and_an_unwrapped_c_ortvalue_is_told_to_wrap():
    import onnxruntime as ort
    from onnxruntime.training.ortmodule import _utils

    def by_dlpack(sess, t_x, t_y):
        binding = sess.io_binding()
        binding.bind_ortvalue_input("X", ort.OrtValue(_utils._ortvalue_from_torch_tensor(t_x)))
        binding.bind_ortvalue_output("Y", ort.OrtValue(_utils._ortvalue_from_torch_tensor(t_y)))
        return binding

    def unwrapped(sess, t_x, t_y):
        binding = sess.io_binding()
        binding.bind_ortvalue_input("X", _utils._ortvalue_from_torch_tensor(t_x))
        return binding

    assert _verdict(by_dlpack) == "[PASS] exercise 'bind_torch'"
    assert "wrap it, ort.OrtValue(c_value)" in _verdict(unwrapped)

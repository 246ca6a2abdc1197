"""ortlab.walkthroughs.iobinding_dlpack (the L1_03 walkthrough's helpers) checked against onnxruntime 1.19.2
itself, numpy and torch: the pointers it compares, the frame roles it reports beside what ORT does with
the same binding, ORT's IOBinding bugs it runs in forked processes (pinned: if a newer ORT fixes one,
the test says so and the notebook needs its text changed), and the copy counts of the device paths."""
import matplotlib
import numpy as np
import pytest

from ortlab.engine import InferenceSession, SessionOptions
from ortlab.walkthroughs import iobinding_dlpack as bv
from ortlab.env import quiet_import
from ortlab.errors import OrtlabError

matplotlib.use("Agg")
ort = quiet_import("onnxruntime")


def batch(n=4, seed=0):
    return np.random.default_rng(seed).standard_normal((n, 8)).astype(np.float32)


def ortlab_session():
    return InferenceSession(bv.mlp_model(), SessionOptions(graph_optimization_level=0))


# --- models and pointers ---------------------------------------------------------------------------------
def test_the_models_run_in_ort_as_the_maths_says():
    x = batch()
    y, z = bv.ort_session().run(None, {"X": x})
    want_y, want_z = bv.mlp_reference(x)
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(z, want_z, rtol=1e-5, atol=1e-5)
    v = np.linspace(-2, 2, 9, dtype=np.float32)
    np.testing.assert_array_equal(bv.ort_session(bv.relu_model()).run(None, {"X": v})[0], np.maximum(v, 0))


def test_ort_session_raises_without_logging_the_error(capfd):
    sess = bv.ort_session()
    binding = sess.io_binding()
    binding.bind_output("Y")
    with pytest.raises(RuntimeError, match="Missing Input: X"):
        sess.run_with_iobinding(binding)
    assert "E:onnxruntime" not in capfd.readouterr().err
    assert sess.get_session_options().log_severity_level == 4


def test_data_ptr_reads_each_kind_of_buffer():
    torch = pytest.importorskip("torch")
    x = batch()
    value = ort.OrtValue.ortvalue_from_numpy(x)  # on the CPU ORT wraps the array: the same memory
    assert bv.data_ptr(x) == x.ctypes.data == value.data_ptr() == bv.data_ptr(value)
    assert bv.data_ptr(value._ortvalue) == x.ctypes.data
    t = torch.from_numpy(x)
    assert bv.data_ptr(t) == t.data_ptr() == x.ctypes.data
    for bad in (None, [1.0], "x"):
        with pytest.raises(OrtlabError, match="holds no tensor data"):
            bv.data_ptr(bad)


def test_as_numpy_is_a_view_of_ort_and_ortlab_outputs():
    x = batch()
    for sess in (bv.ort_session(), ortlab_session()):
        binding = sess.io_binding()
        binding.bind_cpu_input("X", x)
        binding.bind_output("Y")
        sess.run_with_iobinding(binding)
        out = binding.get_outputs()[0]
        view = bv.as_numpy(out)
        assert bv.data_ptr(view) == bv.data_ptr(out)
        np.testing.assert_allclose(view, bv.mlp_reference(x)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(OrtlabError, match="as_numpy"):
        bv.as_numpy([1.0])


def test_pointer_table_says_what_ort_shares_and_what_it_copies():
    x = batch()
    table = bv.pointer_table({"wrapped": (x, ort.OrtValue.ortvalue_from_numpy(x)),
                              "copied": (x, ort.OrtValue.ortvalue_from_numpy(x.copy()))})
    assert table.rows == [("wrapped", "same memory"), ("copied", "different memory")]
    with pytest.raises(OrtlabError):
        bv.pointer_table([(x, x)])


# --- the frame, beside what ORT does with the same binding ------------------------------------------------
def bind_both(buffer_for_y):
    """The same binding made on ORT and ortlab: X from numpy, Y into the caller's buffer (or allocated)."""
    x, made = batch(), {}
    for name, sess in (("ort", bv.ort_session()), ("ortlab", ortlab_session())):
        binding = sess.io_binding()
        binding.bind_cpu_input("X", x)
        if buffer_for_y:
            buffer = np.empty((4, 8), np.float32)
            binding.bind_output("Y", "cpu", 0, np.float32, [4, 8], buffer.ctypes.data)
        else:
            buffer = None
            binding.bind_output("Y", "cpu")
        sess.run_with_iobinding(binding)
        made[name] = (sess, binding, buffer)
    return x, made


def test_frame_table_the_callers_buffers_as_ort_uses_them():
    x, made = bind_both(buffer_for_y=True)
    ort_sess, ort_binding, ort_buffer = made["ort"]
    assert ort_binding.get_outputs()[0].data_ptr() == ort_buffer.ctypes.data  # ORT wrote into it
    sess, _, buffer = made["ortlab"]
    rows = bv.frame_table(sess, {"X": x, "Y": buffer}).rows
    assert rows == [("X", "feed", "yes"), ("Y", "fetch pre-placed by the binding", "yes")]
    np.testing.assert_allclose(buffer, ort_buffer, rtol=1e-6, atol=1e-6)


def test_frame_table_a_device_bound_output_is_allocated_then_pre_placed_as_in_ort():
    x, made = bind_both(buffer_for_y=False)
    ort_sess, ort_binding, _ = made["ort"]
    first_ort = ort_binding.get_outputs()[0].data_ptr()
    ort_sess.run_with_iobinding(ort_binding)
    assert ort_binding.get_outputs()[0].data_ptr() == first_ort  # ORT reuses run 1's buffer
    sess, binding, _ = made["ortlab"]
    first = binding.get_outputs()[0]
    assert bv.frame_table(sess, {"X": x}).rows[1] == ("Y", "fetch allocated by the run", "-")
    sess.run_with_iobinding(binding)
    row = bv.frame_table(sess, {"X": x, "Y": first}).rows[1]
    assert row == ("Y", "fetch pre-placed by the binding", "yes")


def test_frame_table_needs_a_run():
    with pytest.raises(OrtlabError, match="run it first"):
        bv.frame_table(ortlab_session(), {})


# --- ORT's bugs, pinned ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def outcomes():
    return bv.probe_ort_bugs(times=2)


def test_an_orphaned_ort_binding_crashes_when_used(outcomes):
    """ORT 1.19.2's Python IOBinding holds only C.SessionIOBinding(session._sess): once the
    InferenceSession is collected, the first bind dereferences a freed session."""
    runs = [o for o in outcomes if o.bug == "orphaned binding"]
    assert [o.ending for o in runs] == ["killed by SIGSEGV"] * 2
    assert all(o.lines == ["binding made; its InferenceSession has no other reference"] for o in runs)


def test_a_refused_ortvalue_bind_breaks_the_next_binds_until_cleared(outcomes):
    """IOBinding::BindInput adds the name to mapped_feed_names_ before CopyOneInputAcrossDevices fails:
    the maps are out of step and every later bind fails ORT_ENFORCE, though the value is bound."""
    for o in (o for o in outcomes if o.bug == "bind after a refused bind"):
        assert o.ending == "exit 0"
        assert o.lines[0] == "refused: Error when binding input: Could not find OrtValue with name 'nope'"
        assert all("Size mismatch:2!=1" in line for line in o.lines[1:3])
        assert o.lines[3] == "the run works, Y[0, :2] = [3.5, 3.625]"
        assert o.lines[4] == "after clear_binding_inputs(): bind X accepted"
    want = bv.mlp_reference(np.ones((4, 8), np.float32))[0][0, :2]
    np.testing.assert_allclose(want, [3.5, 3.625])  # the line above is the maths


def test_an_ort_output_kept_across_a_clear_dangles(outcomes):
    """pybind returns IOBinding::GetOutputs() by reference (reference_internal): each OrtValue from
    get_outputs() is a view of the binding's slot, destroyed by ClearOutputs()."""
    runs = [o for o in outcomes if o.bug == "output kept across a clear"]
    assert [o.ending for o in runs] == ["killed by SIGSEGV"] * 2
    assert all(o.lines == ["outputs cleared; reading the OrtValue kept from get_outputs()"] for o in runs)


def test_an_ort_output_kept_across_clear_and_rerun_shows_the_new_run():
    """The same slot refilled: the kept OrtValue reads the new result; its numpy view, taken before the
    clear, still holds the old one (the view holds the tensor)."""
    sess, x = bv.ort_session(), batch()
    binding = sess.io_binding()
    binding.bind_cpu_input("X", x)
    binding.bind_output("Y")
    sess.run_with_iobinding(binding)
    kept = binding.get_outputs()[0]
    view = bv.as_numpy(kept)
    binding.clear_binding_outputs()
    binding.bind_output("Y")
    x *= -1
    sess.run_with_iobinding(binding)
    np.testing.assert_allclose(bv.as_numpy(kept), bv.mlp_reference(x)[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(view, bv.mlp_reference(-x)[0], rtol=1e-5, atol=1e-5)


def test_a_refused_bind_cpu_input_leaves_ort_binding_usable(outcomes):
    """pybind checks bind_cpu_input's name against the model's inputs before BindInput: no damage."""
    for o in (o for o in outcomes if o.bug == "bind_cpu_input refused"):
        assert o.ending == "exit 0"
        assert o.lines == ["refused: Failed to find NodeArg with name: nope in the def list",
                           "bind X: accepted"]


def test_ortlab_keeps_what_ort_breaks():
    import gc

    binding = ortlab_session().io_binding()
    gc.collect()
    with pytest.raises(OrtlabError):
        binding.bind_ortvalue_input("nope", ort.OrtValue.ortvalue_from_numpy(batch()))
    binding.bind_cpu_input("X", batch())
    binding.bind_output("Y")
    binding.session.run_with_iobinding(binding)
    np.testing.assert_allclose(binding.get_outputs()[0], bv.mlp_reference(batch())[0], rtol=1e-5, atol=1e-5)


def test_bug_table_counts_the_endings():
    runs = [bv.Outcome("a", "killed by SIGSEGV", ["x"]), bv.Outcome("a", "exit 0", ["y"]),
            bv.Outcome("b", "exit 0", ["p", "q"])]
    assert bv.bug_table(runs).rows == [("a", "exit 0 1/2; killed by SIGSEGV 1/2", "x"),
                                       ("b", "exit 0 1/1", "p | q")]


@pytest.mark.parametrize("kwargs", [{"names": ["no such bug"]}, {"times": 0}, {"times": "3"}])
def test_probe_refuses_bad_arguments(kwargs):
    with pytest.raises(OrtlabError, match="probe_ort_bugs takes"):
        bv.probe_ort_bugs(**kwargs)


# --- copying against binding ------------------------------------------------------------------------------
def test_copy_vs_bind_ort_returns_new_arrays_and_writes_bound_outputs_in_place():
    rows = bv.copy_vs_bind(sizes=(64, 4096), repeat=1)
    assert [r.elements for r in rows] == [64, 4096] and rows[1].nbytes == 4096 * 4
    for r in rows:
        assert r.run_new_arrays and r.bind_in_place and r.equal
        assert min(r.run_s, r.run_copy_s, r.bind_s) > 0
    table = bv.cost_summary(rows)
    assert table.rows[0] == (64, "0.000244", "yes", "yes", "yes")
    bv.plot_costs(rows)
    for bad in ((0,), (True,), (2.5,)):
        with pytest.raises(OrtlabError, match="element counts"):
            bv.copy_vs_bind(sizes=bad, repeat=1)
    with pytest.raises(OrtlabError):
        bv.plot_costs([])


def test_the_copy_counter_counts_what_torch_copies():
    torch = pytest.importorskip("torch")
    t = torch.ones(3)
    with bv._CopyCounter() as counter:
        t.to(torch.float32)  # already float32: torch returns t itself
        t.to("cpu")
    assert counter.copies == 0
    with bv._CopyCounter() as counter:
        t.to(torch.float64)  # a new buffer
        torch.empty(3).copy_(t)
    assert counter.copies == 2


def test_device_copies_on_the_cpu_path():
    pytest.importorskip("torch")
    assert bv.device_copies("cpu", elements=256, runs=2) == {"copying": 0, "bound": 0, "device": "cpu",
                                                             "outputs_on": "cpu"}
    with pytest.raises(OrtlabError, match="'cpu' or 'cuda'"):
        bv.device_copies("tpu")


def test_device_copies_on_a_gpu():
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA GPU: device_copies('cuda') is run where one is lent")
    got = bv.device_copies("cuda", elements=256, runs=3)
    # one copy in and one out per run of the copying path, none when bound
    assert got == {"copying": 6, "bound": 0, "device": "cuda", "outputs_on": "cuda"}

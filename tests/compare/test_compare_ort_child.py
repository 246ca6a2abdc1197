"""`ortlab compare` runs ORT 1.19.2 in a child process: when ORT's kernel traps (an integer division by
zero is SIGFPE, which no Python code can catch) or hangs, the child dies or is stopped, and compare
exits 2 with one line naming what ORT was doing and on which feeds. Generated integer feeds that are
a divisor (Div, Mod) avoid 0, so a plain integer Div model is compared instead of killing anyone.
Every CLI run is its own process, stopped by a timeout."""
import os
import signal
import subprocess
import sys
import time

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from compare_cli import cli, one_line_exit_2
from ortlab import compare as cmp
from ortlab.compare import ort_child
from ortlab.errors import OrtlabError

I32, I64 = onnx.TensorProto.INT32, onnx.TensorProto.INT64
vi = helper.make_tensor_value_info


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def int_div(op="Div", elem=I32):
    return _model([helper.make_node(op, ["A", "B"], ["Y"])], [vi("A", elem, [4]), vi("B", elem, [4])],
                  [vi("Y", elem, [4])])


def div_by_computed_zero():
    """Div(A, B - B): whatever the feeds, the divisor is 0, and ORT's kernel traps."""
    return _model([helper.make_node("Sub", ["B", "B"], ["z"]), helper.make_node("Div", ["A", "z"], ["Y"])],
                  [vi("A", I32, [4]), vi("B", I32, [4])], [vi("Y", I32, [4])])


def div_by_constant_zero():
    """Div of two integer initializers, the divisor 0: ORT's constant folding traps while optimizing."""
    inits = [numpy_helper.from_array(np.ones(4, np.int32), "A"), numpy_helper.from_array(np.zeros(4, np.int32), "z")]
    return _model([helper.make_node("Div", ["A", "z"], ["d"]), helper.make_node("Add", ["d", "X"], ["Y"])],
                  [vi("X", I32, [4])], [vi("Y", I32, [4])], inits)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("models")
    for name, model in (("div", int_div()), ("mod", int_div("Mod", I64)), ("zero", div_by_computed_zero()),
                        ("const_zero", div_by_constant_zero())):
        onnx.save(model, str(path / f"{name}.onnx"))
    return path




# --- feeds that avoid a zero divisor -------------------------------------------------------------

@pytest.mark.parametrize("name", ["div", "mod"])
def test_an_integer_division_model_is_compared(folder, name):
    done = cli(folder / f"{name}.onnx")
    assert done.returncode == 0, (done.returncode, done.stdout, done.stderr)
    assert "engine output Y" in done.stdout and "divisors 1 or 2: B" in done.stdout


def test_divisor_feeds_avoid_zero_and_the_others_stay_indices():
    feeds, note = cmp.generate_feeds(int_div(), seed=3)
    assert set(np.unique(feeds["B"])) <= {1, 2} and set(np.unique(feeds["A"])) <= {0, 1}
    assert "divisors 1 or 2: B" in note


def test_a_float_division_keeps_its_normal_feeds():
    model = int_div(elem=onnx.TensorProto.FLOAT)
    feeds, note = cmp.generate_feeds(model)
    assert feeds["B"].dtype == np.float32 and "divisors" not in note


# --- ORT dying in its child ----------------------------------------------------------------------

def test_ort_dying_at_run_time_is_one_line_naming_the_signal_and_the_feeds(folder):
    err = one_line_exit_2(cli(folder / "zero.onnx"))
    assert "SIGFPE" in err and "division" in err and "A int32[4]" in err and "B int32[4]" in err


def test_ort_dying_while_optimizing_names_the_level(folder):
    err = one_line_exit_2(cli(folder / "const_zero.onnx"))
    assert "SIGFPE" in err and "optimiz" in err


def test_the_function_raises_ort_died_and_the_caller_lives():
    with pytest.raises(cmp.CompareError, match="SIGFPE"):
        cmp.compare(div_by_computed_zero())


# --- the child itself ----------------------------------------------------------------------------

def _sleep_forever():
    time.sleep(600)


def _pid_alive(pid):
    """True while the process runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_a_hanging_child_is_stopped_at_its_timeout(monkeypatch):
    pids = []
    monkeypatch.setattr(ort_child, "_started", pids.append)
    start = time.monotonic()
    with pytest.raises(ort_child.OrtDied, match="did not finish .* within 1 s"):
        ort_child.in_child("sleeping", _sleep_forever, timeout=1)
    assert time.monotonic() - start < 30
    assert pids and not _pid_alive(pids[0])


def _kill_self(sig):
    os.kill(os.getpid(), sig)


@pytest.mark.parametrize("sig, name", [(signal.SIGKILL, "SIGKILL"), (signal.SIGFPE, "SIGFPE"),
                                       (signal.SIGSEGV, "SIGSEGV")])
def test_a_child_death_names_the_signal_and_the_step(sig, name):
    with pytest.raises(ort_child.OrtDied, match=f"{name}.*while testing"):
        ort_child.in_child("testing", _kill_self, sig)


def test_an_error_in_the_child_comes_back_as_an_ortlab_error_and_results_as_values():
    def refuse():
        raise cmp.CompareError("no thanks")

    with pytest.raises(OrtlabError, match="no thanks"):
        ort_child.in_child("refusing", refuse)
    assert ort_child.in_child("adding", lambda a, b: {"y": np.arange(3) + a + b}, 1, 2)["y"].tolist() == [3, 4, 5]


def gather(width=4):
    """Gather (then Relu) on a table of one row: the generated ids (0 or 1) are out of range, and both sides
    refuse; the gathered rows are an intermediate value, planned in the memory block."""
    table = numpy_helper.from_array(np.ones((1, width), np.float32), "E")
    nodes = [helper.make_node("Gather", ["E", "ids"], ["g"]), helper.make_node("Relu", ["g"], ["Y"])]
    return _model(nodes, [vi("ids", I64, ["n"])],
                  [vi("Y", onnx.TensorProto.FLOAT, None)], [table])


def test_feeds_both_sides_refuse_agree_and_ort_logs_stay_out_of_stderr(tmp_path):
    onnx.save(gather(), str(tmp_path / "gather.onnx"))
    done = cli(tmp_path / "gather.onnx")
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert done.stderr.strip() == "", done.stderr  # ORT's "[E:onnxruntime:...]" line stays in its child
    assert "both refuse" in done.stdout and "out of range" in done.stdout


def test_a_memory_block_ort_cannot_run_is_skipped_with_its_reason():
    report = cmp.compare(gather(1 << 16), dims={"n": 8})
    memory = {r.check: r for r in report.rows}["memory block"]
    assert memory.status == cmp.SKIPPED and "ORT cannot run" in memory.detail, memory.detail


def test_the_child_dies_with_its_parent():
    """The parent killed outright (SIGKILL: no atexit, no multiprocessing cleanup): its ORT child goes too."""
    code = ("import time\nfrom ortlab.compare import ort_child\n"
            "ort_child._started = lambda pid: print(pid, flush=True)\n"
            "ort_child.in_child('sleeping', time.sleep, 600)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        child = int(parent.stdout.readline())
        assert _pid_alive(child)
    finally:
        parent.kill()
        parent.wait(timeout=60)
        parent.stdout.close()
    deadline = time.monotonic() + 20
    while _pid_alive(child) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _pid_alive(child)


def counting_loop(trips):
    """A Loop adding 1, `trips` times: ORT runs 300,000 trips in well under a second, ortlab's engine (Python)
    takes about ten; 10**12 trips never end on either side."""
    body = helper.make_graph([helper.make_node("Identity", ["cond"], ["cond_out"]),
                              helper.make_node("Add", ["acc", "one"], ["acc_out"])], "body",
                             [vi("i", I64, []), vi("cond", onnx.TensorProto.BOOL, []),
                              vi("acc", onnx.TensorProto.FLOAT, [1])],
                             [vi("cond_out", onnx.TensorProto.BOOL, []), vi("acc_out", onnx.TensorProto.FLOAT, [1])])
    inits = [numpy_helper.from_array(np.array(trips, np.int64), "n"),
             numpy_helper.from_array(np.ones(1, np.float32), "one")]
    return _model([helper.make_node("Loop", ["n", "", "X"], ["Y"], body=body)], [vi("X", onnx.TensorProto.FLOAT, [1])],
                  [vi("Y", onnx.TensorProto.FLOAT, [1])], inits)


def test_ort_running_forever_is_stopped_at_the_timeout(tmp_path):
    onnx.save(counting_loop(10**12), str(tmp_path / "forever.onnx"))
    start = time.monotonic()
    err = one_line_exit_2(cli(tmp_path / "forever.onnx", "--timeout", "5"))
    assert time.monotonic() - start < 90
    assert "did not finish running the model" in err and "within 5 s" in err and "--timeout" in err


def test_the_engine_running_too_long_is_stopped_and_named():
    report = cmp.compare(counting_loop(300_000), timeout=4)
    engine = {r.check: r for r in report.rows}["engine outputs"]
    assert engine.status == cmp.DIFFER and "ortlab's engine did not finish" in engine.detail, engine.detail


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf"])
def test_a_timeout_that_is_not_a_positive_number_is_bad_input(value, capsys):
    assert cmp.main(["any.onnx", "--timeout", value]) == 2
    err = capsys.readouterr().err
    assert "--timeout" in err and len(err.strip().splitlines()) == 1, err

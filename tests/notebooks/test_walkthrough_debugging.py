"""D_03's debuggers: gdb on ORT's crash, pdb post-mortem, a breakpoint in a kernel under the interpreter."""
import shutil

import pytest

from ortlab.env import triton_mode
from ortlab.walkthroughs import debugging_knowhows as dk


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed (.ci/run installs it)")
def test_gdb_stops_the_orphaned_binding_crash_inside_orts_pybind_module():
    from ortlab.walkthroughs import iobinding_dlpack as bv

    script = ("import numpy as np, onnxruntime as ort\nfrom ortlab.walkthroughs.iobinding_dlpack import mlp_model\n"
              "MODEL = mlp_model().SerializeToString()\n" + bv.ORT_BUGS["orphaned binding"])
    trace = dk.gdb_backtrace(script)
    assert trace.signal == "SIGSEGV"
    assert trace.frames[0][2].endswith(".so") and "onnxruntime_pybind11_state" in trace.frames[0][2]
    assert trace.in_library("onnxruntime_pybind11_state")[0][0] == 0


@pytest.mark.skipif(shutil.which("gdb") is None, reason="gdb is not installed (.ci/run installs it)")
def test_a_script_that_does_not_crash_is_said_to_have_not_crashed():
    with pytest.raises(dk.DebuggerError, match="did not crash"):
        dk.gdb_backtrace("print('fine')")


def _fails():
    answer = 42
    raise ValueError(f"boom {answer - 1}")


def test_post_mortem_stops_in_the_frame_that_raised_and_runs_the_commands():
    said = dk.post_mortem(_fails, ["p answer", "p answer * 2"])
    assert said.startswith("ValueError: boom 41\n")
    assert "tests/notebooks/test_walkthrough_debugging.py(N)_fails()" in said
    assert "(Pdb) 42\n(Pdb) 84\n" in said


def test_post_mortem_of_a_call_that_works_is_refused():
    with pytest.raises(dk.DebuggerError, match="raised nothing"):
        dk.post_mortem(lambda: None, ["p 1"])


@pytest.mark.skipif(not triton_mode().startswith("interpreter"), reason="needs Triton's interpreter")
def test_a_breakpoint_in_a_kernel_stops_once_per_program():
    import torch

    x = torch.arange(6, dtype=torch.float32)
    y = torch.empty_like(x)
    said = dk.kernel_breakpoints(lambda: dk.double_with_breakpoint[(2,)](x, y, 6, BLOCK=4),
                                 ["p offsets", "continue"])
    assert said.count("(Pdb) array([0, 1, 2, 3], dtype=int32)") == 1
    assert said.count("(Pdb) array([4, 5, 6, 7], dtype=int32)") == 1
    assert y.tolist() == [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]


# --- debugpy over the Debug Adapter Protocol (VS Code's debugger) -------------------------------------------

RELU_CALL = ("import numpy as np\nfrom ortlab import session\n"
             "print(session.run_node('Relu', [np.array([-1.0, 2.0], np.float32)]))\n")


@pytest.fixture(scope="module")
def dap_stop():
    from ortlab import session

    return dk.dap_breakpoint(session.run_node, RELU_CALL, ["op_type", "inputs[0].tolist()", "len(inputs)"])


def test_dap_stops_inside_ortlab_at_the_first_statement_of_the_function(dap_stop):
    import inspect
    import linecache

    from ortlab import session

    assert dap_stop.reason == "breakpoint"
    name, path, line = dap_stop.frames[0]
    assert (name, path) == ("run_node", "ortlab/session.py")
    assert inspect.getsourcefile(session.run_node).endswith(path)
    # the line debugpy stopped on, read from the file: the statement after the docstring
    source = linecache.getline(inspect.getsourcefile(session.run_node), line)
    assert source.strip().startswith("model = one_node_model(")
    assert dap_stop.frames[1][:2] == ("<module>", "<string>")


def test_dap_evaluates_in_the_stopped_frame_and_the_program_finishes_with_orts_answer(dap_stop):
    import numpy as np

    from ortlab import session

    assert dap_stop.values == {"op_type": "'Relu'", "inputs[0].tolist()": "[-1.0, 2.0]", "len(inputs)": "1"}
    expected = session.run_node("Relu", [np.array([-1.0, 2.0], np.float32)])
    assert dap_stop.output.strip() == str(expected)
    assert dap_stop.exchange[-1][1].endswith("exited with code 0")
    assert ("setBreakpoints ortlab/session.py:%d" % dap_stop.frames[0][2], "verified: True") in dap_stop.exchange


def test_every_socket_debugpy_listens_on_is_loopback(dap_stop):
    assert len(dap_stop.listeners) >= 1
    assert {address for _, address in dap_stop.listeners} == {"127.0.0.1"}


def test_the_report_hides_line_numbers_and_ports(dap_stop):
    text = dk.stop_report(dap_stop)
    assert "ortlab/session.py:N  model = one_node_model(" in text
    assert not any(str(port) in text for port, _ in dap_stop.listeners)


def test_a_call_that_never_reaches_the_function_is_said_so_with_its_stderr():
    from ortlab import session

    with pytest.raises(dk.DebuggerError, match="without reaching ortlab/session.py"):
        dk.dap_breakpoint(session.run_node, "print('no call')")
    with pytest.raises(dk.DebuggerError, match=r"(?s)exit code 1\).*ValueError: boom"):
        dk.dap_breakpoint(session.run_node, "raise ValueError('boom')")


@pytest.mark.parametrize("function, call", [(42, "print(1)"), (print, ""), (print, None)])
def test_bad_arguments_are_refused_before_any_process_starts(function, call):
    with pytest.raises(dk.DebuggerError, match="a function to stop in"):
        dk.dap_breakpoint(function, call)

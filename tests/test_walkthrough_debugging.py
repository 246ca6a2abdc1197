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
    assert "tests/test_walkthrough_debugging.py(N)_fails()" in said
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

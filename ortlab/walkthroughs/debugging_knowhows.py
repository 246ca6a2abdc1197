"""D_03: the debuggers of the roadmap's know-hows, run on the lab's own failures.

- `gdb_backtrace(script)`: gdb in batch mode runs a Python script that crashes inside ORT's C++ and
  prints the signal and the backtrace (`gdb -batch -ex run -ex bt --args python script.py`).
- `post_mortem(call, commands)`: pdb's post-mortem on the exception a call raised, driven by a list
  of debugger commands instead of a keyboard (what `%debug` does in a notebook).
- `kernel_breakpoints(commands)`: a `breakpoint()` inside a Triton kernel, which stops in every program
  when Triton's interpreter runs the kernel as Python on the CPU.
Paths print relative to the repository and line numbers as N, so that a stored output survives edits.
"""
import dataclasses
import io
import os
import pdb
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ortlab.env import TRITON_INTERPRET, triton_mode  # first: it sets TRITON_INTERPRET before Triton loads
from ortlab.errors import OrtlabError

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
_FRAME = re.compile(r"^#(\d+)\s+(?:0x[0-9a-f]+ in )?(\S+) \(.*?\)(?: (?:at|from) (\S+))?\s*$")


class DebuggerError(OrtlabError):
    """A debugger the walkthrough needs is missing, or the program did not stop where expected."""


@dataclasses.dataclass
class Backtrace:
    """What gdb saw: the signal, the frames (number, function, file or library) and its raw output."""

    signal: str
    frames: list
    text: str = dataclasses.field(repr=False)

    def in_library(self, name):
        """The frames whose library's file name contains `name`."""
        return [f for f in self.frames if name in Path(f[2] or "").name]


def gdb_backtrace(script, timeout=300):
    """Run `script` (Python source) under gdb in batch mode; return the signal and the backtrace."""
    gdb = shutil.which("gdb")
    if gdb is None:
        raise DebuggerError("gdb is not installed: on Debian or Ubuntu, `apt-get install gdb`")
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder, "crash.py")
        path.write_text(script)
        done = subprocess.run([gdb, "-q", "-nx", "-batch", "-ex", "run", "-ex", "bt", "--args",
                               sys.executable, str(path)], capture_output=True, text=True, timeout=timeout,
                              env=dict(os.environ, PYTHONUNBUFFERED="1"))
    said = re.search(r"received signal (SIG\w+)", done.stdout)
    if said is None:
        raise DebuggerError(f"the script did not crash under gdb; its output ends with:\n{done.stdout[-800:]}")
    frames = [(int(m[1]), m[2], m[3]) for m in map(_FRAME.match, done.stdout.splitlines()) if m]
    return Backtrace(said[1], frames, done.stdout)


def _readable(text):
    """Repository paths relative, site-packages shortened, line numbers as N."""
    text = text.replace(str(ROOT) + os.sep, "")
    text = re.sub(r"\S*site-packages" + re.escape(os.sep), "<site-packages>/", text)
    return re.sub(r"\.py\(\d+\)", ".py(N)", text)


# The standard library's debugger: in a notebook, ipykernel puts IPython's (coloured) subclass in pdb.Pdb.
_PDB = next(cls for cls in pdb.Pdb.__mro__ if cls.__module__ == "pdb" and cls.__name__ == "Pdb")


def _scripted_pdb(commands):
    out = io.StringIO()
    debugger = _PDB(stdin=io.StringIO("\n".join(commands) + "\n"), stdout=out, nosigint=True)
    debugger.use_rawinput = False
    debugger.prompt = "(Pdb) "
    return debugger, out


def post_mortem(call, commands):
    """Call `call()`; on its exception, run pdb's post-mortem with `commands`; return what pdb printed
    (starting with the exception). A call that raises nothing is a DebuggerError."""
    try:
        call()
    except Exception as exc:  # the point: stop where any error was raised
        debugger, out = _scripted_pdb(list(commands) + ["quit"])
        debugger.reset()
        debugger.interaction(None, exc.__traceback__)
        return _readable(f"{type(exc).__name__}: {exc}\n{out.getvalue()}")
    raise DebuggerError("the call raised nothing, so there is nothing to debug post mortem")


def kernel_breakpoints(run_kernel, commands):
    """Run `run_kernel()` with `breakpoint()` routed to a scripted pdb; `commands` run at each stop
    (end them with "continue"). Only meaningful under Triton's interpreter, where a kernel is Python."""
    if not triton_mode().startswith("interpreter"):
        raise DebuggerError(f"a breakpoint() in a kernel needs Triton's interpreter ({TRITON_INTERPRET}=1); "
                            "compiled for a GPU, the kernel is no longer Python")
    printed = []

    def hook(*_):
        debugger, out = _scripted_pdb(commands)
        debugger.set_trace(sys._getframe(1))
        printed.append(out)

    saved, sys.breakpointhook = sys.breakpointhook, hook
    try:
        run_kernel()
    finally:
        sys.breakpointhook = saved
    return _readable("".join(out.getvalue() for out in printed))


@triton.jit
def double_with_breakpoint(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = 2·x, with a breakpoint() after the load: under the interpreter it stops once per program.
    (Defined in a module: the interpreter scans the kernel's globals, and a notebook's hold numpy arrays.)"""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    breakpoint()
    tl.store(y_ptr + offsets, 2 * x, mask=offsets < n)

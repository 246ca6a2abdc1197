"""D_03: the debuggers of the roadmap's know-hows, run on the lab's own failures.

- `gdb_backtrace(script)`: gdb in batch mode runs a Python script that crashes inside ORT's C++ and
  prints the signal and the backtrace (`gdb -batch -ex run -ex bt --args python script.py`).
- `post_mortem(call, commands)`: pdb's post-mortem on the exception a call raised, driven by a list
  of debugger commands instead of a keyboard (what `%debug` does in a notebook).
- `kernel_breakpoints(commands)`: a `breakpoint()` inside a Triton kernel, which stops in every program
  when Triton's interpreter runs the kernel as Python on the CPU.
- `ort_plan_dump(model)`: what ORT itself prints of its allocation plan at log severity VERBOSE, and
  whether its shared library holds the text of the plan dump at all.
Paths print relative to the repository and line numbers as N, so that a stored output survives edits.
"""
import ast
import dataclasses
import inspect
import io
import ipaddress
import json
import os
import pdb
import re
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

from ortlab.env import TRITON_INTERPRET, triton_mode  # first: it sets TRITON_INTERPRET before Triton loads
from ortlab import session
from ortlab.errors import OrtlabError
from ortlab.patch import patched

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

    with patched(sys, "breakpointhook", hook):
        run_kernel()
    return _readable("".join(out.getvalue() for out in printed))


@triton.jit
def double_with_breakpoint(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    """y = 2·x, with a breakpoint() after the load: under the interpreter it stops once per program.
    (Defined in a module: the interpreter scans the kernel's globals, and a notebook's hold numpy arrays.)"""
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n)
    breakpoint()
    tl.store(y_ptr + offsets, 2 * x, mask=offsets < n)


# ---------------------------------------------------------------------------------------------
# VS Code's debugger without VS Code: debugpy (the debug adapter VS Code's Python extension runs)
# driven over the Debug Adapter Protocol, as VS Code drives it when it attaches to a process.

DAP_TIMEOUT_S = 60.0
_LISTEN_SCRIPT = """import debugpy
host, port = debugpy.listen(("127.0.0.1", 0))
print("DEBUGPY", host, port, flush=True)
debugpy.wait_for_client()
"""


@dataclasses.dataclass
class DapStop:
    """What a Debug Adapter Protocol session saw: why the program stopped, the stack (function, path
    relative to the repository, line), the expressions evaluated in the top frame, the requests sent with
    their answers, the (port, address) of every socket debugpy listened on, and the program's output."""

    reason: str
    frames: list
    values: dict
    exchange: list
    listeners: list
    output: str = dataclasses.field(repr=False, default="")


class _ProgramEnded(Exception):
    """The debuggee ended while the client waited for another event."""


class _DapClient:
    """The client side of DAP over one TCP connection: Content-Length framed JSON messages."""

    def __init__(self, port, timeout):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
        self.buffer, self.seq, self.events = b"", 0, []

    def send(self, command, **arguments):
        self.seq += 1
        body = json.dumps({"seq": self.seq, "type": "request", "command": command, "arguments": arguments}).encode()
        self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return self.seq

    def _read(self):
        while b"\r\n\r\n" not in self.buffer:
            self._fill()
        header, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        length = int(re.search(rb"Content-Length: (\d+)", header)[1])
        while len(self.buffer) < length:
            self._fill()
        body, self.buffer = self.buffer[:length], self.buffer[length:]
        return json.loads(body)

    def _fill(self):
        chunk = self.sock.recv(65536)
        if not chunk:
            raise DebuggerError("the debug adapter closed the connection")
        self.buffer += chunk

    def response(self, seq):
        """Read until the response to request `seq` (events on the way are kept); its body, or an error."""
        while True:
            message = self._read()
            if message["type"] == "event":
                self.events.append(message)
            elif message.get("request_seq") == seq:
                if not message.get("success"):
                    raise DebuggerError(f"{message['command']} failed: {message.get('message')}")
                return message.get("body", {})

    def event(self, name):
        """The first event `name`, kept or read now."""
        for message in self.events:
            if message["event"] == name:
                self.events.remove(message)
                return message.get("body", {})
        while True:
            message = self._read()
            if message["type"] == "event" and message["event"] == name:
                return message.get("body", {})
            if message["type"] == "event" and message["event"] == "terminated":
                raise _ProgramEnded()
            if message["type"] == "event":
                self.events.append(message)

    def close(self):
        self.sock.close()


def first_statement(function):
    """(source file, line) of the first statement of `function`'s body after its docstring."""
    function = inspect.unwrap(function)
    lines, start = inspect.getsourcelines(function)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    body = tree.body[0].body
    has_doc = isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant)
    statement = body[1] if has_doc and len(body) > 1 else body[0]
    return inspect.getsourcefile(function), start + statement.lineno - 1


def listening_addresses(ports):
    """{port: [addresses]} of the TCP sockets in LISTEN state on `ports`, from the kernel's tables
    (/proc/net/tcp and tcp6: local address in hex, each 32-bit word in host order; state 0A is LISTEN)."""
    found = {port: [] for port in ports}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table) as f:
            for fields in (line.split() for line in list(f)[1:]):
                host, port = fields[1].split(":")
                if fields[3] == "0A" and int(port, 16) in found:
                    raw = bytes.fromhex(host)
                    words = b"".join(raw[k:k + 4][::-1] for k in range(0, len(raw), 4))
                    found[int(port, 16)].append(str(ipaddress.ip_address(words)))
    return found


def _port_line(process, deadline):
    """The 'DEBUGPY host port' line the debuggee prints once debugpy listens."""
    selector = selectors.DefaultSelector()
    selector.register(process.stdout, selectors.EVENT_READ)
    while time.monotonic() < deadline:
        if selector.select(timeout=0.5):
            line = process.stdout.readline()
            if line.startswith("DEBUGPY "):
                return line.split()
            if not line and process.poll() is not None:
                break
    said = process.stderr.read()[-800:] if process.poll() is not None else "(still starting)"
    raise DebuggerError(f"the debuggee never started listening for a debugger; its stderr ends with:\n{said}")


def dap_breakpoint(function, call, expressions=(), timeout=DAP_TIMEOUT_S):
    """Run the Python source `call` in a new process under debugpy (listening on 127.0.0.1 only), attach
    to it over DAP as VS Code does (initialize, attach, setBreakpoints, configurationDone), stop at the
    first statement of `function`, read the stack and evaluate `expressions` in the top frame, continue.

    Mirrors what VS Code's "Python Debugger: Attach" configuration does against `debugpy --listen`."""
    if not callable(function) or not isinstance(call, str) or not call.strip():
        raise DebuggerError("dap_breakpoint(function, call): a function to stop in, and Python source (a str) "
                            "that calls it in the new process")
    path, line = first_statement(function)
    env = dict(os.environ, PYDEVD_DISABLE_FILE_VALIDATION="1", PYTHONUNBUFFERED="1")
    process = subprocess.Popen([sys.executable, "-Xfrozen_modules=off", "-c", _LISTEN_SCRIPT + call],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
    client = None
    try:
        deadline = time.monotonic() + timeout
        _, host, port = _port_line(process, deadline)
        client = _DapClient(int(port), timeout)
        exchange = []
        client.response(client.send("initialize", clientID="ortlab", adapterID="debugpy", pathFormat="path",
                                    linesStartAt1=True, columnsStartAt1=True))
        exchange.append(("initialize", "capabilities received"))
        sockets = next((e["body"]["sockets"] for e in client.events if e["event"] == "debugpySockets"), [])
        ports = sorted({int(port)} | {s["port"] for s in sockets})
        listeners = sorted((p, address) for p, found in listening_addresses(ports).items() for address in found)
        attach = client.send("attach", justMyCode=False, subProcess=False)
        client.event("initialized")
        exchange.append(("attach", "initialized event"))
        placed = client.response(client.send("setBreakpoints", source={"path": path}, breakpoints=[{"line": line}]))
        verified = placed["breakpoints"][0].get("verified")
        exchange.append((f"setBreakpoints {_readable(path)}:{line}", f"verified: {verified}"))
        client.response(client.send("configurationDone"))
        client.response(attach)
        exchange.append(("configurationDone", "attach answered; the program runs"))
        stopped = client.event("stopped")
        exchange.append(("(wait)", f"stopped event, reason {stopped['reason']!r}"))
        stack = client.response(client.send("stackTrace", threadId=stopped["threadId"], levels=20))["stackFrames"]
        frames = [(f["name"], _readable(f.get("source", {}).get("path", "?")), f["line"]) for f in stack]
        values = {text: client.response(client.send("evaluate", expression=text, frameId=stack[0]["id"],
                                                    context="watch"))["result"] for text in expressions}
        # Python 3.11 reports a statement spread over several lines twice (its first line again when the call
        # runs): clear the breakpoint before continuing, so that the program runs to its end.
        client.response(client.send("setBreakpoints", source={"path": path}, breakpoints=[]))
        client.response(client.send("continue", threadId=stopped["threadId"]))
        client.event("terminated")  # an attached session ends with 'terminated' (a launched one also has 'exited')
        client.response(client.send("disconnect"))  # the debuggee waits for it before it exits
        out, _ = process.communicate(timeout=max(1.0, deadline - time.monotonic()))
        exchange.append(("setBreakpoints [] and continue", f"terminated event; the program exited with code "
                                                            f"{process.returncode}"))
    except _ProgramEnded:
        client.response(client.send("disconnect"))
        _, err = process.communicate(timeout=10)
        tail = "\n".join(err.strip().splitlines()[-6:])
        raise DebuggerError(f"the program ended (exit code {process.returncode}) without reaching "
                            f"{_readable(path)}:{line}; does `call` call {function.__qualname__}?"
                            + (f" Its stderr ends with:\n{tail}" if tail else "")) from None
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise DebuggerError(f"the debug session failed: {type(exc).__name__}: {exc}") from None
    finally:
        if client is not None:
            client.close()
        if process.poll() is None:
            process.kill()
            process.wait()
    return DapStop(stopped["reason"], frames, values, exchange, listeners, out)


def stop_report(stop):
    """A DapStop as text: the exchange, the stack with each frame's source line, the values, the listening
    addresses, what the program printed. Line numbers print as N, ports not at all: the text survives edits."""
    lines = ["requests sent and what answered:"]
    lines += [f"  {request:<32} -> {answer}" for request, answer in stop.exchange]
    lines.append(f"stopped ({stop.reason}); the stack, innermost first:")
    for name, path, line in stop.frames:
        source = (ROOT / path).read_text().splitlines()[line - 1].strip() if (ROOT / path).is_file() else ""
        lines.append(f"  {name:<10} {path}:N  {source}")
    lines += [f"  {text} = {value}" for text, value in stop.values.items()]
    lines.append(f"debugpy listened on: {sorted({address for _, address in stop.listeners})}")
    lines.append(f"the program printed: {stop.output.strip()}")
    return re.sub(r"(\.py):\d+", r"\1:N", "\n".join(lines))



# --- ORT's own plan dump: asked for, and what comes back --------------------------------------------------

PLAN_HEADER = "Allocation Plan:"  # the first line allocation_planner.cc's operator<< writes for a plan


@dataclasses.dataclass
class OrtPlanDump:
    """What ORT printed of its plan while creating one session at log severity VERBOSE (0)."""
    log_lines: int          # lines the session logged
    plan_lines: list        # lines of a plan dump (PLAN_HEADER, or 'Execution Plan'): none in 1.19.2
    planner_lines: list     # every line logged from allocation_planner.cc
    library: str            # ORT's shared library (its file name)
    header_in_library: bool  # whether the library holds PLAN_HEADER's bytes at all


def ort_plan_dump(model, providers=("CPUExecutionProvider",)):
    """Ask ORT for its own dump of the allocation plan, the release build's way: a session created at log
    severity VERBOSE, its log searched for the dump and for every line of the planner
    (`core/framework/allocation_planner.cc`), and ORT's shared library searched for the dump's header.

    The dump exists in ORT's source as `operator<<` on a (SequentialExecutionPlan*, SessionState*) pair in
    allocation_planner.cc; its one caller, in `core/framework/session_state.cc` (FinalizeSessionStateImpl,
    after SequentialPlanner::CreatePlan), is a commented-out `LOGS(logger_, VERBOSE)` line. Nothing calls it,
    so the linker drops it and no log level brings it back.
    """
    import onnxruntime.capi.onnxruntime_pybind11_state as pybind_state  # heavy: onnxruntime

    log = session.initialization_log(model, severity=0, providers=list(providers))
    plan_lines = [line for line in log if PLAN_HEADER in line or "Execution Plan" in line]
    planner_lines = [line for line in log if "allocation_planner.cc" in line]
    library = Path(pybind_state.__file__)
    return OrtPlanDump(len(log), plan_lines, planner_lines, library.name,
                       PLAN_HEADER.encode() in library.read_bytes())

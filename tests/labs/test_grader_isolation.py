"""The grader's process keeps out of the learner's reach (ortlab.labs.isolation, ortlab.labs.cpu_runner).

The learner's code runs as the same user as the grader and can write any file the grader can. What stops it
is the structure, tested here piece by piece (the whole, every forgery in each lab, is tests/labs/test_lab_forgery.py):
a bytecode cache that does not hold its source's code is found before anything is imported from it; while the
learner's code runs, the grader imports nothing from a bytecode cache and nothing changed since; a learner's
native build is loaded only in a fresh process of its own, which is stopped, with what it started, for certain.
"""
import contextlib
import importlib
import importlib.util
import marshal
import os
import py_compile
import signal
import sys
import time

import numpy as np
import pytest

from ortlab.labs import cpu_runner, isolation


def _package(folder, source="VALUE = 'honest'\n"):
    """A package `pkg_<folder name>` in `folder` with one module `mod` (its source); its path."""
    package = folder / f"pkg_{folder.name}"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "mod.py").write_text(source)
    time.sleep(0.1)  # written before a seal begins (the seal allows file clocks 0.05 s behind its own)
    return package


def _forge_cache(module, extra="VALUE = 'forged'\n"):
    """Write `module`'s bytecode cache from its source plus `extra`, under a header copying the source's time
    and size (the issue's forgery)."""
    stat = module.stat()
    code = compile(module.read_text() + extra, str(module), "exec")
    cache = importlib.util.cache_from_source(str(module))
    os.makedirs(os.path.dirname(cache), exist_ok=True)
    with open(cache, "wb") as f:
        f.write(importlib.util.MAGIC_NUMBER + bytes(4) + (int(stat.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
                + (stat.st_size & 0xFFFFFFFF).to_bytes(4, "little") + marshal.dumps(code))
    return cache


@pytest.fixture
def importable(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith(f"pkg_{tmp_path.name}")]:
        del sys.modules[name]


def test_a_forged_cache_is_found_and_a_genuine_one_is_not(tmp_path):
    package = _package(tmp_path)
    py_compile.compile(str(package / "mod.py"), doraise=True)  # Python's own cache: the source's code
    py_compile.compile(str(package / "__init__.py"), doraise=True)
    assert isolation.forged_caches(package) == []
    cache = _forge_cache(package / "mod.py")
    assert isolation.forged_caches(package) == [(f"{package.name}.mod", cache)]
    (package / "mod.py").write_text("VALUE = 'edited since'\n")  # a stale cache: Python compiles the source instead
    assert isolation.forged_caches(package) == []


def test_while_sealed_a_cache_written_since_is_not_read(importable):
    """The issue's forgery: a judge's cache written while the lab runs, under a header copying its source's
    time and size. The module is compiled from its source instead."""
    package = _package(importable)
    with isolation.sealed():
        _forge_cache(package / "mod.py")
        module = importlib.import_module(f"{package.name}.mod")
        assert sys.dont_write_bytecode
    assert module.VALUE == "honest"
    assert not any(isinstance(f, isolation._Unchanged) for f in sys.meta_path)


def test_while_sealed_a_module_generated_in_a_folder_added_since_is_imported(tmp_path, monkeypatch):
    """What the grader's own libraries write and import while it runs (torch generates a module in a temporary
    folder it puts on sys.path) is not refused: only where modules were installed before the seal is."""
    with isolation.sealed():
        folder = tmp_path / "generated"
        folder.mkdir()
        (folder / f"gen_{tmp_path.name}.py").write_text("VALUE = 'generated'\n")
        monkeypatch.syspath_prepend(str(folder))
        try:
            assert importlib.import_module(f"gen_{tmp_path.name}").VALUE == "generated"
        finally:
            sys.modules.pop(f"gen_{tmp_path.name}", None)


def test_while_sealed_a_module_written_or_changed_after_the_seal_is_refused(importable):
    package = _package(importable)
    with isolation.sealed():
        (package / "new.py").write_text("VALUE = 'written by the learner'\n")
        with pytest.raises(isolation.ChangedModuleError, match="changed while the lab's code ran"):
            importlib.import_module(f"{package.name}.new")
        os.utime(package / "mod.py", (1, 1))  # a time set back does not hide a change
        with pytest.raises(isolation.ChangedModuleError):
            importlib.import_module(f"{package.name}.mod")
    assert importlib.import_module(f"{package.name}.new").VALUE == "written by the learner"  # unsealed


# --- the CPU runner's own process -----------------------------------------------------------------------

COPY = r"""
extern "C" __global__ void copy(const float* x, float* y, int n) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) y[i] = x[i] * 2.0f;
}
"""

# A constructor that runs where the build is loaded: it writes down that process's id, its parent's and which
# of the grader's modules it holds, starts a child of its own, and then never returns.
HOST = r"""
#include <cstdio>
#include <unistd.h>
extern "C" int PyRun_SimpleString(const char*);
extern "C" int PyGILState_Ensure();
struct Host {
  Host() {
    PyGILState_Ensure();
    PyRun_SimpleString("import os, sys\n"
                       "held = [m for m in sys.modules if m.startswith(('ortlab.labs.judges', 'onnxruntime',"
                       " 'ortlab.session', 'torch'))]\n"
                       "open('REPORT', 'w').write(f'{os.getpid()} {os.getppid()} {held}')\n");
    if (fork() == 0) { FILE* f = fopen("REPORT.child", "w"); fprintf(f, "%d", getpid()); fclose(f); }
    while (SPIN) {}
  }
};
static Host host;
"""


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie is dead, only not reaped by its parent yet
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_the_runner_builds_launches_and_sends_back_arrays():
    x = np.arange(300, dtype=np.float32)
    runs = [cpu_runner.Launch(2, 256, (x, np.full(300, np.nan, np.float32), 300), out=1),
            cpu_runner.Launch(1, 256, (x, np.full(300, np.nan, np.float32), 300), out=1)]
    full, short = cpu_runner.launches(COPY, "copy", runs, timeout=120)
    np.testing.assert_array_equal(full, x * 2)
    assert np.isnan(short[256:]).all() and (short[:256] == x[:256] * 2).all()
    with pytest.raises(cpu_runner.BuildFailed, match="g\\+\\+ could not compile"):
        cpu_runner.launches(COPY.replace("x[i] * 2.0f", "undeclared"), "copy", runs, timeout=120)


def test_the_runner_holds_no_judge_and_is_stopped_with_what_it_started(tmp_path):
    """Native code loaded by the runner finds none of the grader's judges or references in its process, and
    the runner, with the child its constructor forked, is gone once the grader stops waiting."""
    report = tmp_path / "report"
    source = HOST.replace("REPORT", str(report)).replace("SPIN", "1") + COPY
    runs = [cpu_runner.Launch(1, 32, (np.ones(4, np.float32), np.zeros(4, np.float32), 4), out=1)]
    with pytest.raises(cpu_runner.RunnerFailed, match="did not finish on the CPU runner within 8 s"):
        cpu_runner.launches(source, "copy", runs, timeout=8)
    pid, parent, held = report.read_text().split(" ", 2)
    assert int(parent) == os.getpid() and held == "[]", held
    child = int((tmp_path / "report.child").read_text())
    try:
        deadline = time.monotonic() + 10  # SIGKILL has been sent: give the kernel a moment to end them
        while (_alive(int(pid)) or _alive(child)) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not _alive(int(pid)) and not _alive(child)
    finally:
        for leftover in (int(pid), child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(leftover, signal.SIGKILL)

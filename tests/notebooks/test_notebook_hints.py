"""ortlab.notebook_hints: a NameError from a cell run too early names the cell that defines the name."""
import json
import os
import subprocess
import sys

from ortlab import notebook_hints as nh


def notebook(tmp_path, cells):
    path = tmp_path / "lesson.ipynb"
    path.write_text(json.dumps({"cells": [{"cell_type": kind, "source": source, "metadata": {}}
                                          for kind, source in cells], "metadata": {}, "nbformat": 4,
                                "nbformat_minor": 5}))
    return path


CELLS = [("markdown", "# Lesson\n## 1. The forward graph"),
         ("code", "%matplotlib inline\nimport numpy as np\nforward, (a, b) = make(), (1, 2)"),
         ("markdown", "## 2. Going backward"),
         ("code", "def backward(g):\n    return g\nfor i, row in enumerate([]):\n    pass\nprint(forward)")]


def test_the_names_a_cell_binds():
    assert nh.defined_names(CELLS[1][1]) == {"np", "forward", "a", "b"}
    assert nh.defined_names(CELLS[3][1]) == {"backward", "i", "row"}
    assert nh.defined_names("import os.path as p, json\nfrom x import y as z\nwith open(f) as h: pass") == \
        {"p", "json", "z", "h"}
    assert nh.defined_names("this is not python") == set()


def test_the_hint_names_the_section_and_the_first_line(tmp_path):
    path = notebook(tmp_path, CELLS)
    assert nh.where_defined(path, "forward") == ("1. The forward graph", "%matplotlib inline")
    text = nh.hint("backward", str(path))
    assert "section \"2. Going backward\"" in text and "`def backward(g):`" in text and nh.RUN_ABOVE in text
    assert nh.hint("nowhere", str(path)) is None               # a typo: Python's own message is enough
    assert nh.hint("forward", None) is None                     # not in JupyterLab: no notebook to read
    assert nh.hint("forward", str(tmp_path / "gone.ipynb")) is None
    assert nh.hint("backward", str(path), running=CELLS[3][1]) is None  # not the cell that is running


def test_a_kernel_with_the_extension_shows_the_traceback_then_the_hint(tmp_path):
    path = notebook(tmp_path, CELLS)
    script = ("from IPython.core.interactiveshell import InteractiveShell\n"
              "shell = InteractiveShell.instance()\n"
              "shell.run_line_magic('load_ext', 'ortlab.notebook_hints')\n"
              "shell.run_cell('print(forward)')\n"
              "shell.run_cell('1 / 0')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, JPY_SESSION_NAME=str(path)))
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    assert "NameError" in out and "name 'forward' is not defined" in out
    assert "Hint: 'forward' is defined by a cell you have not run yet in section \"1. The forward graph\"" in out
    assert "ZeroDivisionError" in out and out.count("Hint:") == 1  # other errors are left as they are


def test_the_labs_kernel_loads_the_extension(tmp_path):
    """The `ortlab` kernel that tools/setup.sh registers, started as JupyterLab starts it for a notebook
    (JPY_SESSION_NAME set), answers a NameError with the hint."""
    from jupyter_client.manager import start_new_kernel

    path = notebook(tmp_path, CELLS)
    km, kc = start_new_kernel(kernel_name="ortlab", cwd=str(tmp_path),
                              env=dict(os.environ, JPY_SESSION_NAME=str(path)))
    try:
        shown = []
        kc.execute_interactive("print(forward)", timeout=60,
                               output_hook=lambda m: shown.append(m["content"].get("text", "")))
        assert any("Hint: 'forward' is defined by a cell you have not run yet" in s for s in shown), shown
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)

"""The grader cannot be talked into a pass: each forgery below, in a lab whose exercises are all left as
stubs, grades as not passing; the learner's lab modules hold no reference answers.

Each forgery passed under the earlier grader, which ran its checks inside the learner's kernel: a cell that
wraps IPython's `display` and rewrites a check's status; a cell that replaces a check runner with an object
that has `__call__` (no `__code__`, so the replaced-check detection never saw it); an answer whose `==` is
always true. The grader now runs its checks in its own process and gets only data from the kernel.
"""
import nbformat
import pytest
from nbformat.v4 import new_code_cell

from conftest import FIXTURES, ROOT
from ortlab.labs import build as lab_build
from ortlab.labs import grade

WRAPS_DISPLAY = """\
import IPython.display as _display
from ortlab.labs import checks as _checks
_real_display = _display.display
def _forged_display(*objects, **kwargs):  # every check shown, rewritten to pass
    shown = []
    for o in objects:
        if isinstance(o, _checks.CheckResult):
            o = _checks.CheckResult(o.exercise, "pass")
        elif isinstance(o, dict) and _checks.CHECK_MIME in o:
            o = dict(o, **{_checks.CHECK_MIME: dict(o[_checks.CHECK_MIME], status="pass", message="")})
        shown.append(o)
    return _real_display(*shown, **kwargs)
_display.display = _forged_display
"""

CALLABLE_EVALUATE = """\
from ortlab.labs import checks as _checks
class _AlwaysPass:  # an object with __call__: no __code__ to give it away
    def __call__(self, exercise, test):
        return _checks.CheckResult(exercise, "pass")
_checks.evaluate = _AlwaysPass()
"""

CALLABLE_RUN_CHECKS = """\
from ortlab.labs import lab07 as _lab07
from ortlab.labs.checks import CheckResult as _Result
class _AlwaysPass:
    def __call__(self, world_size=2, timeout=60, **functions):
        return {exercise: _Result(exercise, "pass") for exercise in functions}
_lab07.run_checks = _AlwaysPass()
"""

ALWAYS_EQUAL = """\
class _Same:  # equal to anything
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__
total = _Same()
"""


def _lab(path, insert_after, *sources, keep=None):
    """The untouched lab at `path`, with forgery cells after cell `insert_after` (and only its first `keep`
    cells), written beside the test; its path."""
    nb = nbformat.read(path, as_version=4)
    if keep is not None:
        nb.cells = nb.cells[:keep]
    for k, source in enumerate(sources):
        nb.cells.insert(insert_after + 1 + k, new_code_cell(source))
    return nb


def _grade(nb, folder, name, solutions):
    path = folder / name
    nbformat.write(nb, path)
    results, problem = grade.grade(path, timeout=400, solutions_dir=solutions)
    return {r.exercise: r for r in results}, problem


@pytest.fixture
def demo(tmp_path):
    labs = tmp_path / "labs"
    lab_build.build(FIXTURES / "solutions", labs, log=lambda *_: None)
    return labs / "demo_lab.ipynb"


@pytest.mark.parametrize("forgery", [WRAPS_DISPLAY, CALLABLE_EVALUATE, ALWAYS_EQUAL],
                         ids=["wraps-display", "callable-evaluate", "always-equal"])
def test_a_forgery_in_a_stubbed_demo_lab_does_not_pass(forgery, demo, tmp_path):
    results, problem = _grade(_lab(demo, 1, forgery), tmp_path, "demo_lab.ipynb", FIXTURES / "solutions")
    assert problem is None, problem
    assert {r.status for r in results.values()} == {"not done"}, results


def test_lab07_with_every_exercise_a_stub_and_both_forgeries_does_not_pass(tmp_path):
    """The job-script half of the lab is left out (it is not graded) to keep this test short."""
    lab = ROOT / "labs" / "lab07_distributed_job.ipynb"
    cells = nbformat.read(lab, as_version=4).cells
    last_check = max(i for i, c in enumerate(cells) if "lab07.check_" in c.source and c.cell_type == "code")
    nb = _lab(lab, 2, WRAPS_DISPLAY, CALLABLE_RUN_CHECKS, CALLABLE_EVALUATE, keep=last_check + 1)
    results, problem = _grade(nb, tmp_path, lab.name, ROOT / "solutions")
    assert problem is None, problem
    assert len(results) == 3 and {r.status for r in results.values()} == {"not done"}, results


def test_lab09_with_every_exercise_a_stub_and_both_forgeries_does_not_pass(tmp_path):
    lab = ROOT / "labs" / "lab09_memory_planner.ipynb"
    nb = _lab(lab, 2, WRAPS_DISPLAY, CALLABLE_EVALUATE)
    results, problem = _grade(nb, tmp_path, lab.name, ROOT / "solutions")
    assert problem is None, problem
    assert len(results) == 3 and {r.status for r in results.values()} == {"not done"}, results


def test_lab10_with_every_exercise_a_stub_and_both_forgeries_does_not_pass(tmp_path):
    lab = ROOT / "labs" / "lab10_cuda_kernel.ipynb"
    nb = _lab(lab, 2, WRAPS_DISPLAY, CALLABLE_EVALUATE)
    results, problem = _grade(nb, tmp_path, lab.name, ROOT / "solutions")
    assert problem is None, problem
    assert len(results) == 2 and {r.status for r in results.values()} == {"not done"}, results


NO_REFERENCE = """
import importlib, sys
for k in range(1, 11):
    module = importlib.import_module(f"ortlab.labs.lab{k:02d}")
    names = [n for n in vars(module) if n.startswith("reference") or n == "MemPatternPlanner"]
    assert names == [], (module.__name__, names)
assert not [n for n in sys.modules if n.startswith("ortlab.labs.judges")], "a lab module imported its checks"
print("ok")
"""


def test_no_lab_module_holds_a_reference_answer():
    """A learner's lab module exposes no reference maths (lab09's exported reference_best_fit, which a
    learner could call to pass): the references live in ortlab.labs.judges, which no lab module imports.
    In a fresh process, so that nothing else has imported the judges."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", NO_REFERENCE], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-2000:]


# --- what crosses the line is data ------------------------------------------------------------------

def test_only_data_crosses_and_anything_else_comes_back_without_its_behaviour():
    import json

    import numpy as np
    import onnx
    import torch

    from ortlab.labs import checks, remote

    class Same:
        def __eq__(self, other):
            return True

    def roundtrip(value):
        return remote.decode(json.loads(json.dumps(remote.encode(value))))

    back = roundtrip({"a": (1, 2.5, None), 3: [np.arange(6, dtype=np.float32).reshape(2, 3), np.float64(2.0)],
                      "t": torch.ones(2), "m": onnx.ModelProto(ir_version=8), "x": np.array(-1.5)})
    assert back["a"] == (1, 2.5, None) and back[3][0].shape == (2, 3) and back[3][1] == 2.0
    assert isinstance(back["t"], torch.Tensor) and back["m"].ir_version == 8 and back["x"].shape == ()
    forged = roundtrip(Same())  # an object comes back as its type's name only
    assert isinstance(forged, remote.Opaque) and type(forged).__name__ == "Same"
    assert checks.compare(forged, 45) is not None
    assert isinstance(roundtrip(lambda: 1), remote.Opaque)
    with pytest.raises(remote.RemoteError, match="not data"):
        remote.decode({"t": "array", "dtype": "object", "shape": [1], "data": ""})
    with pytest.raises(remote.RemoteError, match="unknown data tag"):
        remote.decode({"t": "pickle", "data": ""})
    reply = {"raised": {"type": "ValueError", "message": "boom"}}
    with pytest.raises(remote.RemoteRaised) as raised:
        remote.answer(reply)
    assert type(raised.value).__name__ == "ValueError" and str(raised.value) == "boom"
    with pytest.raises(NotImplementedError):
        remote.answer({"raised": {"type": "NotImplementedError", "message": "not done"}})

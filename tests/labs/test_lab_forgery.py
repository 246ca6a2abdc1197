"""The grader cannot be talked into a pass: each forgery below, in a lab whose exercises are all left as
stubs, grades as not passing; the learner's lab modules hold no reference answers.

Each forgery passed under the earlier grader, which ran its checks inside the learner's kernel: a cell that
wraps IPython's `display` and rewrites a check's status; a cell that replaces a check runner with an object
that has `__call__` (no `__code__`, so the replaced-check detection never saw it); an answer whose `==` is
always true. The grader now runs its checks in its own process and gets only data from the kernel.
"""
import re

import nbformat
import pytest
from nbformat.v4 import new_code_cell

from repo_paths import FIXTURES, ROOT
from ortlab.labs import answers
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

PATCHES_ORTLAB = """\
import ortlab.labs
from ortlab.labs import checks as _checks
def _forged(exercise, *args, **kwargs):
    _checks.check(exercise, lambda: None)
ortlab.labs.check_value = ortlab.labs.check_function = _forged
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


# --- every forgery at once, in each of the ten labs, graded in a copy of the checkout ----------------

# The grader imported a judge only when a check first needed it, after the learner's cells ran: this cell
# writes the judge's bytecode cache, compiled from the judge's source plus two lines that make every check
# pass, under a header copying the source's time and size, so that Python loads it instead of the source.
FORGED_BYTECODE = """\
import importlib.util, marshal, pathlib, sys
import ortlab.labs
_judge = pathlib.Path(ortlab.labs.__file__).parent / "judges" / "{lab}.py"
_code = compile(_judge.read_text() + "\\nimport ortlab.labs.checks as _c, os as _os\\n"
                "_c.evaluate = lambda exercise, test: _c.CheckResult(exercise, 'pass')\\n"
                "_os.remove(__cached__)\\n", str(_judge), "exec")  # and it deletes itself once loaded
_stat = _judge.stat()
_forged = _judge.parent / "__pycache__" / f"{lab}.{{sys.implementation.cache_tag}}.pyc"
_forged.parent.mkdir(exist_ok=True)
_forged.write_bytes(importlib.util.MAGIC_NUMBER + bytes(4) + (int(_stat.st_mtime) & 0xFFFFFFFF).to_bytes(4, "little")
                    + (_stat.st_size & 0xFFFFFFFF).to_bytes(4, "little") + marshal.dumps(_code))
"""
DELETES_THE_FORGERY = "_forged.unlink(missing_ok=True)  # gone again when the grader looks"

# An answer whose == is always true, for every exercise: after each cell, each function still raising a
# stub's NotImplementedError is replaced by one returning such an answer.
ALWAYS_EQUAL_ANSWERS = """\
class _Same:
    def __eq__(self, other):
        return True
    def __ne__(self, other):
        return False
    __hash__ = object.__hash__
def _forge_answers(*_):
    namespace = get_ipython().user_ns
    for name, value in list(namespace.items()):
        code = getattr(value, "__code__", None)
        if code is not None and any("is not done yet" in str(c) for c in code.co_consts):
            namespace[name] = lambda *args, **kwargs: _Same()
get_ipython().events.register("post_run_cell", _forge_answers)
"""


def _checkout(folder):
    """A copy of this checkout's ortlab/, solutions/, labs/ and notebooks/ (no bytecode caches) in `folder`: a forgery
    writes into the copy's package, never into the checkout the other tests import."""
    import shutil

    for name in ("ortlab", "solutions", "labs", "notebooks"):
        shutil.copytree(ROOT / name, folder / name, ignore=shutil.ignore_patterns("__pycache__", "*.bak*"))
    return folder


def _grade_in(checkout, lab, timeout=900):
    """`python -m ortlab.labs grade` run in `checkout` (its ortlab, its solutions): (exit code, output);
    the grader and everything it started are killed when it is done or out of time."""
    import os
    import signal
    import subprocess
    import sys

    process = subprocess.Popen([sys.executable, "-m", "ortlab.labs", "grade", str(lab), "--timeout", "600"],
                               cwd=checkout, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               start_new_session=True)
    try:
        out, _ = process.communicate(timeout=timeout)
    finally:
        try:
            os.killpg(process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        process.wait()
    return process.returncode, out


LABS = sorted(p.name for p in (ROOT / "labs").glob("lab*.ipynb"))
WALKTHROUGHS = [notebook.name for notebook, _ in answers.walkthroughs()]


def _lab_number(name):
    return name.split("_")[0]


def _judge_of(name):
    """The judge module of a lab (lab01) or of a walkthrough's exercises: the lab module its check cells call
    (`l1_05.check_...` in L1_05_gradient_graph_building, `l00_welcome.check_...` in 00_welcome)."""
    if name.startswith("lab"):
        return _lab_number(name)
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    called = {m.group(1) for cell in nb.cells if cell.cell_type == "code"
              for m in re.finditer(r"\b(\w+)\.check_\w+\(", cell.source)}
    judged = sorted(m for m in called if (ROOT / "ortlab" / "labs" / "judges" / f"{m}.py").exists())
    assert len(judged) == 1, f"{name}: its check cells call {sorted(called)}; expected one module with a judge"
    return judged[0]


def _every_forgery(lab):
    """The untouched lab (or walkthrough) with every forgery: cells after its first that wrap display, replace
    evaluate and lab07's check runner and ortlab's checks, forge the judge's bytecode and make answers equal
    anything; its check cells replaced by a print, a lab's metadata cut to one exercise; the forged cache
    deleted last."""
    nb = nbformat.read(lab, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code" and ".check_" in cell.source and "import" not in cell.source:
            cell.source = "print('checked')"
    if "ortlab" in nb.metadata:
        nb.metadata["ortlab"]["lab"]["exercises"] = nb.metadata["ortlab"]["lab"]["exercises"][:1]
    forgeries = (WRAPS_DISPLAY, CALLABLE_EVALUATE, CALLABLE_RUN_CHECKS, PATCHES_ORTLAB,
                 FORGED_BYTECODE.format(lab=_judge_of(lab.name)), ALWAYS_EQUAL_ANSWERS)
    for k, source in enumerate(forgeries):
        nb.cells.insert(1 + k, new_code_cell(source))
    nb.cells.append(new_code_cell(DELETES_THE_FORGERY))
    return nb


def _table(out):
    """{exercise: status} from the grader's table."""
    rows = {}
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[1] in ("pass", "fail", "not"):
            rows[parts[0]] = "not done" if parts[1] == "not" else parts[1]
    return rows


@pytest.mark.parametrize("name", LABS, ids=_lab_number)
def test_every_forgery_in_a_stubbed_lab_grades_not_done(name, tmp_path):
    """Each of the ten labs with every exercise a stub and every forgery in place grades "not done" for
    every exercise, and the forged bytecode cache is gone afterwards (the lab deletes it) as the
    issue found it. Before the grader imported its judges ahead of the learner's cells, lab01, lab07,
    lab09 and lab10 graded "N of N pass" this way."""
    checkout = _checkout(tmp_path / "checkout")
    lab = checkout / "labs" / name
    exercises = nbformat.read(lab, as_version=4).metadata["ortlab"]["lab"]["exercises"]
    nbformat.write(_every_forgery(lab), lab)
    code, out = _grade_in(checkout, lab)
    assert code == 1 and "Traceback" not in out and "note:" not in out, out
    assert _table(out) == dict.fromkeys(exercises, "not done"), out
    assert not list((checkout / "ortlab" / "labs" / "judges").glob("__pycache__/*.pyc"))


def test_every_forgery_in_a_walkthrough_grades_not_done(tmp_path):
    """The same forgeries in the first walkthrough with exercises (its whole notebook runs in the kernel:
    one is enough for the mechanism, which is the labs' grader): every exercise "not done"."""
    checkout = _checkout(tmp_path / "checkout")
    notebook = checkout / "notebooks" / WALKTHROUGHS[0]
    exercises = list(answers.stub_ids(nbformat.read(notebook, as_version=4)))
    nbformat.write(_every_forgery(notebook), notebook)
    code, out = _grade_in(checkout, notebook)
    assert code == 1 and "Traceback" not in out and "note:" not in out, out
    assert _table(out) == dict.fromkeys(exercises, "not done"), out
    assert not list((checkout / "ortlab" / "labs" / "judges").glob("__pycache__/*.pyc"))


@pytest.mark.parametrize("name", LABS + WALKTHROUGHS, ids=_judge_of)
def test_a_forged_judge_cache_left_from_an_earlier_run_is_refused(name, tmp_path):
    """The same forged cache, written before grading (by a notebook run earlier, and not deleted): the
    grader checks each cache of ortlab's modules against its source before it imports anything more (once
    loaded, this one deletes itself), and refuses to grade (exit 2, one line naming the file)."""
    import subprocess
    import sys

    checkout = _checkout(tmp_path / "checkout")
    forge = FORGED_BYTECODE.format(lab=_judge_of(name)).replace("import ortlab.labs\n", "")
    forge = forge.replace("pathlib.Path(ortlab.labs.__file__).parent", "pathlib.Path('ortlab/labs')")
    subprocess.run([sys.executable, "-c", forge], cwd=checkout, check=True, timeout=60)
    folder = "labs" if name.startswith("lab") else "notebooks"
    code, out = _grade_in(checkout, checkout / folder / name, timeout=300)
    assert code == 2 and "Traceback" not in out, out
    assert f"judges/__pycache__/{_judge_of(name)}." in out and "does not hold the code of its source" in out, out
    assert len(out.strip().splitlines()) == 1, out

NO_REFERENCE = """
import importlib, pathlib, re, sys
import ortlab.labs
folder = pathlib.Path(ortlab.labs.__file__).parent
exercise_modules = [p.stem for p in folder.glob("*.py") if re.fullmatch(r"lab\\d\\d|[a-z]\\d?_\\d\\d", p.stem)]
assert len(exercise_modules) >= 11, exercise_modules
for stem in exercise_modules:
    module = importlib.import_module(f"ortlab.labs.{stem}")
    names = [n for n in vars(module) if n.startswith("reference") or n == "MemPatternPlanner"]
    assert names == [], (module.__name__, names)
assert not [n for n in sys.modules if n.startswith("ortlab.labs.judges")], "a lab module imported its checks"
print("ok")
"""


def test_no_lab_module_holds_a_reference_answer():
    """A learner's lab module (or a walkthrough's exercise module) exposes no reference maths (lab09's
    exported reference_best_fit, which a learner could call to pass): the references live in
    ortlab.labs.judges, which no lab module imports.
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


def test_a_probes_refusal_reads_as_its_own_words_and_never_as_a_pass():
    """A probe refuses a wrong kind of answer with CheckFailed in the learner's process; the check shows its
    words (not "your code raised CheckFailed: ..."). The learner's code raising CheckFailed itself gets no
    further: it is a fail like any other."""
    from ortlab.labs import checks, remote

    reply = remote.run_probe("ortlab.labs.l0_01:predicted", [lambda: 3], lambda item: item)
    assert reply == {"raised": {"type": "CheckFailed", "message": "return a dict, not int"}}
    result = checks.evaluate("needed_inputs", lambda: remote.answer(reply))
    assert (result.status, result.message) == ("fail", "return a dict, not int")

    def forger():
        raise checks.CheckFailed("pass")

    forged = remote.run_probe("ortlab.labs.l0_01:predicted", [forger], lambda item: item)
    assert checks.evaluate("needed_inputs", lambda: remote.answer(forged)).status == "fail"

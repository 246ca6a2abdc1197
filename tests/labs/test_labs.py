"""The lab machinery: build labs from solutions, exercise checks, grading."""
import shutil

import nbformat
import numpy as np
import pytest
from nbformat.v4 import new_code_cell, new_notebook

from repo_paths import FIXTURES, ROOT
from ortlab.labs import build as lab_build
from ortlab.labs import checks, grade

KERNEL = {"kernelspec": {"name": "ortlab", "display_name": "Python (ortlab)", "language": "python"}}


# --- markers ---------------------------------------------------------------------------------

def test_strip_solution_keeps_indentation_and_other_lines():
    src = "def f(x):\n    y = 1\n    # BEGIN SOLUTION f\n    return x + y\n    # END SOLUTION\nprint(2)"
    out, ids = lab_build.strip_solution(src)
    assert ids == ["f"]
    assert out.splitlines() == [
        "def f(x):", "    y = 1",
        "    raise NotImplementedError(\"exercise 'f' is not done yet: replace this line with your solution\")",
        "print(2)"]
    compile(out, "lab", "exec")  # still valid Python


@pytest.mark.parametrize("src, words", [
    ("# BEGIN SOLUTION\nx = 1\n# END SOLUTION", "needs an exercise id"),
    ("# BEGIN SOLUTION a\nx = 1", "never closed"),
    ("x = 1\n# END SOLUTION", "without a BEGIN"),
    ("# BEGIN SOLUTION a\n# BEGIN SOLUTION b\n# END SOLUTION", "inside the solution 'a'"),
])
def test_malformed_markers_are_explained(src, words):
    with pytest.raises(lab_build.LabBuildError, match=words):
        lab_build.strip_solution(src, "demo.ipynb, cell 3")


def _write(path, cells):
    nb = new_notebook(cells=cells, metadata=KERNEL)
    for i, cell in enumerate(nb.cells):
        cell.id = f"c{i}"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


# --- build and check -------------------------------------------------------------------------

@pytest.fixture
def dirs(tmp_path):
    sol, labs = tmp_path / "solutions", tmp_path / "labs"
    sol.mkdir()
    shutil.copy(FIXTURES / "solutions" / "demo_lab.ipynb", sol / "demo_lab.ipynb")
    return sol, labs


def test_build_removes_solutions_clears_outputs_and_keeps_the_rest(dirs):
    sol, labs = dirs
    with pytest.raises(lab_build.LabBuildError, match="does not exist"):  # not "everything is stale"
        lab_build.check(sol, labs)
    labs.mkdir()
    assert lab_build.check(sol, labs) == [labs / "demo_lab.ipynb"]
    lab_build.build(sol, labs, log=lambda *_: None)
    solution = nbformat.read(sol / "demo_lab.ipynb", as_version=4)
    lab = nbformat.read(labs / "demo_lab.ipynb", as_version=4)
    assert lab.metadata["ortlab"]["lab"]["exercises"] == ["relu", "total"]
    assert len(lab.cells) == len(solution.cells)
    for s, cell in zip(solution.cells, lab.cells):
        assert cell.id == s.id and cell.cell_type == s.cell_type
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None and "execution" not in cell.metadata
            assert "BEGIN SOLUTION" not in cell.source and "np.maximum" not in cell.source
        if "BEGIN SOLUTION" not in s.source:
            assert cell.source == s.source
    assert lab_build.check(sol, labs) == []
    assert lab_build.build(sol, labs, log=lambda *_: None) == []  # nothing to do


def test_check_notices_a_changed_solution_and_an_orphan_lab(dirs):
    sol, labs = dirs
    lab_build.build(sol, labs, log=lambda *_: None)
    nb = nbformat.read(sol / "demo_lab.ipynb", as_version=4)
    nb.cells[0].source += "\nMore prose."
    nbformat.write(nb, sol / "demo_lab.ipynb")
    shutil.copy(labs / "demo_lab.ipynb", labs / "old_lab.ipynb")
    assert lab_build.check(sol, labs) == [labs / "demo_lab.ipynb", labs / "old_lab.ipynb"]


def test_build_never_overwrites_a_learners_edits(dirs):
    sol, labs = dirs
    lab_build.build(sol, labs, log=lambda *_: None)
    lab_path = labs / "demo_lab.ipynb"
    lab = nbformat.read(lab_path, as_version=4)
    lab.cells[2].source = "def relu(x):\n    return my_work(x)"
    nbformat.write(lab, lab_path)
    mine = lab_path.read_text()
    nb = nbformat.read(sol / "demo_lab.ipynb", as_version=4)
    nb.cells[0].source += "\nA change upstream."
    nbformat.write(nb, sol / "demo_lab.ipynb")
    with pytest.raises(lab_build.LabEditedError, match="demo_lab.ipynb: edited since"):
        lab_build.build(sol, labs, log=lambda *_: None)
    assert lab_path.read_text() == mine
    lab_build.build(sol, labs, force=True, log=lambda *_: None)
    assert (labs / "demo_lab.ipynb.bak1").read_text() == mine
    assert lab_build.check(sol, labs) == []


def test_a_solution_without_markers_cannot_become_a_lab(tmp_path):
    sol = tmp_path / "solutions"
    _write(sol / "plain.ipynb", [new_code_cell("x = 1")])
    with pytest.raises(lab_build.LabBuildError, match="no '# BEGIN SOLUTION <id>' markers"):
        lab_build.build(sol, tmp_path / "labs")


def test_repository_labs_are_up_to_date(run_cli):
    result = run_cli("ortlab.labs", "check")
    assert result.returncode == 0, result.stdout + result.stderr


# --- checks ----------------------------------------------------------------------------------

def test_check_function_passes_a_correct_implementation(capsys):
    cases = [np.arange(6.0).reshape(2, 3), np.array(-1.5)]
    checks.check_function("double", lambda x: x + x, lambda x: 2 * x, cases)
    assert capsys.readouterr().out.strip() == "[PASS] exercise 'double'"


@pytest.mark.parametrize("learner, words", [
    (lambda x: x.T, "wrong shape: expected (2, 3), got (3, 2)"),
    (lambda x: x + (x > 1), "wrong values: largest difference 1 at index (0, 2) (got 3.0, expected 2.0)"),
    (lambda x: x.reshape(5), "your code raised ValueError"),
])
def test_check_function_says_what_is_wrong_and_where(learner, words, capsys):
    checks.check_function("ident", learner, lambda x: x, [np.arange(6.0).reshape(2, 3)])
    out = capsys.readouterr().out
    assert out.startswith("[FAIL] exercise 'ident': for inputs (float64[2, 3])")
    assert words in out
    assert "Traceback" not in out


def test_not_implemented_is_not_done_and_missing_names_are_explained():
    def stub(x):
        raise NotImplementedError("exercise 'f' is not done yet")
    result = checks.evaluate("f", lambda: checks.compare(stub(1), 1))
    assert (result.status, result.message) == ("not done", "not done yet")  # the name is shown once, by the result
    result = checks.evaluate("g", lambda: undefined_name)  # noqa: F821
    assert result.status == "fail" and "run the exercise's cell first" in result.message


def test_compare_nested_results_and_counts():
    assert checks.compare((1, np.zeros(2)), (1, np.zeros(2))) is None
    assert "expected 2 values" in checks.compare((1,), (1, 2))
    assert "result[1]: wrong values" in checks.compare((1, 3), (1, 2))


def test_check_result_carries_json_for_the_grader():
    result = checks.CheckResult("x", "fail", "why")
    bundle = result._repr_mimebundle_()
    assert bundle["text/plain"] == "[FAIL] exercise 'x': why"
    assert checks.CheckResult.from_json(bundle[checks.CHECK_MIME]) == result


# --- grading ---------------------------------------------------------------------------------

def _untouched_labs(tmp_path):
    labs = sorted((ROOT / "labs").glob("*.ipynb"))
    lab_build.build(FIXTURES / "solutions", tmp_path, log=lambda *_: None)
    return labs + sorted(tmp_path.glob("*.ipynb"))


def test_grading_untouched_labs_reports_every_exercise_not_done(tmp_path):
    for lab in _untouched_labs(tmp_path):
        before = lab.read_bytes()
        reference = FIXTURES / "solutions" if lab.parent == tmp_path else None
        results, problem = grade.grade(lab, timeout=300, solutions_dir=reference)
        assert problem is None, (lab, problem)
        exercises = nbformat.read(lab, as_version=4).metadata["ortlab"]["lab"]["exercises"]
        assert [r.exercise for r in results] == exercises
        assert {r.status for r in results} == {"not done"}, (lab, results)
        assert lab.read_bytes() == before  # the learner's file is never written


def test_grading_a_wrong_answer_reports_the_failure(tmp_path, run_cli):
    lab_build.build(FIXTURES / "solutions", tmp_path, log=lambda *_: None)
    path = tmp_path / "demo_lab.ipynb"
    nb = nbformat.read(path, as_version=4)
    nb.cells[2].source = "def relu(x):\n    return np.abs(x)"
    nb.cells[4].source = "total = 45"
    nbformat.write(nb, path)
    result = run_cli("ortlab.labs", "grade", path, "--solutions", FIXTURES / "solutions")
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert any(line.startswith("relu") and "fail" in line and "wrong values" in line for line in lines), result.stdout
    assert any(line.startswith("total") and "pass" in line for line in lines), result.stdout
    assert "1 of 2 exercises pass" in result.stdout


@pytest.mark.parametrize("make, words", [
    (lambda p: p, "no such file"),
    (lambda p: (p.write_text("{not json"), p)[1], "is not a Jupyter notebook"),
    (lambda p: _write(p, [new_code_cell("x = 1")]), "is not an ortlab lab"),
], ids=["missing", "not-a-notebook", "not-a-lab"])
def test_bad_notebooks_get_one_line_and_nonzero_exit(make, words, tmp_path, run_cli):
    path = make(tmp_path / "x.ipynb")
    result = run_cli("ortlab.labs", "grade", path)
    assert result.returncode == 2
    assert words in result.stderr and "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1


@pytest.mark.parametrize("code, timeout, words", [
    ("import os\nos._exit(1)", 60, "the kernel died in cell 3 (`import os`)"),
    ("import time\ntime.sleep(60)", 8, "ran past its time limit of 8 s"),
], ids=["kernel-dies", "time-limit"])
def test_dead_or_slow_kernels_are_explained(code, timeout, words, tmp_path, run_cli):
    path = _write(tmp_path / "bad.ipynb", [
        new_code_cell("from ortlab.labs import check_value"),
        new_code_cell("# BEGIN SOLUTION a\na = 1\n# END SOLUTION"),
        new_code_cell(code),
        new_code_cell('check_value("a", lambda: a, 1)')])
    result = run_cli("ortlab.labs", "grade", path, "--timeout", timeout)
    assert result.returncode == 1
    assert words in result.stdout and "Traceback" not in result.stdout + result.stderr
    assert "a  " in result.stdout and "not done" in result.stdout


# --- grading cannot be fooled, and never harms the learner's files -------------------------------

def _demo_lab(tmp_path, edit=None):
    """A lab built from the demo fixture into tmp_path/labs, edited by `edit(nb)`; its path."""
    labs = tmp_path / "labs"
    lab_build.build(FIXTURES / "solutions", labs, log=lambda *_: None)
    path = labs / "demo_lab.ipynb"
    if edit is not None:
        nb = nbformat.read(path, as_version=4)
        edit(nb)
        nbformat.write(nb, path)
    return path


def _grade_demo(path, run_cli, *args):
    result = run_cli("ortlab.labs", "grade", path, "--solutions", FIXTURES / "solutions", *args)
    assert "Traceback" not in result.stdout + result.stderr, result.stdout + result.stderr
    return result


def _row(result, exercise):
    return next(line for line in result.stdout.splitlines() if line.startswith(exercise + " "))


HOSTILE = """\
import glob, os
from IPython.display import display
from ortlab.labs.checks import CheckResult, CHECK_MIME
for exercise in ("relu", "total"):
    display(CheckResult(exercise, "pass"))
    display({CHECK_MIME: {"exercise": exercise, "status": "pass", "message": ""}}, raw=True)
for name in glob.glob("*"):
    if name != "demo_lab.ipynb":
        os.remove(name)
with open("demo_lab.ipynb", "w") as f:
    f.write("overwritten by the lab")
from ortlab.labs import checks as _checks
def check_value(exercise, *args, **kwargs):  # the notebook's own "checks", which always pass
    _checks.check(exercise, lambda: None)
check_function = check_value
"""


def test_grading_ignores_forged_results_cut_metadata_and_replaced_checks(tmp_path, run_cli):
    """An untouched lab that displays passing results, lists one exercise in its metadata,
    swaps a check cell for one that always passes, and deletes and overwrites files beside it:
    still 0 of 2, and every file of the learner's is as it was."""
    def edit(nb):
        nb.cells.insert(2, new_code_cell(HOSTILE))
        nb.cells[-1].source = 'check_value("total", lambda: 45, 45)'  # the check cell, made to pass
        nb.metadata["ortlab"]["lab"]["exercises"] = ["relu"]
    path = _demo_lab(tmp_path, edit)
    sibling = path.parent / "my_notes.txt"
    sibling.write_text("mine")
    before = path.read_bytes()
    result = _grade_demo(path, run_cli)
    assert result.returncode == 1, result.stdout
    assert "not done" in _row(result, "relu") and "not done" in _row(result, "total")
    assert "0 of 2 exercises pass" in result.stdout
    assert path.read_bytes() == before and sibling.read_text() == "mine"


PATCHES_ORTLAB = """\
import ortlab.labs
from ortlab.labs import checks as _checks
def forged(exercise, *args, **kwargs):
    _checks.check(exercise, lambda: None)
ortlab.labs.check_value = ortlab.labs.check_function = forged
"""


def test_grading_ignores_a_notebook_that_replaces_ortlabs_checks(tmp_path, run_cli):
    """The checks run in the grader's process: replacing them in the kernel changes nothing."""
    path = _demo_lab(tmp_path, lambda nb: nb.cells.insert(2, new_code_cell(PATCHES_ORTLAB)))
    result = _grade_demo(path, run_cli)
    assert result.returncode == 1, result.stdout
    for exercise in ("relu", "total"):
        row = _row(result, exercise)
        assert "not done" in row, row
    assert "0 of 2 exercises pass" in result.stdout


def test_grading_runs_its_own_checks_where_the_learner_moved_or_deleted_them(tmp_path, run_cli):
    def edit(nb):
        nb.cells[2].source = "def relu(x):\n    return np.maximum(x, 0)"
        del nb.cells[3]  # relu's check cell
        nb.cells[3].source = "total = 45"
        nb.cells[4].source = "print('no check here')"
    result = _grade_demo(_demo_lab(tmp_path, edit), run_cli)
    assert result.returncode == 0, result.stdout
    assert "2 of 2 exercises pass" in result.stdout


def test_grading_shows_the_error_of_the_exercise_cell(tmp_path, run_cli):
    def edit(nb):
        nb.cells[2].source = "def relu(x):\n    return np.maximum(x, 0]"
        nb.cells[4].source = "total = int('forty-five')"
    result = _grade_demo(_demo_lab(tmp_path, edit), run_cli)
    assert result.returncode == 1
    relu, total = _row(result, "relu"), _row(result, "total")
    assert "fail" in relu and "cell 3 (`def relu(x):`) has a SyntaxError" in relu and "line 2" in relu, relu
    assert "fail" in total and "cell 5 (`total = int('forty-five')`) raised ValueError: invalid literal" in total
    assert "no check ran" not in result.stdout


@pytest.mark.parametrize("timeout", ["-5", "0", "nan"])
def test_grading_refuses_a_time_limit_that_is_not_positive(timeout, tmp_path, run_cli):
    result = run_cli("ortlab.labs", "grade", _demo_lab(tmp_path), "--timeout", timeout)
    assert result.returncode == 2
    assert "positive number of seconds" in result.stderr and "Traceback" not in result.stderr
    with pytest.raises(grade.GradeError, match="positive number of seconds"):
        grade.grade(_demo_lab(tmp_path), timeout=0)


def test_grading_a_lab_whose_solution_cannot_be_found_says_so(tmp_path, run_cli):
    path = _demo_lab(tmp_path)
    result = run_cli("ortlab.labs", "grade", path)  # the demo's solution is not in solutions/
    assert result.returncode == 2
    assert "cannot find the solution this lab was generated from" in result.stderr
    assert "--solutions" in result.stderr and len(result.stderr.strip().splitlines()) == 1


# --- the build and check commands refuse what they cannot do -------------------------------------

def _cli_error(result, words):
    assert result.returncode == 2, result.stdout + result.stderr
    assert words in result.stderr, result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_build_with_a_missing_or_empty_solutions_folder_is_an_error(tmp_path, run_cli):
    labs = _demo_lab(tmp_path).parent
    before = sorted(p.name for p in labs.iterdir())
    _cli_error(run_cli("ortlab.labs", "--solutions", tmp_path / "nope", "--labs", labs, "build"),
               "does not exist")
    (tmp_path / "empty").mkdir()
    _cli_error(run_cli("ortlab.labs", "--solutions", tmp_path / "empty", "--labs", labs, "build"),
               "holds no solution notebooks")
    _cli_error(run_cli("ortlab.labs", "--solutions", labs / "demo_lab.ipynb", "--labs", labs, "build"),
               "is not a folder")
    assert sorted(p.name for p in labs.iterdir()) == before  # no lab removed as an "orphan"


def test_build_names_a_corrupted_solution(dirs, run_cli):
    sol, labs = dirs
    (sol / "broken.ipynb").write_text("{not json")
    _cli_error(run_cli("ortlab.labs", "--solutions", sol, "--labs", labs, "build"),
               "broken.ipynb is not a readable notebook (NotJSONError")


def test_build_refuses_to_write_labs_over_the_solutions(dirs, run_cli):
    sol, _ = dirs
    before = (sol / "demo_lab.ipynb").read_bytes()
    _cli_error(run_cli("ortlab.labs", "--solutions", sol, "--labs", sol, "build", "--force"),
               "are the same folder")
    assert (sol / "demo_lab.ipynb").read_bytes() == before


def test_check_with_a_missing_labs_folder_says_so(dirs, run_cli):
    sol, labs = dirs
    _cli_error(run_cli("ortlab.labs", "--solutions", sol, "--labs", labs, "check"),
               f"labs folder {labs}/ does not exist")
    labs.write_text("a file")
    _cli_error(run_cli("ortlab.labs", "--solutions", sol, "--labs", labs, "check"), "is not a folder")


def test_outputs_stored_in_the_learners_file_never_count(tmp_path, run_cli):
    """A stored error output in a cell that does not run this time (the kernel stops first) is not
    reported as that cell's error: the grader runs fresh copies of the learner's cells."""
    import nbformat
    lab = nbformat.read(ROOT / "labs" / "lab01_compose_onnx_model.ipynb", as_version=4)
    code = [c for c in lab.cells if c.cell_type == "code"]
    code[0].source = "import os\nos._exit(0)\n" + code[0].source  # the kernel dies in the first cell
    code[-1].outputs = [nbformat.v4.new_output("error", ename="ValueError", evalue="stored, stale", traceback=[])]
    path = tmp_path / "lab01_compose_onnx_model.ipynb"
    nbformat.write(lab, path)
    out = run_cli("ortlab.labs", "grade", path, "--solutions", ROOT / "solutions")
    assert out.returncode != 0
    assert "stored, stale" not in out.stdout and "kernel died" in out.stdout

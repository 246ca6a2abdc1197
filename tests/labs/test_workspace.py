"""The learner's workspace (ortlab.labs.workspace): work/ is filled once and never overwritten, git ignores
it, grading by name finds the learner's copy first and says which saved file it graded, and `progress`
reads what each saved copy shows."""
import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat

from ortlab.labs import answers, grade, workspace
from ortlab.labs.checks import CheckResult

ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGH = answers.walkthroughs()[0][0]


def test_fill_copies_once_and_never_overwrites_the_learners_copy(tmp_path):
    copied, kept = workspace.fill(tmp_path)
    assert {p.name for p in copied} == {p.name for f in ("notebooks", "labs") for p in (ROOT / f).glob("*.ipynb")}
    assert kept == []
    mine = tmp_path / "labs" / "lab01_compose_onnx_model.ipynb"
    mine.write_text("my work")
    (tmp_path / "notebooks" / WALKTHROUGH.name).unlink()
    copied, kept = workspace.fill(tmp_path)
    assert [p.name for p in copied] == [WALKTHROUGH.name]  # only what was missing
    assert mine in kept and mine.read_text() == "my work"


def test_a_changed_original_is_reported_and_the_copy_kept(tmp_path):
    repo, work = tmp_path / "repo", tmp_path / "work"
    for folder in ("notebooks", "labs"):
        (repo / folder).mkdir(parents=True)
    (repo / "notebooks" / "a.ipynb").write_text("v1")
    workspace.fill(work, repo)
    (work / "notebooks" / "a.ipynb").write_text("mine")
    past = time.time() - 60
    os.utime(work / "notebooks" / "a.ipynb", (past, past))
    (repo / "notebooks" / "a.ipynb").write_text("v2")
    assert workspace.newer_upstream(work, repo) == [work / "notebooks" / "a.ipynb"]
    workspace.fill(work, repo)
    assert (work / "notebooks" / "a.ipynb").read_text() == "mine"


def test_git_ignores_the_workspace():
    done = subprocess.run(["git", "check-ignore", "-q", "work/labs/lab01_compose_onnx_model.ipynb"], cwd=ROOT,
                          timeout=60)
    assert done.returncode == 0  # ignored: `git status` stays clean while a learner works


def _with_check(nb, exercise, status):
    """`nb` with the check cell of `exercise` showing `status` (as if it had just run)."""
    for cell in nb.cells:
        if cell.cell_type == "code" and f"check_{exercise}(" in cell.source:
            bundle = CheckResult(exercise, status, "")._repr_mimebundle_()
            cell.outputs = [nbformat.v4.new_output("display_data", data=bundle)]
    return nb


def test_progress_reads_stubs_and_the_last_shown_checks(tmp_path):
    workspace.fill(tmp_path)
    path = tmp_path / "notebooks" / WALKTHROUGH.name
    every = answers.load(WALKTHROUGH.stem)
    first, second = list(answers.stub_ids(nbformat.read(path, as_version=4)))[:2]
    row = workspace.row(path)
    assert row.passed == [] and first in row.not_done and second in row.not_done
    nb = answers.fill(nbformat.read(path, as_version=4), {first: every.answers[first]}, markers=False)
    nb = _with_check(_with_check(nb, first, "pass"), second, "pass")  # the second's stub is still there
    nbformat.write(nb, path)
    row = workspace.row(path)
    assert row.passed == [first] and second in row.not_done  # a stub in place is never counted done
    base, rows = workspace.progress(tmp_path)
    assert base == tmp_path and any(r.notebook == WALKTHROUGH.stem for r in rows)
    table = workspace.progress_table(base, rows)
    assert f"1 of {sum(r.total for r in rows)} exercises pass" in table


def test_grading_by_name_finds_the_workspace_copy_and_says_which_save_it_graded(tmp_path):
    workspace.fill(tmp_path)
    env = dict(os.environ, ORTLAB_WORKSPACE=str(tmp_path))
    name = "_".join(WALKTHROUGH.stem.split("_")[:2])  # its name as a learner types it: L1_05, 00_welcome
    done = subprocess.run([sys.executable, "-m", "ortlab.labs", "grade", name], cwd=tmp_path.parent, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 1, done.stdout + done.stderr  # untouched: not done
    copy = tmp_path / "notebooks" / WALKTHROUGH.name
    assert done.stdout.startswith(f"graded {copy} as saved at "), done.stdout
    count = len(answers.stub_ids(nbformat.read(copy, as_version=4)))
    assert f"0 of {count} exercises pass" in done.stdout and done.stdout.count("not done") >= count, done.stdout
    progress = subprocess.run([sys.executable, "-m", "ortlab.labs", "progress"], env=env, capture_output=True,
                              text=True, timeout=300)
    assert progress.returncode == 0 and f"exercises in {tmp_path}" in progress.stdout, progress.stderr


def test_lab_path_prefers_the_workspace_over_the_shipped_lab(tmp_path, monkeypatch):
    workspace.fill(tmp_path)
    monkeypatch.setenv("ORTLAB_WORKSPACE", str(tmp_path))
    monkeypatch.chdir(tmp_path.parent)
    assert grade.lab_path("lab01") == tmp_path / "labs" / "lab01_compose_onnx_model.ipynb"
    monkeypatch.setenv("ORTLAB_WORKSPACE", str(tmp_path / "none"))
    assert grade.lab_path("lab01") == ROOT / "labs" / "lab01_compose_onnx_model.ipynb"

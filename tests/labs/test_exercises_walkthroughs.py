"""The walkthroughs' exercises (ortlab.labs.answers): each is 'not done' untouched, passes with its reference
answer, and fails with its own message on each planted usual mistake; the grader grades a walkthrough
against its answers; `labs check` finds a walkthrough and its answers out of step.

The per-exercise checks run in this process (each exercise cell and its check cell, with the walkthrough's
imports): running every walkthrough in a kernel three times would cost minutes. One walkthrough is graded
end to end, through the real grader, for the mechanism.
"""
import contextlib
import io
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from ortlab.gradients import GradientGraphBuilder, ort_gradient_graph
from ortlab.labs import answers, grade, l1_05

ROOT = Path(__file__).resolve().parents[2]
WALKTHROUGHS = answers.walkthroughs()


def _exercises():
    for notebook, path in WALKTHROUGHS:
        reference = answers.reference(nbformat.read(notebook, as_version=4), answers.load(path.stem))
        for exercise in grade.reference_exercises(reference):
            yield pytest.param(notebook, exercise.id, id=f"{notebook.stem[:5]}-{exercise.id}")


def _verdict(notebook, exercise_id, text):
    """What the exercise's check cell prints after its cells ran with `text` in place of the stub (None:
    untouched), in a namespace holding only the walkthrough's imports."""
    walkthrough = nbformat.read(notebook, as_version=4)
    reference = answers.reference(walkthrough, answers.load(notebook.stem))
    exercise = next(e for e in grade.reference_exercises(reference) if e.id == exercise_id)
    filled = answers.fill(walkthrough, {} if text is None else {exercise_id: text}, markers=False)
    keys = [grade._key(cell, i) for i, cell in enumerate(filled.cells)]
    namespace = {}
    for line in grade.reference_imports(reference):
        exec(line, namespace)
    for key in exercise.cells:
        exec(filled.cells[keys.index(key)].source, namespace)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(exercise.check_source, namespace)
    lines = printed.getvalue().strip().splitlines()
    assert len(lines) == 1, lines  # a check shows one line, never a traceback
    return lines[0]


def test_there_are_walkthroughs_with_exercises_and_all_are_in_step():
    assert len(WALKTHROUGHS) >= 1
    assert answers.check_all() == []


@pytest.mark.parametrize("notebook, exercise", list(_exercises()))
def test_untouched_is_not_done_and_the_reference_passes(notebook, exercise):
    assert _verdict(notebook, exercise, None).startswith(f"[NOT DONE] exercise '{exercise}'")
    assert _verdict(notebook, exercise, answers.load(notebook.stem).answers[exercise]) == \
        f"[PASS] exercise '{exercise}'"


@pytest.mark.parametrize("notebook, exercise", list(_exercises()))
def test_each_planted_mistake_fails_with_its_own_message(notebook, exercise):
    mistakes = answers.load(notebook.stem).mistakes[exercise]
    assert mistakes
    for text, words in mistakes:
        verdict = _verdict(notebook, exercise, text)
        assert verdict.startswith(f"[FAIL] exercise '{exercise}'") and words in verdict, (words, verdict)


def test_the_stored_check_outputs_say_not_done():
    """The walkthroughs as stored (what nbval compares) show every exercise 'not done'."""
    for notebook, _ in WALKTHROUGHS:
        nb = nbformat.read(notebook, as_version=4)
        shown = [o["data"]["text/plain"] for c in nb.cells if c.cell_type == "code" for o in c.outputs
                 if "application/vnd.ortlab.check+json" in o.get("data", {})]
        assert len(shown) == len(answers.stub_ids(nb)) >= 2
        assert all(s.startswith("[NOT DONE]") for s in shown), shown


# --- the answers file and the notebook out of step ----------------------------------------------------------

def _copy_answers(tmp_path, edit):
    folder = tmp_path / "walkthroughs"
    folder.mkdir()
    for _, path in WALKTHROUGHS:
        text = path.read_text()
        (folder / path.name).write_text(edit(text) if path == WALKTHROUGHS[0][1] else text)
    return folder


def test_labs_check_names_an_answer_without_a_stub_and_a_stub_without_an_answer(tmp_path):
    first = WALKTHROUGHS[0][1]
    exercise = answers.stub_ids(nbformat.read(WALKTHROUGHS[0][0], as_version=4))
    renamed = next(iter(exercise))
    folder = _copy_answers(tmp_path, lambda text: text.replace(f'"{renamed}":', f'"{renamed}_renamed":', 1))
    found = answers.check_all(folder)
    assert any(f"exercise '{renamed}' has no answer" in p for p in found), found
    assert any(f"answer '{renamed}_renamed' has no stub" in p for p in found), found
    (folder / first.name).write_text("ANSWERS = 3\n")
    with pytest.raises(answers.AnswersError, match="ANSWERS must be a dict"):
        answers.check_all(folder)


def test_labs_check_command_passes_on_this_checkout():
    done = subprocess.run([sys.executable, "-m", "ortlab.labs", "check"], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "every walkthrough's exercises have answers" in done.stdout


# --- the judges' facts are ORT's ----------------------------------------------------------------------------

@pytest.mark.parametrize("model, x_names", [(l1_05.branching_model(), ["W1", "W2"]),
                                             (l1_05.branching_model(), ["W2"]),
                                             (l1_05.shared_values_model(), ["W"])])
def test_the_nodes_ortlab_differentiates_are_those_ort_differentiates(model, x_names):
    """L1_05's 'nodes_to_differentiate' is judged by ortlab's builder: the nodes it picks are exactly those
    whose gradient nodes ORT's builder emits (ORT names them '<node>_Grad/...')."""
    builder = GradientGraphBuilder(model, x_names, "loss")
    ours = {n.name for n in builder.graph.nodes() if n.index in builder.nodes_to_differentiate()}
    theirs = {n.name.split("_Grad/")[0] for n in ort_gradient_graph(model, x_names, "loss").graph.node
              if "_Grad/" in n.name}
    assert ours == theirs


# --- graded end to end, through the grader ------------------------------------------------------------------

def test_the_grader_grades_a_copy_of_a_walkthrough_against_its_answers(tmp_path):
    notebook, path = WALKTHROUGHS[0]
    shutil.copy(notebook, tmp_path / notebook.name)
    results, problem = grade.grade(tmp_path / notebook.name)
    assert problem is None and results and all(r.status == "not done" for r in results), results
    walkthrough = nbformat.read(notebook, as_version=4)
    every = answers.load(path.stem)
    ids = list(answers.stub_ids(walkthrough))
    texts = {ids[0]: every.answers[ids[0]], ids[1]: every.mistakes[ids[1]][0][0]}
    nbformat.write(answers.fill(walkthrough, texts, markers=False), tmp_path / notebook.name)
    results, problem = grade.grade(tmp_path / notebook.name)
    status = {r.exercise: r for r in results}
    assert problem is None and status[ids[0]].status == "pass", results
    assert status[ids[1]].status == "fail" and every.mistakes[ids[1]][0][1] in status[ids[1]].message, results

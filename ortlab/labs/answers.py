"""The walkthroughs' exercises and their reference answers, kept apart from the notebooks the learner reads.

A walkthrough (notebooks/<name>.ipynb) holds each exercise as the stub line a lab build writes,

    raise NotImplementedError("exercise '<id>' is not done yet: replace this line with your solution")

inside a function or class of the learner's, followed by a check cell (ortlab.labs.<notebook>.check_<id>).
Run as stored, each check says "not done", which is the output nbval compares.

The reference answers live in solutions/walkthroughs/<name>.py, outside the package, so nothing the
learner's code imports holds them. That file is plain data:

    ANSWERS = {"<id>": '''lines that replace the stub, indented as if they were at column 0'''}
    MISTAKES = {"<id>": [('''lines of a usual mistake''', "words its check must say"), ...]}

The grader grades a walkthrough (or the learner's copy of one) against the walkthrough with each stub
replaced by its answer between '# BEGIN SOLUTION <id>' and '# END SOLUTION': the same reference a lab is
graded against, so every rule of ortlab.labs.grade holds for walkthroughs too.
"""
import copy
import re
import runpy
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ortlab.errors import OrtlabError

REPO = Path(__file__).resolve().parents[2]
NOTEBOOKS = REPO / "notebooks"
ANSWERS_DIR = REPO / "solutions" / "walkthroughs"
STUB_LINE = re.compile(r"^(?P<indent>\s*)raise NotImplementedError\(\"exercise '(?P<id>[A-Za-z0-9_.-]+)' "
                       r"is not done yet: [^\"]*\"\)\s*$")


class AnswersError(OrtlabError):
    """A walkthrough's answers file is missing, unreadable, or out of step with the notebook."""


@dataclass
class Answers:
    """The reference answers of one walkthrough: {id: lines}, {id: [(lines, words)]}, and their file."""

    answers: dict
    mistakes: dict = field(default_factory=dict)
    path: Path = None


def answers_path(name, folder=None):
    """solutions/walkthroughs/<name>.py for a walkthrough's file name or stem."""
    stem = Path(name).name
    stem = stem[:-len(".ipynb")] if stem.endswith(".ipynb") else stem
    return Path(folder or ANSWERS_DIR) / f"{stem}.py"


def has_answers(name, folder=None):
    return answers_path(name, folder).is_file()


def load(name, folder=None):
    """The Answers of walkthrough `name`, or AnswersError saying what is wrong with its file."""
    path = answers_path(name, folder)
    if not path.is_file():
        raise AnswersError(f"{path}: no such file, so walkthrough {Path(name).stem} has no reference answers")
    try:
        data = runpy.run_path(str(path))
    except Exception as exc:
        raise AnswersError(f"{path} does not run: {type(exc).__name__}: {exc}".splitlines()[0]) from None
    answers, mistakes = data.get("ANSWERS"), data.get("MISTAKES", {})
    if not isinstance(answers, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                for k, v in answers.items()):
        raise AnswersError(f"{path}: ANSWERS must be a dict {{exercise id: the answer's lines (str)}}")
    if not isinstance(mistakes, dict) or not all(
            isinstance(v, list) and all(isinstance(m, tuple) and len(m) == 2 for m in v) for v in mistakes.values()):
        raise AnswersError(f"{path}: MISTAKES must be a dict {{exercise id: [(lines, words the check says)]}}")
    return Answers(answers, mistakes, path)


def stub_ids(nb):
    """{exercise id: index of the cell holding its stub}, in notebook order."""
    found = {}
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for line in cell.source.splitlines():
                match = STUB_LINE.match(line)
                if match:
                    found.setdefault(match["id"], index)
    return found


def _indented(text, indent):
    lines = textwrap.dedent(text).strip("\n").splitlines()
    return [indent + line if line.strip() else "" for line in lines]


def fill(nb, texts, markers=True):
    """A copy of `nb` in which the stub of each exercise in `texts` ({id: lines}) is replaced by its lines,
    at the stub's indentation, between BEGIN/END SOLUTION markers when `markers`."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        out = []
        for line in cell.source.splitlines():
            match = STUB_LINE.match(line)
            if match and match["id"] in texts:
                indent = match["indent"]
                body = _indented(texts[match["id"]], indent)
                out += [f"{indent}# BEGIN SOLUTION {match['id']}", *body, f"{indent}# END SOLUTION"] if markers \
                    else body
            else:
                out.append(line)
        cell.source = "\n".join(out)
    return nb


def problems(nb, answers, where="the walkthrough"):
    """What keeps a walkthrough and its answers file out of step (empty when they agree)."""
    stubs = list(stub_ids(nb))
    found = [f"{where}: exercise '{i}' has no answer in {answers.path}" for i in stubs if i not in answers.answers]
    found += [f"{answers.path}: answer '{i}' has no stub in {where}" for i in answers.answers if i not in stubs]
    found += [f"{answers.path}: exercise '{i}' has no planted mistake in MISTAKES (each exercise needs one)"
              for i in stubs if not answers.mistakes.get(i)]
    if len(stubs) < 2:
        found.append(f"{where} has {len(stubs)} exercise(s); a walkthrough with answers has at least two")
    return found


def reference(nb, answers):
    """The walkthrough with every answer in place, between markers: what the grader grades against."""
    return fill(nb, answers.answers)


def walkthroughs(folder=None):
    """The walkthroughs that have an answers file: [(notebook path, answers path)]."""
    folder = Path(folder or ANSWERS_DIR)
    return [(NOTEBOOKS / f"{p.stem}.ipynb", p) for p in sorted(folder.glob("*.py"))]


def check_all(folder=None):
    """Every problem of every walkthrough with an answers file (empty when all are in step)."""
    found = []
    for notebook, path in walkthroughs(folder):
        if not notebook.is_file():
            found.append(f"{path}: there is no walkthrough {notebook.name} in {notebook.parent}/")
            continue
        found += problems(nbformat.read(notebook, as_version=4), load(path.stem, path.parent),
                          f"notebooks/{notebook.name}")
    return found

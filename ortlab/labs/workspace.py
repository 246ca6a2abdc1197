"""The learner's workspace: work/, a git-ignored copy of notebooks/ and labs/ where the learner writes.

`make lab` fills it on first start (`python -m ortlab.labs workspace`) and opens
work/notebooks/00_welcome.ipynb. A file already in work/ is never overwritten, by this or by any other
command of the lab: the repository's notebooks/ and labs/ stay as CI tests them (`make test`,
`labs check`, `git status` never see work/), and a rebuild of labs/ never reaches the learner's copy.

`progress` reads the learner's saved copies: for each exercise, whether its stub is still in place and
what its check cell showed when it last ran. It grades nothing; `python -m ortlab.labs grade <name>`
does, in a fresh kernel.
"""
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ortlab.labs import answers
from ortlab.labs.build import stub_pattern
from ortlab.labs.checks import CHECK_MIME, CheckResult

REPO = Path(__file__).resolve().parents[2]
FOLDERS = ("notebooks", "labs")


def root():
    """The workspace folder: $ORTLAB_WORKSPACE, else work/ in this checkout."""
    return Path(os.environ.get("ORTLAB_WORKSPACE") or REPO / "work")


def fill(work=None, repo=REPO):
    """Copy each notebook of notebooks/ and labs/ (and labs/README.md) that work/ does not have yet.

    Returns (copied, kept): the paths written, and those left alone because the learner already has them.
    """
    work = Path(work or root())
    copied, kept = [], []
    for folder in FOLDERS:
        (work / folder).mkdir(parents=True, exist_ok=True)
        for source in sorted((repo / folder).glob("*.ipynb")):
            target = work / folder / source.name
            if target.exists():
                kept.append(target)
            else:
                shutil.copyfile(source, target)
                copied.append(target)
    return copied, kept


def newer_upstream(work=None, repo=REPO):
    """The learner's copies whose original in the repository changed since they were copied (by time)."""
    work = Path(work or root())
    return [target for folder in FOLDERS for target in sorted((work / folder).glob("*.ipynb"))
            if (repo / folder / target.name).exists()
            and (repo / folder / target.name).stat().st_mtime > target.stat().st_mtime
            and (repo / folder / target.name).read_bytes() != target.read_bytes()]


@dataclass
class Row:
    """One notebook's exercises as last saved: which pass, fail, or are not done."""

    notebook: str
    passed: list
    failed: list
    not_done: list

    @property
    def total(self):
        return len(self.passed) + len(self.failed) + len(self.not_done)


def exercise_ids(nb, name):
    """The exercises of a notebook: a lab's recorded ones, or a walkthrough's stubs and answers."""
    recorded = nb.metadata.get("ortlab", {}).get("lab", {}).get("exercises") \
        if isinstance(nb.metadata.get("ortlab"), dict) else None
    if recorded:
        return list(recorded)
    if answers.has_answers(name):
        return list(answers.load(name).answers)
    return []


def _shown(nb):
    """{exercise: the status its check cell showed when it last ran}."""
    shown = {}
    for cell in nb.cells:
        for output in cell.get("outputs", []) if cell.cell_type == "code" else []:
            data = output.get("data", {})
            if CHECK_MIME in data:
                try:
                    result = CheckResult.from_json(data[CHECK_MIME])
                except Exception:
                    continue
                shown[result.exercise] = result.status
    return shown


def row(path):
    """The Row of one saved notebook (None when it has no exercises)."""
    nb = nbformat.read(path, as_version=4)
    ids = exercise_ids(nb, Path(path).name)
    if not ids:
        return None
    shown, code = _shown(nb), [c.source for c in nb.cells if c.cell_type == "code"]
    passed, failed, not_done = [], [], []
    for exercise in ids:
        stubbed = any(stub_pattern(exercise).search(source) for source in code)
        status = "not done" if stubbed else shown.get(exercise, "not done")
        {"pass": passed, "fail": failed}.get(status, not_done).append(exercise)
    return Row(Path(path).stem, passed, failed, not_done)


def progress(work=None):
    """A Row per notebook with exercises in the workspace (or in the repository when there is none yet)."""
    work = Path(work or root())
    base = work if (work / "notebooks").is_dir() else REPO
    rows = [row(p) for folder in FOLDERS for p in sorted((base / folder).glob("*.ipynb"))]
    return base, [r for r in rows if r is not None]


def progress_table(base, rows):
    """Plain text: one line per notebook, then the totals."""
    width = max([len("notebook")] + [len(r.notebook) for r in rows])
    lines = [f"exercises in {base} (as last saved and run; `python -m ortlab.labs grade <name>` grades one)",
             f"{'notebook':<{width}}  done  not done / failing"]
    for r in rows:
        todo = [f"{e} (fails)" for e in r.failed] + r.not_done
        lines.append(f"{r.notebook:<{width}}  {len(r.passed)}/{r.total}  {', '.join(todo) or '-'}")
    done = sum(len(r.passed) for r in rows)
    lines.append(f"{done} of {sum(r.total for r in rows)} exercises pass in {len(rows)} notebooks")
    return "\n".join(lines)

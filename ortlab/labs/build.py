"""Generate labs/ from solutions/: solution code out, stubs in, outputs cleared.

A solution cell marks its solution code like this (the exercise id follows BEGIN):

    def square(x):
        # BEGIN SOLUTION square
        return x * x
        # END SOLUTION

The lab gets, at the same indentation,
    raise NotImplementedError("exercise 'square' is not done yet: ...")
Everything else is kept as it is. A lab records its exercises and a hash of
its generated text in its metadata, so the build can tell a lab that a
learner edited (never overwritten without --force, and then backed up first).
"""
import copy
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import nbformat

from ortlab.errors import OrtlabError

BEGIN = re.compile(r"^(?P<indent>\s*)# BEGIN SOLUTION(?:\s+(?P<id>[A-Za-z0-9_.-]+))?\s*$")
END = re.compile(r"^\s*# END SOLUTION\s*$")
STUB = "{indent}raise NotImplementedError(\"exercise '{id}' is not done yet: {hint}\")"
HINT = "replace this line with your solution"
STUB_PATTERN = r"NotImplementedError\(\"exercise '{id}' is not done yet"


class LabBuildError(OrtlabError):
    """A solution notebook's markers are malformed, or a lab cannot be written."""


class LabEditedError(LabBuildError):
    """A lab holds edits that the build did not make; it is left alone."""


def strip_solution(source, where="cell"):
    """Return (lab source, exercise ids) for one code cell's source."""
    out, ids, current = [], [], None
    for number, line in enumerate(source.splitlines(), 1):
        begin, end = BEGIN.match(line), END.match(line)
        if begin:
            if current is not None:
                raise LabBuildError(f"{where}, line {number}: BEGIN SOLUTION inside the solution "
                                    f"'{current}'; close it with '# END SOLUTION' first")
            current = begin["id"]
            if not current:
                raise LabBuildError(f"{where}, line {number}: '# BEGIN SOLUTION' needs an exercise "
                                    "id, e.g. '# BEGIN SOLUTION matmul_add'")
            if current not in ids:  # one exercise may span several methods
                ids.append(current)
            out.append(STUB.format(indent=begin["indent"], id=current, hint=HINT))
        elif end:
            if current is None:
                raise LabBuildError(f"{where}, line {number}: '# END SOLUTION' without a BEGIN")
            current = None
        elif current is None:
            out.append(line)
    if current is not None:
        raise LabBuildError(f"{where}: the solution '{current}' is never closed; "
                            "add '# END SOLUTION' after it")
    return "\n".join(out), ids


def marker_ids(nb):
    """The exercise ids of a notebook's `# BEGIN SOLUTION <id>` markers, in order."""
    ids = []
    for cell in nb.cells:
        if cell.cell_type == "code":
            for line in cell.source.splitlines():
                match = BEGIN.match(line)
                if match and match["id"] and match["id"] not in ids:
                    ids.append(match["id"])
    return ids


def notebook_text(nb):
    """The exact text nbformat.write saves for `nb`."""
    return nbformat.writes(nb) + "\n"


def _text_hash(nb):
    nb = copy.deepcopy(nb)
    nb.metadata.get("ortlab", {}).get("lab", {}).pop("build_hash", None)
    return hashlib.sha256(notebook_text(nb).encode()).hexdigest()[:16]


def make_lab(solution, solution_name):
    """The lab notebook (a new object) for a solution notebook."""
    lab = copy.deepcopy(solution)
    ids = []
    for index, cell in enumerate(lab.cells):
        if cell.cell_type == "code":
            cell.source, found = strip_solution(cell.source, f"{solution_name}, cell {index}")
            cell.outputs, cell.execution_count = [], None
            cell.metadata.pop("execution", None)  # the solution's run timings
            duplicated = set(found) & set(ids)
            if duplicated:
                raise LabBuildError(f"{solution_name}, cell {index}: exercise id(s) "
                                    f"{sorted(duplicated)} used twice; give each its own id")
            ids += found
    if not ids:
        raise LabBuildError(f"{solution_name} has no '# BEGIN SOLUTION <id>' markers, so its lab "
                            "would have no exercises")
    lab.metadata["ortlab"] = {"lab": {"exercises": ids, "solution": solution_name}}
    lab.metadata["ortlab"]["lab"]["build_hash"] = _text_hash(lab)
    return lab


def is_untouched(lab):
    """True when a lab is exactly as the build wrote it (no learner edits, no outputs)."""
    recorded = lab.metadata.get("ortlab", {}).get("lab", {}).get("build_hash")
    return recorded is not None and recorded == _text_hash(lab)


@dataclass
class Plan:
    """What a build would do: files to write, files already up to date, stale orphans."""

    write: dict  # lab path -> notebook
    current: list
    orphans: list


def solution_paths(solutions_dir):
    """The solution notebooks of a folder, or LabBuildError when there is no such folder or none in it."""
    solutions_dir = Path(solutions_dir)
    if not solutions_dir.exists():
        raise LabBuildError(f"solutions folder {solutions_dir}/ does not exist; give the folder of "
                            "solution notebooks with --solutions (default: solutions)")
    if not solutions_dir.is_dir():
        raise LabBuildError(f"{solutions_dir} is not a folder; --solutions takes the folder of solution notebooks")
    paths = sorted(solutions_dir.glob("*.ipynb"))
    if not paths:
        raise LabBuildError(f"{solutions_dir}/ holds no solution notebooks (*.ipynb), so there are no labs "
                            "to build; is --solutions the right folder?")
    return paths


def read_solution(path):
    """A solution notebook, or LabBuildError naming the file when it cannot be read."""
    try:
        return nbformat.read(path, as_version=4)
    except Exception as exc:
        reason = str(exc).strip().splitlines()
        raise LabBuildError(f"{path} is not a readable notebook ({type(exc).__name__}"
                            f"{': ' + reason[0][:100] if reason else ''}); restore it "
                            f"(e.g. `git checkout -- {path}`) or fix its JSON") from None


def _check_labs_dir(solutions_dir, labs_dir):
    if labs_dir.exists() and not labs_dir.is_dir():
        raise LabBuildError(f"{labs_dir} is not a folder; --labs takes the folder the labs are written to")
    if labs_dir.resolve() == Path(solutions_dir).resolve():
        raise LabBuildError(f"--labs and --solutions are the same folder ({labs_dir}/); the labs would "
                            "replace the solutions. Give the labs a folder of their own")


def plan(solutions_dir="solutions", labs_dir="labs"):
    solutions_dir, labs_dir = Path(solutions_dir), Path(labs_dir)
    paths = solution_paths(solutions_dir)
    _check_labs_dir(solutions_dir, labs_dir)
    write, current = {}, []
    for path in paths:
        lab = make_lab(read_solution(path), f"{solutions_dir.name}/{path.name}")
        target = labs_dir / path.name
        text = notebook_text(lab)
        if target.exists() and target.read_text() == text:
            current.append(target)
        else:
            write[target] = lab
    wanted = {labs_dir / p.name for p in solutions_dir.glob("*.ipynb")}
    orphans = sorted(p for p in labs_dir.glob("*.ipynb") if p not in wanted)
    return Plan(write, current, orphans)


def _backup(path):
    for n in range(1, 1000):
        backup = path.with_name(f"{path.name}.bak{n}")
        if not backup.exists():
            backup.write_bytes(path.read_bytes())
            return backup
    raise LabBuildError(f"too many backups of {path}; tidy the .bak files")


def _read_lab(path):
    try:
        return nbformat.read(path, as_version=4)
    except Exception:
        return None


def build(solutions_dir="solutions", labs_dir="labs", force=False, log=print):
    """Write every lab that is missing or out of date; return the paths written.

    A lab a learner edited is not overwritten: LabEditedError names it, unless
    force=True, which first copies it to '<lab>.ipynb.bakN'.
    """
    todo = plan(solutions_dir, labs_dir)
    edited = [p for p in list(todo.write) + todo.orphans
              if p.exists() and not ((nb := _read_lab(p)) is not None and is_untouched(nb))]
    if edited and not force:
        names = ", ".join(str(p) for p in edited)
        raise LabEditedError(f"{names}: edited since it was generated (your work?); nothing was "
                             "written. Copy your work elsewhere, or run the build with --force, "
                             "which backs each one up as <name>.bakN before writing")
    Path(labs_dir).mkdir(parents=True, exist_ok=True)
    for path in edited:
        log(f"backed up {path} to {_backup(path)}")
    for path, lab in todo.write.items():
        path.write_text(notebook_text(lab))
        log(f"wrote {path}")
    for path in todo.orphans:
        path.unlink()
        log(f"removed {path} (its solution is gone)")
    return list(todo.write)


def check(solutions_dir="solutions", labs_dir="labs"):
    """Paths in labs/ that are not what the build would write (empty when up to date)."""
    if Path(labs_dir).exists() and not Path(labs_dir).is_dir():
        raise LabBuildError(f"{labs_dir} is not a folder; --labs takes the folder the labs are written to")
    if not Path(labs_dir).is_dir():
        raise LabBuildError(f"labs folder {labs_dir}/ does not exist; run `python -m ortlab.labs build` to "
                            "write it (or give the right one with --labs)")
    todo = plan(solutions_dir, labs_dir)
    return sorted(list(todo.write) + todo.orphans)


def stub_pattern(exercise):
    """Regex matching the stub line the build puts in place of exercise `exercise`."""
    return re.compile(STUB_PATTERN.format(id=re.escape(exercise)))

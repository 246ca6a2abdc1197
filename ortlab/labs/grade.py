"""Grade a learner's lab: run it in a fresh kernel, in a scratch folder, with the grader's own checks.

What decides pass or fail is not what the learner's notebook displays, nor its metadata:

- the exercises are those of the *reference*: the solution the lab was generated from
  (solutions/<name>.ipynb, found by the lab's file name or recorded solution), or, for a
  solution notebook itself, its own '# BEGIN SOLUTION' markers;
- each exercise's check cell is the reference's (the cell whose stored output is that
  exercise's check, else the first code cell after the exercise mentioning a check). The
  grader runs the learner's cells in order in a kernel, and runs the reference's check cell
  in place of the learner's (or after the exercise's cell when the learner deleted it);
- a check runs in the grader's own process, never in the kernel: it asks the kernel to run the
  learner's code on inputs it chooses and gets back outputs as data (ortlab.labs.remote), and
  decides from that data. Nothing the learner's code does in its kernel (displaying results,
  wrapping `display`, replacing a check or its runner) reaches the verdict; a result a notebook
  displays is never read.

The learner's notebook is copied into a temporary folder, which is the kernel's working folder,
so a cell that writes, overwrites or deletes files beside the notebook touches only the copy.
The learner's file is read once and never written.

The kernel runs as the same user as the grader, so the learner's code can write the grader's files. Every
judge is imported before the kernel starts, a forged bytecode cache of ortlab's own modules is refused,
and while the kernel runs this process imports nothing (no module, no bytecode cache) written since it
started (ortlab.labs.isolation).
"""
import ast
import builtins
import os
import re
import secrets
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from ortlab.errors import OrtlabError
from ortlab.labs.build import BEGIN, marker_ids, stub_pattern, strip_solution
from ortlab.labs import answers as walkthrough_answers
from ortlab.labs import checks, isolation, remote, workspace
from ortlab.labs.checks import CHECK_MIME, CheckResult
from ortlab.labs.remote import Learner

DEFAULT_TIMEOUT = 600
REPO = Path(__file__).resolve().parents[2]  # the checkout holding ortlab/ and solutions/
SOLUTIONS = REPO / "solutions"


class GradeError(OrtlabError):
    """The notebook could not be graded (missing, not a notebook, not a lab, kernel trouble)."""


def _read_notebook(path, role):
    try:
        return nbformat.read(path, as_version=4)
    except Exception as exc:
        raise GradeError(f"{path} is not a Jupyter notebook ({type(exc).__name__}); "
                         f"give the .ipynb file of {role}") from None


def lab_path(given):
    """The notebook `given` names: a path as given, or a lab's or walkthrough's name or id ("lab01",
    "lab01_compose_onnx_model", "L1_05", with or without .ipynb) looked up in the current folder, then in the
    learner's workspace (work/labs, work/notebooks: ortlab.labs.workspace), then in this checkout's labs/ and
    notebooks/, so that grading works from any folder and from a `!` cell."""
    path = Path(given)
    if path.exists() or path.parent != Path("."):
        return path
    stem = path.name[:-len(".ipynb")] if path.name.endswith(".ipynb") else path.name
    work = workspace.root()
    for folder in (Path.cwd(), work / "labs", work / "notebooks", REPO / "labs", REPO / "notebooks"):
        found = sorted(folder.glob(f"{stem}.ipynb")) or sorted(folder.glob(f"{stem}_*.ipynb"))
        if len(found) == 1:
            return found[0]
    return path


def load_lab(path):
    """Read a lab (or solution) notebook, or raise GradeError saying why it cannot be graded."""
    path = Path(path)
    if not path.exists():
        labs = ", ".join(sorted(p.stem.split("_")[0] for p in (REPO / "labs").glob("lab*.ipynb")))
        raise GradeError(f"{path}: no such file; give a lab's path, or its name ({labs})")
    if path.is_dir():
        raise GradeError(f"{path} is a folder; give one lab notebook, e.g. labs/lab01_compose_onnx_model.ipynb")
    nb = _read_notebook(path, "a lab")
    recorded = nb.metadata.get("ortlab", {}).get("lab", {}) if isinstance(nb.metadata.get("ortlab"), dict) else {}
    if not (isinstance(recorded, dict) and recorded.get("exercises")) and not marker_ids(nb) \
            and not walkthrough_answers.has_answers(path.name):
        raise GradeError(f"{path} is not an ortlab lab: it has no exercises "
                         "(labs are generated into labs/ by `python -m ortlab.labs build`)")
    return nb


def has_marker(cell):
    """True when a cell holds a `# BEGIN SOLUTION` line (a solution, never a check)."""
    return any(BEGIN.match(line) for line in cell.source.splitlines())


def _key(cell, index):
    """How a cell is matched between the reference and the learner's copy: its id (the build keeps ids)."""
    return cell.get("id") or f"#{index}"


# --- the reference: exercises and their check cells ------------------------------------------

@dataclass
class Exercise:
    """One exercise of the reference: its id, the keys of its cells, and its check cell's code."""

    id: str
    cells: list = field(default_factory=list)  # keys of the cells holding its solution
    check_key: str = None
    check_source: str = ""


def find_reference(path, nb, solutions_dir=None):
    """(reference notebook, where it came from) for the notebook `nb` read from `path`."""
    path = Path(path)
    recorded = nb.metadata.get("ortlab", {}).get("lab", {}) if isinstance(nb.metadata.get("ortlab"), dict) else {}
    names = [path.name]
    if isinstance(recorded, dict) and isinstance(recorded.get("solution"), str):
        names.append(Path(recorded["solution"]).name)  # a name only: never a path the lab chooses
    folder = Path(solutions_dir) if solutions_dir is not None else SOLUTIONS
    if walkthrough_answers.has_answers(path.name, folder / "walkthroughs"):
        return _walkthrough_reference(path, folder / "walkthroughs")
    for name in dict.fromkeys(names):
        candidate = folder / name
        if candidate.is_file():
            reference = _read_notebook(candidate, "the lab's solution")
            if marker_ids(reference):
                return reference, str(candidate)
    if marker_ids(nb):  # a solution (or a notebook written like one) is its own reference
        return nb, str(path)
    raise GradeError(f"{path}: cannot find the solution this lab was generated from (looked for "
                     f"{' and '.join(dict.fromkeys(names))} in {folder}/), so there is nothing to grade "
                     "it against; keep the lab's file name, or pass --solutions <folder holding its solution>")


def _walkthrough_reference(path, answers_dir):
    """A walkthrough's reference: this checkout's notebooks/<name>.ipynb (never the learner's copy) with the
    answers of solutions/walkthroughs/<name>.py in place of its stubs (ortlab.labs.answers)."""
    source = walkthrough_answers.NOTEBOOKS / f"{Path(path).stem}.ipynb"
    if not source.is_file():
        raise GradeError(f"{path}: the walkthrough it is a copy of ({source}) is missing; restore it with git")
    try:
        answers = walkthrough_answers.load(path.name, answers_dir)
    except OrtlabError as exc:
        raise GradeError(str(exc)) from None
    walkthrough = _read_notebook(source, "the walkthrough")
    return walkthrough_answers.reference(walkthrough, answers), f"{source} with {answers.path}"


def _check_cells(cell):
    for output in cell.get("outputs", []):
        data = output.get("data", {}) if isinstance(output, dict) else {}
        if CHECK_MIME in data:
            try:
                yield CheckResult.from_json(data[CHECK_MIME]).exercise
            except Exception:
                continue


def reference_exercises(reference, where="the reference"):
    """The reference's exercises, in order, each with its cells and its check cell."""
    exercises = {}
    for index, cell in enumerate(reference.cells):
        if cell.cell_type != "code":
            continue
        try:
            _, ids = strip_solution(cell.source, f"{where}, cell {index + 1}")
        except OrtlabError as exc:
            raise GradeError(str(exc)) from None
        for exercise in ids:
            exercises.setdefault(exercise, Exercise(exercise)).cells.append(_key(cell, index))
    if not exercises:
        raise GradeError(f"{where} has no '# BEGIN SOLUTION <id>' markers, so there is nothing to grade")
    code = [(index, cell) for index, cell in enumerate(reference.cells) if cell.cell_type == "code"]
    for exercise in exercises.values():
        for index, cell in code:  # the cell whose stored output is this exercise's check
            if exercise.id in _check_cells(cell) and not has_marker(cell):
                exercise.check_key, exercise.check_source = _key(cell, index), cell.source
                break
        else:  # not executed: the first code cell after the exercise that calls a check
            last = max(i for i, c in code if _key(c, i) in exercise.cells)
            for index, cell in code:
                if index > last and "check" in cell.source and not has_marker(cell):
                    exercise.check_key, exercise.check_source = _key(cell, index), cell.source
                    break
            else:
                raise GradeError(f"{where} has no check cell for exercise '{exercise.id}' (a code "
                                 "cell after it calling one of ortlab.labs' checks)")
    return list(exercises.values())


# --- running ---------------------------------------------------------------------------------

def _kernel_name(nb):
    from jupyter_client.kernelspec import KernelSpecManager  # optional: jupyter_client

    wanted = nb.metadata.get("kernelspec", {}).get("name", "python3")
    return wanted if wanted in KernelSpecManager().find_kernel_specs() else "python3"


def reference_imports(reference):
    """The import statements in the reference's code cells (the grader runs them to read its checks)."""
    lines = []
    for cell in reference.cells:
        if cell.cell_type != "code":
            continue
        try:
            tree = ast.parse(cell.source)
        except SyntaxError:  # IPython magics
            continue
        lines += [ast.unparse(node) for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom))]
    return list(dict.fromkeys(lines))


def check_namespace(imports, source):
    """The namespace the grader runs a reference check cell in, in its own process: the reference's
    imports, and each other name the cell reads as a remote.Learner (the learner's object of that name,
    which only the kernel holds)."""
    namespace = {}
    for line in imports:
        try:
            exec(line, namespace)
        except Exception:  # an import the grader's process lacks: the check says so when it needs it
            pass
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id not in namespace \
                and not hasattr(builtins, node.id):
            namespace[node.id] = Learner(name=node.id)
    return namespace


@dataclass
class Step:
    """One thing the grader does: run a learner's cell (index in their notebook) in the kernel, or run the
    reference's check of `exercises` in the grader's own process (source: the reference's check cell)."""

    cell: object = None
    learner_index: int = None
    exercises: tuple = ()
    source: str = None
    results: dict = field(default_factory=dict)
    error: tuple = None  # (ename, message) when the check itself could not run


def plan(nb, exercises):
    """The steps, in order: the learner's cells, with the grader's checks in place of theirs."""
    keys = [_key(cell, i) for i, cell in enumerate(nb.cells)]
    by_check = {}
    for exercise in exercises:
        by_check.setdefault(exercise.check_key, []).append(exercise)
    missing = [e for e in exercises if e.check_key not in keys]
    steps, placed = [], set()

    def grader_step(group):
        return Step(exercises=tuple(e.id for e in group), source=group[0].check_source)

    for index, (cell, key) in enumerate(zip(nb.cells, keys)):
        if key in by_check and key not in placed:
            placed.add(key)
            steps.append(grader_step(by_check[key]))
            continue
        if cell.cell_type == "code":  # a fresh copy: outputs stored in the learner's file never count
            steps.append(Step(nbformat.v4.new_code_cell(cell.source), learner_index=index))
        for exercise in list(missing):  # its check cell is gone: check right after its last cell
            if key in exercise.cells and key == max((k for k in keys if k in exercise.cells),
                                                    key=keys.index):
                steps.append(grader_step([exercise]))
                missing.remove(exercise)
    steps += [grader_step([e]) for e in missing]  # neither the check nor the exercise is left
    return steps


class _Stopped(BaseException):
    """The kernel timed out or died while a check waited for it (no check may catch this)."""

    def __init__(self, error):
        super().__init__(str(error))
        self.error = error


class KernelRemote:
    """A check's way to the learner's kernel while grading: each call runs one probe there, in a cell of
    its own, and reads back the one reply carrying that cell's token (data only: ortlab.labs.remote)."""

    def __init__(self, client, run_nb, deadline):
        self.client, self.run_nb, self.deadline = client, run_nb, deadline

    def call(self, fn, *args):
        from nbclient.exceptions import CellTimeoutError, DeadKernelError  # optional: nbclient

        token = secrets.token_hex(16)
        source = (f"__import__('ortlab.labs.remote', fromlist=['serve']).serve("
                  f"{remote.request(remote.name_of(fn), args)!r}, {token!r})")
        cell = nbformat.v4.new_code_cell(source)
        self.run_nb.cells.append(cell)
        remaining = self.deadline - time.monotonic()
        try:
            if remaining <= 0:
                raise CellTimeoutError("time is up")
            self.client.timeout = max(1, int(remaining))
            self.client.execute_cell(cell, len(self.run_nb.cells) - 1)
        except (CellTimeoutError, DeadKernelError) as exc:
            raise _Stopped(exc) from None
        replies = [o["data"][remote.RESULT_MIME] for o in cell.get("outputs", [])
                   if remote.RESULT_MIME in o.get("data", {})]
        replies = [r for r in replies if isinstance(r, dict) and r.get("token") == token]
        if len(replies) == 1:
            return remote.answer(replies[0].get("reply"))
        error = _errors(cell)
        if error:  # the request itself failed in the kernel (the notebook broke ortlab there)
            raise remote.answer({"raised": {"type": error[0], "message": error[1]}}) from None
        raise remote.RemoteError(f"the kernel sent {len(replies)} replies to one request")


def run_check(step, imports, kernel):
    """Run the reference's check cell of `step` in this process; its results go to step.results."""
    label = f"<the grader's check of exercise {', '.join(repr(i) for i in step.exercises)}>"
    try:
        namespace = check_namespace(imports, step.source)
        with checks.judging(kernel) as results:
            exec(compile(step.source, label, "exec"), namespace)
    except _Stopped:
        raise
    except Exception as exc:  # the check cell itself failed (e.g. it is not a call of ortlab's checks)
        step.error = (type(exc).__name__, (str(exc).strip().splitlines() or [""])[0])
        return
    for result in results:
        if result.exercise in step.exercises and result.exercise not in step.results:
            step.results[result.exercise] = result


def _where(step, nb):
    if step.learner_index is not None:
        return f"in {_cell_name(nb, step.learner_index)}"
    return f"while checking exercise {', '.join(repr(e) for e in step.exercises)}"


def _cell_name(nb, index):
    first = next((line.strip() for line in nb.cells[index].source.splitlines() if line.strip()), "")
    return f"cell {index + 1} (`{first[:40]}{'...' if len(first) > 40 else ''}`)"


def _kernel_env():
    """The grader's environment for the kernel, with ortlab first on the path and Triton's mode chosen as
    ortlab.env chooses it (a lab that imports triton before ortlab still runs Triton's interpreter)."""
    from ortlab import env as ortlab_env  # lazy: ortlab.env imports torch, which `import ortlab.labs` does not

    ortlab_env.configure_triton()  # sets TRITON_INTERPRET here when unset and no GPU: the kernel inherits it
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def execute(steps, nb, scratch, timeout, imports=()):
    """Run the steps: the learner's cells in a fresh kernel whose working folder is `scratch`, the checks
    in this process (asking the kernel for data). Returns a problem, or None."""
    from nbclient import NotebookClient  # optional: nbclient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError  # optional: nbclient

    run_nb = nbformat.v4.new_notebook(metadata=nb.metadata)
    client = NotebookClient(run_nb, kernel_name=_kernel_name(nb), allow_errors=True,
                            resources={"metadata": {"path": str(scratch)}})
    deadline = time.monotonic() + timeout
    kernel = KernelRemote(client, run_nb, deadline)
    step = None
    try:
        # The kernel's own stderr (shutdown noise after a time-out) goes to a scratch file.
        with tempfile.TemporaryFile() as kernel_log, \
                client.setup_kernel(stderr=kernel_log, env=_kernel_env(), cwd=str(scratch)):
            for step in steps:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise CellTimeoutError("time is up")
                if step.cell is None:
                    try:
                        run_check(step, imports, kernel)
                    except _Stopped as stopped:
                        raise stopped.error from None
                    continue
                run_nb.cells.append(step.cell)
                client.timeout = max(1, int(remaining))
                client.execute_cell(step.cell, len(run_nb.cells) - 1)
    except CellTimeoutError:
        return f"stopped {_where(step, nb)}: the lab ran past its time limit of {timeout:g} s"
    except DeadKernelError:
        return (f"the kernel died {_where(step, nb)} (a crash in native code, out of memory, or a "
                "call to os._exit?)")
    except Exception as exc:  # kernel start-up and transport failures
        return f"could not run the notebook: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def _errors(cell):
    """(ename, first line of evalue) of the error a cell's run ended with, or None."""
    for output in cell.get("outputs", []):
        if output.get("output_type") == "error":
            value = (output.get("evalue") or "").strip().splitlines()
            value = re.sub(r"\((?:[^()]*\.py|<[^>]*>), line (\d+)\)", r"(line \1)", value[0] if value else "")
            return output.get("ename", "Error"), value
    return None


STUB_ERROR = re.compile(r"exercise '[^']*' is not done yet")


def _is_stub_error(error):
    """True for the NotImplementedError of a lab's stub (of any exercise): 'not done', not an error."""
    return error[0] == "NotImplementedError" and STUB_ERROR.search(error[1]) is not None


def _check_timeout(timeout):
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0 \
            or timeout == float("inf"):
        shown = f"{timeout:g}" if isinstance(timeout, (int, float)) and not isinstance(timeout, bool) else repr(timeout)
        raise GradeError(f"the time limit must be a positive number of seconds (e.g. --timeout 600), "
                         f"not {shown}")


def grade(path, timeout=DEFAULT_TIMEOUT, solutions_dir=None):
    """Grade a lab; return (results, problem). `problem` is None when the notebook ran through.

    `solutions_dir` is where the lab's solution is looked up (default: this checkout's solutions/).
    """
    _check_timeout(timeout)
    path = lab_path(path)
    nb = load_lab(path)
    reference, where = find_reference(path, nb, solutions_dir)
    exercises = reference_exercises(reference, where)
    steps = plan(nb, exercises)
    imports = reference_imports(reference)
    forged = isolation.prepare(imports)  # before any of the learner's code runs
    if forged:
        name, cache = forged[0]
        raise GradeError(f"{cache}, the bytecode cache of {name}, does not hold the code of its source "
                         f"(it was written by other code than Python's own compile, e.g. a notebook's); "
                         f"the grader will not run it: delete it and grade again")
    with tempfile.TemporaryDirectory(prefix="ortlab-grade-") as scratch, isolation.sealed():
        shutil.copyfile(path, Path(scratch) / path.name)  # the learner's file is only read
        problem = execute(steps, nb, scratch, timeout, imports)
    found, check_errors = {}, {}
    for step in steps:
        if step.cell is None:
            found.update(step.results)
            for exercise in step.exercises:
                if step.error and exercise not in found:
                    check_errors[exercise] = step.error
    keys = [_key(cell, i) for i, cell in enumerate(nb.cells)]
    learner_steps = {step.learner_index: step for step in steps if step.learner_index is not None}
    results = []
    for exercise in exercises:
        stub = stub_pattern(exercise.id)
        mine = [i for i, k in enumerate(keys) if k in exercise.cells
                or stub.search(nb.cells[i].source) or f"BEGIN SOLUTION {exercise.id}" in nb.cells[i].source]
        stubbed = any(stub.search(nb.cells[i].source) for i in mine) or any(
            stub.search(c.source) for c in nb.cells if c.cell_type == "code")
        raised = [(i, e) for i in mine if i in learner_steps
                  and (e := _errors(learner_steps[i].cell)) and not _is_stub_error(e)]
        result = found.get(exercise.id)
        if result is not None and result.status == "pass":
            pass
        elif raised:
            i, (ename, value) = raised[0]
            verb = "has a" if ename in ("SyntaxError", "IndentationError", "TabError") else "raised"
            result = CheckResult(exercise.id, "fail", f"{_cell_name(nb, i)} {verb} {ename}: {value}; "
                                 "fix that cell first")
        elif stubbed:
            result = CheckResult(exercise.id, "not done", "the exercise's stub is still in place")
        elif result is None and exercise.id in check_errors:
            ename, value = check_errors[exercise.id]
            result = CheckResult(exercise.id, "fail", f"the check could not run: {ename}: {value}"
                                 + (" (keep the names the lab gives your functions and classes)"
                                    if ename == "NameError" else ""))
        elif result is None:
            result = CheckResult(exercise.id, "not done", problem or "the check did not run")
        results.append(result)
    return results, problem


def table(results):
    """Plain-text table: exercise, status, message."""
    width = max([len("exercise")] + [len(r.exercise) for r in results])
    lines = [f"{'exercise':<{width}}  {'status':<8}  message", "-" * (width + 30)]
    lines += [f"{r.exercise:<{width}}  {r.status:<8}  {r.message}" for r in results]
    passed = sum(r.status == "pass" for r in results)
    lines.append(f"{passed} of {len(results)} exercises pass")
    return "\n".join(lines)

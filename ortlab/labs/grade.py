"""Grade a learner's lab: run a copy in a fresh kernel and tabulate the exercise checks.

The learner's file is only read, never written.
"""
import tempfile
import time
from pathlib import Path

import nbformat

from ortlab.errors import OrtlabError
from ortlab.labs.build import exercises_in, stub_pattern
from ortlab.labs.checks import CHECK_MIME, CheckResult

DEFAULT_TIMEOUT = 600


class GradeError(OrtlabError):
    """The notebook could not be graded (missing, not a notebook, not a lab, kernel trouble)."""


def load_lab(path):
    """Read a lab (or solution) notebook, or raise GradeError saying why it cannot be graded."""
    path = Path(path)
    if not path.exists():
        raise GradeError(f"{path}: no such file")
    if path.is_dir():
        raise GradeError(f"{path} is a folder; give one lab notebook, e.g. labs/lab01_compose_onnx_model.ipynb")
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as exc:
        raise GradeError(f"{path} is not a Jupyter notebook ({type(exc).__name__}); "
                         "give the .ipynb file of a lab") from None
    if not exercises_in(nb):
        raise GradeError(f"{path} is not an ortlab lab: it has no exercises "
                         "(labs are generated into labs/ by `python -m ortlab.labs build`)")
    return nb


def _kernel_name(nb):
    from jupyter_client.kernelspec import KernelSpecManager

    wanted = nb.metadata.get("kernelspec", {}).get("name", "python3")
    return wanted if wanted in KernelSpecManager().find_kernel_specs() else "python3"


def _check_results(cell):
    for output in cell.get("outputs", []):
        data = output.get("data", {})
        if CHECK_MIME in data:
            yield CheckResult.from_json(data[CHECK_MIME])


def execute(nb, cwd, timeout):
    """Run every cell of `nb` in a fresh kernel (errors allowed); return a problem or None."""
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError

    client = NotebookClient(nb, kernel_name=_kernel_name(nb), allow_errors=True,
                            resources={"metadata": {"path": str(cwd)}})
    deadline = time.monotonic() + timeout
    index = -1
    try:
        # The kernel's own stderr (shutdown noise after a time-out) goes to a scratch file.
        with tempfile.TemporaryFile() as kernel_log, client.setup_kernel(stderr=kernel_log):
            for index, cell in enumerate(nb.cells):
                client.timeout = max(1, int(deadline - time.monotonic()))
                client.execute_cell(cell, index)
    except CellTimeoutError:
        return f"stopped in cell {index}: the lab ran past its time limit of {timeout} s"
    except DeadKernelError:
        return f"the kernel died in cell {index} (a crash in native code, or out of memory?)"
    except Exception as exc:  # kernel start-up and transport failures
        return f"could not run the notebook: {type(exc).__name__}: {exc}".splitlines()[0]
    return None


def grade(path, timeout=DEFAULT_TIMEOUT):
    """Grade a lab; return (results, problem). `problem` is None when the notebook ran through."""
    nb = load_lab(path)
    exercises = exercises_in(nb)
    problem = execute(nb, Path(path).resolve().parent, timeout)
    found = {}
    for cell in nb.cells:
        for result in _check_results(cell):
            found[result.exercise] = result
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    results = []
    for exercise in exercises:
        stubbed = any(stub_pattern(exercise).search(s) for s in sources)
        result = found.get(exercise)
        if stubbed and (result is None or result.status != "pass"):
            result = CheckResult(exercise, "not done", "the exercise's stub is still in place")
        elif result is None:
            result = CheckResult(exercise, "not done", problem or "no check ran for this exercise")
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

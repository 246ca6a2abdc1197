"""Every solution in solutions/ (and the demo lab's) grades as all pass, out of process, as a learner's finished
lab would. Apart from test_labs.py so that `make test`'s workers share the slowest grading runs."""
import pytest

from repo_paths import FIXTURES, ROOT

SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb")) + [FIXTURES / "solutions" / "demo_lab.ipynb"]


@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.name)
def test_grading_a_solution_passes_every_exercise(solution, run_cli):
    result = run_cli("ortlab.labs", "grade", solution)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "FAIL" not in result.stdout and "not done" not in result.stdout

"""Hands-on labs: generated from solutions/, checked cell by cell, graded in a fresh kernel.

    python -m ortlab.labs build           write labs/ from solutions/   (ortlab.labs.build)
    python -m ortlab.labs check           fail when labs/ is out of date
    python -m ortlab.labs grade LAB.ipynb run a lab and tabulate its exercises (ortlab.labs.grade)

Notebooks call the checks below after each exercise.
"""
from ortlab.labs.build import LabBuildError, LabEditedError
from ortlab.labs.checks import (CheckFailed, CheckResult, check, check_function,
                                check_value, compare, evaluate)
from ortlab.labs.grade import GradeError

__all__ = ["CheckFailed", "CheckResult", "GradeError", "LabBuildError", "LabEditedError",
           "check", "check_function", "check_value", "compare", "evaluate"]

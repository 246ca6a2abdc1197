"""What compare() returns: its rows (one per check), the exit code they mean, and the error it raises on
bad input. Shared by every module of ortlab.compare."""
import json
from dataclasses import asdict, dataclass

import numpy as np

from ortlab.errors import OrtlabError
from ortlab.viz import Table

AGREE, DIFFER, SKIPPED, INFO = "agree", "DIFFER", "skipped", "info"
TOLERANCE = 1e-4         # |a - b| <= TOLERANCE * (1 + |b|): float32 reordering, not a wrong result


class CompareError(OrtlabError):
    """compare() was given something it cannot compare; the message says what to give instead."""


@dataclass
class Row:
    """One check: what was compared, whether the two sides agree, and how they differ (or why skipped)."""

    check: str
    status: str
    detail: str


@dataclass
class Report:
    """compare()'s rows, what it generated, and the exit code they mean."""

    rows: list
    generated: str

    @property
    def exit_code(self):
        """0 when no row differs, else 1 (ORT and ortlab disagree somewhere)."""
        return 1 if any(r.status == DIFFER for r in self.rows) else 0

    def table(self):
        return Table(("check", "status", "detail"), [(r.check, r.status, r.detail) for r in self.rows])

    def statuses(self):
        """The checks and their status only: what stays the same on every machine (no float values)."""
        return Table(("check", "status"), [(r.check, r.status) for r in self.rows])

    def differences(self):
        """The rows that differ, with how (a Table; empty when ortlab and ORT agree everywhere)."""
        return Table(("check", "how they differ"), [(r.check, r.detail) for r in self.rows if r.status == DIFFER])

    def to_json(self):
        return json.dumps({"rows": [asdict(r) for r in self.rows], "generated": self.generated,
                           "exit_code": self.exit_code}, indent=2)

    def __repr__(self):
        return f"{self.table()!r}\n{self.generated}"


def max_diff(a, b):
    """(largest |a - b|, within tolerance) for two arrays; shapes or dtypes that differ never agree."""
    a, b = np.asarray(a), np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype:
        return float("inf"), False
    if a.size == 0:
        return 0.0, True
    if not np.issubdtype(a.dtype, np.number):
        return (0.0, True) if np.array_equal(a, b) else (float("inf"), False)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    same_nan = np.isnan(a64) == np.isnan(b64)
    gap = np.abs(np.where(np.isnan(a64), 0, a64) - np.where(np.isnan(b64), 0, b64))
    ok = bool(same_nan.all() and np.all(gap <= TOLERANCE * (1 + np.abs(np.nan_to_num(b64)))))
    return float(gap.max()), ok


def why(exc):
    """An error's first line, at most 200 characters (its type's name when it has no message)."""
    return str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__

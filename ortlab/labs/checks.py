"""Exercise checks: what a solution (or lab) notebook calls after each exercise.

A check never raises: it displays one line (pass, fail and why, or not done)
and carries the same result as JSON under CHECK_MIME. The grader (ortlab.labs.grade)
never reads what a notebook displays: it runs each check (`judge`) in its own process,
reaching the learner's code only through ortlab.labs.remote, which carries data.
"""
import contextlib
import importlib
import json
import re
from dataclasses import asdict, dataclass

import numpy as np

from ortlab.labs.remote import LocalRemote, call, learner, value

CHECK_MIME = "application/vnd.ortlab.check+json"
STATUSES = ("pass", "fail", "not done")
_MARK = {"pass": "PASS", "fail": "FAIL", "not done": "NOT DONE"}


class CheckFailed(Exception):
    """Raised inside a check's test to fail it with a message for the learner."""


def same_keys(got, expected, kind, give):
    """CheckFailed unless the learner's dict `got` has exactly the keys `expected` (in any order): the first
    key that is not one of them ("'x' is not a <kind>; the <kind>s are ..."), else the first one left out
    ("'y' is missing: give <give> for every <kind>")."""
    expected = list(expected)
    unknown = [key for key in got if key not in expected]
    if unknown:
        raise CheckFailed(f"{unknown[0]!r} is not a {kind}; the {kind}s are {', '.join(map(str, expected))}")
    missing = [key for key in expected if key not in got]
    if missing:
        raise CheckFailed(f"{missing[0]!r} is missing: give {give} for every {kind}")


@dataclass(frozen=True)
class CheckResult:
    """The outcome of one exercise check."""

    exercise: str
    status: str
    message: str = ""

    def __str__(self):
        tail = f": {self.message}" if self.message else ""
        return f"[{_MARK[self.status]}] exercise '{self.exercise}'{tail}"

    def _repr_mimebundle_(self, include=None, exclude=None):
        return {"text/plain": str(self), CHECK_MIME: asdict(self)}

    @classmethod
    def from_json(cls, data):
        if isinstance(data, str):
            data = json.loads(data)
        return cls(data["exercise"], data["status"], data.get("message", ""))


_JUDGING = []  # (remote, results) while the grader runs a reference's check cell (ortlab.labs.grade)


@contextlib.contextmanager
def judging(remote):
    """While the grader runs a reference's check cell in its own process: every check asks the learner's
    kernel through `remote` for data, and its result is appended to the list this yields (not shown)."""
    results = []
    _JUDGING.append((remote, results))
    try:
        yield results
    finally:
        _JUDGING.pop()


def judge(exercise, test, *args):
    """Check an exercise with `test(remote, *args)`, run where the learner's code cannot reach it.

    `test` is a function, or "labNN.name" for ortlab.labs.judges.labNN.name (imported only now, so that
    a lab module never holds its reference maths). It gets the learner's objects (remote.Learner) among
    `args` and reaches them only through `remote.call(probe, ...)`, which carries data both ways. In a
    notebook it runs here and the result is displayed; under the grader it runs in the grader's process.
    """
    if isinstance(test, str):
        module, name = test.rsplit(".", 1)
        test = getattr(importlib.import_module(f"ortlab.labs.judges.{module}"), name)
    if _JUDGING:
        remote, results = _JUDGING[-1]
        results.append(evaluate(exercise, lambda: test(remote, *args)))
        return
    _show(evaluate(exercise, lambda: test(LocalRemote(), *args)))


def _show(result):
    try:
        from IPython import get_ipython  # optional: IPython
        from IPython.display import display  # optional: IPython
    except ImportError:  # pragma: no cover - IPython is a dependency
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        display(result)
    else:
        print(result)


def _short(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def _not_done(exc):
    """A stub's message without the exercise's name, which the result already shows:
    "exercise 'x' is not done yet: replace this line" -> "not done yet: replace this line"."""
    text = re.sub(r"^exercise '[^']*' is ", "", str(exc).strip())
    return text or "not implemented yet"


def evaluate(exercise, test):
    """Run `test()` and turn what happens into a CheckResult (without displaying it).

    `test` returns None (pass) or a string saying what is wrong, or raises
    CheckFailed. NotImplementedError means the exercise is not done yet; any
    other exception is a failure reported in one line.
    """
    try:
        reason = test()
    except NotImplementedError as exc:
        return CheckResult(exercise, "not done", _not_done(exc))
    except CheckFailed as exc:
        return CheckResult(exercise, "fail", str(exc))
    except NameError as exc:
        return CheckResult(exercise, "fail", f"{_short(exc)}: run the exercise's cell first "
                                             "(did it raise?)")
    except Exception as exc:  # the learner's code may raise anything
        if type(exc).__name__ == "CheckFailed":  # a probe's refusal in the learner's process, back as remote.answer
            return CheckResult(exercise, "fail", str(exc))  # raises it: its words, not "your code raised ..."
        return CheckResult(exercise, "fail", f"your code raised {_short(exc)}")
    if reason:
        return CheckResult(exercise, "fail", str(reason))
    return CheckResult(exercise, "pass")


def check(exercise, test):
    """Check an exercise with a custom test and display the result (`evaluate` returns it).

    A custom test runs beside the learner's code, so the grader cannot use it: a lab that is graded
    checks with `judge` (a lab module's checks, check_function, check_value)."""
    if _JUDGING:
        _JUDGING[-1][1].append(CheckResult(exercise, "fail", "the solution checks this exercise with a custom "
                                           "check(...), which the grader cannot run apart from the notebook"))
        return
    _show(evaluate(exercise, test))


def describe(value):
    """A short description of an argument: float32[2, 3] for arrays, repr for small scalars."""
    if hasattr(value, "shape") and hasattr(value, "dtype"):
        return f"{str(value.dtype).replace('torch.', '')}{list(value.shape)}"
    text = repr(value)
    return text if len(text) <= 40 else f"{type(value).__name__}(...)"


def _as_array(value):
    if hasattr(value, "detach"):  # a torch tensor
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def compare(got, expected, rtol=1e-5, atol=1e-6, what="the result"):
    """None when `got` matches `expected` (arrays, scalars, or tuples of them), else why not."""
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            return f"{what}: expected {len(expected)} values, got {describe(got)}"
        for i, (g, e) in enumerate(zip(got, expected)):
            reason = compare(g, e, rtol, atol, f"{what}[{i}]")
            if reason:
                return reason
        return None
    try:
        g = _as_array(got)
    except Exception:
        return f"{what}: expected an array, got {type(got).__name__}"
    e = _as_array(expected)
    if g.shape != e.shape:
        return f"{what}: wrong shape: expected {tuple(e.shape)}, got {tuple(g.shape)}"
    if g.dtype.kind in "biuf" and e.dtype.kind in "biuf":
        if np.allclose(g, e, rtol=rtol, atol=atol, equal_nan=True):
            return None
        diff = np.abs(g.astype(np.float64) - e.astype(np.float64))
        diff = np.where(np.isnan(diff), np.inf, diff)
        at = np.unravel_index(int(np.argmax(diff)), diff.shape) if diff.ndim else ()
        return (f"{what}: wrong values: largest difference {diff[at]:.3g} at index "
                f"{tuple(int(i) for i in at)} (got {g[at]!r}, expected {e[at]!r})")
    return None if np.array_equal(g, e) else f"{what}: wrong values: expected {e!r}, got {g!r}"


def call_learner(fn, *args, what):
    """fn(*args), with anything it raises (but 'not done') turned into a one-line CheckFailed naming `what`."""
    try:
        return fn(*args)
    except (NotImplementedError, CheckFailed):
        raise
    except Exception as exc:
        raise CheckFailed(f"{what} raised {_short(exc)[:160]}") from None


def _function_test(remote, fn, reference, cases, rtol, atol):
    for case in cases:
        args = case if isinstance(case, tuple) else (case,)
        shown = ", ".join(describe(a) for a in args)
        try:
            got = remote.call(call, fn, *args)
        except (NotImplementedError, CheckFailed):
            raise
        except Exception as exc:
            raise CheckFailed(f"for inputs ({shown}) your code raised {_short(exc)}") from None
        reason = compare(got, reference(*args), rtol, atol)
        if reason:
            return f"for inputs ({shown}), {reason}"
    return None


def check_function(exercise, fn, reference, cases, rtol=1e-5, atol=1e-6):
    """Call `fn(*case)` and `reference(*case)` for each case and compare the results.

    A failure names the inputs it happened at, e.g.
    "for inputs (float32[2, 3]): wrong shape: expected (2, 3), got (3, 2)".
    """
    judge(exercise, _function_test, learner(fn), reference, cases, rtol, atol)


def _value_test(remote, get, expected, rtol, atol):
    return compare(remote.call(value, learner(get())), expected, rtol, atol, "your answer")


def check_value(exercise, get, expected, rtol=1e-5, atol=1e-6):
    """Compare a value the learner computed with the expected one.

    `get` is a zero-argument callable (e.g. `lambda: answer`) so that a missing
    or unfinished answer is reported as such rather than raising in the cell.
    """
    judge(exercise, _value_test, get, expected, rtol, atol)

"""Exercise checks: what a solution (or lab) notebook calls after each exercise.

A check never raises: it displays one line (pass, fail and why, or not done)
and carries the same result as JSON under CHECK_MIME. The grader (ortlab.labs.grade)
runs its own copy of each check cell inside `grading(token)` and accepts only results
carrying that token, so a result a learner's cell displays itself counts for nothing.
"""
import contextlib
import json
from dataclasses import asdict, dataclass

import numpy as np

CHECK_MIME = "application/vnd.ortlab.check+json"
STATUSES = ("pass", "fail", "not done")
_MARK = {"pass": "PASS", "fail": "FAIL", "not done": "NOT DONE"}


class CheckFailed(Exception):
    """Raised inside a check's test to fail it with a message for the learner."""


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


_GRADING = []  # the token of the grader's check cell being run, if any


def replaced_checks():
    """Names of ortlab.labs functions (module functions and methods) that a notebook replaced with
    code of its own (a function defined in a notebook cell: module '__main__', or an IPython cell file)."""
    import sys

    found = []

    def foreign(value):
        fn = getattr(value, "__func__", value)
        code = getattr(fn, "__code__", None)
        if code is None:
            return False
        where = code.co_filename
        return (getattr(fn, "__module__", None) == "__main__" or "ipykernel_" in where
                or where.startswith("<ipython-input"))

    for name, module in list(sys.modules.items()):
        if name != "ortlab.labs" and not name.startswith("ortlab.labs."):
            continue
        for attr, value in list(vars(module).items()):
            if foreign(value):
                found.append(f"{name}.{attr}")
            elif isinstance(value, type) and value.__module__ == name:
                found += [f"{name}.{attr}.{m}" for m, v in list(vars(value).items()) if foreign(v)]
    return found


@contextlib.contextmanager
def grading(token):
    """While the grader runs a check cell: every result shown carries `token` (ortlab.labs.grade).

    When the notebook replaced ortlab's checks with code of its own, nothing is tagged: the grader
    gets a note naming what was replaced instead (and fails the exercise)."""
    replaced = replaced_checks()
    if replaced:
        from IPython.display import display

        display({CHECK_MIME: {"token": str(token), "replaced": replaced},
                 "text/plain": f"ortlab's checks were replaced: {', '.join(replaced)}"}, raw=True)
        yield
        return
    _GRADING.append(str(token))
    try:
        yield
    finally:
        _GRADING.pop()


def _show(result):
    try:
        from IPython import get_ipython
        from IPython.display import display
    except ImportError:  # pragma: no cover - IPython is a dependency
        get_ipython = None
    if get_ipython is not None and get_ipython() is not None:
        if _GRADING:
            bundle = result._repr_mimebundle_()
            bundle[CHECK_MIME] = dict(bundle[CHECK_MIME], token=_GRADING[-1])
            display(bundle, raw=True)
        else:
            display(result)
    else:
        print(result)


def _short(exc):
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")


def evaluate(exercise, test):
    """Run `test()` and turn what happens into a CheckResult (without displaying it).

    `test` returns None (pass) or a string saying what is wrong, or raises
    CheckFailed. NotImplementedError means the exercise is not done yet; any
    other exception is a failure reported in one line.
    """
    try:
        reason = test()
    except NotImplementedError as exc:
        return CheckResult(exercise, "not done", str(exc) or "not implemented yet")
    except CheckFailed as exc:
        return CheckResult(exercise, "fail", str(exc))
    except NameError as exc:
        return CheckResult(exercise, "fail", f"{_short(exc)}: run the exercise's cell first "
                                             "(did it raise?)")
    except Exception as exc:  # the learner's code may raise anything
        return CheckResult(exercise, "fail", f"your code raised {_short(exc)}")
    if reason:
        return CheckResult(exercise, "fail", str(reason))
    return CheckResult(exercise, "pass")


def check(exercise, test):
    """Check an exercise with a custom test and display the result (`evaluate` returns it)."""
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


def check_function(exercise, fn, reference, cases, rtol=1e-5, atol=1e-6):
    """Call `fn(*case)` and `reference(*case)` for each case and compare the results.

    A failure names the inputs it happened at, e.g.
    "for inputs (float32[2, 3]): wrong shape: expected (2, 3), got (3, 2)".
    """
    def test():
        for case in cases:
            args = case if isinstance(case, tuple) else (case,)
            shown = ", ".join(describe(a) for a in args)
            try:
                got = fn(*args)
            except (NotImplementedError, CheckFailed):
                raise
            except Exception as exc:
                raise CheckFailed(f"for inputs ({shown}) your code raised {_short(exc)}") from None
            reason = compare(got, reference(*args), rtol, atol)
            if reason:
                return f"for inputs ({shown}), {reason}"
        return None

    check(exercise, test)


def check_value(exercise, get, expected, rtol=1e-5, atol=1e-6):
    """Compare a value the learner computed with the expected one.

    `get` is a zero-argument callable (e.g. `lambda: answer`) so that a missing
    or unfinished answer is reported as such rather than raising in the cell.
    """
    check(exercise, lambda: compare(get(), expected, rtol, atol, "your answer"))

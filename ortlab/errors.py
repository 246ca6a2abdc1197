"""The errors ortlab raises on purpose.

Every message says what is wrong and what to do about it, so that a learner
never has to read a traceback from deep inside numpy or onnx to find out.
"""


class OrtlabError(Exception):
    """Base of every error ortlab raises on purpose."""


def as_names(value, what, error=OrtlabError):
    """A list of value names from a list (tuple, set...) of str, or one str as one name (not its
    letters): the one rule every ortlab function that takes names follows. `what` names the
    argument in the message, `error` is the OrtlabError subclass to raise."""
    if isinstance(value, str):
        return [value]
    if value is None or isinstance(value, (bytes, dict)) or not hasattr(value, "__iter__"):
        raise error(f"{what} must be a name or a list of names, not {type(value).__name__}")
    names = list(value)
    bad = [n for n in names if not isinstance(n, str)]
    if bad:
        raise error(f"{what} must hold value names (str), got {bad[0]!r} ({type(bad[0]).__name__})")
    return names


def as_list(value, what, items, example, error=OrtlabError):
    """A non-empty list from a list (tuple, generator...) of values; a str or bytes is refused (its letters
    are not the values), as is anything not iterable. `what` names the argument, `items` says what it
    holds and `example` shows a good value, for the message; `error` is the OrtlabError subclass to raise."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise error(f"{what} must be a list of {items} such as {example}, not {value!r}")
    values = list(value)
    if not values:
        raise error(f"{what} is empty: give at least one, e.g. {example}")
    return values

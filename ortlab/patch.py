"""One scoped patch: set an attribute, a mapping entry or environment variables for a `with` block, and put
back exactly what was there (or remove what was not) when the block ends, whatever ends it.

    patched(target, name, value)   target.name = value (an object), or target[name] = value (a dict such as
                                   sys.modules or a module's __dict__)
    environment({name: value})     os.environ entries; a value of None unsets the variable

Every temporary change ortlab makes to code it does not own (torch.distributed, torch.cuda, sys.modules,
ORTModule's functions, environment variables) goes through these two, so none outlives its block.
"""
import contextlib
import os
from collections.abc import MutableMapping

_MISSING = object()


def _get(target, name):
    if isinstance(target, MutableMapping):
        return target.get(name, _MISSING)
    return target.__dict__.get(name, _MISSING) if hasattr(target, "__dict__") else getattr(target, name, _MISSING)


def _set(target, name, value):
    if isinstance(target, MutableMapping):
        if value is _MISSING:
            target.pop(name, None)
        else:
            target[name] = value
    elif value is _MISSING:
        if hasattr(target, name):
            delattr(target, name)
    else:
        setattr(target, name, value)


@contextlib.contextmanager
def patched(target, name, value):
    """`target`'s `name` is `value` inside the block; afterwards what it was, or absent if it was absent.
    Yields value."""
    saved = _get(target, name)
    _set(target, name, value)
    try:
        yield value
    finally:
        _set(target, name, saved)


@contextlib.contextmanager
def environment(variables):
    """The environment variables {name: value} inside the block (None unsets one); restored afterwards."""
    with contextlib.ExitStack() as stack:
        for name, value in variables.items():
            stack.enter_context(patched(os.environ, name, _MISSING if value is None else str(value)))
        yield

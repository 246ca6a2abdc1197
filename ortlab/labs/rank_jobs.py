"""Shipping a notebook cell's functions to spawned ranks: a rank started with the spawn method finds a
function by its module and name, and a notebook cell is no module. So the functions' source
(inspect.getsource), with the imports and constants they use, is written into a module of its own in a
temporary folder, and each rank imports that file. lab07 uses it; any lab whose checks run on ranks can.
"""
import builtins
import dis
import importlib.util
import inspect
import os
import sys
import textwrap
import types

from ortlab.errors import OrtlabError
from ortlab.labs.build import BEGIN, END


class RankJobError(OrtlabError):
    """A function cannot be sent to the ranks; the message says what to do."""



def _is_cell_function(value):
    """True for a function or class defined in the notebook (module __main__ or an IPython cell)."""
    fn = getattr(value, "__func__", value)
    code = getattr(fn, "__code__", None)
    where = code.co_filename if code is not None else ""
    return getattr(value, "__module__", None) == "__main__" or "ipykernel_" in where \
        or where.startswith("<ipython-input")


def _global_names(code):
    """The global names a code object (and the functions nested in it) reads, in order."""
    names = []
    for instruction in dis.get_instructions(code):
        if instruction.opname in ("LOAD_GLOBAL", "LOAD_NAME") and instruction.argval not in names:
            names.append(instruction.argval)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names += [n for n in _global_names(const) if n not in names]
    return names


def _is_plain_constant(value):
    if value is None or isinstance(value, (bool, int, float, str, bytes)):
        return True
    return isinstance(value, (tuple, frozenset)) and all(_is_plain_constant(v) for v in value)


def _import_line(name, value):
    """The import statement that binds `name` to `value` in a fresh process, or None."""
    if isinstance(value, types.ModuleType):
        module = value.__name__
        if module == "__main__":
            return None
        return f"import {module}" if module == name else f"import {module} as {name}"
    module, qualname = getattr(value, "__module__", None), getattr(value, "__qualname__", None)
    if not module or not qualname or "." in qualname or module == "__main__":
        return None
    if getattr(sys.modules.get(module), qualname, None) is not value:
        return None
    return f"from {module} import {qualname}" + ("" if qualname == name else f" as {name}")


def _source(fn, owner):
    """The dedented source of a notebook function or class, or RankJobError saying why it cannot be read."""
    if getattr(fn, "__name__", "") == "<lambda>":
        raise RankJobError(f"{owner} is a lambda: write it with `def` so its source can be sent to the ranks")
    try:
        text = textwrap.dedent(inspect.getsource(fn))
    except (OSError, TypeError) as exc:
        raise RankJobError(f"cannot read the source of {getattr(fn, '__name__', fn)!r} ({exc}): define it with "
                         "`def` in a notebook cell, and run that cell again") from None
    # the lab's solution markers are comments for the lab's build, not for the ranks
    return "".join(line for line in text.splitlines(True) if not (BEGIN.match(line) or END.match(line)))


def _collect(fn, owner, imports, sources, seen):
    """Add fn's source and what it needs from the notebook to `imports` and `sources` (dicts, in order)."""
    if id(fn) in seen:
        return
    seen.add(id(fn))
    code = getattr(fn, "__code__", None)
    names = _global_names(code) if code is not None else []
    if isinstance(fn, type):
        names = [n for member in vars(fn).values() if hasattr(member, "__code__")
                 for n in _global_names(member.__code__)]
    glob = getattr(fn, "__globals__", None) or vars(sys.modules.get(fn.__module__, builtins))
    for name in names:
        if name not in glob:
            continue  # a builtin, or a name that does not exist: the rank's NameError says so
        value = glob[name]
        line = _import_line(name, value)
        if line:
            imports.setdefault(name, line)
        elif (inspect.isfunction(value) or inspect.isclass(value)) and _is_cell_function(value):
            _collect(value, f"{name} (used by {owner})", imports, sources, seen)
            if value.__name__ != name:
                sources.setdefault(f"{name} alias", f"{name} = {value.__name__}\n")
        elif _is_plain_constant(value):
            imports.setdefault(name, f"{name} = {value!r}")
        else:
            raise RankJobError(
                f"{owner} uses `{name}` ({type(value).__name__}), defined in the notebook: each rank is a "
                f"new "
                f"process that gets only your functions' source, their imports and their plain constants. "
                f"Create `{name}` inside the function (or from its arguments)")
    if fn.__name__ in sources:
        raise RankJobError(f"two different functions are called {fn.__name__!r} ({owner} is one): give each "
                         "its own name")
    sources[fn.__name__] = _source(fn, owner)


def module_source(functions, aliases=()):
    """The source of a module holding `functions` (each a function, with what it uses from the notebook),
    then `name = function` lines for each (name, function) in `aliases`."""
    imports, sources, seen = {}, {}, set()
    for owner, fn in functions:
        if not callable(fn):
            raise RankJobError(f"{owner} must be a function, got {type(fn).__name__}: pass the function itself "
                             f"(without calling it)")
        _collect(fn, owner, imports, sources, seen)
    header = ["# Written by ortlab.labs.lab07 from your notebook: each rank is a new process, which can",
              "# import a module but not a notebook cell, so your functions are copied here (your notebook",
              "# is untouched)."]
    parts = ["\n".join(header + list(imports.values())) + "\n"]
    parts += [text.rstrip("\n") + "\n" for text in sources.values()]
    lines = [f"{name} = {fn.__name__}" for name, fn in aliases if fn.__name__ != name]
    if lines:
        parts.append("\n".join(lines) + "\n")
    return "\n\n".join(parts)


def job_source(**functions):
    """The module the ranks import: `name=function` pairs, with the imports and constants they use.

    Functions a function calls that are defined in the notebook come along too (their source).
    Raises RankJobError for a lambda, a function without readable source, or a notebook object that is not
    a module, a function, a class or a plain constant.
    """
    if not functions:
        raise RankJobError("give the functions to send, e.g. job_source(ring_all_reduce=ring_all_reduce)")
    return module_source(list(functions.items()), list(functions.items()))


def write_job(folder, **functions):
    """Write job_source(**functions) to a new file in `folder`; return its path (never overwrites a file)."""
    return write_new(os.path.join(folder, "lab07_job.py"), job_source(**functions))


def write_new(path, text):
    if os.path.exists(path):
        raise RankJobError(f"{path} exists; the lab never overwrites a file: choose a new name or folder")
    with open(path, "x", encoding="utf-8") as f:
        f.write(text)
    return path


def load_job(path, name="lab07_job"):
    """Import the module at `path` (what each rank does with the job file); its __main__ block is not run."""
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

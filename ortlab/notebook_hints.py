"""A hint for a cell run before the cells it needs: which cell of the notebook defines the missing name.

An IPython extension (the lab's `ortlab` kernel loads it: tools/setup.sh writes `--ext` into its
kernel.json). On a NameError it shows IPython's usual traceback, then, when the notebook that runs
(JupyterLab passes its path to the kernel in JPY_SESSION_NAME) defines that name in one of its code
cells, names that cell by its section heading and first line, and says to run the cells above first.
The notebook is read from disk: a cell edited but not saved is read as it was saved.

    %load_ext ortlab.notebook_hints        (or the kernel's --ext ortlab.notebook_hints)
"""
import ast
import json
import os
import sys

RUN_ABOVE = "run the cells above it first (JupyterLab: Run > Run All Above Selected Cell)"


def defined_names(source):
    """Names a cell's code binds: assignments, imports, def/class, for/with/except targets."""
    lines = [line for line in source.splitlines() if not line.lstrip().startswith(("%", "!"))]
    try:
        tree = ast.parse("\n".join(lines))
    except SyntaxError:
        return set()
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
        elif isinstance(node, ast.ExceptHandler) and node.name:
            names.add(node.name)
    return names


def where_defined(notebook, name, running=""):
    """(section heading or None, first line) of the first code cell of `notebook` (a path) that binds
    `name`, other than the cell `running` now; None when no cell does or the file cannot be read."""
    try:
        with open(notebook, encoding="utf-8") as f:
            cells = json.load(f).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return None
    heading = None
    for cell in cells:
        source = "".join(cell.get("source", []))
        if cell.get("cell_type") == "markdown":
            titles = [line.lstrip("#").strip() for line in source.splitlines() if line.startswith("#")]
            heading = titles[-1] if titles else heading
        elif cell.get("cell_type") == "code" and source.strip() != running.strip() and name in defined_names(source):
            first = next((line.strip() for line in source.splitlines() if line.strip()), "")
            return heading, first
    return None


def hint(name, notebook, running=""):
    """The sentence shown under a NameError for `name` raised by the cell `running`, or None when no
    other cell of `notebook` defines it."""
    found = where_defined(notebook, name, running) if notebook and name else None
    if found is None:
        return None
    heading, first = found
    section = f' in section "{heading}"' if heading else ""
    return (f"'{name}' is defined by a cell you have not run yet{section}, the one that begins "
            f"`{first[:80]}`: {RUN_ABOVE}.")


def _on_name_error(shell, etype, value, tb, tb_offset=None):
    shell.showtraceback((etype, value, tb), tb_offset=tb_offset)
    running = (shell.user_ns.get("_ih") or [""])[-1]
    text = hint(getattr(value, "name", None), os.environ.get("JPY_SESSION_NAME"), running)
    if text:
        print(f"\nHint: {text}", file=sys.stderr)


def load_ipython_extension(ipython):
    ipython.set_custom_exc((NameError,), _on_name_error)


def unload_ipython_extension(ipython):
    ipython.set_custom_exc((), None)

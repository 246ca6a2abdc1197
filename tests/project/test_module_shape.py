"""The package's modules stay small and say what they depend on (CONTRIBUTING, "How the code should look"):
- no module over 600 lines;
- no module imports another module's private name (`from ortlab.x import _helper`): what two modules share
  is public, in the lower of the two floors;
- an import inside a function is kept only for an optional or heavy dependency, and says why in a comment on
  its line or the line above (anything else goes to the top of the module, where a reader looks first).
"""
import ast

import pytest

from repo_paths import ROOT

MAX_LINES = 600
MODULES = sorted((ROOT / "ortlab").rglob("*.py"))


def _tree(path):
    return ast.parse(path.read_text(), filename=str(path))


def private_imports(tree):
    """(line, module, name) for each `from ortlab... import _name`."""
    return [(node.lineno, node.module, alias.name) for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ortlab")
            for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]


def unexplained_local_imports(source):
    """(line, text) of each import inside a function with no comment on its line or the line above."""
    lines, found = source.splitlines(), []
    for function in ast.walk(ast.parse(source)):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for node in ast.walk(function):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                line, above = lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else ""
                if "#" not in line and not above.strip().startswith("#"):
                    found.append((node.lineno, line.strip()))
    return sorted(set(found))


@pytest.mark.parametrize("source, found", [
    ("def f():\n    import torch\n", [(2, "import torch")]),
    ("def f():\n    import torch  # heavy: torch\n", []),
    ("def f():\n    # optional: netron\n    from netron import server\n", []),
    ("import torch\n\n\ndef f():\n    return torch\n", []),
])
def test_the_local_import_rule_tells_explained_from_unexplained(source, found):
    assert unexplained_local_imports(source) == found


def test_the_private_import_rule_finds_a_private_name():
    assert private_imports(ast.parse("from ortlab.env import _x, y\nfrom os import _exit\n")) == \
        [(1, "ortlab.env", "_x")]


def test_no_module_is_over_600_lines():
    long = {str(p.relative_to(ROOT)): n for p in MODULES if (n := len(p.read_text().splitlines())) > MAX_LINES}
    assert not long, f"split these by idea (one idea per module): {long}"


def test_no_module_imports_another_modules_private_name():
    found = [f"{p.relative_to(ROOT)}:{line} from {module} import {name}"
             for p in MODULES for line, module, name in private_imports(_tree(p))]
    assert not found, f"make what is shared public, in the lower floor: {found}"


def test_every_import_inside_a_function_says_why_it_is_there():
    found = [f"{p.relative_to(ROOT)}:{line}: {text}" for p in MODULES
             for line, text in unexplained_local_imports(p.read_text())]
    assert not found, ("move these imports to the top of their module, or say on the line why they must wait "
                       f"(optional, heavy, a cycle): {found}")

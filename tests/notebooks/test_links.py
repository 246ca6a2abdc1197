"""Every cross-reference to a notebook resolves, or says on the same line that it is planned."""
import json
import re
import sys

import pytest

from repo_paths import ROOT

FOLDERS = ("notebooks", "solutions", "labs")
# a notebook named by its id (L1_03, D_02, lab09, 00_welcome), optionally with the rest of its name
REFERENCE = re.compile(r"(?<![\w/.-])((?:L\d_\d\d|D_\d\d|lab\d\d|00_welcome)(?:_[a-z0-9]+)*)(?:\.ipynb)?(?![\w-])")
LINK = re.compile(r"\]\(([^)#\s]+\.ipynb)(?:#[^)]*)?\)")


def notebook_stems():
    return {p.stem for folder in FOLDERS for p in (ROOT / folder).glob("*.ipynb")}


def resolves(name, stems):
    """A full name must be a notebook; a bare id (L0_02, lab03) must start one."""
    return name in stems or any(stem.startswith(name + "_") for stem in stems)


def documents():
    """(where, text) of every markdown and code source line in the notebooks, the READMEs, CONTRIBUTING.md, docs/."""
    for folder in FOLDERS:
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            for index, cell in enumerate(json.loads(path.read_text())["cells"]):
                for number, line in enumerate("".join(cell["source"]).splitlines(), 1):
                    yield f"{path.relative_to(ROOT)} cell {index} line {number}", path.parent, line
    for path in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md")),
                 *(ROOT / f / "README.md" for f in FOLDERS)]:
        if path.exists():
            for number, line in enumerate(path.read_text().splitlines(), 1):
                yield f"{path.relative_to(ROOT)} line {number}", path.parent, line


def broken_references():
    stems, broken = notebook_stems(), []
    for where, folder, line in documents():
        if "planned" in line.lower():
            continue
        for name in REFERENCE.findall(line):
            if not resolves(name, stems):
                broken.append(f"{where}: {name}")
        for target in LINK.findall(line):
            if not (folder / target).resolve().is_file():
                broken.append(f"{where}: link {target}")
    return broken


def test_every_notebook_reference_resolves_or_says_planned():
    broken = broken_references()
    assert not broken, ("references to notebooks that do not exist (add 'planned' on the line, or fix "
                        "the name):\n" + "\n".join(broken))


@pytest.mark.parametrize("line, ok", [
    ("see `L0_02_ortmodule`", True), ("see L0_02", True), ("see L2_09", False),
    ("see L2_09 (planned)", True), ("see `L0_02_ortmodul`", False),
    ("[lab](../labs/lab01_compose_onnx_model.ipynb)", True),
    ("[lab](../labs/lab09_memory.ipynb)", False), ("a path /tmp/L2_03_x is not a reference", True),
])
def test_the_checker_itself(line, ok, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "documents", lambda: [("t", ROOT / "notebooks", line)])
    assert (broken_references() == []) is ok


def test_every_ortlab_module_the_docs_name_exists():
    """`ortlab.x.y` in the README, CONTRIBUTING.md and docs/, and `ortlab.x` (`a`, `b`): each a module or
    an attribute of one (modules move; the pages must follow)."""
    import importlib
    import importlib.util

    def exists(dotted):
        try:
            if importlib.util.find_spec(dotted) is not None:
                return True
        except ModuleNotFoundError:  # a name inside a module, not a submodule
            pass
        parent, _, name = dotted.rpartition(".")
        try:
            return hasattr(importlib.import_module(parent), name)
        except ImportError:
            return False

    missing = []
    for path in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]:
        text = path.read_text()
        named = set(re.findall(r"`(ortlab(?:\.\w+)+)`", text))
        for package, inside in re.findall(r"`(ortlab(?:\.\w+)*)` \(([^)]*)\)", text):
            named.update(f"{package}.{n}" for n in re.findall(r"`(\w+)`", inside))
        missing += [f"{path.name}: {name}" for name in sorted(named) if not exists(name)]
    assert not missing, missing

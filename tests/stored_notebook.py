"""Reading a stored walkthrough the way the prose-figure tests need it: its cells, its prose, the output of the
code cell that holds some words, and a stored viz.Table as rows. One copy for tests/notebooks/test_prose_figures_*.py.

Imported by bare name, as repo_paths is (pytest puts tests/ on sys.path): `from stored_notebook import output`.
"""
import json
import re

from repo_paths import ROOT

NOTEBOOKS = ROOT / "notebooks"


def cells(stem):
    return json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())["cells"]


def markdown_cells(stem):
    return ["".join(c["source"]) for c in cells(stem) if c["cell_type"] == "markdown"]


def markdown(stem):
    return "\n".join(markdown_cells(stem))


def code_cell(stem, marker):
    """The first code cell whose source contains `marker`."""
    for cell in cells(stem):
        if cell["cell_type"] == "code" and marker in "".join(cell["source"]):
            return cell
    raise AssertionError(f"{stem}: no code cell contains {marker!r}")


def output(stem, marker, stream=None):
    """The text output of code_cell(stem, marker): one stream ('stdout', 'stderr') joined as printed, or every
    text output, one per line."""
    texts = []
    for out in code_cell(stem, marker).get("outputs", []):
        if stream is not None and out.get("name") != stream:
            continue
        text = out.get("text") or out.get("data", {}).get("text/plain", "")
        texts.append("".join(text))
    return "".join(texts) if stream else "\n".join(texts)


def table(text):
    """A stored viz.Table as a list of rows, each a list of its cells (split at the header's column starts)."""
    lines = [line for line in text.splitlines() if line.strip()]
    rule = next(i for i, line in enumerate(lines) if set(line.replace(" ", "")) == {"-"})
    starts = [m.start() for m in re.finditer(r"-+", lines[rule])]
    return [_cut(lines[rule - 1], starts)] + [_cut(line, starts) for line in lines[rule + 1:]]


def _cut(line, starts):
    return [line[a:b].strip() for a, b in zip(starts, starts[1:] + [None])]

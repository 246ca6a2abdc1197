"""00_welcome: the lab's contents, read from the notebooks that exist, so the list cannot drift.

A walkthrough's level is its file name's prefix (`L0_`..`L3_`, `D_` for the training domain); its
topic is the text after "·" in its first heading. A lab's title comes from its solution's heading.
"""
import json
from pathlib import Path

from ortlab.viz import Table

ROOT = Path(__file__).resolve().parents[2]
LEVELS = {"L0": "0", "L1": "1", "L2": "2", "L3": "3", "D": "domain"}


def _heading(path):
    """The text of a notebook's first heading after its '·' (the whole heading when it has none)."""
    cells = json.loads(Path(path).read_text())["cells"]
    first = next((line for c in cells if c["cell_type"] == "markdown"
                  for line in "".join(c["source"]).splitlines() if line.startswith("#")), path.stem)
    return first.lstrip("# ").split(" · ", 1)[-1].strip()


def walkthroughs(root=ROOT):
    """Table of (level, notebook, topic) for every notebooks/<level>_NN_*.ipynb, in roadmap order."""
    rows = []
    for path in sorted(Path(root, "notebooks").glob("*.ipynb")):
        prefix = path.stem.split("_", 1)[0]
        if prefix in LEVELS:
            rows.append((LEVELS[prefix], path.stem, _heading(path)))
    order = list(LEVELS.values())
    rows.sort(key=lambda row: (order.index(row[0]), row[1]))
    return Table(("level", "notebook", "topic"), rows)


def labs(root=ROOT):
    """Table of (lab, title) for every lab the lab ships (labs/ is generated from solutions/)."""
    rows = [(path.stem, _heading(path)) for path in sorted(Path(root, "solutions").glob("lab*.ipynb"))]
    return Table(("lab", "title"), rows)

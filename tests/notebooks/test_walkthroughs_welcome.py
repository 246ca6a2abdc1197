"""00_welcome's contents are read from the notebooks that exist (ortlab.walkthroughs.welcome)."""
import json
import re

from ortlab.walkthroughs import welcome
from repo_paths import ROOT



def _write(path, heading):
    cell = {"cell_type": "markdown", "id": "x", "metadata": {}, "source": [heading + "\n", "\ntext\n"]}
    path.write_text(json.dumps({"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}))


def test_levels_come_from_file_names_and_topics_from_headings(tmp_path):
    (tmp_path / "notebooks").mkdir()
    _write(tmp_path / "notebooks" / "D_01_knobs.ipynb", "# D_01 · Knobs")
    _write(tmp_path / "notebooks" / "L1_02_eps.ipynb", "# L1 · Execution providers")
    _write(tmp_path / "notebooks" / "L0_01_session.ipynb", "# InferenceSession, no dot")
    _write(tmp_path / "notebooks" / "00_welcome.ipynb", "# Welcome")
    table = welcome.walkthroughs(tmp_path)
    assert table.rows == [("0", "L0_01_session", "InferenceSession, no dot"),
                          ("1", "L1_02_eps", "Execution providers"),
                          ("domain", "D_01_knobs", "Knobs")]


def test_every_walkthrough_in_the_readme_table_of_contents_is_listed_and_nothing_else():
    readme = (ROOT / "README.md").read_text()
    toc = set(re.findall(r"`notebooks/((?:L\d|D)_\d\d_\w+)\.ipynb`", readme))
    listed = {row[1] for row in welcome.walkthroughs().rows}
    assert listed == toc


def test_every_lab_is_listed():
    listed = {row[0] for row in welcome.labs().rows}
    assert listed == {p.stem for p in (ROOT / "labs").glob("lab*.ipynb")}

"""What a learner reads cites the lab's sources by title, never by an internal file or tracker number.

The lab's source documents are public: the ORT training onboarding roadmap, the "ONNX Runtime Training
Guidelines", the ORT training design slides, onnxruntime PR #19007 and the ORTModule "Performance
Investigation" guide (README, "Sources"). A learner has no "seed 001" and no "issue 20".
"""
import json
import re

import pytest

from repo_paths import ROOT

# A source document by its file number ("seed 001", "Seed-004"), or a tracker number ("issue 20").
# A public reference is written owner/repo#N and is not matched.
INTERNAL = re.compile(r"\bseeds?[ -]?0\d\d\b|\bissues? ?#?\d+\b", re.IGNORECASE)


def _notebook_text(path):
    nb = json.loads(path.read_text())
    for i, cell in enumerate(nb["cells"]):
        yield f"cell {i} source", "".join(cell["source"])
        for out in cell.get("outputs", []):
            text = "".join(out.get("text", "")) + "".join(out.get("data", {}).get("text/plain", ""))
            yield f"cell {i} output", text


def _texts():
    for folder in ("notebooks", "solutions", "labs"):
        for path in sorted((ROOT / folder).glob("*.ipynb")):
            for where, text in _notebook_text(path):
                yield f"{folder}/{path.name}, {where}", text
    for path in [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").glob("*.md"))]:
        yield str(path.relative_to(ROOT)), path.read_text()
    for path in sorted((ROOT / "ortlab").rglob("*.py")):
        yield str(path.relative_to(ROOT)), path.read_text()


def internal_citations():
    found = []
    for where, text in _texts():
        for match in INTERNAL.finditer(text):
            line = text[: match.start()].count("\n") + 1
            found.append(f"{where}, line {line}: {match.group(0)!r}")
    return found


@pytest.mark.parametrize("text, cited", [
    ("Seed 001's table", True), ("as seed-004 says", True), ("issue 20's probe", True),
    ("random DAGs, 24 seeds", False), ("env.seed_everything(0)", False), ("pytorch/pytorch#132644", False),
])
def test_the_pattern_tells_an_internal_citation_from_ordinary_words(text, cited):
    assert bool(INTERNAL.search(text)) is cited


def test_no_learner_facing_text_cites_a_source_by_file_or_tracker_number():
    found = internal_citations()
    assert not found, ("cite the source by its title (README, 'Sources'):\n" + "\n".join(found))

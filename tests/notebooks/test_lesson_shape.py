"""Every walkthrough reads as a lesson: it opens with what the learner will be able to do, the time it takes and
what to read first; it tells one story in at most about 1,500 words of prose before its "Going deeper" part;
it defines the lab's jargon where it first appears; it carries no development history; the test harness's
markers stay out of the learner's text (nbval reads them from cell tags); and it was executed whole, top to
bottom, so its execution counts climb one by one.
"""
import json
import re

import pytest

from repo_paths import ROOT

WALKTHROUGHS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXECUTED = WALKTHROUGHS + sorted((ROOT / "solutions").glob("*.ipynb"))
ALL = EXECUTED + sorted((ROOT / "labs").glob("*.ipynb"))
STORY_WORDS = 1500
DEEPER = re.compile(r"^#+\s*Going deeper", re.MULTILINE)
NBVAL_COMMENT = re.compile(r"^\s*#\s*NBVAL_", re.MULTILINE)
NBVAL_TAGS = {"nbval-ignore-output", "nbval-check-output", "nbval-raises-exception", "raises-exception",
              "nbval-skip"}
# Words a newcomer to ORT does not know yet: at its first appearance in a notebook's prose, the word is
# explained in parentheses right after it ("MLAS (ORT's own CPU math library)") or is the parenthesised
# short form of the words just before it ("execution provider (EP)").
JARGON = ("MLAS", "ulp", "EP", "PTX", "SASS", "program counter", "ML indices")
HISTORY = re.compile(r"when this notebook was|\bthe seed(?:'s)? (?:says|question)|for a reason not found"
                     r"|an earlier gradient graph", re.IGNORECASE)
# Walkthroughs whose story is still longer than STORY_WORDS (strict xfail: shortening one makes its test
# pass, and then it must leave this list).
STORY_TOO_LONG = set()


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _prose(text):
    """A markdown cell's words as a reader meets them: fenced code and inline code spans left out."""
    return re.sub(r"`[^`\n]*`", " ", re.sub(r"```.*?```", " ", text, flags=re.DOTALL))


def story(path):
    """The markdown of a walkthrough before its "Going deeper" heading, one string per cell."""
    found = []
    for cell in _cells(path):
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            head = DEEPER.search(text)
            found.append(_prose(text[: head.start()] if head else text))
            if head:
                break
    return found


def words(texts):
    return sum(len(re.findall(r"[A-Za-z0-9][\w'’.-]*", t)) for t in texts)


def first_use_explained(text, term):
    """(explained, context) for the first appearance of `term` in `text`; (True, None) where it never appears."""
    match = re.search(rf"(?<![\w-]){re.escape(term)}s?(?![\w-])", text)
    if match is None:
        return True, None
    before, after = text[: match.start()], text[match.end():]
    explained = bool(re.match(r"\**\s*\(", after)) or bool(re.search(r"\(\**$", before))
    return explained, text[max(0, match.start() - 60): match.end() + 60]


@pytest.mark.parametrize("text, term, ok", [
    ("ORT's CPU kernels call MLAS (ORT's own math library) for GEMM", "MLAS", True),
    ("each execution provider (EP) owns kernels; an EP is", "EP", True),
    ("MLAS is fast. Later, MLAS (ORT's math library)", "MLAS", False),
    ("the EPs decide", "EP", False),
    ("CPUExecutionProvider and EP-specific", "EP", True),
    ("no jargon here", "ulp", True),
])
def test_the_first_use_rule_reads_definitions_and_bare_words_apart(text, term, ok):
    assert first_use_explained(text, term)[0] is ok


@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_a_walkthrough_opens_with_what_you_will_do_how_long_and_what_to_read_first(path):
    opening = "".join(_cells(path)[0]["source"])
    for label in ("You will be able to", "Time:", "Read first:"):
        assert label in opening, f"{path.name}'s first cell lacks {label!r}: say it before the story starts"


@pytest.mark.parametrize("path", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason="story still over 1,500 words"))
    if p.stem in STORY_TOO_LONG else p for p in WALKTHROUGHS], ids=lambda p: p.stem)
def test_a_walkthrough_tells_its_story_in_at_most_1500_words_before_going_deeper(path):
    n = words(story(path))
    assert n <= STORY_WORDS, (f"{path.name}: {n} words of prose before its 'Going deeper' heading; move the "
                              f"exhaustive tables and tours after a '## Going deeper' heading")


@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_jargon_is_explained_where_it_first_appears(path):
    text = "\n".join(_prose("".join(c["source"])) for c in _cells(path) if c["cell_type"] == "markdown")
    unexplained = []
    for term in JARGON:
        explained, context = first_use_explained(text, term)
        if not explained:
            unexplained.append(f"{term!r} in ...{context}...")
    assert not unexplained, f"{path.name}: explain at first use, in parentheses: {unexplained}"


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_no_development_history_in_the_learners_text(path):
    found = [m.group(0) for c in _cells(path) if c["cell_type"] == "markdown"
             for m in HISTORY.finditer("".join(c["source"]))]
    assert not found, f"{path.name} tells the lab's own history: {found}"


@pytest.mark.parametrize("path", ALL, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_nbval_markers_are_cell_tags_not_comments_in_the_learners_code(path):
    for i, cell in enumerate(_cells(path)):
        assert not NBVAL_COMMENT.search("".join(cell["source"])), (
            f"{path.name} cell {i}: an NBVAL comment in the learner's code; tag the cell instead")
        unknown = {t for t in cell.get("metadata", {}).get("tags", []) if t.startswith("nbval")} - NBVAL_TAGS
        assert not unknown, f"{path.name} cell {i}: nbval does not know the tags {sorted(unknown)}"


@pytest.mark.parametrize("path", EXECUTED, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_a_stored_notebook_was_executed_whole_top_to_bottom(path):
    counts = [c.get("execution_count") for c in _cells(path) if c["cell_type"] == "code"]
    assert counts == list(range(1, len(counts) + 1)), (
        f"{path.name}: execution counts {counts} are not 1, 2, 3, ...: re-execute it whole "
        f"(make execute NOTEBOOKS={path.relative_to(ROOT)})")


@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_a_walkthrough_leaves_its_netron_views_live(path):
    """The servers stop with the kernel (ortlab.viz stops them at exit); a cell that stops them makes "Run All"
    end with every live view refusing connections."""
    stopping = [i for i, c in enumerate(_cells(path))
                if c["cell_type"] == "code" and "stop_all(" in "".join(c["source"])]
    assert not stopping, f"{path.name} cells {stopping} stop the Netron views: leave them to the kernel's end"


def study_minutes(path):
    """The README's estimate of a walkthrough's minutes to read and do: 150 words of prose a minute (fenced code
    left out), 2 minutes a code cell, and each exercise's own estimate ("### Exercise `id` (N minutes)"), rounded
    to 5 minutes."""
    words = code = exercises = 0
    for cell in _cells(path):
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            words += words_of(re.sub(r"```.*?```", " ", text, flags=re.DOTALL))
            exercises += sum(int(n) for n in re.findall(r"^###\s*Exercise\b.*?\((\d+) minutes?\)", text, re.MULTILINE))
        else:
            code += 1
    return 5 * round((words / 150 + 2 * code + exercises) / 5)


def words_of(text):
    return len(re.findall(r"[A-Za-z0-9][\w'’.-]*", text))


@pytest.mark.parametrize("path", WALKTHROUGHS, ids=lambda p: p.stem)
def test_the_opening_and_the_readme_give_the_same_minutes_by_the_readmes_rule(path):
    minutes = study_minutes(path)
    opening = "".join(_cells(path)[0]["source"])
    assert f"about {minutes} minutes to read and do" in opening, f"{path.name}: say 'about {minutes} minutes'"
    row = re.search(re.escape(f"`notebooks/{path.name}`") + r".*\| (\d+) \|$", (ROOT / "README.md").read_text(),
                    re.MULTILINE)
    assert row and int(row.group(1)) == minutes, f"README's course map: {path.name} takes {minutes} minutes"

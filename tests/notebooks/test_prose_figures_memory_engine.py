"""The figures the prose of the memory and engine lessons quotes are the figures in the outputs beside it.

Each test reads a stored notebook with json, takes a figure from its markdown and the same figure from an
output (or recomputes it from the output's own numbers), and compares them, so the prose cannot drift from the
output again: lab09's "ORT's block over the lower bound" percentage (solutions/ and labs/); L2_02's byte counts,
printed with thousands separators where the prose writes them so; L2_02's slow cells, announced; and the
lesson's own words about VariadicAlias, checked against ORT's kernel registry.
"""
import json
import re

import pytest

from repo_paths import ROOT


def _cells(path):
    return json.loads(path.read_text())["cells"]


def _text(cell):
    return "".join(cell["source"])


def _output(cell):
    return "".join("".join(o.get("text") or o.get("data", {}).get("text/plain", "")) for o in cell.get("outputs", []))


def _cell_after(cells, marker):
    """(markdown cell containing `marker`, index)."""
    for i, cell in enumerate(cells):
        if cell["cell_type"] == "markdown" and marker in _text(cell):
            return cell, i
    raise AssertionError(f"no markdown cell says {marker!r}")


@pytest.mark.parametrize("folder", ["solutions", "labs"])
def test_lab09_prose_quotes_the_tables_percentage_of_ort_over_the_bound(folder):
    cells = _cells(ROOT / folder / "lab09_memory_planner.ipynb")
    prose, _ = _cell_after(cells, "greedy by size at the lower bound")
    said = float(re.search(r"ORT's block (\d+\.\d+)% over it", _text(prose)).group(1))
    tables = [c for c in cells if c["cell_type"] == "code" and "planner_table" in _text(c)]
    if folder == "labs":   # the shipped lab is not executed: the solution's output is the one the prose reads
        tables = [c for c in _cells(ROOT / "solutions" / "lab09_memory_planner.ipynb")
                  if c["cell_type"] == "code" and "planner_table" in _text(c)]
    row = next(line for line in _output(tables[0]).splitlines() if line.startswith("gpt training"))
    fields = re.split(r"\s{2,}", row.strip())
    ort_request, lower_bound, printed = int(fields[1].replace(",", "")), int(fields[4].replace(",", "")), fields[5]
    assert printed == f"+{said:.2f}%"
    assert f"{ort_request / lower_bound - 1:.2%}" == f"{said:.2f}%"


L2_02 = ROOT / "notebooks" / "L2_02_memory.ipynb"
ORT_LOG_WORDS = ("BFCArena", "Extended allocation", "Total allocated")   # ORT's own log format, quoted as is
MIB = 1 << 20


def _code_with(cells, words):
    return next(c for c in cells if c["cell_type"] == "code" and words in _text(c))


def _bytes(text):
    return int(text.replace(",", ""))


def test_l2_02_prints_byte_counts_with_thousands_separators_as_its_prose_writes_them():
    bare = [(i, m.group(0)) for i, c in enumerate(_cells(L2_02)) if c["cell_type"] == "code"
            for line in _output(c).splitlines() if not any(w in line for w in ORT_LOG_WORDS)
            for m in re.finditer(r"(?<![\w.,])\d{5,}(?![\w.,])", line)]
    assert not bare, f"L2_02 prints byte counts without separators: {bare[:5]}"


def test_l2_02_the_block_in_the_order_table_is_the_block_predicted_in_section_3():
    cells = _cells(L2_02)
    predicted = re.search(r"block predicted by plan\(\): ([\d,]+) bytes", _output(_code_with(cells, "kind_counts")))
    table = _output(_code_with(cells, "for order in (\"default\", \"priority\"):"))
    row = next(line for line in table.splitlines() if line.startswith("default   True"))
    assert predicted.group(1) in row.split()


def test_l2_02_variadic_alias_prose_states_the_blocks_the_cell_prints():
    cells = _cells(L2_02)
    out = _output(_code_with(cells, "passthrough_model()"))
    without, ort = map(_bytes, re.search(r"declaring nothing\s*: plan\(\) ([\d,]+)\s+ORT ([\d,]+)", out).groups())
    with_alias, ort_again = map(_bytes, re.search(r"VariadicAlias\(0, 0\)\)?\s*: plan\(\) ([\d,]+)\s+ORT ([\d,]+)",
                                                  out).groups())
    prose, _ = _cell_after(cells, "With the declaration, `a2` and `b2`")
    text = " ".join(_text(prose).split())
    count, size = re.search(r"the block is ORT's: (\w+) (\d+) MiB buffers", text).groups()
    words = {"two": 2, "three": 3, "four": 4}
    assert with_alias == ort == ort_again == words[count] * int(size) * MIB
    live, size_live = re.search(r"(\w+) (\d+) MiB buffers live at `pass`", text).groups()
    high = int(re.search(r"the prediction is (\d+) MiB\s+too high", text).group(1))
    assert without == words[live] * int(size_live) * MIB and without - ort == high * MIB


@pytest.mark.parametrize("code_words", ["by_batch = {b: plan(", "om_graphs = mo.ortmodule_graphs("])
def test_l2_02_a_slow_cell_is_announced_in_the_prose_before_it(code_words):
    cells = _cells(L2_02)
    index = next(i for i, c in enumerate(cells) if c["cell_type"] == "code" and code_words in _text(c))
    before = next(_text(c) for c in reversed(cells[:index]) if c["cell_type"] == "markdown")
    assert re.search(r"this cell takes about \d+ s", before)


def test_l2_02_the_opening_says_how_long_the_imports_take():
    assert re.search(r"the imports, about \d+ s", _text(_cells(L2_02)[0]))


def test_readable_writes_integers_with_separators_and_leaves_the_rest():
    from ortlab.viz import Table
    from ortlab.walkthroughs.memory import readable
    table = readable(Table(("a", "b", "c"), [(7806208, "x", True), (12, 0.5, None)]))
    assert table.rows == [("7,806,208", "x", True), ("12", 0.5, None)]


def test_passthrough_declares_variadic_alias_and_the_plan_is_orts_block():
    import numpy as np

    from ortlab.memory import plan
    from ortlab.walkthroughs import memory as mv
    model = mv.passthrough_model()
    from ortlab.ops.kernel_declarations import ORT_CPU_KERNEL_DECLARATIONS
    # group.cc's KernelDefBuilder().VariadicAlias(0, 0), from com.microsoft opset 1 on
    assert ORT_CPU_KERNEL_DECLARATIONS[("com.microsoft", "PassThrough")] == [(1, None, {"variadic_alias": (0, 0)})]
    feeds = {"x": np.ones((65536, 8), np.float32)}
    theirs = mv.arena_requests(mv.ort_first_run_log(model, feeds))[0]
    assert plan(model, feeds).peak_bytes == theirs  # ORT's block, by default
    assert plan(model, feeds, declarations=mv.without_declaration("PassThrough")).peak_bytes > theirs


def test_l2_01_step_times_are_unchecked_and_the_prose_says_why_pytorch_can_trail():
    cells = _cells(ROOT / "notebooks" / "L2_01_execution_engine.ipynb")
    timing = _code_with(cells, "median_step_time()")
    assert "nbval-ignore-output" in timing["metadata"].get("tags", [])
    medians = dict(re.findall(r"(PyTorch|ortlab stack)\s.*median\s+([\d.]+) ms", _output(timing), re.MULTILINE))
    prose, _ = _cell_after(cells, "The times under the curves are this machine's")
    text = " ".join(_text(prose).split())
    assert "`torch.get_num_threads()`" in text and "(the cell is not checked)" in text
    if float(medians["PyTorch"]) > float(medians["ortlab stack"]):
        assert "can come out slower than ortlab's" in text

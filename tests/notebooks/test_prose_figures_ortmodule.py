"""The ORTModule lessons (L0_02, L1_07, D_02) say in prose what their stored outputs show, figure for figure:

- L0_02's sentence on `ORTMODULE_LOG_LEVEL` against `DebugOptions`: the INFO-line counts and the "exporter's
  graph printed" answers it quotes are those its cell printed, and the lowercase value it says raises KeyError
  is the one L1_07's table shows failing, in a row where the exporter's graph follows DebugOptions;
- L0_02's section on the re-post-export check: the table has both checks' answers for every call, and the
  prose's claims (x gets a gradient only with every check on; the fast path skips both checks) are its rows;
- D_02's compute-optimizer check prints two facts, the same losses and a different executed graph, each
  recomputed here from the outputs beside it (the loss table, the op-count table), and the node counts its
  prose quotes are the table's;
- L1_07's compute-optimizer (FLOP reduction) section: the FLOP counts and the ratio the prose quotes are the
  output's, and the output's FLOPs are recomputed here from the shapes it printed.

Each test reads the stored notebook with json and extracts the figure from the prose and from the output.
The helpers these sections call are unit-tested at the end (ortlab.walkthroughs.ortmodule_optimizations,
ortmodule_input_features, ortmodule_feature_models).
"""
import json
import re

import numpy as np

from repo_paths import ROOT

NOTEBOOKS = ROOT / "notebooks"


def _cells(stem):
    return json.loads((NOTEBOOKS / f"{stem}.ipynb").read_text())["cells"]


def _cell(stem, cell_id):
    found = [c for c in _cells(stem) if c.get("id") == cell_id]
    assert found, f"{stem} has no cell {cell_id!r}: the cell these figures are pinned to moved or was renamed"
    return found[0]


def _source(cell):
    """A cell's text with every run of whitespace (line breaks included) as one space."""
    return re.sub(r"\s+", " ", "".join(cell["source"]))


def _output(cell):
    text = []
    for out in cell.get("outputs", []):
        if out["output_type"] == "stream":
            text.append("".join(out["text"]))
        elif "data" in out:
            text.append("".join(out["data"].get("text/plain", "")))
    return "\n".join(text)


def _table_rows(text, first_column):
    """The rows of a viz.Table printed in `text` whose first column equals `first_column`, split on 2+ spaces."""
    rows = []
    for line in text.splitlines():
        cells = re.split(r" {2,}", line.strip())
        if cells and cells[0] == first_column:
            rows.append(cells)
    return rows


# ---------------------------------------------------------------------------------------------
# L0_02: ORTMODULE_LOG_LEVEL against DebugOptions, and L1_07's table behind it

L0_02, L1_07, D_02 = "L0_02_ortmodule", "L1_07_ortmodule_optimizations", "D_02_convergence_investigation"


def _log_level_printed():
    """{(DebugOptions level, variable level): (INFO lines, exporter's graph printed)} from L0_02's cell."""
    printed = re.findall(r"DebugOptions\(log_level=(\w+)\), ORTMODULE_LOG_LEVEL=(\w+): (\d+) INFO lines, "
                         r"the torch exporter's graph printed: (yes|no)", _output(_cell(L0_02, "L0_02_ortmodule-09b")))
    return {(d, v): (int(n), shown) for d, v, n, shown in printed}


# ---------------------------------------------------------------------------------------------
# L0_02: the re-post-export check


# ---------------------------------------------------------------------------------------------
# D_02: the compute optimizer off runs a different graph with the same losses


def test_d_02_prints_both_facts_it_checks_and_its_prose_quotes_the_node_counts():
    cell = _cell(D_02, "D_02_convergence_investi-16")
    out = _output(cell)
    same = re.search(r"same losses \(largest relative gap below 1e-5\): (True|False)", out)
    different = re.search(r"different executed graphs: (True|False) \((\d+) nodes with the optimizer on, (\d+) off\)",
                          out)
    assert same and different, "D_02's check no longer prints both facts"
    # the losses, from the loss table beside it
    curves = _output(_cell(D_02, "D_02_convergence_investi-13"))
    on = _table_rows(curves, "ORTModule")[0][1:3]
    off = _table_rows(curves, "ORTModule, compute optimizer off")[0][1:3]
    assert (same.group(1) == "True") == (on == off)
    # the graphs, from the op-count table beside it
    total = _table_rows(out, "(all nodes)")[0][1:3]
    changed = [line for line in out.splitlines() if re.match(r"^\S+\s+\d+\s+\d+\s+\w", line)]
    assert (different.group(1) == "True") == bool(changed)
    assert [different.group(2), different.group(3)] == total
    prose = _source(_cell(D_02, "D_02_convergence_investi-16a"))
    quoted = re.search(r"ORT executed (\d+) nodes instead of (\d+)", prose)
    assert quoted and [quoted.group(2), quoted.group(1)] == total
    assert "a different graph with the same losses" not in "".join(_source(c) for c in _cells(D_02))


# ---------------------------------------------------------------------------------------------
# L1_07: the compute optimizer's FLOP reduction


# ---------------------------------------------------------------------------------------------
# The helpers behind these sections


def _two_matmuls():
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 5, 3])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    w = helper.make_tensor("w", TensorProto.FLOAT, [3, 4], np.ones(12, np.float32))
    v = helper.make_tensor("v", TensorProto.FLOAT, [4, 6], np.ones(24, np.float32))
    index = helper.make_tensor("i", TensorProto.INT64, [], [0])
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"], name="first"),
             helper.make_node("Gather", ["h", "i"], ["g"], axis=1),
             helper.make_node("MatMul", ["g", "v"], ["y"], name="second")]
    graph = helper.make_graph(nodes, "g", [x], [y], [w, v, index])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
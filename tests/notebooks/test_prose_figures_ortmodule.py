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


def test_l0_02_says_the_log_level_variable_overrides_only_the_info_lines_it_printed():
    printed = _log_level_printed()
    prose = _source(_cell(L0_02, "L0_02_ortmodule-09c"))
    assert "wins both ways" not in prose
    counts = re.search(r"\((\d+) lines where `DebugOptions` asks for INFO, (\d+) where it asks for WARNING\)", prose)
    shown = re.search(r"printed: (yes|no) with `DebugOptions` INFO, (yes|no) with WARNING", prose)
    assert counts and shown, "L0_02's sentence on ORTMODULE_LOG_LEVEL no longer quotes the counts it is pinned to"
    assert printed[("INFO", "WARNING")] == (int(counts.group(1)), shown.group(1))
    assert printed[("WARNING", "INFO")] == (int(counts.group(2)), shown.group(2))
    # "partial": the variable decides the INFO lines (none where it says WARNING, some where it says INFO)...
    assert printed[("INFO", "WARNING")][0] == 0 < printed[("WARNING", "INFO")][0]
    # ...and the exporter's graph follows DebugOptions
    assert (printed[("INFO", "WARNING")][1], printed[("WARNING", "INFO")][1]) == ("yes", "no")


def test_l0_02s_pointer_to_l1_07_names_what_l1_07_executed():
    prose = _source(_cell(L0_02, "L0_02_ortmodule-09c"))
    lowercase = re.search(r"a lowercase `(\w+)` raises `KeyError`", prose)
    assert lowercase, "L0_02 no longer says which lowercase value raises KeyError"
    l1_07 = _cells(L1_07)
    assert "L1_07 · ORTModule beyond the basics" in _source(l1_07[0]), "L0_02 points to L1_07 by its title"
    table = next(_output(c) for c in l1_07 if "lg.env_level_table" in _source(c))
    assert f"KeyError: '{lowercase.group(1)}'" in table
    header = re.split(r" {2,}", table.splitlines()[0].strip())
    column = {name: k for k, name in enumerate(header)}
    rows = [re.split(r" {2,}", line.strip()) for line in table.splitlines()[2:]]
    partial = [r for r in rows if r[:2] == ["INFO", "WARNING"]]
    assert partial, "L1_07's table lost its DebugOptions INFO / ORTMODULE_LOG_LEVEL=WARNING row"
    assert partial[0][column["ORTModule INFO"]] == "0" and partial[0][column["exporter graph"]] != "0"


# ---------------------------------------------------------------------------------------------
# L0_02: the re-post-export check


def test_l0_02_reprocess_check_prose_matches_its_table():
    table = _output(_cell(L0_02, "L0_02_ortmodule-51"))
    rows = [re.split(r" {2,}", line.strip()) for line in table.splitlines()[2:] if line.strip()]
    by = {(r[0], r[1]): r[2:] for r in rows}
    every, fast = "SKIP_CHECK_DISABLED", "default (fast path)"
    prose = _source(_cell(L0_02, "L0_02_ortmodule-52"))
    # "x.requires_grad_(True) keeps the export (_export_check False) and rebuilds the gradient graph
    # (_reprocess_check True), and x gets its gradient"
    export, reprocess, builds, received = by[(every, "x.requires_grad_(True)")]
    assert "`_export_check` False" in prose and "`_reprocess_check` True" in prose
    assert (export, reprocess, int(builds)) == ("False", "True", 1) and received.endswith("+ x")
    assert by[(every, "first weight frozen, x plain")][1] == "True"  # "freezing a weight rebuilds it again"
    # "On the fast path neither check runs ... x.grad stays None"
    assert "neither check runs" in prose
    later = [v for (policy, call), v in by.items() if policy == fast and call != "first call"]
    assert later and all(v[:2] == ["skipped", "skipped"] and v[2] == "0" for v in later)
    assert not by[(fast, "x.requires_grad_(True)")][3].endswith("+ x")


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


def test_l1_07_flop_figures_are_the_tables_and_the_table_follows_its_shapes():
    table = _output(_cell(L1_07, "L1_07_ortmodule_optimizations-co4"))
    flops = {}
    for line in table.splitlines()[2:]:
        row = re.match(r"(\S+)\s+(MatMul \S+)\s+(\[[\d, ]+\])\s+(\[[\d, ]+\])\s+([\d,]+)$", line.strip())
        assert row, f"unreadable row of L1_07's matmul table: {line!r}"
        label, _, first, out = row.group(1), row.group(2), json.loads(row.group(3)), json.loads(row.group(4))
        assert int(row.group(5).replace(",", "")) == 2 * int(np.prod(out)) * first[-1]  # 2 · outputs · K
        flops[label] = flops.get(label, 0) + int(row.group(5).replace(",", ""))
    prose = _source(_cell(L1_07, "L1_07_ortmodule_optimizations-co5"))
    quoted = re.search(r"do ([\d,]+) FLOPs with the optimizer off and ([\d,]+) with it on: (\d+) times fewer, "
                       r"one row of the (\d+) per sequence", prose)
    assert quoted, "L1_07's sentence on the FLOPs no longer quotes them"
    off, on = (int(quoted.group(k).replace(",", "")) for k in (1, 2))
    assert (off, on) == (flops["COMPUTE_OPTIMIZER=0"], flops["COMPUTE_OPTIMIZER=1"])
    assert off // on == int(quoted.group(3)) == int(quoted.group(4))
    printed = _output(_cell(L1_07, "L1_07_ortmodule_optimizations-co2"))
    assert f"{off:,} FLOPs with the optimizer off, {on:,} with it on" in printed
    on_ops = re.search(r"^COMPUTE_OPTIMIZER=1: (.+)$", printed, re.MULTILINE).group(1).split(" -> ")
    off_ops = re.search(r"^COMPUTE_OPTIMIZER=0: (.+)$", printed, re.MULTILINE).group(1).split(" -> ")
    assert on_ops[0] == "Gather" and off_ops.index("Gather") > off_ops.index("MatMul")  # "the Gather comes first"
    changes = _output(_cell(L1_07, "L1_07_ortmodule_optimizations-co6"))
    assert "GatherGrad" in prose and re.search(r"com\.microsoft:GatherGrad\s+1\s+0\s+disappears", changes)


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


def test_value_shapes_and_matmul_work_read_the_shapes_a_graph_runs_on():
    from ortlab.walkthroughs import ortmodule_optimizations as of

    model = _two_matmuls()
    feeds = {"x": np.zeros((2, 5, 3), np.float32)}
    assert of.value_shapes(model, feeds) == {"y": [2, 6], "h": [2, 5, 4], "g": [2, 4]}
    assert of.matmul_work(model, feeds) == [("MatMul first", [2, 5, 3], [2, 5, 4], 2 * 40 * 3),
                                            ("MatMul second", [2, 4], [2, 6], 2 * 12 * 4)]


def test_first_token_classifier_reads_position_zero_only():
    import torch

    from ortlab.walkthroughs.ortmodule_feature_models import FirstTokenClassifier

    model = FirstTokenClassifier()
    x, labels = model.example_inputs(batch=3, seq=7)
    assert x.shape == (3, 7, 16) and labels.shape == (3,)
    changed = x.clone()
    changed[:, 1:] = torch.randn(3, 6, 16)
    assert torch.equal(model(x, labels), model(changed, labels))
    assert not torch.equal(model(x, labels), model(x[:, [1, 0]], labels))


def test_compute_optimizer_moves_the_gather_above_the_matmuls_and_keeps_the_losses():
    from ortlab.walkthroughs import ortmodule_optimizations as of

    co = of.compute_optimizer(steps=1, batch=2, seq=8)
    assert co.losses_equal() and co.losses_equal("COMPUTE_OPTIMIZER=0")
    assert co.facts["forward ops"]["COMPUTE_OPTIMIZER=1"][0] == "Gather"
    assert co.facts["flops"]["COMPUTE_OPTIMIZER=0"] == 8 * co.facts["flops"]["COMPUTE_OPTIMIZER=1"]


def test_reprocess_checks_see_a_new_input_needing_a_gradient_only_with_every_check_on():
    from ortlab import models
    from ortlab.walkthroughs import ortmodule_input_features as oi

    mlp = models.get("mlp", dropout=0.0)
    table = oi.reprocess_checks(mlp, mlp.example_inputs())
    rows = {(r[0], r[1]): r[2:] for r in table.rows}
    assert rows[("SKIP_CHECK_DISABLED", "the same call again")][:3] == (False, False, 0)
    assert rows[("SKIP_CHECK_DISABLED", "x.requires_grad_(True)")] == (False, True, 1, "4 parameters + x")
    assert rows[("SKIP_CHECK_DISABLED", "first weight frozen, x plain")] == (False, True, 1, "3 parameters")
    assert rows[("default (fast path)", "x.requires_grad_(True)")] == ("skipped", "skipped", 0, "4 parameters")

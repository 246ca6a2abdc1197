"""The prose of the graph walkthroughs (L0_01, L0_06, L1_01) says what their stored outputs show, and the helpers
behind L1_01's new cells compute what ORT computes.

Prose against stored output (each figure or claim is read from the stored notebook's markdown and compared with
the output beside it, or recomputed): the node counts L1_01 states for common subexpression elimination (CSE)
and constant folding, the node CSE removes, the graphs each of ORT's two transformer lists makes, that the
Python InferenceSession has no RegisterGraphTransformer (L0_01 and L1_01 say so), and that L0_06's registry cell
shows the builder its prose names. Helpers (ortlab/walkthroughs/graph_transformers.py): cse_steps and
folding_steps agree with ortlab's transformers, ort_only runs one ORT transformer alone, ort_pre_gradient_graph
returns ORT's pre-training graph, inference_vs_training puts the same graphs side by side, beside pads columns.
"""
import re

import pytest

from stored_notebook import markdown as _markdown
from stored_notebook import output as _output_after, table as _table

L1_01 = "L1_01_graph_transformers"
NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9}










def _column(rows, title):
    index = rows[0].index(title)
    return [row[index] for row in rows[1:] if row[index]]


def test_the_cse_paragraph_counts_the_nodes_the_stored_graphs_have():
    said = re.search(r"on the same model: the same (\w+) nodes", _markdown(L1_01))
    assert said, "L1_01 no longer says how many nodes CSE leaves"
    rows = _table(_output_after(L1_01, 'ex.ort_only(cse, "CommonSubexpressionElimination")'))
    assert len(_column(rows, "ortlab")) == len(_column(rows, "ORT")) == NUMBERS[said.group(1)]
    assert sorted(_column(rows, "ortlab")) == sorted(_column(rows, "ORT"))


def test_the_node_cse_removes_is_the_one_the_prose_names():
    said = re.search(r"meets `(\w+)` before `(\w+)`, so `(\w+)` goes", _markdown(L1_01))
    assert said, "L1_01 no longer says which Relu CSE removes"
    first, second, gone = said.groups()
    rows = _table(_output_after(L1_01, "ex.cse_steps(cse)"))
    order = [row[0] for row in rows[1:]]
    assert order.index(first) < order.index(second)
    verdict = {row[0]: row[3] for row in rows[1:]}
    assert gone == second and verdict[gone].startswith(f"same key as {first}: removed")


def test_the_folding_paragraph_counts_the_nodes_the_stored_graphs_have():
    said = re.search(r"ORT's alone: the same (\w+) nodes left", _markdown(L1_01))
    assert said, "L1_01 no longer says how many nodes constant folding leaves"
    output = _output_after(L1_01, 'ex.ort_only(folding, "ConstantFolding")')
    rows = _table(output[output.index("original"):])
    assert len(_column(rows, "ortlab")) == len(_column(rows, "ORT")) == NUMBERS[said.group(1)]
    made = re.findall(r"new initializers (\[.*?\])", output)
    assert len(made) == 2 and made[0] == made[1], output


def test_the_folding_walk_keeps_transpose_w_only_when_w_is_excluded():
    text = _markdown(L1_01)
    assert "`Neg(b2)` folds because `Mul(b, two)` just did" in text
    plain = {row[0]: row[2] for row in _table(_output_after(L1_01, "ex.folding_steps(folding)"))[1:]}
    excluded = {row[0]: row[2] for row in _table(_output_after(L1_01, 'excluded=["W"]'))[1:]}
    assert plain["transpose_W"].startswith("folded") and excluded["transpose_W"] == "kept: reads W, a weight to train"
    assert plain["neg_b2"].startswith("folded") and plain["mul_b"].startswith("folded")


def test_the_two_transformer_lists_make_the_graphs_the_prose_describes():
    text = _markdown(L1_01)
    assert "The inference list folds `Transpose(W)`" in text
    assert "training graph keeps the\n`Add` before its `Gelu`" in text
    rows = _table(_output_after(L1_01, "ex.inference_vs_training("))[1:]
    basic, extended, training = (row[1] for row in rows)
    assert "Transpose" not in basic and "Transpose" not in extended and training.startswith("Transpose")
    assert "Erf" in basic and "com.microsoft:BiasGelu" in extended and training.endswith("Add, com.microsoft:Gelu")
    assert all(row[1] == row[2] for row in rows), "ortlab's graph differs from ORT's in a row"


def test_register_graph_transformer_is_cpp_only_as_both_notebooks_say():
    import onnxruntime as ort

    assert "the last one is C++ only" in _markdown("L0_01_inference_session")
    assert "Python has neither" in _markdown(L1_01)
    output = _output_after(L1_01, "methods naming a transformer")
    live = [m for m in dir(ort.InferenceSession) if "ransformer" in m]
    binding = [m for m in dir(ort.capi._pybind_state.InferenceSession) if "ransformer" in m]
    assert live == binding == []
    assert f"methods naming a transformer: {live}" in output and f"the same: {binding}" in output


def test_l0_06_registry_cell_shows_the_builder_named_after_orts_class():
    text = _markdown("L0_06_per_op_gradients")
    declared = re.search(r"DECLARE_GRADIENT_BUILDER\((Get(\w+)Gradient)\)", text)
    registered = re.search(r'REGISTER_GRADIENT_BUILDER\("(\w+)", (\w+)\)', text)
    assert declared and registered and registered.group(2) == declared.group(1)
    op = registered.group(1)
    from ortlab.gradients import get_gradient_builder

    builder = get_gradient_builder(op)
    assert builder.__name__ == f"get_{declared.group(2).lower()}_gradient"
    assert f"GRADIENT_BUILDERS['{op}', ''] -> {builder.__module__}.{builder.__name__}" in \
        _output_after("L0_06_per_op_gradients", 'GRADIENT_BUILDERS["Sqrt", ""]')


# the helpers behind the cells

def test_cse_steps_removes_what_orts_transformer_and_ortlabs_remove():
    from ortlab.transformers import optimize
    from ortlab.walkthroughs import graph_transformers as ex

    model = ex.cse_model()
    rows = ex.cse_steps(model).rows
    removed = {row[0] for row in rows if "removed" in row[3]}
    kept = {n.name for n in optimize(model, level=1, names=["CommonSubexpressionElimination"]).graph.node}
    theirs = ex.ort_only(model, "CommonSubexpressionElimination")
    assert removed == {"relu_1", "exp_1"} and kept == {n.name for n in model.graph.node} - removed
    assert sorted(ex.node_lines(theirs)) == sorted(ex.node_lines(optimize(model, level=1,
                                                                          names=["CommonSubexpressionElimination"])))


def test_folding_steps_folds_what_constant_folding_folds():
    from ortlab.transformers import optimize
    from ortlab.walkthroughs import graph_transformers as ex

    model = ex.folding_model()
    folded = {row[0] for row in ex.folding_steps(model).rows if row[2].startswith("folded")}
    left = {n.name for n in optimize(model, level=1, names=["ConstantFolding"]).graph.node}
    assert folded == {n.name for n in model.graph.node} - left == {"transpose_W", "mul_b", "neg_b2", "shape"}
    training = {row[0] for row in ex.folding_steps(model, excluded=["W"]).rows if row[2].startswith("folded")}
    assert training == folded - {"transpose_W"}


def test_ort_only_names_what_orts_level_runs_when_asked_for_another():
    from ortlab.walkthroughs import graph_transformers as ex

    with pytest.raises(ValueError, match="ConstantFolding"):
        ex.ort_only(ex.folding_model(), "NoSuchFusion")


@pytest.mark.parametrize("weights, transpose", [(["W"], True), ([], False)])
def test_ort_pre_gradient_graph_excludes_the_weights_to_train_from_folding(weights, transpose):
    from ortlab.walkthroughs import graph_transformers as ex

    ops = [n.op_type for n in ex.ort_pre_gradient_graph(ex.training_model(), weights).graph.node]
    assert ("Transpose" in ops) is transpose and ops[-2:] == ["Add", "Gelu"]


def test_beside_pads_the_shorter_columns():
    from ortlab.walkthroughs import graph_transformers as ex

    model = ex.folding_model()
    table = ex.beside(a=model, b=ex.cse_model())
    assert len(table.rows) == max(len(model.graph.node), len(ex.cse_model().graph.node))
    assert len(model.graph.node) < len(table.rows) and table.rows[-1][0] == ""
    assert table.rows[len(model.graph.node) - 1][0] == ex.node_lines(model)[-1]
    assert table.rows[-1][1] == ex.node_lines(ex.cse_model())[-1]

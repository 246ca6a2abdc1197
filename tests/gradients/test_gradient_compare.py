"""The comparison helpers the gradient notebooks use: what they report matches what the
graphs hold."""
import numpy as np
from onnx import numpy_helper

from ortlab.gradients import build_gradient_graph, ort_gradient_graph
from ortlab.walkthroughs.per_op_gradients import (count_by_type, gradient_nodes, op_model, ort_verdict, side_by_side,
                                                  value_table)

rng = np.random.default_rng(0)


def f(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def test_op_model_differentiates_its_inputs_and_keeps_constants_out():
    case = op_model("Dropout", {"X": f(2, 3), "ratio": np.array(0.5, np.float32), "training_mode": np.array(True)},
                    ("ratio", "training_mode"), outputs=2)
    assert case.x_names == ["X"] and list(case.feeds) == ["X"]
    assert [o for o in case.model.graph.node[0].output] == ["Y", "Y1"]
    assert {i.name for i in case.model.graph.initializer} == {"ratio", "training_mode", "R"}
    r = next(numpy_helper.to_array(t) for t in case.model.graph.initializer if t.name == "R")
    np.testing.assert_array_equal(case.loss_weights, r)
    assert r.shape == (2, 3)


def test_side_by_side_and_counts_list_each_builders_nodes():
    case = op_model("Sqrt", {"X": np.abs(f(2, 3)) + 0.5})
    ours = build_gradient_graph(case.model, case.x_names, "loss")
    theirs = ort_gradient_graph(case.model, case.x_names, "loss")
    table = side_by_side(case.model, ours, theirs, of="Sqrt")
    assert [r[0].split("(")[0] for r in table.rows] == ["Div", "Mul"]
    assert [r[1].split("(")[0] for r in table.rows] == ["Div", "Mul"]
    counts = count_by_type(case.model, ortlab=ours, ORT=theirs)
    total = dict((r[0], r[1:]) for r in counts.rows)["total"]
    assert total == (len(gradient_nodes(ours, case.model)), len(gradient_nodes(theirs, case.model)))
    assert total[0] == len(ours.graph.node) - len(case.model.graph.node)


def test_value_table_reports_small_errors_for_right_gradients():
    case = op_model("Mul", {"A": f(2, 3), "B": f(3)})
    table = value_table(case, ortlab=build_gradient_graph(case.model, case.x_names, "loss"))
    assert [r[0] for r in table.rows] == ["A", "B"]
    assert all(float(r[1]) < 1e-2 for r in table.rows)


def test_ort_verdict_names_what_ort_lacks_and_gets_wrong():
    assert "has not been registered: Sum" in ort_verdict(op_model("Sum", {"a": f(2, 3), "b": f(3)}))
    where = op_model("Where", {"c": rng.random((2, 3)) > 0.5, "a": f(2, 3), "b": f(3)}, ("c",))
    assert "gradient of b has shape [2, 3], not [3]" in ort_verdict(where)
    assert ort_verdict(op_model("Mul", {"A": f(2, 3), "B": f(3)})) == "ORT builds it, same values"

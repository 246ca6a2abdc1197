"""The facts L0_03's exercise judges use agree with ORT or with an independent computation.

'upstream_nodes': the nodes the judge says a value depends on (ortlab's producers) are those
onnx.utils.Extractor keeps when it extracts the sub-model computing that value. 'topological_order': every
order ORT's GraphViewer really runs (read from its profiler, DEFAULT and PRIORITY_BASED) passes the judge's
rule, and the shuffled model's file order does not.
"""
import numpy as np
import onnx
import pytest

from ortlab import session
from ortlab.ir import Graph
from ortlab.labs import l0_03
from ortlab.labs.judges.l0_03 import needed, order_problem


@pytest.mark.parametrize("value", ["right", "Y", "joined", "Z", "h"])
def test_the_nodes_a_value_needs_are_those_onnx_extractor_keeps(value):
    model = l0_03.diamond_model()
    extracted = onnx.utils.Extractor(model).extract_model(["X"], [value])
    assert set(needed(Graph.from_model(model), value)) == {n.name for n in extracted.graph.node}


@pytest.mark.parametrize("build", [l0_03.diamond_model, l0_03.shuffled_model])
@pytest.mark.parametrize("order", ["default", "priority"])
def test_orders_ort_runs_pass_the_judges_rule(build, order):
    model = build()
    ran = session.execution_order(model, {"X": np.ones((2, 3), np.float32)}, order=order,
                                  providers=["CPUExecutionProvider"])
    assert sorted(ran) == sorted(n.name for n in model.graph.node)
    assert order_problem(model, ran) is None


def test_the_shuffled_file_order_is_not_one_ort_could_run():
    model = l0_03.shuffled_model()
    assert "comes before" in order_problem(model, [n.name for n in model.graph.node])
    with pytest.raises(onnx.checker.ValidationError):
        onnx.checker.check_model(model)

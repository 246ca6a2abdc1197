"""The facts L0_02's exercise judges read from ORTModule's code agree with what the real ORTModule does when it
runs the calls (exports, builds its session, trains).

'graph_inputs': for every call the check uses, the graph ORTModule exports takes exactly the judge's names as its
user inputs, and the model's loss is PyTorch's. 're_export': run one after the other under ORTModule with every
check on, the calls export again exactly where the judge says (ORTModule's own INFO log, "need_export_model").
"""
import warnings

import numpy as np
import pytest

from ortlab.labs import l0_02
from ortlab.labs.judges.l0_02 import REASONS, graph_input_cases, ort_exports, ort_model_info
from ortlab.ortmodule import driver as om


@pytest.mark.parametrize("k", range(len(graph_input_cases())))
def test_the_graph_ortmodule_exports_takes_the_judges_input_names(k):
    args, kwargs = graph_input_cases()[k]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with om.captured_logs():
            model = om.ortmodule(l0_02.NestedModel(), "WARNING", False)
            loss = model(*args, **kwargs)
    manager = model._torch_module._execution_manager(True)._graph_transition_manager
    exported = [i.name for i in manager._exported_model_info.exported_model.graph.input]
    parameters = {n for n, _ in manager._flatten_module.named_parameters()}
    assert [n for n in exported if n not in parameters] == list(ort_model_info(args, kwargs).onnx_graph_input_names)
    np.testing.assert_allclose(float(loss), float(l0_02.NestedModel()(*args, **kwargs)), rtol=1e-5)


def test_ortmodule_exports_again_where_the_judge_says():
    calls = l0_02.re_export_calls()
    run = om.call_outcomes(l0_02.NestedModel(), [(a, k) for _, a, k in calls], SKIPCHECK_POLICY="SKIP_CHECK_DISABLED")
    assert [o.decision for o in run] == ort_exports([(a, k) for _, a, k in calls])
    assert all(o.returned == "float32 []" for o in run)
    assert len(REASONS) == len(calls)

"""OrtModuleRun.records: ORTModule's INFO lines keep the field lists ORT prints under them."""
import copy

from ortlab import models
from ortlab.ortmodule import driver as om
from ortlab.ortmodule.driver import OrtModuleRun


def _run(log):
    return OrtModuleRun(losses=[0.0], log=log, folder=None, prefix="m", fell_back=False, seconds=0.0)


def test_a_field_list_stays_with_its_line_and_other_indented_lines_do_not():
    log = ["orttraining [INFO] - do_export started: ModelInfoForExport class:",
           "            \tInput names:   ['x']",
           "Exported graph: graph(%x : Float(*),",
           "      %w : Float(4)):",
           "orttraining [WARNING] - [export] Filtered logs (0 records suppressed):",
           "    orttraining [INFO] - Exporting the PyTorch model to ONNX...",
           "orttraining [INFO] - done: ExportedModelInfo class:",
           "            \tonnx_graph_input_names: ['x', 'w']"]
    assert _run(log).records() == [log[0], "    Input names:   ['x']", log[6],
                                   "    onnx_graph_input_names: ['x', 'w']"]
    assert _run(log).records(width=20)[1] == "    Input names:   ["


def test_the_real_ortmodule_log_keeps_its_model_info_fields():
    mlp = models.get("mlp")
    run = om.train(copy.deepcopy(mlp), [mlp.example_inputs()], 1, log_level="INFO", save_onnx=False)
    text = "\n".join(run.records())
    # ModelInfoForExport (_io.py) and PostExportProcessedModelInfo (_graph_transition_manager.py)
    # name the forward's inputs; the MLP's forward takes (x, labels)
    assert "ModelInfoForExport class:\n    Export mode:" in text
    assert "    Input names:                      ['x', 'labels']" in text
    assert "    onnx_graph_input_names_user_defined: ['x', 'labels']" in text
    assert "Exported graph" not in text


def test_ortmodule_prepares_gradient_information_for_eval_too_but_builds_no_gradient_graph():
    mlp = models.get("mlp")
    table = om.gradient_info_by_mode(mlp, mlp.example_inputs())
    rows = {row[0]: row for row in table.rows}
    n_params = len(list(mlp.parameters()))
    assert rows["training"][1:4] == ("TRAINING", n_params, n_params)
    # what the GraphTransitionManager PR says evaluation should not get, ORT 1.19.2 still computes
    assert rows["eval"][1:4] == ("EVAL", n_params, n_params)
    assert "optimized_pre_grad" in rows["training"][4] and "optimized_pre_grad" not in rows["eval"][4]


def test_a_field_missing_from_the_log_is_named():
    import pytest

    with pytest.raises(om.OrtModuleError, match="no field 'Export mode' of ModelInfoForExport"):
        om.record_field(["orttraining [INFO] - nothing here"], "ModelInfoForExport", "Export mode")

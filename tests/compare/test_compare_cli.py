"""python -m ortlab compare and ortlab.compare.compare on small models built here: each check's row
against ORT 1.19.2 (its optimized graph, its transformer log, its gradient builder, its outputs, its
arena request), exit codes, and bad input ending in exit code 2 / CompareError."""
import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from compare_cli import cli
from ortlab import compare as cmp
from ortlab.errors import OrtlabError

F = onnx.TensorProto.FLOAT


def _init(name, *shape, seed=0):
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def _model(nodes, inputs, outputs, inits):
    graph = helper.make_graph(nodes, "m", inputs, outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def mlp():
    """Gemm, Relu, Gemm, and a scalar loss."""
    nodes = [helper.make_node("Gemm", ["X", "W1", "B1"], ["h"], name="gemm1"),
             helper.make_node("Relu", ["h"], ["r"], name="relu"),
             helper.make_node("Gemm", ["r", "W2", "B2"], ["Y"], name="gemm2"),
             helper.make_node("ReduceSum", ["Y"], ["loss"], name="loss", keepdims=0)]
    return _model(nodes, [helper.make_tensor_value_info("X", F, [4, 8])],
                  [helper.make_tensor_value_info("Y", F, [4, 3]), helper.make_tensor_value_info("loss", F, [])],
                  [_init("W1", 8, 16), _init("B1", 16, seed=1), _init("W2", 16, 3, seed=2), _init("B2", 3, seed=3)])


def add_layer_norm():
    """LayerNormalization(A + B): ORT's extended level fuses it into SkipLayerNormalization."""
    nodes = [helper.make_node("Add", ["A", "B"], ["s"], name="add"),
             helper.make_node("LayerNormalization", ["s", "gamma", "beta"], ["Y"], name="ln", axis=-1)]
    return _model(nodes, [helper.make_tensor_value_info(n, F, [2, 3, 8]) for n in "AB"],
                  [helper.make_tensor_value_info("Y", F, [2, 3, 8])], [_init("gamma", 8), _init("beta", 8, seed=1)])


def matmul_scale():
    """MatMul(X, W) * 0.5: ORT's extended level folds the scale into a FusedMatMul (alpha 0.5)."""
    scale = numpy_helper.from_array(np.array(0.5, np.float32), "scale")
    nodes = [helper.make_node("MatMul", ["X", "W"], ["m"], name="matmul"),
             helper.make_node("Mul", ["m", "scale"], ["Y"], name="mul"),
             helper.make_node("ReduceSum", ["Y"], ["loss"], name="loss", keepdims=0)]
    return _model(nodes, [helper.make_tensor_value_info("X", F, [3, 4])],
                  [helper.make_tensor_value_info("Y", F, [3, 5]), helper.make_tensor_value_info("loss", F, [])],
                  [_init("W", 4, 5), scale])


def dynamic_batch():
    """MatMul + Add + Tanh on a [batch, 64] input, with a 64x1024 weight: an N x 1024 activation."""
    nodes = [helper.make_node("MatMul", ["X", "W"], ["m"], name="matmul"),
             helper.make_node("Add", ["m", "B"], ["a"], name="add"),
             helper.make_node("Tanh", ["a"], ["Y"], name="tanh")]
    return _model(nodes, [helper.make_tensor_value_info("X", F, ["batch", 64])],
                  [helper.make_tensor_value_info("Y", F, ["batch", 1024])], [_init("W", 64, 1024), _init("B", 1024)])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("models")
    for name, build in (("mlp", mlp), ("add_layer_norm", add_layer_norm), ("matmul_scale", matmul_scale),
                        ("dynamic_batch", dynamic_batch)):
        onnx.save(build(), str(path / f"{name}.onnx"))
    (path / "notes.txt").write_text("not a model\n")
    bad = helper.make_graph([helper.make_node("Frobnicate", ["X"], ["Y"])], "bad",
                            [helper.make_tensor_value_info("X", F, [2])], [helper.make_tensor_value_info("Y", F, [2])])
    onnx.save(helper.make_model(bad, opset_imports=[helper.make_opsetid("", 17)]), str(path / "bad_op.onnx"))
    return path



def _rows(report):
    return {r.check: r for r in report.rows}


def _ort_op_counts(model, level):
    from ortlab.session import optimized_model
    from ortlab.walkthroughs.graph_transformers import op_counts
    return op_counts(optimized_model(model, level, providers=["CPUExecutionProvider"]))


def test_cli_on_mlp_with_gradients_agrees_and_writes_json(folder, tmp_path):
    out = tmp_path / "rows.json"
    done = cli(folder / "mlp.onnx", "--loss", "loss", "--x", "W1,B2", "--json", out)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    data = json.loads(out.read_text())
    rows = {r["check"]: r for r in data["rows"]}
    assert data["exit_code"] == 0 and "X float32[4, 8]" in data["generated"]
    # ORT's own extended graph fuses Gemm + Relu into FusedGemm; the row names the fusion for both sides
    assert _ort_op_counts(mlp(), "extended").get("com.microsoft:FusedGemm", 0) + \
        _ort_op_counts(mlp(), "extended").get("FusedGemm", 0) == 1
    extended = rows["graph: ORT extended vs ortlab level 2"]
    assert extended["status"] == "agree" and "ORT fired: GemmActivationFusion x1" in extended["detail"]
    for x in ("W1", "B2"):
        assert rows[f"gradients of loss: d/d{x}"]["status"] == "agree"
    assert rows["engine output Y"]["status"] == "agree" and rows["engine output loss"]["status"] == "agree"
    assert rows["memory block"]["status"] == "skipped" and "1 MiB" in rows["memory block"]["detail"]


def test_add_layer_norm_fuses_into_skip_layer_norm_on_both_sides(folder):
    report = cmp.compare(folder / "add_layer_norm.onnx")
    rows = _rows(report)
    theirs = _ort_op_counts(add_layer_norm(), "extended")
    assert any(op.endswith("SkipLayerNormalization") for op in theirs)  # ORT itself fuses
    extended = rows["graph: ORT extended vs ortlab level 2"]
    assert extended.status == "agree", extended.detail
    assert "ORT fired: SkipLayerNormFusion x1" in extended.detail
    assert "SkipLayerNormFusion" in extended.detail.split("| ORT fired")[0]  # ortlab fired it too
    assert rows["gradients"].status == "skipped"
    assert report.exit_code == (1 if any(r.status == cmp.DIFFER for r in report.rows) else 0)


def test_add_layer_norm_engine_matches_ort(folder):
    """The engine runs the fused SkipLayerNormalization (what ortlab's level 2 leaves) as ORT does: it
    needs the SkipLayerNormalization kernel that transformers/contrib_ops.py gains alongside this file."""
    report = cmp.compare(folder / "add_layer_norm.onnx")
    assert _rows(report)["engine output Y"].status == "agree"
    assert report.exit_code == 0, report


def test_matmul_scale_fuses_and_a_rule_records_its_declines(folder):
    report = cmp.compare(folder / "matmul_scale.onnx", loss="loss", x=["W"])
    rows = _rows(report)
    assert any(op.endswith("FusedMatMul") for op in _ort_op_counts(matmul_scale(), "extended"))
    extended = rows["graph: ORT extended vs ortlab level 2"]
    assert extended.status == "agree" and "MatMulScaleFusion x1" in extended.detail, extended.detail
    assert rows["gradients of loss: d/dW"].status == "agree"
    # ortlab's level-1 MatMulAddFusion looked at the MatMul and says why it left it (it feeds a Mul)
    assert "MatMulAddFusion: its output does not go to exactly one Add" in rows[
        "graph: ORT basic vs ortlab level 1"].detail
    assert rows["engine output Y"].status == "agree"
    assert report.exit_code == 0, report


def test_dynamic_batch_says_its_size_and_compares_the_memory_block(folder):
    report = cmp.compare(folder / "dynamic_batch.onnx", dims={"batch": 512})
    assert "batch=512" in report.generated and "X float32[512, 64]" in report.generated
    memory = _rows(report)["memory block"]
    # 512 x 1024 float32 activations: 2 MiB each, over the arena's first region, so ORT logs its request
    assert memory.status == "agree", memory.detail
    assert "ORT requested" in memory.detail
    default = cmp.generate_feeds(dynamic_batch())
    assert default[0]["X"].shape == (2, 64) and "batch=2" in default[1]
    assert report.exit_code == 0, report


def test_integer_feeds_stay_valid_indices():
    nodes = [helper.make_node("Gather", ["E", "ids"], ["Y"], name="gather", axis=0)]
    model = _model(nodes, [helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, ["n"])],
                   [helper.make_tensor_value_info("Y", F, None)], [_init("E", 2, 4)])
    feeds, note = cmp.generate_feeds(model, {"n": 64})
    assert set(np.unique(feeds["ids"])) <= {0, 1} and "n=64" in note
    assert cmp.compare(model, dims={"n": 64}).exit_code == 0


def test_a_known_difference_from_ort_exits_non_zero():
    """Relu -> Dropout(ratio 0.3, training_mode a constant False) -> Relu: ortlab's EliminateDropout
    removes the Dropout, ORT 1.19.2 keeps it (the difference tests/transformers/test_transformers.py pins)."""
    from ortlab.walkthroughs.graph_transformers import elimination

    model = elimination("dropout")
    assert _ort_op_counts(model, "basic").get("Dropout") == 1  # ORT's own graph keeps it
    report = cmp.compare(model)
    basic = _rows(report)["graph: ORT basic vs ortlab level 1"]
    assert basic.status == cmp.DIFFER and "Dropout 0 vs 1" in basic.detail, basic.detail
    assert "ortlab fired: EliminateDropout x1" in basic.detail
    assert _rows(report)["engine output y"].status == "agree"  # the outputs still agree
    assert report.exit_code == 1


def test_a_disagreement_exits_non_zero(folder, monkeypatch):
    """ortlab's engine made wrong on purpose (every output + 0.01): the engine rows must differ."""
    from ortlab.engine import InferenceSession

    real_run = InferenceSession.run
    monkeypatch.setattr(InferenceSession, "run",
                        lambda self, names, feeds, run_options=None: [o + np.float32(0.01) for o in
                                                                      real_run(self, names, feeds, run_options)])
    report = cmp.compare(folder / "matmul_scale.onnx")
    row = _rows(report)["engine output Y"]
    assert row.status == cmp.DIFFER and "0.01" in row.detail
    assert report.exit_code == 1
    assert "DIFFER" in repr(report)


@pytest.mark.parametrize("args, words", [
    (("missing.onnx",), "no such model file"),
    (("notes.txt",), "is not a readable ONNX model"),
    (("mlp.onnx", "--loss", "loss", "--x", "X"), "'X' is not an initializer"),
    (("mlp.onnx", "--loss", "h", "--x", "W1"), "'h' is not an output"),
    (("mlp.onnx", "--loss", "loss"), "needs both"),
    (("mlp.onnx", "--dim", "batch"), "NAME=N"),
    (("bad_op.onnx",), "ORT 1.19.2 cannot load this model"),
    ((".",), "a folder, not a model file"),
])
def test_bad_input_is_one_line_and_exit_code_2(folder, args, words, capsys):
    assert cmp.main([str(folder / args[0]), *args[1:]]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


@pytest.mark.parametrize("kwargs, words", [
    ({"loss": "loss", "x": ["X"]}, "'X' is not an initializer"),
    ({"loss": "r", "x": "W1"}, "'r' is not an output"),
    ({"loss": "loss", "x": [3]}, "must hold value names"),
])
def test_the_function_raises_compare_error(kwargs, words):
    with pytest.raises(OrtlabError, match=words):
        cmp.compare(mlp(), **kwargs)
    with pytest.raises(cmp.CompareError, match="onnx.ModelProto or a path"):
        cmp.compare(42)
    with pytest.raises(cmp.CompareError, match=r"exactly the graph inputs \['X'\]"):
        cmp.compare(mlp(), feeds={"x": np.zeros((4, 8), np.float32)})


def test_cli_bad_file_is_one_line_no_traceback(folder):
    done = cli(folder / "notes.txt")
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert cli().returncode == 2  # no model named: argparse's usage, exit code 2


def test_statuses_and_differences_views_of_a_report():
    """statuses() keeps every check with its status only; differences() only the differing rows, with how."""
    from ortlab.compare import DIFFER, Report, Row

    report = Report([Row("graph: a", "agree", "same op counts"), Row("graph: b", DIFFER, "Conv 2 vs 1"),
                     Row("engine output y", "agree", "max |engine - ORT| = 1e-07")], "feeds")
    assert report.statuses().rows == [("graph: a", "agree"), ("graph: b", DIFFER), ("engine output y", "agree")]
    assert report.differences().rows == [("graph: b", "Conv 2 vs 1")]
    assert Report([Row("x", "agree", "")], "").differences().rows == []

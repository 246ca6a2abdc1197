"""What `python -m ortlab compare` accepts and refuses before it runs anything: --dim names checked
against the model's dynamic dimensions, feed sizes checked up front, --seed and --json checked first,
models with no nodes accepted, files that are not models refused. Bad input is exit code 2 and one
line on stderr, never a traceback; every CLI run is its own process, stopped by a timeout."""
import time

import numpy as np
import onnx
import pytest
from onnx import helper

from compare_cli import cli, one_line_exit_2
from ortlab import compare as cmp

F, I64 = onnx.TensorProto.FLOAT, onnx.TensorProto.INT64
vi = helper.make_tensor_value_info


def _model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "m", inputs, outputs, list(inits))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def relu(shape):
    return _model([helper.make_node("Relu", ["X"], ["Y"])], [vi("X", F, shape)], [vi("Y", F, shape)])


def identity_graph():
    """No nodes at all: the graph's output is its input (valid ONNX, and ORT runs it)."""
    return _model([], [vi("X", F, [2, 3])], [vi("X", F, [2, 3])])


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("models")
    for name, model in (("dyn", relu(["batch", 3])), ("static", relu([2, 3])), ("identity", identity_graph()),
                        ("unnamed", relu([None, 3]))):
        onnx.save(model, str(path / f"{name}.onnx"))
    (path / "empty.onnx").write_bytes(b"")
    return path




# --- --dim names ---------------------------------------------------------------------------------

def test_an_unknown_dim_name_is_bad_input_naming_the_dynamic_dims(folder):
    err = one_line_exit_2(cli(folder / "dyn.onnx", "--dim", "seq=4"))
    assert "'seq'" in err and "batch" in err


def test_a_dim_on_a_static_model_is_bad_input(folder):
    err = one_line_exit_2(cli(folder / "static.onnx", "--dim", "batch=3"))
    assert "'batch'" in err and "no dynamic dimension" in err


def test_an_unnamed_dynamic_dim_is_named_by_its_input_and_axis(folder):
    feeds, note = cmp.generate_feeds(relu([None, 3]), {"X[0]": 5})
    assert feeds["X"].shape == (5, 3) and "X[0]=5" in note
    with pytest.raises(cmp.CompareError, match=r"X\[0\]"):
        cmp.compare(folder / "unnamed.onnx", dims={"N": 5})


def test_the_function_refuses_unknown_dims_too():
    with pytest.raises(cmp.CompareError, match="'seq'.*batch"):
        cmp.compare(relu(["batch", 3]), dims={"seq": 4})
    with pytest.raises(cmp.CompareError, match="dims must be a dict"):
        cmp.compare(relu(["batch", 3]), dims=[("batch", 4)])
    with pytest.raises(cmp.CompareError, match="a size of 0 or more"):
        cmp.compare(relu(["batch", 3]), dims={"batch": -1})


@pytest.mark.parametrize("args, words", [
    (("--dim", "batch=3", "--dim", "batch=4"), "twice"),
    (("--dim", "=3"), "NAME=N"),
    (("--dim", "batch="), "NAME=N"),
    (("--dim", "batch=-1"), "NAME=N"),
    (("--dim", "batch=2.5"), "NAME=N"),
    (("--seed", "-1"), "seed"),
    (("--json", ""), "--json"),
])
def test_malformed_options_are_one_line(folder, args, words, capsys):
    assert cmp.main([str(folder / "dyn.onnx"), *args]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1, err


# --- sizes, seed, --json -------------------------------------------------------------------------

def test_a_huge_dim_names_the_input_and_its_bytes(folder):
    err = one_line_exit_2(cli(folder / "dyn.onnx", "--dim", "batch=100000000000"))
    assert "'X'" in err and "1,200,000,000,000 bytes" in err


def test_a_huge_static_input_is_refused_up_front():
    with pytest.raises(cmp.CompareError, match=r"'X' float32\[100000, 100000\].*40,000,000,000 bytes.*fixed"):
        cmp.generate_feeds(relu([100000, 100000]))


def test_a_negative_seed_is_bad_input(folder):
    err = one_line_exit_2(cli(folder / "static.onnx", "--seed", "-1"))
    assert "seed" in err and "-1" in err
    with pytest.raises(cmp.CompareError, match="seed"):
        cmp.compare(relu([2, 3]), seed=1.5)


@pytest.mark.parametrize("target", ["/proc/nope/x.json", "{folder}", "{folder}/missing_dir/x.json"])
def test_an_unwritable_json_path_is_refused_before_the_run(folder, target):
    start = time.monotonic()
    err = one_line_exit_2(cli(folder / "static.onnx", "--json", target.format(folder=folder)))
    assert "--json" in err
    assert time.monotonic() - start < 60


# --- models --------------------------------------------------------------------------------------

def test_a_model_with_no_nodes_is_compared(folder):
    done = cli(folder / "identity.onnx")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "engine output X" in done.stdout
    report = cmp.compare(identity_graph())
    assert {r.check: r.status for r in report.rows}["engine output X"] == cmp.AGREE


def test_an_empty_file_is_bad_input(folder):
    err = one_line_exit_2(cli(folder / "empty.onnx"))
    assert "empty.onnx" in err and "is it an ONNX model" in err


def test_zero_size_dims_are_compared(folder):
    report = cmp.compare(folder / "dyn.onnx", dims={"batch": 0})
    assert "X float32[0, 3]" in report.generated
    assert {r.check: r.status for r in report.rows}["engine output Y"] == cmp.AGREE
    assert np.prod(cmp.generate_feeds(relu(["batch", 3]), {"batch": 0})[0]["X"].shape) == 0


def test_a_path_that_is_not_a_plain_file_is_named(tmp_path, capsys):
    import os

    fifo = tmp_path / "pipe.onnx"
    os.mkfifo(fifo)
    assert cmp.main([str(fifo)]) == 2
    err = capsys.readouterr().err
    assert "not a plain file" in err and len(err.strip().splitlines()) == 1, err
    assert cmp.main([""]) == 2
    err = capsys.readouterr().err
    assert "no model path" in err and len(err.strip().splitlines()) == 1, err


def test_an_optional_input_is_named_in_words():
    opt = helper.make_value_info("O", helper.make_optional_type_proto(helper.make_tensor_type_proto(F, [2])))
    model = _model([helper.make_node("OptionalGetElement", ["O"], ["Y"])], [opt], [vi("Y", F, [2])], opset=18)
    with pytest.raises(cmp.CompareError, match="input 'O' is an optional, not a tensor"):
        cmp.generate_feeds(model)


@pytest.mark.parametrize("args, words", [
    (("{folder}/dyn.onnx", "--seed", "abc"), "--seed: invalid int value: 'abc'"),
    ((), "the following arguments are required: model"),
    (("{folder}/dyn.onnx", "--frob"), "unrecognized arguments: --frob"),
])
def test_argument_errors_are_one_line_too(folder, args, words):
    err = one_line_exit_2(cli(*(a.format(folder=folder) for a in args)))
    assert words in err and "--help" in err

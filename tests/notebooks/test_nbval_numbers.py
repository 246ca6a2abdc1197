"""The notebook comparison: a decimal number may move by one unit in its last printed digit, nothing else."""
import nbformat
import pytest

from tests.nbval_numbers import close_in_last_digit, snap_numbers


@pytest.mark.parametrize("test, ref, same", [
    ("0.9094", "0.9093", True), ("0.9092", "0.9093", True), ("0.9095", "0.9093", False),
    ("1.240", "1.238", False), ("1.818", "1.584", False), ("-0.000", "0.000", True),
    ("2.0e-07", "2.1e-07", True), ("2.0e-07", "2.0e-06", False), ("0.91", "0.909", False),
    ("10.00", "9.99", True), ("1.0e+00", "1.0", False), ("5e593", "5e594", False),
])
def test_one_unit_in_the_last_digit(test, ref, same):
    assert close_in_last_digit(test, ref) is same


def test_snap_keeps_integers_and_text_exact():
    ref = "History(80 steps, loss 2.8938 -> 0.9093)"
    assert snap_numbers("History(80 steps, loss 2.8938 -> 0.9094)", ref) == ref
    assert snap_numbers("History(81 steps, loss 2.8938 -> 0.9094)", ref) != ref  # integers exact
    assert snap_numbers("History(80 steps, loss 2.8938 -> 0.9100)", ref) != ref  # too far
    assert snap_numbers("Histories(80 steps, loss 2.8938 -> 0.9094)", ref) != ref  # text exact
    table = "a  0.513  0.267\nb  0.638  0.066"
    assert snap_numbers("a  0.514  0.266\nb  0.638  0.067", table) == table


def test_installed_into_nbvals_comparison():
    from nbval.plugin import IPyNbCell

    from tests.nbval_numbers import install
    install()
    assert IPyNbCell.compare_outputs.snaps_numbers

    class Cell:  # the attributes nbval's compare_outputs reads
        colors = type("C", (), {k: "" for k in ("FAIL", "OKBLUE", "ENDC", "OKGREEN")})()
        parent = type("P", (), {"skip_compare": ("metadata", "execution_count", "name", "output_type"),
                                "sanitize_patterns": {}})()
        sanitize = IPyNbCell.sanitize
        format_output_compare = lambda self, *a: None

    def stream(text):
        return nbformat.from_dict({"output_type": "stream", "name": "stdout", "text": text})

    def result(text):
        return nbformat.from_dict({"output_type": "execute_result", "execution_count": 1, "metadata": {},
                                   "data": {"text/plain": text}})

    compare = IPyNbCell.compare_outputs
    assert compare(Cell(), [stream("loss 0.9094\n"), result("x 1.001")], [stream("loss 0.9093\n"), result("x 1.000")])
    assert not compare(Cell(), [stream("loss 0.9104\n")], [stream("loss 0.9093\n")])
    assert not compare(Cell(), [result("7 nodes")], [result("8 nodes")])


def test_images_are_left_alone():
    from tests.nbval_numbers import _snap_output
    test = {"output_type": "display_data", "data": {"image/png": "iVBOR5e593x", "text/plain": "loss 0.9094"}}
    ref = {"output_type": "display_data", "data": {"image/png": "iVBOR5e594x", "text/plain": "loss 0.9093"}}
    snapped = _snap_output(test, ref)
    assert snapped["data"] == {"image/png": "iVBOR5e593x", "text/plain": "loss 0.9093"}


def test_numbers_inside_versions_and_words_are_not_numbers():
    assert snap_numbers("onnxruntime 1.19.2", "onnxruntime 1.18.2") == "onnxruntime 1.19.2"
    assert snap_numbers("id A5e5B", "id A6e5B") == "id A5e5B"
    assert snap_numbers("by 1.57x", "by 1.56x") == "by 1.56x"  # a unit suffix is still a number

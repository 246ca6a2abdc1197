"""Grading from any folder by a lab's name, and a stub's message said once."""
import pytest

from ortlab.labs import checks
from ortlab.labs.grade import REPO, GradeError, lab_path, load_lab


@pytest.mark.parametrize("given", ["lab01", "lab01_compose_onnx_model", "lab01_compose_onnx_model.ipynb"])
def test_a_lab_is_found_by_its_name_from_any_folder(given, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # not the checkout: as from a notebook's `!` cell elsewhere
    assert lab_path(given) == REPO / "labs" / "lab01_compose_onnx_model.ipynb"


def test_a_path_is_taken_as_given_and_a_local_notebook_first(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "lab01_mine.ipynb").write_text("{}")
    assert lab_path("lab01") == tmp_path / "lab01_mine.ipynb"      # the learner's copy beside them wins
    assert lab_path("sub/lab01.ipynb").as_posix() == "sub/lab01.ipynb"


def test_an_unknown_name_lists_the_labs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(GradeError, match=r"lab99: no such file; give a lab's path, or its name \(lab01, lab02"):
        load_lab(lab_path("lab99"))


def test_a_stub_says_not_done_without_repeating_the_exercise():
    def stub():
        raise NotImplementedError("exercise 'transpose_matmul' is not done yet: replace this line with your solution")
    shown = str(checks.evaluate("transpose_matmul", stub))
    assert shown == "[NOT DONE] exercise 'transpose_matmul': not done yet: replace this line with your solution"
    assert str(checks.evaluate("f", lambda: (_ for _ in ()).throw(NotImplementedError()))) == \
        "[NOT DONE] exercise 'f': not implemented yet"

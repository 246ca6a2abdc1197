"""ortlab.patch: a scoped change that always puts back what was there, or removes what was not."""
import os
import sys
import types

import pytest

from ortlab.patch import environment, patched


def test_an_attribute_is_restored_even_when_the_block_raises():
    target = types.SimpleNamespace(f=1)
    with pytest.raises(RuntimeError), patched(target, "f", 2):
        assert target.f == 2
        raise RuntimeError("boom")
    assert target.f == 1


def test_an_attribute_that_was_absent_is_removed_again():
    target = types.SimpleNamespace()
    with patched(target, "g", 3):
        assert target.g == 3
    assert not hasattr(target, "g")


def test_a_mapping_entry_such_as_a_module_is_put_back_or_removed():
    name = "ortlab_test_patch_module"
    with patched(sys.modules, name, types.ModuleType(name)):
        assert name in sys.modules
    assert name not in sys.modules
    with patched(sys.modules, "os", "not os"):
        assert sys.modules["os"] == "not os"
    assert sys.modules["os"] is os


def test_environment_sets_and_unsets_then_restores(monkeypatch):
    monkeypatch.setenv("ORTLAB_PATCH_A", "before")
    monkeypatch.delenv("ORTLAB_PATCH_B", raising=False)
    with environment({"ORTLAB_PATCH_A": None, "ORTLAB_PATCH_B": 7}):
        assert "ORTLAB_PATCH_A" not in os.environ and os.environ["ORTLAB_PATCH_B"] == "7"
    assert os.environ["ORTLAB_PATCH_A"] == "before" and "ORTLAB_PATCH_B" not in os.environ


def test_nested_patches_of_the_same_name_unwind_in_order():
    target = types.SimpleNamespace(f="a")
    with patched(target, "f", "b"):
        with patched(target, "f", "c"):
            assert target.f == "c"
        assert target.f == "b"
    assert target.f == "a"

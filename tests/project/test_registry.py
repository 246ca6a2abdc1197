"""ortlab.registry.Registry and ortlab.onnx_defs: the table every registry uses, and the op keys."""
from pathlib import Path

import numpy as np
import pytest

from ortlab.onnx_defs import domain_of, node_label, one_node_model, op_key, op_name, opset_of
from ortlab.registry import NotRegisteredError, Registry, RegistryError
from ortlab.session import run_model
from repo_paths import TESTS


def _kernel_a():
    return "a"


def _kernel_b():
    return "b"


def test_op_keys_fold_the_onnx_domain_and_print_one_way():
    assert op_key("Add", "ai.onnx") == op_key("Add", None) == op_key("Add") == ("Add", "")
    assert domain_of("com.microsoft") == "com.microsoft"
    assert op_name("Add", "ai.onnx") == "Add" and op_name("Gelu", "com.microsoft") == "com.microsoft:Gelu"
    assert opset_of({"ai.onnx": 15}) == 15 and opset_of({"": 17, "com.microsoft": 1}, "com.microsoft") == 1


def test_registry_lookup_normalises_keys_and_lists_what_is_registered_on_a_miss():
    r = Registry("kernel", hint="Register one with @register_kernel.")
    r.register(("Gelu", "com.microsoft"), _kernel_a)
    r.register(("Softmax", "ai.onnx"), _kernel_b)
    assert r.lookup("Softmax") is _kernel_b and r["Gelu", "com.microsoft"] is _kernel_a
    assert ("Softmax", None) in r and "Gelu" not in r and r.get("Gelu") is None
    with pytest.raises(NotRegisteredError) as caught:
        r.lookup("Gelu")
    message = str(caught.value)
    assert "did you mean com.microsoft:Gelu?" in message and "@register_kernel" in message
    assert message.endswith("Registered: Softmax, com.microsoft:Gelu")
    with pytest.raises(KeyError):  # a Mapping's miss is still a KeyError
        r["Softmx"]


def test_error_policy_refuses_a_second_definition_unless_override():
    r = Registry("kernel")
    r.register("Relu", _kernel_a)
    with pytest.raises(RegistryError, match="Relu is already registered .*override=True"):
        r.register("Relu", _kernel_b)
    assert r["Relu"] is _kernel_a
    r.register("Relu", _kernel_b, override=True)
    assert r["Relu"] is _kernel_b


def test_a_rerun_cell_replaces_its_own_definition_under_the_error_policy():
    r = Registry("kernel")
    first = type("MyKernel", (), {"__module__": "__main__"})
    again = type("MyKernel", (), {"__module__": "__main__"})  # the same cell run twice
    r.register("Relu", first)
    r.register("Relu", again)
    assert r["Relu"] is again


def test_replace_policy_keeps_the_position_of_a_replaced_entry():
    r = Registry("transformer", duplicates="replace", op_keys=False)
    for name in ("A", "B", "C"):
        r.register(name, name.lower())
    r.register("A", "new")
    assert list(r) == ["A", "B", "C"] and r["A"] == "new"


def test_using_restores_exactly_what_was_there_even_after_an_exception():
    r = Registry("gradient builder", duplicates="replace")
    r.register("Sqrt", _kernel_a)
    with pytest.raises(ZeroDivisionError):
        with r.using("Sqrt", _kernel_b):
            assert r["Sqrt"] is _kernel_b
            1 / 0
    assert r["Sqrt"] is _kernel_a
    with r.using("Exp", _kernel_b):
        assert "Exp" in r
    assert "Exp" not in r and r.unregister("Sqrt") is _kernel_a and len(r) == 0


def test_a_registry_with_its_own_error_and_wording():
    class NoCheck(Exception):
        pass

    r = Registry("check", op_keys=False, error=NoCheck, miss=lambda reg, key, where: f"no check {key!r}")
    with pytest.raises(NoCheck, match="no check 'x'"):
        r.lookup("x")
    with pytest.raises(RegistryError, match="'error' or 'replace'"):
        Registry("bad", duplicates="sometimes")


def test_one_node_model_runs_in_ort_and_omits_none_inputs():
    x = np.array([[1.0, -2.0, 3.0]], dtype=np.float32)
    model = one_node_model("Softmax", [x], {"axis": -1})
    assert model.ir_version == 8 and [o.name for o in model.graph.output] == ["y0"]
    out = run_model(model, {"x0": x})["y0"]
    e = np.exp(x - x.max())
    np.testing.assert_allclose(out, e / e.sum(), rtol=1e-6)
    clip = one_node_model("Clip", [x, None, np.array(0.5, dtype=np.float32)])
    assert list(clip.graph.node[0].input) == ["x0", "", "x2"]
    np.testing.assert_array_equal(run_model(clip, {"x0": x, "x2": np.array(0.5, dtype=np.float32)})["y0"],
                                  np.minimum(x, 0.5))
    assert node_label(clip.graph.node[0]) == "Clip(y0)"


# The guard: an entry registered in one of ortlab's registries without a test fails here.
def _test_sources():
    here = Path(__file__).resolve()
    return "\n".join(p.read_text() for p in sorted(TESTS.rglob("test_*.py")) if p != here)


def _untested(names):
    import re

    text = _test_sources()
    return sorted(n for n in names if not re.search(rf"\b{re.escape(n)}\b", text))


def test_every_registered_transformer_rule_and_doctor_check_is_named_by_a_test():
    from ortlab.profiling.graph_doctor import CHECKS
    from ortlab.transformers.registry import RULES, TRANSFORMERS

    assert not _untested(TRANSFORMERS), "transformers with no test"
    assert not _untested(RULES), "rewrite rules with no test"
    assert not _untested(CHECKS), "graph-doctor checks with no test"


def test_every_reference_op_is_named_by_a_test():
    from ortlab.ops.contrib_ops import CONTRIB_OPS

    assert len(CONTRIB_OPS) >= 6 and not _untested(op for op, _ in CONTRIB_OPS), "reference ops with no test"


def test_every_registered_kernel_is_named_by_a_test():
    from ortlab.triton_kernels import KERNELS

    assert not _untested(op for op, _ in KERNELS), "kernels with no test"


def test_the_kernels_registry_and_bench_need_neither_onnx_nor_onnxruntime():
    """bench runs on a GPU image that has torch and Triton only (CONTRIBUTING.md, "On a GPU machine")."""
    import subprocess
    import sys

    code = ("import sys, ortlab.benchmarks.kernels; from ortlab.triton_kernels import KERNELS; "
            "assert len(KERNELS) > 0; print(sorted(m for m in ('onnx', 'onnxruntime') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_a_key_of_the_wrong_type_is_refused_with_what_a_key_is():
    ops, names = Registry("kernel"), Registry("check", op_keys=False)
    for bad in (42, ["Relu"], ("Relu", 1), None):
        with pytest.raises(RegistryError, match="keyed by an op type"):
            ops.lookup(bad)
        assert bad not in ops
    with pytest.raises(RegistryError, match="keyed by name"):
        names.register(["x"], 1)


def test_every_engine_kernel_and_execution_provider_is_named_by_a_test():
    from ortlab.engine import EXECUTION_PROVIDERS, KERNEL_REGISTRIES

    ops = [op for registry in KERNEL_REGISTRIES.values() for op, _ in registry.kernels]
    assert not _untested(ops), "engine kernels with no test"
    assert not _untested(EXECUTION_PROVIDERS), "execution providers with no test"

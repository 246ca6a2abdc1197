"""Gradient definitions in ORT's Python format: traced from ortlab builders, turned back into
builders, and registered into ORT's C++ gradient builder (in a fresh process, since ORT keeps
a registration for the life of the process)."""
import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import ortcheck
from gradient_cases import CASES
from ortlab.gradients import (OrtGradientError, build_gradient_graph, builder_from_definition,
                              gradient_definition, using_gradient)
from repo_paths import TESTS

# Builders whose definition does not depend on static shapes or attributes of the node, so a
# traced definition holds for every node of the op (as an ORT definition must).
TRACEABLE = ["Add-broadcast", "Sub-broadcast", "Mul-broadcast", "Div-broadcast", "Pow", "Sqrt", "Erf",
             "Where-broadcast", "Gelu", "Sigmoid", "Gemm", "Concat", "Slice", "Gather-repeats", "Cos", "Softsign"]
# Builders that need static types or ranks (or the opset): tracing says so instead of guessing.
NOT_TRACEABLE = ["MatMul-2d", "Cast", "Softmax", "ReduceMean"]
BY_ID = {c.id: c for c in CASES}


def trace(case):
    return gradient_definition(case.op, case.op, case.domain, num_inputs=len(case.inputs),
                               num_outputs=case.outputs, attributes=case.attrs)


@pytest.mark.parametrize("case_id", TRACEABLE)
def test_a_traced_definition_turned_back_into_a_builder_gives_torchs_gradients(case_id):
    case = BY_ID[case_id]
    definition = trace(case)
    assert all(isinstance(n[1], list) and isinstance(n[2], list) for n in definition)
    assert any(o.startswith("GI(") for n in definition for o in n[2])
    with using_gradient(case.op, builder_from_definition(definition), case.domain):
        model = build_gradient_graph(case.model(), case.x_names, "loss")
    outputs = dict(zip([o.name for o in model.graph.output], ortcheck.run(model, case.feeds)))
    expected = case.torch_gradients()
    for x in case.x_names:
        np.testing.assert_allclose(outputs[f"{x}_grad"], expected[x], rtol=1e-4, atol=1e-5, err_msg=x)


@pytest.mark.parametrize("case_id", NOT_TRACEABLE)
def test_builders_that_need_static_information_refuse_to_trace(case_id):
    with pytest.raises(Exception) as info:
        trace(BY_ID[case_id])
    assert "rank" in str(info.value) or "static" in str(info.value)


def test_the_override_is_undone_after_the_with_block():
    from ortlab.gradients import get_gradient_builder
    before = get_gradient_builder("Sqrt")
    with using_gradient("Sqrt", lambda b: [b.GO(0)]):
        assert get_gradient_builder("Sqrt") is not before
    assert get_gradient_builder("Sqrt") is before


@pytest.mark.parametrize("definition, words", [
    ([], "non-empty list"),
    ([("Mul", "GO(0)", ["GI(0)"])], "lists of strings"),
    ([("Mul", ["GO(0)", "sig"], ["GI(0)"])], "'sig', which is neither"),
    ([("Sigmoid", ["I(0)"], ["O(0)"])], "writes 'O(0)'"),
    ([("Sigmoid", ["I(0)"], ["sig"])], "no node writes a gradient"),
    ([("Mul", ["GO(0)"])], "expected (op_type, inputs, outputs"),
])
def test_a_malformed_definition_is_explained(definition, words):
    with pytest.raises(OrtGradientError) as info:
        builder_from_definition(definition)
    assert words in str(info.value)


PROBE = textwrap.dedent("""
    import json, sys
    import numpy as np
    from onnx import TensorProto, helper
    from ortlab import OrtlabError
    from ortlab.gradients import check_gradient, ort_gradient_graph, register_ort_gradient
    import ortcheck

    def model(op, shapes):
        names = [f"x{i}" for i in range(len(shapes))]
        g = helper.make_graph(
            [helper.make_node(op, names, ["y"]), helper.make_node("ReduceSum", ["y"], ["loss"], keepdims=0)], op,
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in zip(names, shapes)],
            [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])])
        m = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
        m.ir_version = 8
        return m, names

    rng = np.random.default_rng(0)
    report = {}
    for op, shapes, definition in [
            ("Softsign", [[3, 4]], "Softsign"),
            ("PRelu", [[2, 3, 4], [3, 1]], [
                ("Constant", [], ["zero"], {"value": {"value": 0.0, "dtype": "IElemType(0)", "is_tensor": True}}),
                ("Greater", ["I(0)", "zero"], ["pos"]),
                ("Constant", [], ["one"], {"value": {"value": 1.0, "dtype": "IElemType(0)", "is_tensor": True}}),
                ("Where", ["pos", "one", "I(1)"], ["slope"]),
                ("Mul", ["GO(0)", "slope"], ["GI(0)"]),
                ("Where", ["pos", "zero", "I(0)"], ["negx"]),
                ("Mul", ["GO(0)", "negx"], ["full"]),
                ("Shape", ["I(1)"], ["s_shape"]),
                ("Shape", ["full"], ["f_shape"]),
                (("BroadcastGradientArgs", "com.microsoft"), ["s_shape", "f_shape"], ["axes", "unused"]),
                ("ReduceSum", ["full", "axes"], ["summed"], {"keepdims": {"value": 1, "dtype": "int"},
                                                            "noop_with_empty_axes": {"value": 1, "dtype": "int"}}),
                ("Reshape", ["summed", "s_shape"], ["GI(1)"])])]:
        m, names = model(op, shapes)
        feeds = {n: rng.standard_normal(s).astype(np.float32) for n, s in zip(names, shapes)}
        try:
            ort_gradient_graph(m, names, "loss")
            lacked = False
        except OrtlabError:
            lacked = True
        builder = definition if isinstance(definition, list) else None
        if builder is None:
            from ortlab.gradients import get_gradient_builder
            builder = get_gradient_builder(definition)
        register_ort_gradient(op, builder, num_inputs=len(shapes))
        register_ort_gradient(op, builder, num_inputs=len(shapes))  # the same again: accepted
        g = ort_gradient_graph(m, names, "loss")
        grads = dict(zip([o.name for o in g.graph.output], ortcheck.run(g, feeds)))
        try:
            register_ort_gradient(op, [("Neg", ["GO(0)"], ["GI(0)"])], num_inputs=len(shapes))
            refused = ""
        except OrtlabError as exc:
            refused = str(exc)
        report[op] = {"lacked": lacked, "ops": [n.op_type for n in g.graph.node],
                      "passed": check_gradient(m, names, "loss", feeds, gradient_model=g).passed,
                      "feeds": {k: v.tolist() for k, v in feeds.items()},
                      "grads": {k: v.tolist() for k, v in grads.items()}, "refused": refused}
    print(json.dumps(report))
""")


@pytest.fixture(scope="module")
def registered():
    run = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300,
                         cwd=TESTS)  # where ortcheck and gradient_cases are
    assert run.returncode == 0, run.stderr[-3000:]
    return json.loads(run.stdout.strip().splitlines()[-1])


def test_ort_lacks_the_ops_until_a_python_definition_is_registered(registered):
    assert registered["Softsign"]["lacked"] and registered["PRelu"]["lacked"]
    assert {"Abs", "Div"} <= set(registered["Softsign"]["ops"])  # the traced ortlab builder's nodes
    assert "BroadcastGradientArgs" in registered["PRelu"]["ops"]


def test_orts_graph_with_the_registered_gradient_passes_the_checker_and_equals_torch(registered):
    import torch
    softsign, prelu = registered["Softsign"], registered["PRelu"]
    assert softsign["passed"] and prelu["passed"]
    x = torch.tensor(softsign["feeds"]["x0"], requires_grad=True)
    torch.nn.functional.softsign(x).sum().backward()
    np.testing.assert_allclose(softsign["grads"]["x0_grad"], x.grad.numpy(), rtol=1e-5, atol=1e-6)
    x, s = (torch.tensor(prelu["feeds"][k], requires_grad=True) for k in ("x0", "x1"))
    torch.where(x > 0, x, x * s).sum().backward()
    np.testing.assert_allclose(prelu["grads"]["x0_grad"], x.grad.numpy(), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(prelu["grads"]["x1_grad"], s.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_a_second_different_registration_is_refused_with_a_way_out(registered):
    for op in ("Softsign", "PRelu"):
        assert "restart the kernel" in registered[op]["refused"]

"""Models ORT 1.19.2 refuses to load, refused by ortlab's Graph too (Graph.resolve, as ORT's Graph::Resolve).

Each case is first refused by a real onnxruntime.InferenceSession (its message checked), then by
ortlab with an OrtlabError saying what is wrong and that ORT refuses it; the valid neighbours
(nodes without names, a contrib op of the right arity) load in both.
Rules: two nodes of one name (graph.cc, VerifyNoDuplicateName: names are optional, so any number of
unnamed nodes is fine); a com.microsoft op with more or fewer inputs or outputs than its schema
allows (graph.cc, VerifyNodeAndOpMatch against contrib_defs.cc / training_op_defs.cc).
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlab.errors import OrtlabError
from ortlab.ir import Graph
from ortlab.ir.load_rules import MS_OP_ARITY
from ortlab.onnx_defs import MS_DOMAIN, make_model

F = TensorProto.FLOAT
h = helper.make_node


def model(nodes, inputs, outputs, ms=False, inits=()):
    graph = helper.make_graph(nodes, "case", [helper.make_tensor_value_info(n, F, s) for n, s in inputs],
                              [helper.make_tensor_value_info(n, F, None) for n in outputs],
                              [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in inits])
    return make_model(graph, opset=17, domains=(MS_DOMAIN,) if ms else ())


def ort_refusal(m):
    """ORT's message when it refuses to load the model, None when it loads."""
    try:
        ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
    except Exception as exc:
        return str(exc)
    return None


def ortlab_load(m):
    graph = Graph.from_model(m)
    graph.resolve()
    return graph


def chain(names):
    """Relu -> Neg -> ... one node per name, x -> y."""
    ops = ["Relu", "Neg", "Abs", "Neg"]
    values = ["x"] + [f"v{k}" for k in range(len(names) - 1)] + ["y"]
    nodes = [h(ops[k % len(ops)], [values[k]], [values[k + 1]], name=n) for k, n in enumerate(names)]
    return model(nodes, [("x", [2])], ["y"])


@pytest.mark.parametrize("names", [["n", "n"], ["n", "m", "n"], ["", "n", "", "n"]])
def test_two_nodes_of_one_name_are_refused_as_ort_refuses_them(names):
    m = chain(names)
    assert "two nodes with same node name (n)" in ort_refusal(m)
    with pytest.raises(OrtlabError, match=r"(?s)two nodes are named 'n'.*ORT refuses") as info:
        ortlab_load(m)
    assert "rename" in str(info.value)


@pytest.mark.parametrize("names", [["", ""], ["", "", ""], ["a", "", "b", ""], ["a", "b"]])
def test_unnamed_nodes_and_distinct_names_load_in_both(names):
    m = chain(names)
    assert ort_refusal(m) is None
    ortlab_load(m)


def ms_node_model(op, n_in, n_out):
    """One com.microsoft node of n_in float [2, 2] inputs and n_out outputs."""
    ins, outs = [f"i{k}" for k in range(n_in)], [f"o{k}" for k in range(n_out)]
    return model([h(op, ins, outs, domain=MS_DOMAIN)], [(n, [2, 2]) for n in ins], outs, ms=True)


ARITY_CASES = [(op, n_in, "input") for op, ((lo, hi), _) in MS_OP_ARITY.items()
               for n_in in (lo - 1, hi + 1) if n_in >= 0]


@pytest.mark.parametrize("op, n_in, what", ARITY_CASES, ids=[f"{c[0]}-{c[1]}-inputs" for c in ARITY_CASES])
def test_a_contrib_op_with_a_wrong_number_of_inputs_is_refused_as_ort_refuses_it(op, n_in, what):
    (lo, hi), _ = MS_OP_ARITY[op]
    m = ms_node_model(op, n_in, 1)
    assert f"has input size {n_in} not in range [min={lo}, max={hi}]" in ort_refusal(m)
    with pytest.raises(OrtlabError, match=rf"(?s){op}.*{n_in} inputs.*ORT refuses"):
        ortlab_load(m)


OUTPUT_CASES = [(op, lo_in, hi_out + 1) for op, ((lo_in, _), (_, hi_out)) in MS_OP_ARITY.items()]


@pytest.mark.parametrize("op, n_in, n_out", OUTPUT_CASES, ids=[f"{c[0]}-{c[2]}-outputs" for c in OUTPUT_CASES])
def test_a_contrib_op_with_too_many_outputs_is_refused_as_ort_refuses_it(op, n_in, n_out):
    _, (lo, hi) = MS_OP_ARITY[op]
    m = ms_node_model(op, n_in, n_out)
    assert f"has output size {n_out} not in range [min={lo}, max={hi}]" in ort_refusal(m)
    with pytest.raises(OrtlabError, match=rf"(?s){op}.*{n_out} outputs.*ORT refuses"):
        ortlab_load(m)


@pytest.mark.parametrize("build", [
    lambda: model([h("FusedMatMul", ["a", "b"], ["y"], domain=MS_DOMAIN, alpha=0.5)], [("a", [2, 3]), ("b", [3, 4])],
                  ["y"], ms=True),
    lambda: model([h("BiasGelu", ["a", "b"], ["y"], domain=MS_DOMAIN)], [("a", [2, 3])], ["y"], ms=True,
                  inits=[("b", np.ones(3))]),
    lambda: model([h("Gelu", ["a"], ["y"], domain=MS_DOMAIN)], [("a", [2, 3])], ["y"], ms=True),
    lambda: model([h("SkipLayerNormalization", ["a", "s", "g"], ["y"], domain=MS_DOMAIN)],
                  [("a", [1, 2, 3]), ("s", [1, 2, 3])], ["y"], ms=True, inits=[("g", np.ones(3))]),
    lambda: model([h("SkipLayerNormalization", ["a", "s", "g", "b", "bias"], ["y", "", "", "sum"], domain=MS_DOMAIN)],
                  [("a", [1, 2, 3]), ("s", [1, 2, 3])], ["y", "sum"], ms=True,
                  inits=[("g", np.ones(3)), ("b", np.zeros(3)), ("bias", np.zeros(3))]),
    lambda: model([h("FusedMatMul", ["a", "b"], ["y"], domain=MS_DOMAIN, name="f"), h("Relu", ["y"], ["z"], name="r")],
                  [("a", [2, 3]), ("b", [3, 4])], ["z"], ms=True),
])
def test_contrib_ops_of_the_right_arity_load_in_both(build):
    m = build()
    assert ort_refusal(m) is None
    ortlab_load(m)


def test_a_reshape_whose_computed_shape_holds_two_minus_ones_loads_as_in_ort():
    """Reshape(x, Concat(dim 0, dim 1, [-1, -1])): ORT 1.19.2 loads it (the Reshape fails only when it
    runs); ortlab's load check used ONNX's data propagation, which refuses it, and said ORT refuses it."""
    dims = [h("Shape", ["x"], ["s"]), h("Gather", ["s", "i0"], ["g0"], axis=0),
            h("Gather", ["s", "i1"], ["g1"], axis=0), h("Unsqueeze", ["g0", "ax"], ["u0"]),
            h("Unsqueeze", ["g1", "ax"], ["u1"]),
            h("Concat", ["u0", "u1", "c"], ["shape"], axis=0), h("Reshape", ["x", "shape"], ["y"])]
    graph = helper.make_graph(dims, "case", [helper.make_tensor_value_info("x", F, ["B", "S", 8])],
                              [helper.make_tensor_value_info("y", F, None)],
                              [numpy_helper.from_array(np.asarray(v, np.int64), n)
                               for n, v in (("i0", 0), ("i1", 1), ("ax", [0]), ("c", [-1, -1]))])
    m = make_model(graph, opset=17, domains=())
    assert ort_refusal(m) is None
    ortlab_load(m)

"""ortlab.ir against ORT's Graph: round trips, bookkeeping, Resolve's errors, execution orders."""
import io

import numpy as np
import onnx
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import ortcheck
from ortlab import OrtlabError, session
from ortlab.ir import (DuplicateProducerError, Graph, GraphCycleError, MissingInputError,
                       UnknownOpError, is_topological)

F = TensorProto.FLOAT


def vi(name, shape, t=F):
    return helper.make_tensor_value_info(name, t, shape)


def model_of(nodes, inputs, outputs, initializers=(), opset=17, **kw):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], **kw)
    model.ir_version = 8
    return model


def hand_built():
    """Attributes, initializers, an unnamed node, a contrib op, metadata and doc strings."""
    w = helper.make_tensor("W", F, [3, 4], np.linspace(-1, 1, 12).astype(np.float32))
    nodes = [helper.make_node("MatMul", ["X", "W"], ["H"], name="proj"),
             helper.make_node("Gelu", ["H"], ["G"], domain="com.microsoft"),
             helper.make_node("Transpose", ["G"], ["T"], name="t", perm=[1, 0]),
             helper.make_node("ReduceSum", ["T"], ["Y"], name="sum", keepdims=0)]
    model = model_of(nodes, [vi("X", [2, 3])], [vi("Y", [4])], [w], doc_string="hand built",
                     producer_name="ortlab-tests")
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    helper.set_model_props(model, {"purpose": "round trip"})
    return model


def torch_exported():
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.GELU(), torch.nn.LayerNorm(8),
                              torch.nn.Linear(8, 2), torch.nn.Softmax(-1))
    buf = io.BytesIO()
    torch.onnx.export(net, (torch.randn(3, 4),), buf, input_names=["x"], opset_version=14)
    return onnx.load_from_string(buf.getvalue())


# --- round trips ---------------------------------------------------------------------------

@pytest.mark.parametrize("make", [hand_built, torch_exported])
def test_round_trip_keeps_the_model_and_its_outputs(make, tmp_path):
    model = make()
    graph = Graph.from_model(model)
    back = graph.to_model()
    onnx.checker.check_model(back)
    assert list(back.graph.node) == list(model.graph.node)
    assert list(back.graph.initializer) == list(model.graph.initializer)
    assert list(back.graph.input) == list(model.graph.input)
    assert list(back.graph.output) == list(model.graph.output)
    assert list(back.opset_import) == list(model.opset_import)
    for field in ("ir_version", "producer_name", "producer_version", "doc_string", "metadata_props"):
        assert getattr(back, field) == getattr(model, field), field
    feeds = ortcheck.random_feeds(model)
    for a, b in zip(ortcheck.run(model, feeds), ortcheck.run(back, feeds)):
        np.testing.assert_array_equal(a, b)
    path = graph.save(tmp_path / "m.onnx")
    assert list(Graph.load(path).to_model().graph.node) == list(model.graph.node)


def test_resolve_infers_types_and_shapes_like_onnx():
    graph = Graph.from_model(hand_built())
    assert graph.node_arg("T").shape is None
    graph.resolve()
    assert graph.node_arg("H").shape == [2, 4] and graph.node_arg("H").dtype == "float32"
    assert graph.node_arg("Y").shape == [4]
    x = graph.node_arg("X")
    assert (x.is_graph_input, x.is_initializer, x.is_graph_output) == (True, False, False)
    assert graph.node_arg("W").is_initializer and graph.node_arg("Y").is_graph_output


# --- nodes, names, NodeArgs ------------------------------------------------------------------

def test_node_properties_and_schema_for_the_models_opset():
    graph = Graph.from_model(hand_built())
    proj, gelu, t, rs = graph.nodes()
    assert (proj.index, proj.name, proj.op_type, proj.domain) == (0, "proj", "MatMul", "")
    assert gelu.name == "" and gelu.domain == "com.microsoft" and gelu.schema is None
    assert t.attributes == {"perm": [1, 0]} and rs.attribute("keepdims") == 0
    assert rs.attribute("noop_with_empty_axes", 0) == 0  # default when unset
    assert rs.schema.since_version == 13 and t.schema.name == "Transpose"
    assert [a.name for a in t.inputs] == ["G"] and t.outputs[0] is graph.node_arg("T")


def test_node_arg_admits_shapes_that_fit_its_symbolic_shape():
    arg = Graph().get_or_create_node_arg("a", helper.make_tensor_type_proto(F, ["batch", 3]))
    assert arg.admits((4, 3)) and arg.admits([1, 3])
    assert not arg.admits((4, 2)) and not arg.admits((4, 3, 1))
    assert not Graph().get_or_create_node_arg("untyped").admits((1,))


def test_get_or_create_node_arg_returns_the_same_object():
    graph = Graph()
    a = graph.get_or_create_node_arg("a")
    assert graph.get_or_create_node_arg("a") is a and a.type_proto is None
    typed = helper.make_tensor_type_proto(F, [2])
    assert graph.get_or_create_node_arg("a", typed) is a and a.shape == [2]
    assert not graph.get_or_create_node_arg("").exists()


def test_indices_are_identities_that_survive_removal():
    graph = Graph.from_model(hand_built())
    gelu = graph.node(1)
    graph.remove_node(gelu)
    assert [n.index for n in graph.nodes()] == [0, 2, 3]
    new = graph.add_node("Relu", ["H"], ["G"], name="relu")
    assert new.index == 4 and graph.node(2).name == "t"
    with pytest.raises(OrtlabError, match="no node with index 1"):
        graph.node(1)
    assert graph.producer("G") is new and graph.consumers("H") == [new]
    assert graph.has_node(new) and not graph.has_node(gelu) and not Graph().has_node(new)


def test_rewiring_keeps_producers_and_consumers_right():
    graph = Graph.from_model(hand_built())
    copy = graph.add_node("Identity", ["H"], ["H2"], name="copy")
    graph.replace_all_uses("H", "H2", exclude=[copy])
    assert [n.name for n in graph.consumers("H")] == ["copy"]
    assert [n.op_type for n in graph.consumers("H2")] == ["Gelu"]
    graph.replace_node_output(graph.node(3), 0, "Y2")
    assert graph.producer("Y") is None and graph.producer("Y2").name == "sum"
    assert graph.append_node_output(copy, "") == 1 and graph.append_node_output(copy, "H3") == 2
    assert copy.output_names == ["H2", "", "H3"] and graph.producer("H3") is copy


def test_every_ir_error_is_a_graph_error():
    from ortlab.ir import GraphError, topological_order

    assert all(issubclass(e, GraphError) for e in (GraphCycleError, MissingInputError, UnknownOpError,
                                                   DuplicateProducerError))
    assert topological_order.GraphCycleError is GraphCycleError
    with pytest.raises(GraphError, match="unknown order 'fastest'"):
        Graph.from_model(hand_built()).topological_order("fastest")


# --- Resolve's errors ------------------------------------------------------------------------

def relu(i, o, name=None):
    return helper.make_node("Relu", [i], [o], name=name or f"r_{o}")


@pytest.mark.parametrize("nodes, error, words", [
    ([relu("X", "a"), relu("b", "c"), relu("c", "b"), helper.make_node("Add", ["a", "b"], ["Y"])],
     GraphCycleError, r"cycle \((r_c#1 -> r_b#2 -> r_c#1|r_b#2 -> r_c#1 -> r_b#2)\)"),
    ([relu("X", "a"), helper.make_node("Add", ["a", "nope"], ["Y"], name="add")],
     MissingInputError, "node 'add' \\(#1 Add\\) reads 'nope', which no node produces"),
    ([relu("X", "a", "first"), relu("X", "a", "second"), relu("a", "Y")],
     DuplicateProducerError, "'a' is produced by 'first' \\(#0 Relu\\) and 'second' \\(#1 Relu\\)"),
    ([helper.make_node("Rellu", ["X"], ["Y"], name="typo")],
     UnknownOpError, "op 'Rellu' of domain 'ai.onnx' is not known at opset 17: no schema"),
    ([helper.make_node("Gelu", ["X"], ["Y"], name="g20")],
     UnknownOpError, "first version is newer than opset 17"),
    ([helper.make_node("FusedMatMul", ["X", "X"], ["Y"], domain="com.microsoft", name="fm")],
     UnknownOpError, "uses domain 'com.microsoft', which the model does not import"),
], ids=["cycle", "missing-input", "two-producers", "unknown-op", "op-newer-than-opset", "domain-not-imported"])
def test_resolve_explains_what_is_wrong(nodes, error, words):
    graph = Graph.from_model(model_of(nodes, [vi("X", [2, 2])], [vi("Y", [2, 2])]))
    with pytest.raises(error, match=words):
        graph.resolve()


def test_load_errors_are_explained(tmp_path):
    with pytest.raises(OrtlabError, match="no such model file"):
        Graph.load(tmp_path / "missing.onnx")
    (tmp_path / "bad.onnx").write_bytes(b"\x00not a model" * 10)
    with pytest.raises(OrtlabError, match="not a readable ONNX model"):
        Graph.load(tmp_path / "bad.onnx")


def _ort_refuses(model):
    with pytest.raises(Exception):
        session.create(model, session.session_options("disable"), ["CPUExecutionProvider"])


def _with_opset(model, version):
    model.opset_import[0].version = version
    return model


# Graphs ORT's Graph::Resolve (or its model loader) refuses; ortlab's resolve() must refuse them too.
@pytest.mark.parametrize("make, words", [
    (lambda: model_of([helper.make_node("Add", ["A", "B"], ["Y"], name="add")],
                      [vi("A", [2, 3]), vi("B", [4, 5])], [vi("Y", None)]),
     r"node 'add' \(#0 Add\): type and shape inference fails.*Incompatible dimensions"),
    (lambda: model_of([helper.make_node("Transpose", ["A"], ["Y"], name="t", perm=[0, 5])],
                      [vi("A", [2, 3])], [vi("Y", None)]),
     r"node 't' \(#0 Transpose\): type and shape inference fails.*Invalid attribute perm"),
    (lambda: model_of([helper.make_node("Cast", ["A"], ["Y"], name="c")], [vi("A", [2, 3])], [vi("Y", None)]),
     r"node 'c' \(#0 Cast\) does not match the schema of Cast.*Required attribute 'to' is missing"),
    (lambda: model_of([helper.make_node("Relu", ["A"], ["Y"], name="r")],
                      [vi("A", [2, 3]), vi("A", [2, 3])], [vi("Y", None)]),
     r"graph input 'A' is declared more than once"),
    (lambda: _with_opset(model_of([helper.make_node("Relu", ["A"], ["Y"], name="r")],
                                  [vi("A", [2, 3])], [vi("Y", None)]), 999),
     r"imports opset 999 of domain 'ai.onnx'.*supports up to opset 21"),
    (lambda: model_of([helper.make_node("Add", ["A", "A", "A"], ["Y"], name="add3")],
                      [vi("A", [2, 3])], [vi("Y", None)]),
     r"node 'add3' \(#0 Add\) does not match the schema.*input size 3 not in range"),
    (lambda: model_of([helper.make_node("Relu", ["A"], ["Y"], name="r", alpha=1.0)],
                      [vi("A", [2, 3])], [vi("Y", None)]),
     r"node 'r' \(#0 Relu\) does not match.*Unrecognized attribute: alpha"),
    (lambda: model_of([helper.make_node("Add", ["A", "I"], ["Y"])],
                      [vi("A", [2, 3]), vi("I", [2, 3], TensorProto.INT64)], [vi("Y", None)]),
     r"node #0 Add \(no name\): type and shape inference fails.*inconsistent type tensor\(int64\)"),
], ids=["add-shapes", "transpose-perm", "cast-without-to", "input-twice", "opset-999", "arity",
        "unknown-attribute", "mixed-types"])
def test_resolve_refuses_what_ort_refuses_and_names_the_node(make, words):
    _ort_refuses(make())
    with pytest.raises(OrtlabError, match=words):
        Graph.from_model(make()).resolve()


def test_resolve_keeps_accepting_what_ort_accepts():
    """Contrib ops (unknown to onnx) pass, and a declared output shape that inference contradicts
    is merged leniently, as ORT does (it warns and loads the model)."""
    ok = [hand_built(),
          model_of([helper.make_node("Relu", ["A"], ["Y"], name="r")], [vi("A", [2, 3])], [vi("Y", [5])]),
          model_of([helper.make_node("Add", ["A", "B"], ["Y"], name="add")],
                   [vi("A", ["n", 3]), vi("B", [1, 3])], [vi("Y", None)])]
    for model in ok:
        session.create(model, session.session_options("disable"), ["CPUExecutionProvider"])
        Graph.from_model(model).resolve()


def test_a_missing_external_data_file_is_named(tmp_path):
    w = onnx.numpy_helper.from_array(np.ones((32, 32), np.float32), "W")
    model = model_of([helper.make_node("MatMul", ["X", "W"], ["Y"])], [vi("X", [2, 32])], [vi("Y", None)], [w])
    onnx.save(model, str(tmp_path / "m.onnx"), save_as_external_data=True, location="weights.bin",
              size_threshold=0)
    assert Graph.load(tmp_path / "m.onnx").initializer_value("W").shape == (32, 32)
    (tmp_path / "weights.bin").unlink()
    for load in (Graph.load, session.create):
        with pytest.raises(OrtlabError, match=r"initializer 'W' is stored outside the model in .*weights\.bin, "
                                              "which does not exist"):
            load(tmp_path / "m.onnx")


# --- execution orders, against ORT's own ------------------------------------------------------

UNARY, BINARY = ("Relu", "Neg", "Abs", "Sigmoid"), ("Add", "Mul", "Sub")


@st.composite
def random_dags(draw):
    """A random DAG of elementwise ops (and Shape->Cast pairs), nodes listed in random order."""
    n = draw(st.integers(1, 10))
    values, nodes = ["X"], []
    for i in range(n):
        kind = draw(st.sampled_from(("unary", "binary", "shape")))
        a = draw(st.sampled_from(values))
        if kind == "shape":
            nodes.append(helper.make_node("Shape", [a], [f"s{i}"], name=f"n{i}_shape"))
            nodes.append(helper.make_node("Cast", [f"s{i}"], [f"v{i}"], to=F, name=f"n{i}_cast"))
        elif kind == "unary":
            op = draw(st.sampled_from(UNARY))
            nodes.append(helper.make_node(op, [a], [f"v{i}"], name=f"n{i}_{op}"))
        else:
            op, b = draw(st.sampled_from(BINARY)), draw(st.sampled_from(values))
            nodes.append(helper.make_node(op, [a, b], [f"v{i}"], name=f"n{i}_{op}"))
        values.append(f"v{i}")
    order = draw(st.permutations(range(len(nodes))))
    nodes = [nodes[i] for i in order]
    consumed = {i for nd in nodes for i in nd.input}
    outputs = [vi(v, None) for v in values[1:] if v not in consumed] or [vi("X", None)]
    return model_of(nodes, [vi("X", [2])], outputs)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_dags())
def test_our_orders_are_orts_orders(model):
    graph = Graph.from_model(model)
    feeds = {"X": np.array([1.0, -2.0], np.float32)}
    for kind in ("default", "priority"):
        ours = graph.topological_order(kind)
        assert is_topological(ours)
        theirs = session.execution_order(model, feeds, order=kind, providers=ortcheck.CPU)
        assert [n.name for n in ours] == theirs, kind


@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_our_orders_are_orts_orders_on_exported_models(name):
    from ortlab import models

    model = models.get(name)
    onx = models.export(model, model.example_inputs(), training=True)
    graph = Graph.from_model(onx, constants_as_initializers=True)  # as ORT loads it
    assert not any(n.op_type == "Constant" for n in graph.nodes())
    feeds = {i.name: t.numpy() for i, t in zip(onx.graph.input, model.example_inputs())}
    for kind in ("default", "priority"):
        assert [n.name for n in graph.topological_order(kind)] == \
            session.execution_order(onx, feeds, order=kind, providers=ortcheck.CPU), kind
    (expected,) = ortcheck.run(Graph.from_model(onx).to_model(), feeds)
    (got,) = ortcheck.run(graph.to_model(), feeds)
    assert np.isfinite(got) and got.shape == expected.shape


def test_the_two_orders_differ_where_priorities_matter():
    nodes = [relu("X", "a", "n0_relu"), helper.make_node("Neg", ["X"], ["b"], name="n1_neg"),
             helper.make_node("Shape", ["b"], ["s"], name="n2_shape"),
             helper.make_node("Abs", ["a"], ["c"], name="n3_abs"),
             helper.make_node("Add", ["c", "b"], ["Y"], name="n4_add"),
             helper.make_node("Cast", ["s"], ["Z"], to=F, name="n5_cast")]
    graph = Graph.from_model(model_of(nodes, [vi("X", [2])], [vi("Y", [2]), vi("Z", [1])]))
    default = [n.name for n in graph.topological_order("default")]
    priority = [n.name for n in graph.topological_order("priority")]
    # traced by hand from graph_viewer.cc, and what ORT's own profiler reports
    assert default == ["n1_neg", "n2_shape", "n5_cast", "n0_relu", "n3_abs", "n4_add"]
    assert priority == ["n0_relu", "n1_neg", "n2_shape", "n3_abs", "n4_add", "n5_cast"]
    feeds = {"X": np.array([1.0, -2.0], np.float32)}
    model = graph.to_model()
    assert session.execution_order(model, feeds, order="default", providers=ortcheck.CPU) == default
    assert session.execution_order(model, feeds, order="priority", providers=ortcheck.CPU) == priority
    with pytest.raises(OrtlabError, match="unknown order 'fastest'"):
        graph.topological_order("fastest")


# --- producer/consumer maps after random edits, against a brute-force scan --------------------

def brute_force(graph):
    producers, consumers = {}, {}
    for node in graph.nodes():
        for o in node.output_names:
            producers.setdefault(o, []).append(node.index)
        for i in node.input_names:
            if i:
                consumers.setdefault(i, set()).add(node.index)
    return producers, consumers


@settings(max_examples=60, deadline=None)
@given(random_dags(), st.lists(st.tuples(st.sampled_from(("add", "remove", "rewire", "rename_out")),
                                         st.integers(0, 1000), st.integers(0, 1000)), max_size=12))
def test_maps_agree_with_a_brute_force_scan_after_random_edits(model, edits):
    graph = Graph.from_model(model)
    for step, (edit, a, b) in enumerate(edits):
        live = graph.nodes()
        names = [arg.name for arg in graph.node_args() if arg.exists()]
        if edit == "add" or not live:
            graph.add_node("Relu", [names[a % len(names)]], [f"new{step}"], name=f"add{step}")
        elif edit == "remove":
            graph.remove_node(live[a % len(live)])
        elif edit == "rewire":
            node = live[a % len(live)]
            graph.replace_node_input(node, b % len(node.inputs), names[b % len(names)])
        else:
            graph.replace_node_output(live[a % len(live)], 0, f"renamed{step}")
    producers, consumers = brute_force(graph)
    for name in {a.name for a in graph.node_args()} | set(producers) | set(consumers):
        assert [n.index for n in graph.consumers(name)] == sorted(consumers.get(name, ()))
        if len(producers.get(name, [])) <= 1:
            assert (graph.producer(name) or None) == (graph.node(producers[name][0]) if name in producers else None)

"""ReshapeFusion against ORT 1.19.2's own, graph for graph, on the patterns ORT's generators test.

The models are built here in the spirit of onnxruntime/test/testdata/transform/fusion/reshape_fusion*.py
(Shape -> Gather -> Unsqueeze -> Concat -> Reshape, with constants and one-number pieces); ORT's side
is the graph a session writes to optimized_model_filepath at level "basic" on the CPU EP, compared
with ortlab's level-1 graph node by node (tests/transformers/test_fusions_vs_ort.py's graph_key). Cases ORT
declines are in the table too, with the same expectation: both leave the subgraph.
"""
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from ortlab import session
from ortlab.onnx_defs import make_model
from ortlab.transformers import GraphTransformerManager, optimize
from ortlab.walkthroughs import graph_transformers as ex
from tests.transformers.test_fusions_vs_ort import assert_same_graph

CPU = ["CPUExecutionProvider"]
F, I64 = TensorProto.FLOAT, TensorProto.INT64
h = helper.make_node


def i64(v):
    return np.asarray(v, np.int64)


def dim_chain(k, index, source="x", axes=(0,), opset=17, shape_attrs=None):
    """Shape(source) -> Gather(index) -> Unsqueeze(axes): the nodes, initializers and output of Concat input k."""
    p = f"d{k}_"
    unsq = (h("Unsqueeze", [p + "g"], [p + "u"], axes=list(axes)) if opset < 13
            else h("Unsqueeze", [p + "g", p + "ax"], [p + "u"]))
    nodes = [h("Shape", [source], [p + "s"], **(shape_attrs or {})), h("Gather", [p + "s", p + "i"], [p + "g"], axis=0),
             unsq]
    return nodes, [(p + "i", i64(index))] + ([] if opset < 13 else [(p + "ax", i64(list(axes)))]), p + "u"


def D(index, **options):
    return ("dim", index, options)


def C(values):
    return ("const", values)


def reshape_model(parts, x_shape=("B", "S", 8), opset=17, extra_inputs=(), outputs=(), concat_readers=0,
                  reshape_attrs=None, extra_nodes=(), extra_inits=()):
    """Reshape(x, Concat(parts)): D(k) a Shape->Gather(k)->Unsqueeze chain of its own, C(values) an
    int64 initializer, ('value', name) a graph input or a value extra_nodes make."""
    nodes, inits, concat_in = [], list(extra_inits), []
    for k, part in enumerate(parts):
        if part[0] == "dim":
            more, consts, out = dim_chain(k, part[1], opset=opset, **part[2])
            nodes, inits = nodes + more, inits + consts
            concat_in.append(out)
        elif part[0] == "const":
            inits.append((f"c{k}", i64(part[1])))
            concat_in.append(f"c{k}")
        else:
            concat_in.append(part[1])
    nodes += list(extra_nodes)
    nodes += [h("Concat", concat_in, ["shape"], axis=0), h("Reshape", ["x", "shape"], ["y"], **(reshape_attrs or {}))]
    outs = [helper.make_tensor_value_info("y", F, None)]
    outs += [helper.make_tensor_value_info(name, elem, None) for name, elem in outputs]
    for r in range(concat_readers):
        nodes.append(h("Cast", ["shape"], [f"sf{r}"], to=F))
        outs.append(helper.make_tensor_value_info(f"sf{r}", F, None))
    ins = [helper.make_tensor_value_info("x", F, list(x_shape))]
    ins += [helper.make_tensor_value_info(n, e, s) for n, e, s in extra_inputs]
    graph = helper.make_graph(nodes, "reshape_fusion", ins, outs, [numpy_helper.from_array(v, n) for n, v in inits])
    return make_model(graph, opset=opset, domains=())


def shared_shape(other_reader=False, index_is_input=False, tail=(2, 4)):
    """One Shape(x) read by both Gathers, as exporters write it; other_reader: a Cast reads it too;
    index_is_input: the second Gather's index is an initializer a feed may override."""
    nodes = [h("Shape", ["x"], ["s"]), h("Gather", ["s", "i0"], ["g0"], axis=0),
             h("Gather", ["s", "i1"], ["g1"], axis=0), h("Unsqueeze", ["g0", "ax"], ["u0"]),
             h("Unsqueeze", ["g1", "ax"], ["u1"]),
             h("Concat", ["u0", "u1", "c"], ["shape"], axis=0), h("Reshape", ["x", "shape"], ["y"])]
    outs = [helper.make_tensor_value_info("y", F, None)]
    if other_reader:
        nodes.append(h("Cast", ["s"], ["sf"], to=F))
        outs.append(helper.make_tensor_value_info("sf", F, None))
    ins = [helper.make_tensor_value_info("x", F, ["B", "S", 8])]
    if index_is_input:
        ins.append(helper.make_tensor_value_info("i1", I64, []))
    inits = [("i0", i64(0)), ("i1", i64(1)), ("ax", i64([0])), ("c", i64(list(tail)))]
    graph = helper.make_graph(nodes, "reshape_fusion", ins, outs, [numpy_helper.from_array(v, n) for n, v in inits])
    return make_model(graph, opset=17, domains=())


def slice_squeeze_piece():
    """Unsqueeze(Squeeze(Slice(Shape(x), 2, 3))): x's last dim as one number, through a Slice."""
    nodes = [h("Shape", ["x"], ["ss"]), h("Slice", ["ss", "st", "en"], ["sl"]), h("Squeeze", ["sl", "sax"], ["sq"]),
             h("Unsqueeze", ["sq", "sax"], ["uq"])]
    return reshape_model([D(0), D(1), ("value", "uq"), C([1])], extra_nodes=nodes,
                         extra_inits=[("st", i64([2])), ("en", i64([3])), ("sax", i64([0]))])


def div_piece():
    """Unsqueeze(Gather(Shape(x), 2) / 4): a computed number (the head size of an attention reshape)."""
    nodes = [h("Shape", ["x"], ["ss"]), h("Gather", ["ss", "two"], ["g2"], axis=0), h("Div", ["g2", "k"], ["dv"]),
             h("Unsqueeze", ["dv", "sax"], ["uq"])]
    return reshape_model([D(0), D(1), ("value", "uq"), C([4])], extra_nodes=nodes,
                         extra_inits=[("two", i64(2)), ("k", i64(4)), ("sax", i64([0]))])


# (case id, model builder): ortlab's level-1 graph must equal ORT's "basic" one
CASES = [
    ("two-kept-dims", lambda: reshape_model([D(0), D(1), C([2, 4])])),
    ("ort-generator-5-inputs", lambda: reshape_model([D(0), C([128]), D(2), D(3), C([-1])],
                                                     x_shape=("unk_0", 256, "unk_2", "unk_3"),
                                                     outputs=[("d3_g", I64)])),
    ("two-constants-between", lambda: reshape_model([D(0), C([2]), D(2), C([4])], x_shape=("B", 2, "S", 4))),
    ("shared-shape", shared_shape),
    ("shared-shape-also-cast", lambda: shared_shape(other_reader=True)),
    ("gather-is-graph-output", lambda: reshape_model([D(0), D(1), C([2, 4])], outputs=[("d1_g", I64)])),
    ("shape-is-graph-output", lambda: reshape_model([D(0), D(1), C([2, 4])], outputs=[("d1_s", I64)])),
    ("wrong-index-is-one-number", lambda: reshape_model([D(1), D(1), C([8])])),
    ("negative-index-is-one-number", lambda: reshape_model([D(0), D(1), D(-1)], x_shape=("B", "S", "H"))),
    ("unsqueeze-axis-minus-1", lambda: reshape_model([D(0), D(1, axes=(-1,)), C([2, 4])])),
    ("shape-of-other-value", lambda: reshape_model([D(0, source="z"), D(1), C([2, 4])],
                                                   extra_inputs=[("z", F, ["B", "S", 8])])),
    ("shape-of-untyped-value", lambda: reshape_model([D(0, source="z"), D(1), C([2, 4])],
                                                     extra_inputs=[("z", F, None)])),
    ("shape-start-0", lambda: reshape_model([D(0, shape_attrs={"start": 0}), D(1), C([2, 4])])),
    ("shape-start-1", lambda: reshape_model([D(0, shape_attrs={"start": 1}), D(1), C([2, 4])])),
    ("shape-end-3", lambda: reshape_model([D(0, shape_attrs={"end": 3}), D(1), C([2, 4])])),
    ("graph-input-of-one-number", lambda: reshape_model([D(0), D(1), ("value", "n"), C([4])],
                                                        extra_inputs=[("n", I64, [1])])),
    ("slice-squeeze-piece", slice_squeeze_piece),
    ("one-kept-dim", lambda: reshape_model([D(0), C([-1])])),
    ("partly-static", lambda: reshape_model([D(0), D(1), C([2, 4])], x_shape=("B", 3, 8))),
    ("div-piece", div_piece),
    ("opset-11", lambda: reshape_model([D(0), D(1), C([2, 4])], opset=11)),
    # declined by both
    ("two-minus-ones", lambda: reshape_model([D(1), D(0), C([8])])),
    ("graph-input-of-unknown-size", lambda: reshape_model([D(0), D(1), ("value", "n"), C([4])],
                                                          extra_inputs=[("n", I64, ["k"])])),
    ("concat-read-twice", lambda: reshape_model([D(0), D(1), C([2, 4])], concat_readers=1)),
    ("concat-is-graph-output", lambda: reshape_model([D(0), D(1), C([2, 4])], outputs=[("shape", I64)])),
    ("allowzero", lambda: reshape_model([D(0), D(1), C([2, 4])], reshape_attrs={"allowzero": 1})),
    ("opset-19-reshape", lambda: reshape_model([D(0), D(1), C([2, 4])], opset=19)),
    ("opset-21-reshape", lambda: reshape_model([D(0), D(1), C([2, 4])], opset=21)),
]


def without_defaults(model):
    """A copy whose ONNX-domain nodes drop attributes equal to their schema's default: ORT writes
    some out (Reshape-14 allowzero=0, Shape-15 start=0) on every such node it saves."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    for node in model.graph.node:
        if node.domain not in ("", "ai.onnx"):
            continue
        schema = onnx.defs.get_schema(node.op_type, opset, "")
        defaults = {n: a.default_value for n, a in schema.attributes.items() if a.default_value.name}
        keep = [a for a in node.attribute if not (a.name in defaults and helper.get_attribute_value(a)
                                                  == helper.get_attribute_value(defaults[a.name]))]
        del node.attribute[:]
        node.attribute.extend(keep)
    return model


def assert_same_graph_as_orts(ours, model, level="basic"):
    theirs = session.optimized_model(model, level, providers=CPU)
    assert_same_graph(without_defaults(ours), without_defaults(theirs))


def feeds_for(model):
    """Random x (symbolic dims 2), z like x, an int64 n = [2]: the original Reshape is valid."""
    feeds = ex.feeds(model)
    if "z" in feeds:
        feeds["z"] = feeds["x"].copy()
    if "n" in feeds:
        feeds["n"] = np.array([2], np.int64)
    return feeds


def assert_level_1_equals_orts(m, feeds):
    """ortlab's level-1 graph of `m` is ORT's basic one, and both give the original's outputs on `feeds`."""
    ours = optimize(m, level=1, providers=CPU)
    assert_same_graph_as_orts(ours, m)
    want, got = session.run_model(m, feeds), session.run_model(ours, feeds)
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_ortlab_reshape_fusion_equals_orts(case):
    _, build = case
    m = build()
    assert_level_1_equals_orts(m, feeds_for(m))


def fused_shape(model):
    inits = {t.name: numpy_helper.to_array(t).tolist() for t in model.graph.initializer}
    reshape, = [n for n in model.graph.node if n.op_type == "Reshape"]
    return inits.get(reshape.input[1])


@pytest.mark.parametrize("parts, shape", [([D(0), D(1), C([2, 4])], [0, 0, 2, 4]),
                                          ([D(1), D(1), C([8])], [-1, 0, 8]),
                                          ([D(0), ("value", "n"), C([4])], [0, -1, 4])])
def test_the_fused_shape_keeps_dims_with_0_and_infers_one_number_with_minus_1(parts, shape):
    m = reshape_model(parts, extra_inputs=[("n", I64, [1])])
    assert fused_shape(optimize(m, names=["ReshapeFusion"], providers=CPU)) == shape
    assert fused_shape(session.optimized_model(m, "basic", providers=CPU)) == shape


def test_a_chain_concat_reads_twice_stays_unread_as_in_ort():
    """CSE makes the two copies of Shape->Gather(1)->Unsqueeze one, read twice by the Concat: ORT removes
    only nodes with one reader, so the chain stays behind with nothing reading it; so does ortlab's."""
    m = reshape_model([D(1), D(1), C([8])])
    ours = optimize(m, level=1, providers=CPU)
    assert ex.op_counts(ours) == {"Reshape": 1, "Shape": 1, "Gather": 1, "Unsqueeze": 1}
    unsqueeze, = [n for n in ours.graph.node if n.op_type == "Unsqueeze"]
    assert not [n for n in ours.graph.node if unsqueeze.output[0] in n.input]


def test_a_gather_index_a_feed_can_change_is_not_taken_for_a_kept_dim():
    """The Gather's index is an initializer that is also a graph input: ORT 1.19.2 keeps the dim
    the index holds at load time (a 0), and a feed of another index then gives another result.
    ortlab takes that piece for one number (-1), so with a -1 already in the shape it declines.
    If this starts failing, ORT was fixed."""
    m = shared_shape(index_is_input=True, tail=(-1, 4))
    x = np.arange(64, dtype=np.float32).reshape(2, 4, 8)
    feeds = {"x": x, "i1": np.array(0, np.int64)}
    want = session.run_model(m, feeds)["y"]
    assert want.shape == (2, 2, 4, 4)  # [B, B, -1, 4]: the index fed picks dim 0
    assert session.run_model(m, feeds, CPU, level="basic")["y"].shape == (2, 4, 2, 4)
    manager = GraphTransformerManager.from_registry(1, providers=CPU)
    ours = manager.optimize(m)
    assert "Concat" in ex.op_counts(ours)
    assert session.run_model(ours, feeds)["y"].shape == want.shape
    reasons = [why for r in manager.history if r.transformer == "ReshapeFusion" for _, why in r.declined]
    assert any("more than one -1" in why for why in reasons)


@pytest.mark.parametrize("case, reason", [("two-minus-ones", "more than one -1"),
                                          ("allowzero", "allowzero"),
                                          ("concat-read-twice", "read by more than the Reshape"),
                                          ("graph-input-of-unknown-size", "more than one number")])
def test_a_declined_reshape_says_why(case, reason):
    from ortlab.ir import Graph
    from ortlab.transformers import ReshapeFusion
    build = dict(CASES)[case]
    g = Graph.from_model(build(), constants_as_initializers=True)
    g.resolve()
    reshape, = [n for n in g.nodes() if n.op_type == "Reshape"]
    assert reason in ReshapeFusion().why_not(g, reshape)


def test_reshape_fusion_is_a_level_1_transformer_for_every_ep():
    """graph_transformer_utils.cc adds ReshapeFusion to the level-1 transformers, with no EP filter."""
    from ortlab.transformers import registry
    level, cls, eps = registry.TRANSFORMERS["ReshapeFusion"]
    assert (level, cls.__name__, eps) == (1, "ReshapeFusion", None)

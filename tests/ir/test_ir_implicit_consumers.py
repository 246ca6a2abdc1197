"""Graph.consumers counts the nodes whose subgraphs read a value, as ORT's GetConsumerNodes does.

ORT's consumer map is filled by Graph::PopulateNodeArgToProducerConsumerLookupsFromNodes (graph.cc) from
Node::ForEachDef, which visits implicit inputs. A rewrite that asks "who else reads this value?" must see
an If whose branch reads it, and a rewrite that renames a value renames the branch's reads too
(graph_utils.cc, UpdateImplicitInputNameInSubgraph). Each model is run through ortlab's transformers and
through ORT 1.19.2's own (basic / extended): the outputs must be those of the unoptimized model in ORT and
in onnx.reference, and the optimized graphs must hold the same ops.
"""
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnx.reference import ReferenceEvaluator

from ortlab import session
from ortlab.ir import Graph
from ortlab.ir.errors import GraphError
from ortlab.transformers import optimize
from ortlab.transformers import graph_utils as gu
from ortlab.walkthroughs.graph_transformers import op_counts

F = TensorProto.FLOAT
CPU = ["CPUExecutionProvider"]
LEVELS = {"basic": 1, "extended": 2}
n = helper.make_node


def value(name, elem=F, shape=(2, 4)):
    return helper.make_tensor_value_info(name, elem, None if shape is None else list(shape))


def branches(then_nodes, else_nodes, elem=F):
    """then/else GraphProtos: their last node's output is the branch output (type only, no shape)."""
    return [helper.make_graph(nodes, name, [], [value(nodes[-1].output[0], elem, None)])
            for name, nodes in (("then", then_nodes), ("else", else_nodes))]


def if_reading(read, out="z", elem=F):
    """If(cond): then Neg(read), else Abs(read)."""
    then_g, else_g = branches([n("Neg", [read], ["t_out"])], [n("Abs", [read], ["e_out"])], elem)
    return n("If", ["cond"], [out], then_branch=then_g, else_branch=else_g, name="branch")


def model(nodes, inputs, outputs, inits=(), opset=17):
    graph = helper.make_graph(nodes, "g", inputs + [value("cond", TensorProto.BOOL, [])], outputs, list(inits))
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    m.ir_version = 8
    return m


def const(name, array):
    return numpy_helper.from_array(np.asarray(array, np.float32), name)


# --- the models ---------------------------------------------------------------------------------------

def identity_read_only_in_branch():
    return model([n("Relu", ["x"], ["r"]), n("Identity", ["r"], ["y"]), if_reading("y")], [value("x")], [value("z")])


def identity_read_in_branch_and_by_exp():
    return model([n("Relu", ["x"], ["r"]), n("Identity", ["r"], ["y"]), n("Exp", ["y"], ["w"]), if_reading("y")],
                 [value("x")], [value("z"), value("w")])


def identity_whose_input_name_the_branch_has():
    """The then branch reads y and r: ORT does not rename y to r there (CanUpdateImplicitInputNameInSubgraph),
    so the Identity stays."""
    then_g, else_g = branches([n("Add", ["y", "r"], ["t_out"])], [n("Abs", ["y"], ["e_out"])])
    return model([n("Relu", ["x"], ["r"]), n("Identity", ["r"], ["y"]),
                  n("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g)], [value("x")], [value("z")])


def identity_graph_output_read_in_branch():
    """Identity's output is a graph output: ORT renames upstream only when no node reads it (no output edge)."""
    return model([n("Relu", ["x"], ["r"]), n("Identity", ["r"], ["y"]), if_reading("y")], [value("x")],
                 [value("z"), value("y")])


def identity_graph_output_read_by_exp():
    return model([n("Relu", ["x"], ["r"]), n("Identity", ["r"], ["y"]), n("Exp", ["y"], ["z"])], [value("x")],
                 [value("z"), value("y")])


def dropout_read_in_branch():
    return model([n("Relu", ["x"], ["r"]), n("Dropout", ["r"], ["y"]), n("Exp", ["y"], ["w"]), if_reading("y")],
                 [value("x")], [value("z"), value("w")])


def identity_read_in_a_loop_inside_a_branch():
    """The Identity's output is read two subgraphs down: If -> Loop body."""
    body = helper.make_graph([n("Identity", ["cond_in"], ["cond_out"]), n("Add", ["acc", "y"], ["acc_out"])], "body",
                             [value("i", TensorProto.INT64, []), value("cond_in", TensorProto.BOOL, []),
                              value("acc", F, None)],
                             [value("cond_out", TensorProto.BOOL, []), value("acc_out", F, None)])
    loop = n("Loop", ["trips", "", "y"], ["t_out"], body=body)
    trips = numpy_helper.from_array(np.array(3, np.int64), "trips")
    then_g = helper.make_graph([loop], "then", [], [value("t_out", F, None)], [trips])
    _, else_g = branches([n("Neg", ["y"], ["t_out"])], [n("Abs", ["y"], ["e_out"])])
    return model([n("Relu", ["x"], ["r"]), n("Identity", ["r"], ["y"]),
                  n("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g)], [value("x")], [value("z")])


def identity_whose_input_name_a_nested_body_has():
    """As above, but the Loop body also reads r: ORT checks the nested body's names too, and keeps the Identity."""
    m = identity_read_in_a_loop_inside_a_branch()
    then_g = next(a.g for a in m.graph.node[2].attribute if a.name == "then_branch")
    body = then_g.node[0].attribute[0].g
    body.node[1].input[0] = "r"  # acc_out = r + y: the body now reads both outer values
    return m


def identity_whose_input_name_a_nested_sibling_branch_has():
    """If -> inner If whose then branch reads y, whose else branch reads r: ORT checks every subgraph of a nested
    node that reads y (CanUpdateImplicitInputNameInSubgraph), finds r, and keeps the Identity."""
    inner_then, inner_else = branches([n("Neg", ["y"], ["it"])], [n("Abs", ["r"], ["ie"])])
    inner = n("If", ["cond"], ["t_out"], then_branch=inner_then, else_branch=inner_else)
    then_g = helper.make_graph([inner], "then", [], [value("t_out", F, None)])
    _, else_g = branches([n("Neg", ["x"], ["t_unused"])], [n("Sigmoid", ["x"], ["e_out"])])
    return model([n("Relu", ["x"], ["r"]), n("Identity", ["r"], ["y"]),
                  n("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g)], [value("x")], [value("z")])


def cast_read_by_shape_and_branch():
    """PreShapeNodeElimination: a Cast read by a Shape and by a branch is no Cast read only by Shapes.
    (x has a symbolic dim, so the Shape is not folded.)"""
    x = value("x", shape=("N", 4))
    return model([n("Cast", ["x"], ["c1"], to=TensorProto.DOUBLE), n("Shape", ["c1"], ["s"]),
                  if_reading("c1", elem=TensorProto.DOUBLE)],
                 [x], [value("z", TensorProto.DOUBLE, None), value("s", TensorProto.INT64, [2])])


def not_read_by_where_and_branch():
    """NotWhereFusion: Not(c) read by a Where and by a branch (opset 15: Where-9 rules apply)."""
    then_g, else_g = branches([n("Where", ["n", "a", "b"], ["t_out"])], [n("Abs", ["a"], ["e_out"])])
    return model([n("Not", ["c"], ["n"]), n("Where", ["n", "a", "b"], ["w"]),
                  n("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g)],
                 [value("c", TensorProto.BOOL), value("a"), value("b")], [value("z"), value("w")], opset=15)


def twin_relus_both_read_in_branch():
    """CSE merges Relu(x) twice; the branch reads both: its reads of the second become reads of the first."""
    then_g, else_g = branches([n("Add", ["r1", "r2"], ["t_out"])], [n("Abs", ["r2"], ["e_out"])])
    return model([n("Relu", ["x"], ["r1"]), n("Relu", ["x"], ["r2"]), n("Add", ["r1", "r2"], ["w"]),
                  n("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g)], [value("x")],
                 [value("z"), value("w")])


def gelu_intermediate_read_in_branch():
    inits = [const("sq2", 1.4142135), const("one", 1.0), const("half", 0.5)]
    return model([n("Div", ["x", "sq2"], ["d"]), n("Erf", ["d"], ["er"]), n("Add", ["er", "one"], ["ad"]),
                  n("Mul", ["x", "ad"], ["mu"]), n("Mul", ["mu", "half"], ["g"]), if_reading("er")],
                 [value("x")], [value("z"), value("g")], inits)


def layer_norm_mean_read_in_branch():
    inits = [const("two", 2.0), const("eps", 1e-5), const("scale", np.linspace(0.5, 2, 4)),
             const("bias", np.linspace(-1, 1, 4))]
    nodes = [n("ReduceMean", ["x"], ["mean"], axes=[-1]), n("Sub", ["x", "mean"], ["d"]),
             n("Pow", ["d", "two"], ["p"]), n("ReduceMean", ["p"], ["var"], axes=[-1]),
             n("Add", ["var", "eps"], ["ve"]), n("Sqrt", ["ve"], ["sd"]), n("Div", ["d", "sd"], ["nm"]),
             n("Mul", ["nm", "scale"], ["sc"]), n("Add", ["sc", "bias"], ["ln"]), if_reading("mean")]
    return model(nodes, [value("x")], [value("z"), value("ln")], inits)


def reshape_shape_read_in_branch(read):
    """ReshapeFusion: Reshape(x, Concat(Unsqueeze(Gather(Shape(x), 0)), Unsqueeze(Gather(Shape(x), 1)), [2, 4]));
    a branch reads `read` (the Concat's output, or a Gather's). Folding the Concat to [0, 0, 2, 4] would hand the
    branch other values."""
    i64 = TensorProto.INT64
    nodes = [n("Shape", ["x"], ["s"])]
    for k in (0, 1):
        nodes += [n("Gather", ["s", f"i{k}"], [f"g{k}"], axis=0), n("Unsqueeze", [f"g{k}", "ax"], [f"u{k}"])]
    nodes += [n("Concat", ["u0", "u1", "c"], ["shape"], axis=0), n("Reshape", ["x", "shape"], ["y"]),
              if_reading(read, elem=i64)]
    inits = [numpy_helper.from_array(np.array(v, np.int64), name)
             for name, v in (("i0", 0), ("i1", 1), ("ax", [0]), ("c", [2, 4]))]
    return model(nodes, [value("x", shape=("B", "S", 8))], [value("y", shape=None), value("z", i64, None)], inits)


def reshape_concat_read_in_branch():
    return reshape_shape_read_in_branch("shape")


def reshape_gather_read_in_branch():
    return reshape_shape_read_in_branch("g0")


def shape_only_read_in_branch_is_folded():
    """ConstantFolding: Shape(x) of a static x, read only by a branch, becomes an initializer of that name."""
    return model([n("Relu", ["x"], ["w"]), n("Shape", ["x"], ["s"]), if_reading("s", elem=TensorProto.INT64)],
                 [value("x")], [value("z", TensorProto.INT64, None), value("w")])


def initializer_read_only_in_branch():
    return model([n("Relu", ["x"], ["w"]), if_reading("k")], [value("x")], [value("z"), value("w")],
                 [const("k", np.arange(8).reshape(2, 4))])


CASES = {f.__name__: f for f in (
    identity_read_only_in_branch, identity_read_in_branch_and_by_exp, identity_whose_input_name_the_branch_has,
    identity_graph_output_read_in_branch, identity_graph_output_read_by_exp,
    dropout_read_in_branch, identity_read_in_a_loop_inside_a_branch, identity_whose_input_name_a_nested_body_has,
    identity_whose_input_name_a_nested_sibling_branch_has, cast_read_by_shape_and_branch,
    not_read_by_where_and_branch, twin_relus_both_read_in_branch, gelu_intermediate_read_in_branch,
    layer_norm_mean_read_in_branch, reshape_concat_read_in_branch, reshape_gather_read_in_branch,
    shape_only_read_in_branch_is_folded, initializer_read_only_in_branch)}


# onnx.reference (onnx 1.17) runs this Loop's body without adding y three times: numpy gives the outputs
NUMPY = {"identity_read_in_a_loop_inside_a_branch":
         lambda f: [4 * np.maximum(f["x"], 0) if f["cond"] else np.maximum(f["x"], 0)],
         "identity_whose_input_name_a_nested_body_has":
         lambda f: [2 * np.maximum(f["x"], 0) if f["cond"] else np.maximum(f["x"], 0)]}


def feeds(m, cond):
    rng = np.random.default_rng(0)
    found = {"cond": np.array(cond)}
    for vi in m.graph.input:
        if vi.name == "cond":
            continue
        t = vi.type.tensor_type
        shape = [d.dim_value or 3 for d in t.shape.dim]
        found[vi.name] = (rng.random(shape) > 0.5 if t.elem_type == TensorProto.BOOL
                          else rng.standard_normal(shape).astype(np.float32))
    return found


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("name", CASES)
def test_a_value_a_branch_reads_survives_the_transformers_as_in_ort(name, level):
    original = CASES[name]()
    ours = optimize(original, level=LEVELS[level], providers=CPU)
    theirs = session.optimized_model(original, level, providers=CPU)
    assert sorted(op_counts(ours).items()) == sorted(op_counts(theirs).items())
    for cond in (True, False):
        f = feeds(original, cond)
        want = session.run_model(original, f)
        reference = NUMPY[name](f) if name in NUMPY else ReferenceEvaluator(original).run(None, f)
        for got in (session.run_model(ours, f), session.run_model(theirs, f)):
            for k, expected in zip(want, reference):
                np.testing.assert_allclose(got[k], want[k], rtol=1e-5, atol=1e-6, err_msg=f"{k}, cond={cond}")
                np.testing.assert_allclose(got[k], expected, rtol=1e-5, atol=1e-6, err_msg=f"{k}, cond={cond}")


# --- the IR itself ------------------------------------------------------------------------------------

def test_consumers_count_a_read_from_inside_a_branch_and_two_subgraphs_down():
    g = Graph.from_model(identity_read_in_a_loop_inside_a_branch())
    identity, branch = g.node(1), g.node(2)
    assert [c.index for c in g.consumers("y")] == [branch.index]
    assert g.explicit_consumers("y") == [] and g.implicit_consumers("y") == [branch]
    assert [c.index for c in g.consumers("r")] == [identity.index]
    assert gu.uses(g, "y") == 1 and gu.subgraph_readers(g, "y") == 1
    assert gu.single_consumer(g, "y") is None  # the If reads y in no input slot: nothing to rewire there


def test_a_branch_that_defines_its_own_value_of_that_name_is_no_reader():
    then_g, else_g = branches([n("Relu", ["x"], ["y"]), n("Neg", ["y"], ["t_out"])], [n("Abs", ["x"], ["e_out"])])
    m = model([n("Relu", ["x"], ["y"]), n("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g),
               n("Exp", ["y"], ["w"])], [value("x")], [value("z"), value("w")])
    g = Graph.from_model(m)
    assert [c.op_type for c in g.consumers("y")] == ["Exp"]
    assert [c.op_type for c in g.consumers("x")] == ["Relu", "If"]


def test_consumers_follow_a_changed_subgraph_add_node_resolve_and_remove_node():
    g = Graph.from_model(identity_read_only_in_branch())
    branch = g.node(2)
    then_g, else_g = branches([n("Neg", ["r"], ["t_out"])], [n("Abs", ["r"], ["e_out"])])
    branch.attribute_protos["then_branch"] = helper.make_attribute("then_branch", then_g)
    assert g.consumers("y") == [branch]           # the else branch still reads y
    branch.attribute_protos["else_branch"] = helper.make_attribute("else_branch", else_g)
    assert g.consumers("y") == [] and [c.index for c in g.consumers("r")] == [1, 2]
    late = g.add_node("If", ["cond"], ["later"])  # given its branches after add_node: they count from resolve()
    then_g, else_g = branches([n("Neg", ["y"], ["t2"])], [n("Abs", ["x"], ["e2"])])
    late.attribute_protos["then_branch"] = helper.make_attribute("then_branch", then_g)
    late.attribute_protos["else_branch"] = helper.make_attribute("else_branch", else_g)
    assert g.consumers("y") == []
    g.resolve(infer_shapes=False)
    assert g.consumers("y") == [late] and g.consumers("x") == [g.node(0), late]
    g.remove_node(late)
    g.remove_node(branch)
    assert g.consumers("y") == [] and [c.index for c in g.consumers("r")] == [1]


def test_replace_all_uses_renames_the_reads_inside_subgraphs_nested_ones_too():
    original = identity_read_in_a_loop_inside_a_branch()
    g = Graph.from_model(original)
    identity = g.node(1)
    assert g.can_replace_all_uses("y", "r")
    g.remove_node(identity)
    g.replace_all_uses("y", "r")
    assert g.consumers("y") == [] and [c.op_type for c in g.consumers("r")] == ["If"]
    renamed = g.to_model()
    for cond in (True, False):
        f = feeds(original, cond)
        np.testing.assert_allclose(session.run_model(renamed, f)["z"], session.run_model(original, f)["z"])


def test_replace_all_uses_refuses_a_name_a_subgraph_defines_itself_and_changes_nothing():
    then_g, else_g = branches([n("Exp", ["x"], ["r"]), n("Add", ["y", "r"], ["t_out"])], [n("Abs", ["y"], ["e_out"])])
    m = model([n("Relu", ["x"], ["r"]), n("Identity", ["r"], ["y"]),
               n("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g)], [value("x")], [value("z")])
    g = Graph.from_model(m)
    before = g.to_model().SerializeToString()
    assert not g.can_replace_all_uses("y", "r")
    with pytest.raises(GraphError, match="value of their own called 'r'"):
        g.replace_all_uses("y", "r")
    assert g.to_model().SerializeToString() == before
    # (ONNX itself forbids a branch to define a name of the graph around it: resolve() refuses this model)
    with pytest.raises(GraphError, match="single static assignment"):
        g.resolve()


def test_consumers_refuse_a_name_that_is_not_a_str():
    g = Graph.from_model(identity_read_only_in_branch())
    before = g.to_model().SerializeToString()
    for bad in (None, 3, ["y"]):
        for call in (g.consumers, g.explicit_consumers, g.implicit_consumers, lambda b: g.replace_all_uses("y", b),
                     lambda b: g.replace_all_uses(b, "r")):
            with pytest.raises(GraphError, match="value name"):
                call(bad)
    assert g.to_model().SerializeToString() == before


@pytest.mark.parametrize("order", range(24))
def test_a_node_read_only_by_a_branch_is_no_leaf_in_either_order(order):
    """ORT gives an implicit input an edge (Graph::BuildConnections), so the Relu a branch alone reads is no leaf
    of the reverse DFS and feeds Kahn's in-degrees once: ortlab's orders are ORT's, read from its profiler, for
    every order of the four nodes in the file. (ortlab's default order ran the Relu first when it came last.)"""
    import itertools

    nodes = [if_reading("r"), n("Exp", ["x"], ["w"], name="exp"), n("Relu", ["x"], ["r"], name="relu"),
             n("Sigmoid", ["x"], ["s"], name="sig")]
    nodes = [nodes[i] for i in list(itertools.permutations(range(4)))[order]]
    m = model(nodes, [value("x")], [value("z"), value("w"), value("s")])
    g = Graph.from_model(m)
    top = {"branch", "exp", "relu", "sig"}
    for kind in ("default", "priority"):
        theirs = [name for name in session.execution_order(m, feeds(m, True), order=kind, providers=CPU) if name in top]
        assert [node.name for node in g.topological_order(kind)] == theirs, kind


@pytest.mark.parametrize("op", ["Cast", "Dropout", "Identity"])
@pytest.mark.parametrize("level", LEVELS)
def test_a_graph_output_is_renamed_upstream_by_identity_elimination_alone(op, level):
    """ORT's EliminateIdentity renames the producer's output when the Identity writes a graph output; CastElimination
    and EliminateDropout ask CanRemoveNode only, which refuses a graph output: the Cast and the Dropout stay.
    (ortlab removed all three.)"""
    attrs = {"to": F} if op == "Cast" else {}
    m = model([n("Relu", ["x"], ["r"]), n(op, ["r"], ["y"], **attrs)], [value("x")], [value("y")])
    ours = optimize(m, level=LEVELS[level], providers=CPU)
    theirs = session.optimized_model(m, level, providers=CPU)
    assert op_counts(ours) == op_counts(theirs)
    f = feeds(m, True)
    np.testing.assert_allclose(session.run_model(ours, f)["y"], np.maximum(f["x"], 0))


def test_the_forward_model_of_a_training_split_keeps_an_initializer_only_a_branch_reads():
    """split_training_graph gives the forward model the initializers its nodes read: a branch's read counts (the
    If read k only inside then_branch; k was left out and ORT refused the forward model). ORT's own C++ gradient
    builder (the 'ort' builder) fails on this graph ('Attempting to get index by a name which does not exist'):
    pinned here."""
    from ortlab.gradients.ort import OrtGradientError
    from ortlab.training import training_manager as tm

    then_g = helper.make_graph([n("Mul", ["x", "k"], ["t0"]), n("Cast", ["t0"], ["t_out"], to=TensorProto.INT64)],
                               "then", [], [value("t_out", TensorProto.INT64, None)])
    else_g = helper.make_graph([n("Cast", ["x"], ["e_out"], to=TensorProto.INT64)], "else", [],
                               [value("e_out", TensorProto.INT64, None)])
    m = model([n("Mul", ["x", "w"], ["y"]), n("If", ["cond"], ["z"], then_branch=then_g, else_branch=else_g)],
              [value("x")], [value("y"), value("z", TensorProto.INT64, None)], [const("k", np.full((2, 4), 3.0)),
                                                                               const("w", np.full((2, 4), 2.0))])
    training, differentiable = tm.build_training_graph(m, ["y", "z"], ["x", "w"], "ortlab")
    split = tm.split_training_graph(training, m, ["y", "z"], differentiable, ["x", "w"])
    assert sorted(t.name for t in split.forward.graph.initializer) == ["k", "w"]
    for cond in (True, False):
        f = feeds(m, cond)
        got = session.run_model(split.forward, f)
        np.testing.assert_array_equal(got["z"], (f["x"] * 3 if cond else f["x"]).astype(np.int64))
        np.testing.assert_allclose(got["y"], f["x"] * 2)
    with pytest.raises(OrtGradientError, match="does not exist"):
        tm.build_training_graph(m, ["y", "z"], ["x", "w"], "ort")

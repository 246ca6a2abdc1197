"""Held-out checks of the graph transformers inside subgraphs (If's branches, Loop's body), against ORT 1.19.2.

Models written apart from tests/transformers/test_transformers_in_subgraphs.py: fusions whose checks need the shapes
of values computed inside a body, from outer values computed by nodes (not graph inputs); eliminations whose output
is a body output; nested bodies reading renamed outer values; weights read inside a body that must not be folded. Each
is compared with ORT's saved graph (op types per body, nested) and with ORT's values.
"""
import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto as T
from onnx import helper as h
from onnx import numpy_helper as nh

from ortlab import session
from ortlab.engine import InferenceSession, SessionOptions
from ortlab.transformers import optimize
from test_transformers_in_subgraphs import ops

pytestmark = pytest.mark.heldout

LEVELS = {"basic": 1, "extended": 2}
RNG = np.random.RandomState(27)


def vi(name, shape=(2,), elem=T.FLOAT):
    return h.make_tensor_value_info(name, elem, list(shape))


def weight(name, shape):
    return nh.from_array(RNG.randn(*shape).astype(np.float32), name)


def _model(nodes, inputs, outputs, initializers=()):
    graph = h.make_graph(nodes, "g", inputs, outputs, list(initializers))
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=9)


def matmul_add_in_branch():
    """MatMul + Add (MatMulAddFusion: Gemm, which needs the MatMul output's shape, inferred inside the branch) on a
    Relu of a graph input: the branch reads the Relu's output, whose type the outer graph infers."""
    then = h.make_graph([h.make_node("MatMul", ["xr", "W"], ["mm"]), h.make_node("Add", ["mm", "B"], ["t"])], "then",
                        [], [vi("t", (3, 5))])
    other = h.make_graph([h.make_node("MatMul", ["xr", "W"], ["e"])], "else", [], [vi("e", (3, 5))])
    nodes = [h.make_node("Relu", ["xx"], ["xr"]), h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    model = _model(nodes, [vi("xx", (3, 4)), vi("c", (), T.BOOL)], [vi("y", (3, 5))],
                   [weight("W", (4, 5)), weight("B", (5,))])
    return model, {"xx": RNG.randn(3, 4).astype(np.float32), "c": np.array(True)}


def matmul_add_in_loop():
    """The same fusion in a Loop body, on the carried value (typed by the body's input) and an outer weight."""
    body = h.make_graph([h.make_node("Identity", ["cond"], ["cond_out"]), h.make_node("MatMul", ["v", "W"], ["mm"]),
                         h.make_node("Add", ["mm", "B"], ["a"]), h.make_node("Tanh", ["a"], ["v_out"])], "body",
                        [vi("i", (), T.INT64), vi("cond", (), T.BOOL), vi("v", (3, 4))],
                        [vi("cond_out", (), T.BOOL), vi("v_out", (3, 4))])
    nodes = [h.make_node("Relu", ["xx"], ["xr"]), h.make_node("Loop", ["n", "", "xr"], ["y"], body=body)]
    model = _model(nodes, [vi("xx", (3, 4)), vi("n", (), T.INT64)], [vi("y", (3, 4))],
                   [weight("W", (4, 4)), weight("B", (4,))])
    return model, {"xx": RNG.randn(3, 4).astype(np.float32), "n": np.array(3)}


def eliminations_as_body_outputs():
    """Identity, Dropout and a Cast to the same type whose outputs are a Loop body's output."""
    body = h.make_graph([h.make_node("Identity", ["cond"], ["cond_out"]), h.make_node("Add", ["v", "x"], ["a"]),
                         h.make_node("Dropout", ["a"], ["d"]), h.make_node("Cast", ["d"], ["v_out"], to=T.FLOAT)],
                        "body", [vi("i", (), T.INT64), vi("cond", (), T.BOOL), vi("v")],
                        [vi("cond_out", (), T.BOOL), vi("v_out")])
    model = _model([h.make_node("Loop", ["n", "", "x"], ["y"], body=body)], [vi("x"), vi("n", (), T.INT64)], [vi("y")])
    return model, {"x": np.array([0.7, -1.3], np.float32), "n": np.array(3)}


def renamed_outer_value():
    """An Identity in the main graph whose output two nested bodies read (If in a Loop in an If): removing it renames
    the value they read."""
    inner_then = h.make_graph([h.make_node("Mul", ["v", "w"], ["it"])], "it", [], [vi("it")])
    inner_else = h.make_graph([h.make_node("Neg", ["xi"], ["ie"])], "ie", [], [vi("ie")])
    body = h.make_graph([h.make_node("Identity", ["cond"], ["cond_out"]),
                         h.make_node("If", ["cond"], ["v_out"], then_branch=inner_then, else_branch=inner_else)],
                        "body", [vi("i", (), T.INT64), vi("cond", (), T.BOOL), vi("v")],
                        [vi("cond_out", (), T.BOOL), vi("v_out")])
    then = h.make_graph([h.make_node("Loop", ["n", "c", "xi"], ["t"], body=body)], "then", [], [vi("t")])
    other = h.make_graph([h.make_node("Abs", ["xi"], ["e"])], "else", [], [vi("e")])
    nodes = [h.make_node("Identity", ["x"], ["xi"]),
             h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)]
    model = _model(nodes, [vi("x"), vi("c", (), T.BOOL), vi("n", (), T.INT64)], [vi("y")],
                   [nh.from_array(np.array([2.0, 3.0], np.float32), "w")])
    return model, {"x": np.array([0.7, -1.3], np.float32), "c": np.array(True), "n": np.array(2)}


def cse_across_branches():
    """The same Relu in the main graph and twice in a branch: CSE merges the two inside the branch only."""
    then = h.make_graph([h.make_node("Relu", ["x"], ["r1"]), h.make_node("Relu", ["x"], ["r2"]),
                         h.make_node("Add", ["r1", "r2"], ["t"])], "then", [], [vi("t")])
    other = h.make_graph([h.make_node("Relu", ["x"], ["e"])], "else", [], [vi("e")])
    nodes = [h.make_node("Relu", ["x"], ["r0"]), h.make_node("If", ["c"], ["y0"], then_branch=then, else_branch=other),
             h.make_node("Add", ["y0", "r0"], ["y"])]
    model = _model(nodes, [vi("x"), vi("c", (), T.BOOL)], [vi("y")])
    return model, {"x": np.array([0.7, -1.3], np.float32), "c": np.array(True)}


MODELS = {"matmul add in a branch": matmul_add_in_branch, "matmul add in a loop": matmul_add_in_loop,
          "eliminations as body outputs": eliminations_as_body_outputs, "renamed outer value": renamed_outer_value,
          "cse across branches": cse_across_branches}


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("case", MODELS)
def test_bodies_are_optimized_as_orts(case, level):
    model, _ = MODELS[case]()
    theirs = session.optimized_model(model, level=level, providers=["CPUExecutionProvider"])
    ours = optimize(model, level=LEVELS[level], providers=["CPUExecutionProvider"])
    assert ops(ours.graph) == ops(theirs.graph)


@pytest.mark.parametrize("case", MODELS)
def test_optimized_sessions_compute_orts_values(case):
    model, feeds = MODELS[case]()
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    ours = InferenceSession(model, SessionOptions(graph_optimization_level=99)).run(None, feeds)
    np.testing.assert_allclose(ours[0], expected[0], rtol=1e-5, atol=1e-6)


def in_a_branch(model, weights):
    """`model`'s graph as both branches of an If on a new condition, its initializers outside the If (read from
    the outer scope: ORT treats them as constant inside the body) or inside each branch."""
    g = model.graph
    inner = list(g.initializer) if weights == "in the branches" else []
    branches = {f"{side}_branch": h.make_graph(list(g.node), side, [], list(g.output), inner)
                for side in ("then", "else")}
    outputs = []
    for k, out in enumerate(g.output):
        outputs.append(h.make_value_info(f"if_out_{k}", out.type))
    node = h.make_node("If", ["if_cond"], [o.name for o in outputs], **branches)
    graph = h.make_graph([node], "g", [*g.input, vi("if_cond", (), T.BOOL)], outputs,
                         list(g.initializer) if weights == "outside" else [])
    return h.make_model(graph, opset_imports=list(model.opset_import), ir_version=model.ir_version)


def _fusion_cases():
    import test_fusions_vs_ort as fusions
    return [pytest.param(build, id=name) for name, build, equal in fusions.CASES if equal]


@pytest.mark.parametrize("weights", ["outside", "in the branches"])
@pytest.mark.parametrize("build", _fusion_cases())
def test_fusion_cases_inside_a_branch_are_optimized_as_orts(build, weights):
    model = in_a_branch(build(), weights)
    theirs = session.optimized_model(model, level="extended", providers=["CPUExecutionProvider"])
    ours = optimize(model, level=2, providers=["CPUExecutionProvider"])
    assert ops(ours.graph) == ops(theirs.graph)


def test_a_weight_read_inside_a_branch_is_not_folded_when_excluded():
    """Training passes the trainable weights as excluded_initializers: Add(w1, w2) inside a branch stays (ORT's
    ConstantFolding skips a node reading an excluded initializer, in a subgraph as in the main graph)."""
    then = h.make_graph([h.make_node("Add", ["w1", "w2"], ["s"]), h.make_node("Mul", ["x", "s"], ["t"])], "then",
                        [], [vi("t")])
    other = h.make_graph([h.make_node("Neg", ["x"], ["e"])], "else", [], [vi("e")])
    model = _model([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                   [vi("x"), vi("c", (), T.BOOL)], [vi("y")],
                   [nh.from_array(np.array([1.0, 2.0], np.float32), "w1"),
                    nh.from_array(np.array([3.0, 4.0], np.float32), "w2")])
    kept = optimize(model, level=2, providers=["CPUExecutionProvider"], excluded_initializers=["w1"])
    folded = optimize(model, level=2, providers=["CPUExecutionProvider"])
    assert ops(kept.graph) == [("If", [("else_branch", [("Neg", [])]), ("then_branch", [("Add", []), ("Mul", [])])])]
    assert ops(folded.graph) == ops(session.optimized_model(model, level="extended",
                                                            providers=["CPUExecutionProvider"]).graph)


def test_a_loop_without_condition_inside_a_branch_computes_orts_values():
    body = h.make_graph([h.make_node("Identity", ["cond"], ["cond_out"]),
                         h.make_node("Cast", ["cond"], ["f"], to=T.FLOAT),
                         h.make_node("Add", ["v", "f"], ["v_out"])], "body",
                        [vi("i", (), T.INT64), vi("cond", (), T.BOOL), vi("v")],
                        [vi("cond_out", (), T.BOOL), vi("v_out")])
    then = h.make_graph([h.make_node("Loop", ["n", "", "x"], ["t"], body=body)], "then", [], [vi("t")])
    other = h.make_graph([h.make_node("Abs", ["x"], ["e"])], "else", [], [vi("e")])
    model = _model([h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)],
                   [vi("x"), vi("c", (), T.BOOL), vi("n", (), T.INT64)], [vi("y")])
    feeds = {"x": np.array([0.7, -1.3], np.float32), "c": np.array(True), "n": np.array(3)}
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    ours = InferenceSession(model, SessionOptions(graph_optimization_level=0)).run(None, feeds)
    np.testing.assert_allclose(ours[0], expected[0], rtol=1e-6)


def _random_body_models(seed):
    """A random model of test_transformer_properties' blocks (Dropout left out: ORT's training build keeps a Dropout
    whose ratio is not 0, in the main graph too), as both branches of an If and as a Loop body, weights outside."""
    import random

    from test_transformer_properties import BLOCKS, Builder
    pick, builder = random.Random(seed), Builder(seed)
    for block in [pick.choice([b for b in BLOCKS if b != "dropout"]) for _ in range(pick.randint(1, 6))]:
        builder.values.append(builder.add(block, builder.values[-1], pick.randint(0, 10)))
    x = RNG.randn(2, 3, 4).astype(np.float32)
    branch = in_a_branch(builder.model([]), "outside"), {"x": x, "if_cond": np.array(True)}
    nodes = [h.make_node("Identity", ["cond"], ["cond_out"]), h.make_node("Identity", ["v"], ["x"]), *builder.nodes,
             h.make_node("Identity", [builder.values[-1]], ["v_out"])]
    body = h.make_graph(nodes, "body", [vi("i", (), T.INT64), vi("cond", (), T.BOOL), vi("v", (2, 3, 4))],
                        [vi("cond_out", (), T.BOOL), vi("v_out", (2, 3, 4))])
    loop = _model([h.make_node("Loop", ["n", "", "x0"], ["y"], body=body)], [vi("x0", (2, 3, 4)), vi("n", (), T.INT64)],
                  [vi("y", (2, 3, 4))], builder.inits)
    return [branch, (loop, {"x0": x, "n": np.array(2)})]


@pytest.mark.parametrize("seed", range(10))
def test_random_bodies_are_optimized_and_run_as_orts(seed):
    for model, feeds in _random_body_models(seed):
        for level in LEVELS:
            theirs = session.optimized_model(model, level=level, providers=["CPUExecutionProvider"])
            ours = optimize(model, level=LEVELS[level], providers=["CPUExecutionProvider"])
            assert ops(ours.graph) == ops(theirs.graph)
        expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
        ours = InferenceSession(model, SessionOptions(graph_optimization_level=99)).run(None, feeds)
        np.testing.assert_allclose(ours[0], expected[0], rtol=1e-4, atol=1e-5)


def _constant(name, values):
    return h.make_node("Constant", [], [name], value=nh.from_array(np.array(values, np.float32)))


def _branch_with_constants(changed):
    """A then branch ORT's transformers leave alone (a Constant node, read by an Add or its output), in a model where
    something else changes: the main graph (an Identity) or the other branch (an Identity)."""
    then_nodes = {"output": [_constant("t", [1.0, 2.0])],
                  "read": [_constant("k", [1.0, 2.0]), h.make_node("Add", ["x", "k"], ["t"])]}
    for constant, nodes in then_nodes.items():
        then = h.make_graph(nodes, "then", [], [vi("t")])
        other = [h.make_node("Identity", ["x"], ["x1"]), h.make_node("Neg", ["x1"], ["e"])] if changed == "sibling" \
            else [h.make_node("Neg", ["x"], ["e"])]
        node = h.make_node("If", ["c"], ["y"], then_branch=then, else_branch=h.make_graph(other, "else", [], [vi("e")]))
        if changed == "main graph":
            yield constant, _model([h.make_node("Identity", ["x0"], ["x"]), node],
                                   [vi("x0"), vi("c", (), T.BOOL)], [vi("y")])
        else:
            yield constant, _model([node], [vi("x"), vi("c", (), T.BOOL)], [vi("y")])


@pytest.mark.parametrize("level", LEVELS)
@pytest.mark.parametrize("changed", ["main graph", "sibling"])
def test_an_unchanged_body_of_a_changed_model_holds_its_constants_as_initializers_as_ort(changed, level):
    """ORT writes a changed model's subgraphs from their Graphs, where Constant nodes became initializers: the
    untouched branch loses its Constant node as well (it keeps it only when the model is saved unchanged)."""
    for _, model in _branch_with_constants(changed):
        theirs = session.optimized_model(model, level=level, providers=["CPUExecutionProvider"])
        ours = optimize(model, level=LEVELS[level], providers=["CPUExecutionProvider"])
        assert ops(ours.graph) == ops(theirs.graph)
        assert "Constant" not in str(ops(theirs.graph))

"""ortlab.transformers against ORT's own optimizer: same fusions on the same graphs, same outputs.

The independent reference throughout is ORT: `session.optimized_model` returns the graph ORT
runs after its transformers (SessionOptions.optimized_model_filepath), and ORT runs both the
original and ortlab's optimized model. Where ORT 1.19.2 differs on purpose, the case says so.
"""
import numpy as np
import onnx
import pytest

import ortcheck
from ortlab import models, session
from ortlab.errors import OrtlabError
from ortlab.walkthroughs import graph_transformers as ex
from ortlab.transformers import optimize
from ortlab.ops.contrib_ops import reference_run

CPU = ["CPUExecutionProvider"]
LEVEL = {1: "basic", 2: "extended"}
# The op types a fusion emits or an elimination removes: compared with ORT node type by node type.
COUNTED = ["LayerNormalization", "com.microsoft:Gelu", "com.microsoft:BiasGelu", "com.microsoft:FusedMatMul",
           "Gemm", "com.microsoft:FusedGemm", "MatMul", "Identity", "Dropout", "Erf", "Pow", "ReduceMean",
           "com.microsoft:SkipLayerNormalization", "SimplifiedLayerNormalization", "Add", "Mul", "Div", "Where"]


def ort_counts(model, level=2):
    return ex.op_counts(session.optimized_model(model, LEVEL[level], providers=CPU))


def assert_same_outputs(original, optimized, feeds, reference=False):
    run = reference_run if reference else session.run_model
    want, got = session.run_model(original, feeds), run(optimized, feeds)
    assert list(want) == list(got)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-6, err_msg=name)


def seeded_dropouts(model):
    """A copy whose Dropout nodes carry a seed, so ORT draws the same mask in both models."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for node in model.graph.node:
        if node.op_type == "Dropout":
            node.attribute.append(onnx.helper.make_attribute("seed", 7))
    return model


# --- the model zoo, inference and training exports ---------------------------------------------

@pytest.fixture(scope="module", params=[(n, t) for n in ("mlp", "bert", "gpt") for t in (False, True)],
                ids=lambda p: f"{p[0]}-{'training' if p[1] else 'inference'}")
def exported(request):
    name, training = request.param
    onx, x, y = ortcheck.clean_export(name, training)
    feeds = {models.get(name).input_names[0]: x, "labels": y}
    return name, training, seeded_dropouts(onx), feeds


@pytest.mark.parametrize("level", [1, 2])
def test_zoo_fusions_match_ort_node_type_by_node_type(exported, level):
    name, training, model, feeds = exported
    ours = optimize(model, level=level, providers=CPU)
    mine, theirs = ex.op_counts(ours), ort_counts(model, level)
    for op in COUNTED:
        assert mine.get(op, 0) == theirs.get(op, 0), (op, mine, theirs)
    assert_same_outputs(model, ours, feeds)
    assert len(ours.graph.node) <= len(model.graph.node)


def test_zoo_transformers_fire_where_expected(exported):
    name, training, model, _ = exported
    if name == "mlp":
        assert ex.op_counts(optimize(model, providers=CPU)).get("com.microsoft:FusedGemm") == 1
        return
    counts = ex.op_counts(optimize(model, providers=CPU))
    assert counts["LayerNormalization"] == 5 and counts["com.microsoft:BiasGelu"] == 2
    assert counts["com.microsoft:FusedMatMul"] == 2  # q @ k^T / sqrt(d): MatMulScaleFusion
    assert "Erf" not in counts and "Pow" not in counts
    assert counts.get("Dropout", 0) == (7 if training else 0)


# --- hand-built cases: fire on the positive ones, leave the negative ones alone -----------------

# (case id, model, transformer names, op type to count, fires?, ORT 1.19.2 on CPU agrees?)
CASES = [
    ("layernorm", ex.layer_norm(), ["LayerNormFusion"], "LayerNormalization", True, True),
    ("layernorm-axis1", ex.layer_norm(axis=1), ["LayerNormFusion"], "LayerNormalization", False, True),
    ("layernorm-shared-sub", ex.layer_norm(shared_sub=True), ["LayerNormFusion"], "LayerNormalization", False, True),
    # ORT 1.19.2 fuses even when epsilon is a graph input (see test_ort_fuses_a_fed_epsilon_wrongly)
    ("layernorm-eps-input", ex.layer_norm(eps_as_input=True), ["LayerNormFusion"], "LayerNormalization", False,
     False),
    ("layernorm-2d-scale", ex.layer_norm(scale_2d=True), ["LayerNormFusion"], "LayerNormalization", False, True),
    ("gelu", ex.gelu(), ["GeluFusion"], "com.microsoft:Gelu", True, True),
    ("gelu-half-first", ex.gelu(form="half_first"), ["GeluFusion"], "com.microsoft:Gelu", True, True),
    # ORT 1.19.2 matches only Div(x, sqrt 2); ortlab also takes Mul(x, 1/sqrt 2)
    ("gelu-mul", ex.gelu(form="mul"), ["GeluFusion"], "com.microsoft:Gelu", True, False),
    ("gelu-wrong-constant", ex.gelu(constant=2.0), ["GeluFusion"], "com.microsoft:Gelu", False, True),
    ("gelu-shared-erf", ex.gelu(shared_erf=True), ["GeluFusion"], "com.microsoft:Gelu", False, True),
    ("biasgelu", ex.gelu(bias="1d"), ["GeluFusion", "BiasGeluFusion"], "com.microsoft:BiasGelu", True, True),
    ("biasgelu-2d-bias", ex.gelu(bias="2d"), ["GeluFusion", "BiasGeluFusion"], "com.microsoft:BiasGelu", False, True),
    ("matmuladd", ex.matmul_add(), ["MatMulAddFusion"], "Gemm", True, True),
    ("matmuladd-3d", ex.matmul_add(a_shape=(2, 3, 4)), ["MatMulAddFusion"], "Gemm", False, True),
    ("matmuladd-shared", ex.matmul_add(extra_consumer=True), ["MatMulAddFusion"], "Gemm", False, True),
    ("matmuladd-2d-bias", ex.matmul_add(bias_shape=(3, 5)), ["MatMulAddFusion"], "Gemm", True, True),
    ("gemm-relu", ex.matmul_add(activation="Relu"), ["MatMulAddFusion", "GemmActivationFusion"],
     "com.microsoft:FusedGemm", True, True),
    ("transpose-matmul", ex.matmul_transpose(), ["MatmulTransposeFusion"], "com.microsoft:FusedMatMul", True, True),
    # a transpose of the batch axes folds too (transBatchA)
    ("transpose-batch-axes", ex.matmul_transpose(perm=(1, 0, 2)), ["MatmulTransposeFusion"],
     "com.microsoft:FusedMatMul", True, True),
    ("matmul-div", ex.matmul_transpose(scale=2.0), ["MatmulTransposeFusion", "MatMulScaleFusion"],
     "com.microsoft:FusedMatMul", True, True),
    ("mul-matmul", ex.matmul_transpose(scale=2.0, scale_position="before"),
     ["MatmulTransposeFusion", "MatMulScaleFusion"], "com.microsoft:FusedMatMul", True, True),
    ("identity", ex.elimination("identity"), ["EliminateIdentity"], "Identity", True, True),
    ("identity-graph-output", ex.elimination("identity_output"), ["EliminateIdentity"], "Identity", True, True),
    ("identity-input-to-output", ex.elimination("identity_input_to_output"), ["EliminateIdentity"], "Identity",
     False, True),
    # ORT 1.19.2 keeps a Dropout whose ratio is non-zero even when training_mode is a constant False
    ("dropout-inference", ex.elimination("dropout"), ["EliminateDropout"], "Dropout", True, False),
    ("dropout-training", ex.elimination("dropout_training"), ["EliminateDropout"], "Dropout", False, True),
    ("dropout-ratio0", ex.elimination("dropout_ratio0_training"), ["EliminateDropout"], "Dropout", True, True),
    ("dropout-mask-used", ex.elimination("dropout_mask_used"), ["EliminateDropout"], "Dropout", False, True),
    ("cast-same-type", ex.elimination("cast_same"), ["CastElimination"], "Cast", True, True),
    ("cast-real", ex.elimination("cast_real"), ["CastElimination"], "Cast", False, True),
    # ORT 1.19.2 has no no-op Reshape elimination
    ("reshape-same", ex.elimination("reshape_same"), ["NoopReshapeElimination"], "Reshape", True, False),
    ("reshape-other", ex.elimination("reshape_other"), ["NoopReshapeElimination"], "Reshape", False, True),
    ("cse", ex.constants_and_duplicates(), ["CommonSubexpressionElimination"], "Relu", True, True),
    ("constant-folding", ex.constants_and_duplicates(), ["ConstantFolding"], "Add", True, True),
]
REMOVES = {"Identity", "Dropout", "Cast", "Reshape", "Relu", "Add"}  # counted ops an elimination removes


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_case_fires_only_when_safe_and_agrees_with_ort(case):
    _, model, names, op, fires, ort_agrees = case
    before = ex.op_counts(model).get(op, 0)
    after = ex.op_counts(optimize(model, names=names, providers=CPU)).get(op, 0)
    fired = after < before if op in REMOVES else after > before
    assert fired == fires, (before, after)
    full = ex.op_counts(optimize(model, level=2, providers=CPU)).get(op, 0)
    theirs = ort_counts(model).get(op, 0)
    assert (full == theirs) == ort_agrees, (full, theirs)
    assert_same_outputs(model, optimize(model, level=2, providers=CPU), ex.feeds(model))


def test_ort_fuses_a_fed_epsilon_wrongly():
    """ORT 1.19.2's LayerNormFusion takes its default epsilon when epsilon is not a constant, so a
    fed epsilon is ignored; ortlab declines. If this starts failing, ORT was fixed: update the case."""
    model = ex.layer_norm(eps_as_input=True)
    feeds = dict(ex.feeds(model), eps=np.array(0.5, np.float32))
    unfused = session.run_model(model, feeds)["y"]
    ort_fused = session.run_model(model, feeds, CPU, level="extended")["y"]
    assert np.abs(ort_fused - unfused).max() > 0.1
    assert_same_outputs(model, optimize(model, providers=CPU), feeds)


def test_declined_nodes_say_why():
    from ortlab.transformers import GraphTransformerManager
    manager = GraphTransformerManager.from_registry(2, names=["LayerNormFusion"], providers=CPU)
    manager.optimize(ex.layer_norm(axis=1))
    reasons = [why for _, _, why in manager.declined().rows]
    assert any("not the last axis" in r for r in reasons), reasons


# --- CUDA-only fusions: asked for by name, checked with the reference kernels --------------------

@pytest.mark.parametrize("bias_shape, fires", [((1, 1, 4, 4), True), ((4, 4), True), ((2, 1, 1, 4), True),
                                               ((2, 1, 4, 1), False), ((1, 2, 1, 4), False)])
def test_bias_softmax_fusion(bias_shape, fires):
    model = ex.bias_softmax(bias_shape)
    assert "com.microsoft:BiasSoftmax" not in ex.op_counts(optimize(model, providers=CPU))  # CUDA/ROCm only
    ours = optimize(model, names=["BiasSoftmaxFusion"])
    assert ("com.microsoft:BiasSoftmax" in ex.op_counts(ours)) == fires
    assert_same_outputs(model, ours, ex.feeds(model), reference=True)


def test_bias_softmax_leaves_other_axes_alone():
    model = ex.bias_softmax(axis=1)
    assert ex.op_counts(optimize(model, names=["BiasSoftmaxFusion"])) == ex.op_counts(model)


@pytest.mark.parametrize("residual", [True, False])
def test_bias_dropout_fusion_in_inference_mode(residual):
    model = ex.bias_dropout(residual=residual)
    assert "com.microsoft:BiasDropout" not in ex.op_counts(optimize(model, providers=CPU))
    ours = optimize(model, names=["BiasDropoutFusion"])
    counts = ex.op_counts(ours)
    assert counts.get("com.microsoft:BiasDropout") == 1 and "Dropout" not in counts
    assert counts.get("Add", 0) == 0  # the bias Add and the residual Add are both inside
    assert_same_outputs(model, ours, ex.feeds(model), reference=True)


def test_bias_dropout_declines_a_bias_that_is_not_1d():
    model = ex.bias_dropout(bias_shape=(3, 4))
    assert ex.op_counts(optimize(model, names=["BiasDropoutFusion"])) == ex.op_counts(model)


# --- the manager: loop, order, levels, names -----------------------------------------------------

def test_the_loop_catches_what_a_single_pass_misses():
    from ortlab.transformers import BiasGeluFusion, GeluFusion, GraphTransformerManager
    for steps, expected in ((1, "com.microsoft:Gelu"), (10, "com.microsoft:BiasGelu")):
        manager = GraphTransformerManager(steps)
        manager.register(BiasGeluFusion())  # before GeluFusion: no Gelu exists yet in step 0
        manager.register(GeluFusion())
        assert expected in ex.op_counts(manager.optimize(ex.gelu(bias="1d")))


def test_order_changes_the_result():
    from ortlab.transformers import BiasGeluFusion, GeluFusion, GraphTransformerManager, MatMulAddFusion
    model = ex.order_matters()
    gemm_first, bias_gelu_first = GraphTransformerManager(), GraphTransformerManager()
    for t in (MatMulAddFusion(), GeluFusion(), BiasGeluFusion()):
        gemm_first.register(t, level=1)
    for t in (GeluFusion(), BiasGeluFusion(), MatMulAddFusion()):
        bias_gelu_first.register(t, level=1)
    a, b = ex.op_counts(gemm_first.optimize(model)), ex.op_counts(bias_gelu_first.optimize(model))
    assert a == {"Gemm": 1, "com.microsoft:Gelu": 1} == ort_counts(model)  # ORT's levels: Gemm first
    assert b == {"MatMul": 1, "com.microsoft:BiasGelu": 1}
    for m in (gemm_first, bias_gelu_first):
        assert_same_outputs(model, m.optimize(model), ex.feeds(model))


def test_history_records_what_each_step_removed_added_and_fused():
    from ortlab.transformers import GraphTransformerManager
    manager = GraphTransformerManager.from_registry(2, providers=CPU)
    manager.optimize(ex.layer_norm())
    record = next(r for r in manager.history if r.transformer == "LayerNormFusion" and r.modified)
    assert len(record.removed) == 9 and len(record.added) == 1
    assert record.fused[0][1] == "LayerNormalization" and record.fused[0][2][0] == "ReduceMean"
    assert manager.fire_counts() == {"LayerNormFusion": 1}
    assert "LayerNormFusion" in repr(manager.history_table())


def test_fire_counts_name_each_rule_and_count_each_rewrite():
    from ortlab.transformers import GraphTransformerManager
    manager = GraphTransformerManager.from_registry(2, providers=CPU)
    manager.optimize(ex.elimination("identity"))
    assert manager.fire_counts() == {"EliminateIdentity": 1}  # the rule, not Level1_RuleBasedTransformer
    manager.optimize(ex.constants_and_duplicates())
    assert manager.fire_counts() == {"CommonSubexpressionElimination": 1, "ConstantFolding": 1}


def test_constant_sharing_makes_equal_scalars_one_initializer():
    from onnx import helper, numpy_helper

    from ortlab.onnx_defs import make_model
    from ortlab.transformers import GraphTransformerManager
    inits = [numpy_helper.from_array(np.array(2.0, np.float32), n) for n in ("c1", "c2")]
    graph = helper.make_graph([helper.make_node("Mul", ["x", "c1"], ["a"]),
                               helper.make_node("Mul", ["a", "c2"], ["y"])],
                              "shared", [helper.make_tensor_value_info("x", 1, [2])],
                              [helper.make_tensor_value_info("y", 1, None)], inits)
    model = make_model(graph, domains=())
    manager = GraphTransformerManager.from_registry(1, names=["ConstantSharing"], providers=CPU)
    out = manager.optimize(model)
    assert [i.name for i in out.graph.initializer] == ["c1"]
    assert [list(n.input) for n in out.graph.node] == [["x", "c1"], ["a", "c1"]]
    assert manager.fire_counts() == {"ConstantSharing": 1}
    assert_same_outputs(model, out, {"x": np.array([1.0, -3.0], np.float32)})


def test_a_pattern_fusion_needs_only_anchor_match_and_fused_op():
    from ortlab.ir import Graph
    from ortlab.transformers import GraphTransformerManager, Match, PatternFusion
    from ortlab.transformers import graph_utils as gu
    from ortlab.transformers.registry import TRANSFORMERS

    class ReluReluFusion(PatternFusion):
        """Relu(Relu(x)) -> Relu(x)."""
        anchor, fused_op = "Relu", "Relu"

        def match(self, graph, relu):
            first = graph.producer(relu.input_names[0])
            if not gu.is_op(first, "Relu") or gu.single_consumer(graph, first.output_names[0]) is not relu:
                return "its input is not a Relu read only by it"
            return Match([first, relu], first.input_names, relu.output_names)

    model = ex.elimination("identity")  # Relu -> Identity -> Relu: a Relu pair once Identity is gone
    with TRANSFORMERS.using("ReluReluFusion", (2, ReluReluFusion, None)):
        manager = GraphTransformerManager.from_registry(2, providers=CPU)
        out = manager.optimize(model)
    assert "ReluReluFusion" not in TRANSFORMERS
    assert ex.op_counts(out) == {"Relu": 1}
    assert manager.fire_counts() == {"EliminateIdentity": 1, "ReluReluFusion": 1}
    records = [r for r in manager.history if r.transformer == "ReluReluFusion"]
    assert [r.modified for r in records] == [True, False]  # the second step finds nothing more
    assert [why for _, why in records[-1].declined] == ["its input is not a Relu read only by it"]
    assert_same_outputs(model, out, ex.feeds(model))
    graph = Graph.from_model(model)
    graph.resolve()
    first, identity, last = graph.nodes()
    fusion = ReluReluFusion()
    assert fusion.why_not(graph, last) == "its input is not a Relu read only by it"
    assert fusion.why_not(graph, identity) == "ReluReluFusion starts from Relu, not Identity"


def test_layer_norm_match_is_data_or_a_reason():
    from ortlab.ir import Graph
    from ortlab.transformers import LayerNormFusion
    graph = Graph.from_model(ex.layer_norm(axis=1))
    graph.resolve()
    fusion = LayerNormFusion()
    assert fusion.match(graph, graph.nodes()[0]) == "it reduces over axes [1], not the last axis alone"
    graph = Graph.from_model(ex.layer_norm())
    graph.resolve()
    found = fusion.match(graph, graph.nodes()[0])
    assert (found.x, found.scale, found.bias, found.output) == ("x", "w", "b", "y") and len(found.nodes) == 9
    assert fusion.why_not(graph, graph.nodes()[0]) is None


def test_level_1_does_no_fusion_into_contrib_ops():
    counts = ex.op_counts(optimize(ex.gelu(bias="1d"), level=1))
    assert not any(k.startswith("com.microsoft") for k in counts) and counts["Erf"] == 1


def test_unknown_names_and_levels_are_explained():
    with pytest.raises(OrtlabError, match="no transformer or rule named"):
        optimize(ex.gelu(), names=["GeluFusoin"])
    with pytest.raises(OrtlabError, match="level must be one of"):
        optimize(ex.gelu(), level=7)


def test_a_registered_transformer_runs_and_can_be_removed():
    from ortlab.transformers import GraphTransformer, register_transformer, unregister

    @register_transformer(level=2)
    class DropRelu(GraphTransformer):
        def apply_impl(self, graph):
            return False

    try:
        from ortlab.transformers import GraphTransformerManager
        names = [t.name for t in GraphTransformerManager.from_registry(2, providers=CPU).transformers[2]]
        assert names[-1] == "DropRelu"
    finally:
        unregister("DropRelu")
    assert "DropRelu" not in [t.name for t in GraphTransformerManager.from_registry(2).transformers[2]]


# --- bad input --------------------------------------------------------------------------------

def test_a_model_that_does_not_resolve_names_the_node_and_is_left_untouched():
    model = ex.gelu()
    model.graph.node[1].input[0] = "nowhere"
    saved = model.SerializeToString()
    with pytest.raises(OrtlabError, match="reads 'nowhere'"):
        optimize(model)
    assert model.SerializeToString() == saved


def test_a_transformer_raising_inside_is_named_with_its_node():
    from ortlab.transformers import GraphTransformer, GraphTransformerManager, TransformerError

    class Broken(GraphTransformer):
        def apply_impl(self, graph):
            for node in self.nodes(graph):
                if node.op_type == "Erf":
                    raise ValueError("boom")
            return False

    model = ex.gelu()
    saved = model.SerializeToString()
    manager = GraphTransformerManager()
    manager.register(Broken())
    with pytest.raises(TransformerError, match=r"transformer Broken failed at node .*Erf.*boom"):
        manager.optimize(model)
    assert model.SerializeToString() == saved


def test_a_rule_returning_garbage_is_explained():
    from ortlab.transformers import GraphTransformerManager, RewriteRule, RuleBasedGraphTransformer
    from ortlab.transformers import TransformerError

    class Sloppy(RewriteRule):
        target_op_types = ("Erf",)

        def satisfy_condition(self, graph, node):
            return True

        def apply(self, graph, node):
            return True

    manager = GraphTransformerManager()
    manager.register(RuleBasedGraphTransformer("rules", [Sloppy()]))
    with pytest.raises(TransformerError, match="return a RuleEffect"):
        manager.optimize(ex.gelu())


def _transposed_weight():
    """Y = X @ Transpose(W): folding Transpose(W) into a constant cuts W off from its gradient."""
    from onnx import helper, numpy_helper
    w = numpy_helper.from_array(np.arange(9, dtype=np.float32).reshape(3, 3), "W")
    graph = helper.make_graph([helper.make_node("Transpose", ["W"], ["Wt"], name="t", perm=[1, 0]),
                               helper.make_node("MatMul", ["X", "Wt"], ["Y"], name="mm")], "g",
                              [helper.make_tensor_value_info("X", 1, [2, 3])],
                              [helper.make_tensor_value_info("Y", 1, None)], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def test_a_misspelt_keyword_is_refused_not_dropped():
    model = _transposed_weight()
    with pytest.raises(OrtlabError, match=r"unknown keyword 'excluded_initializer' \(did you mean "
                                          r"'excluded_initializers'\?\)"):
        optimize(model, providers=CPU, excluded_initializer=["W"])
    with pytest.raises(OrtlabError, match=r"excluded_initializers names 'Wq', which is not an initializer"):
        optimize(model, providers=CPU, excluded_initializers=["Wq"])
    # the right keyword keeps W a variable; a single name is one name, not its letters
    for excluded in (["W"], "W"):
        kept = optimize(model, providers=CPU, excluded_initializers=excluded)
        assert "W" in {t.name for t in kept.graph.initializer}
        assert "W" in {i for n in kept.graph.node for i in n.input}


@pytest.mark.parametrize("bad, words", [(None, "not NoneType"), (42, "not int")])
def test_optimize_of_something_that_is_not_a_model_is_explained(bad, words):
    with pytest.raises(OrtlabError, match=f"optimize\\(\\) takes an onnx.ModelProto or a path.*{words}"):
        optimize(bad)


def test_providers_given_as_one_name_or_misspelt():
    model = _transposed_weight()
    assert ex.op_counts(optimize(model, providers="CPUExecutionProvider")) == ex.op_counts(
        optimize(model, providers=CPU))
    with pytest.raises(OrtlabError, match="unknown execution provider 'CPUExecutionProvidr'.*did you mean"):
        optimize(model, providers=["CPUExecutionProvidr"])


@pytest.mark.parametrize("answer", [True, False, 1, ["Relu"]])
def test_a_pattern_match_that_returns_neither_match_reason_nor_none_is_explained(answer):
    from ortlab.ir import Graph
    from ortlab.transformers import PatternFusion, TransformerError

    class Wrong(PatternFusion):
        anchor, fused_op = "Relu", "Relu"

        def match(self, graph, node):
            return answer

    graph = Graph.from_model(ex.elimination("identity"))
    graph.resolve()
    with pytest.raises(TransformerError, match="return a Match .*a str .*or None"):
        Wrong().apply(graph)


def test_the_run_order_is_ort_order_whatever_the_registration_order():
    """graph_transformer_utils.cc's order (registry.ORT_ORDER, ORT_RULE_ORDER) is the one source: a class
    registered again (last in registration order) keeps its place; an unlisted one runs after ORT's."""
    from ortlab.transformers import registry

    first_rule, first_fusion = registry.RULES["EliminateIdentity"], registry.TRANSFORMERS["ConstantSharing"]
    try:
        registry.unregister("EliminateIdentity")
        registry.unregister("ConstantSharing")
        registry.register_rule(first_rule[0])(first_rule[1])
        registry.register_transformer(first_fusion[0], first_fusion[2])(first_fusion[1])
        rules = [cls.__name__ for _, cls in registry.in_ort_order(registry.RULES)]
        fusions = [cls.__name__ for _, cls, _ in registry.in_ort_order()]
        assert rules[:len(registry.ORT_RULE_ORDER)] == registry.ORT_RULE_ORDER
        assert fusions[:len(registry.ORT_ORDER)] == registry.ORT_ORDER
        assert rules[-1] == "NoopReshapeElimination"  # ortlab's own rule, after ORT's
        from ortlab.transformers import GraphTransformerManager
        (rule_based, *_) = GraphTransformerManager.from_registry(level=1).transformers[1]
        assert [type(r).__name__ for r in rule_based.rules] == rules
    finally:
        registry.register_rule(first_rule[0])(first_rule[1])
        registry.register_transformer(first_fusion[0], first_fusion[2])(first_fusion[1])

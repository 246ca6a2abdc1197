"""ortlab's transformers and gradient builders at every opset torch exports by default (14 to 17),
each checked against ORT 1.19.2 on the same model: its optimized graph (CPU EP) and its C++
GradientGraphBuilder.

What changes across these opsets for them: torch exports nn.LayerNorm as a LayerNormalization
node only from opset 17 (ONNX's LayerNormalization-17), as the decomposed ReduceMean/Sub/Pow/...
subgraph below; ORT's LayerNormFusion fuses that subgraph at every opset into LayerNormalization
of the ONNX domain, which below 17 is ORT's own registration of the op. The elementwise ops get
new versions at 14 (Add, Sub, Mul, Div, Relu, Reshape, Identity), Pow at 15, Where at 16; the
axes/split inputs of ReduceSum, Squeeze, Unsqueeze, Split and the Softmax axis semantics changed
at 13, and ReduceMean's axes and Split's num_outputs at 18 (the small opset-18 section at the end).
"""
import numpy as np
import onnx
import pytest
import torch
from onnx import numpy_helper

import ortcheck
from gradient_cases import CASES as GRADIENT_CASES
from gradient_cases import Case, const, x
from ortlab import OrtlabError, models, session
from ortlab.gradients import build_gradient_graph, ort_gradient_graph
from ortlab.walkthroughs import graph_transformers as compare
from ortlab.walkthroughs import graph_transformers as ex
from ortlab.transformers import optimize, optimize_for_training
from ortlab.ops.contrib_ops import reference_run
from test_gradients import ORT_LACKS, ORT_WRONG

OPSETS = [14, 15, 16, 17]
CPU = ["CPUExecutionProvider"]
# The op types a fusion emits or an elimination removes (as in test_transformers.py)
COUNTED = ["LayerNormalization", "com.microsoft:Gelu", "com.microsoft:BiasGelu", "com.microsoft:FusedMatMul",
           "Gemm", "com.microsoft:FusedGemm", "MatMul", "Identity", "Dropout", "Erf", "Pow", "ReduceMean"]


def at_opset(model, opset):
    """A copy of a hand-built model importing ONNX opset `opset` (its nodes are valid at 14 to 17)."""
    model = onnx.ModelProto.FromString(model.SerializeToString())
    for imp in model.opset_import:
        if imp.domain in ("", "ai.onnx"):
            imp.version = opset
    return model


def default_opset(model):
    return next(i.version for i in model.opset_import if i.domain in ("", "ai.onnx"))


def run(model, feeds):
    return dict(zip([o.name for o in model.graph.output], ortcheck.run(model, feeds)))


def assert_same_outputs(original, optimized, feeds):
    want, got = run(original, feeds), run(optimized, feeds)
    assert list(want) == list(got)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


def ort_optimized(model):
    return session.optimized_model(model, "extended", providers=CPU)


# --- LayerNorm from torch: nn.LayerNorm and a hand-written decomposition --------------------------

class HandLayerNorm(torch.nn.Module):
    """LayerNorm written out: torch exports it as the decomposed subgraph at every opset."""

    def __init__(self, d=8):
        super().__init__()
        self.w, self.b = torch.nn.Parameter(torch.randn(d)), torch.nn.Parameter(torch.randn(d))

    def forward(self, x):
        d = x - x.mean(-1, keepdim=True)
        return d / torch.sqrt(d.pow(2).mean(-1, keepdim=True) + 1e-5) * self.w + self.b


@pytest.fixture(scope="module")
def layer_norms():
    """{(kind, opset): (model, feeds)} for torch's nn.LayerNorm and HandLayerNorm, exported."""
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8)
    out = {}
    layer_norm = torch.nn.LayerNorm(8)
    with torch.no_grad():
        layer_norm.weight.normal_()
        layer_norm.bias.normal_()
    for kind, module in (("nn.LayerNorm", layer_norm), ("hand-written", HandLayerNorm())):
        for opset in OPSETS:
            out[kind, opset] = models.export(module, (x,), opset=opset), {"input_0": x.numpy()}
    return out


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("kind", ["nn.LayerNorm", "hand-written"])
def test_layer_norm_fuses_into_onnx_domain_layer_normalization_as_ort_does(layer_norms, kind, opset):
    model, feeds = layer_norms[kind, opset]
    exported = ex.op_counts(model)
    torch_emits_it = kind == "nn.LayerNorm" and opset >= 17
    assert ("LayerNormalization" in exported) == torch_emits_it, exported
    ours, theirs = optimize(model, providers=CPU), ort_optimized(model)
    for m in (ours, theirs):
        assert ex.op_counts(m) == {"LayerNormalization": 1}
        assert default_opset(m) == opset  # the model's imports are left alone: no opset 17 needed
        (node,) = m.graph.node
        assert node.domain in ("", "ai.onnx")
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        assert attrs["axis"] == -1 and attrs["epsilon"] == pytest.approx(1e-5)
        # fused by LayerNormFusion: the training build adds the saved mean and inverse std
        assert len(node.output) == (1 if torch_emits_it else 3)
    table = compare.side_by_side(model, 2, changed_only=False)
    assert all(row[2] == row[3] for row in table.rows), table.rows
    assert_same_outputs(model, ours, feeds)
    assert_same_outputs(model, theirs, feeds)


# --- the hand-built examples of test_transformers.py, at each opset -------------------------------

# (case id, model, op type the case is about); ORT 1.19.2 agrees with ortlab on each at opset 17
EXAMPLES = [
    ("layernorm", ex.layer_norm(), "LayerNormalization"),
    ("layernorm-axis1", ex.layer_norm(axis=1), "LayerNormalization"),
    # ORT fuses what is left into its SimplifiedLayerNormalization (SimplifiedLayerNormFusion, which
    # ortlab does not have) at every opset: only the LayerNormalization count is compared
    ("layernorm-shared-sub", ex.layer_norm(shared_sub=True), "LayerNormalization"),
    ("layernorm-2d-scale", ex.layer_norm(scale_2d=True), "LayerNormalization"),
    ("gelu", ex.gelu(), "com.microsoft:Gelu"),
    ("gelu-half-first", ex.gelu(form="half_first"), "com.microsoft:Gelu"),
    ("biasgelu", ex.gelu(bias="1d"), "com.microsoft:BiasGelu"),
    ("matmuladd", ex.matmul_add(), "Gemm"),
    ("matmuladd-3d", ex.matmul_add(a_shape=(2, 3, 4)), "Gemm"),
    ("gemm-relu", ex.matmul_add(activation="Relu"), "com.microsoft:FusedGemm"),
    ("transpose-matmul", ex.matmul_transpose(), "com.microsoft:FusedMatMul"),
    ("matmul-div", ex.matmul_transpose(scale=2.0), "com.microsoft:FusedMatMul"),
    ("mul-matmul", ex.matmul_transpose(scale=2.0, scale_position="before"), "com.microsoft:FusedMatMul"),
    ("identity", ex.elimination("identity"), "Identity"),
    ("dropout-ratio0", ex.elimination("dropout_ratio0_training"), "Dropout"),
    ("dropout-training", ex.elimination("dropout_training"), "Dropout"),
    ("cast-same-type", ex.elimination("cast_same"), "Cast"),
    ("cse", ex.constants_and_duplicates(), "Relu"),
    ("constant-folding", ex.constants_and_duplicates(), "Add"),
]


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("case", EXAMPLES, ids=[c[0] for c in EXAMPLES])
def test_example_matches_ort_at_opset(case, opset):
    _, model, op = case
    model = at_opset(model, opset)
    table = compare.side_by_side(model, 2, changed_only=False)
    counts = {row[0]: row[1:] for row in table.rows}
    compared = [op] if case[0] == "layernorm-shared-sub" else COUNTED + [op]
    for name in set(compared) & set(counts):
        original, ours, theirs = counts[name]
        assert ours == theirs, (name, counts)
    assert_same_outputs(model, optimize(model, providers=CPU), ex.feeds(model))


# CUDA-only fusions (ORT's CPU EP has no BiasSoftmax or BiasDropout kernel): asked for by name and
# checked with the reference kernels; BiasSoftmaxFusion reads the Softmax axis as opset 13+ defines it
@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("build, fused", [(ex.bias_softmax, "com.microsoft:BiasSoftmax"),
                                          (ex.bias_dropout, "com.microsoft:BiasDropout")], ids=["softmax", "dropout"])
def test_cuda_bias_fusions_at_opset(build, fused, opset):
    model = at_opset(build(), opset)
    ours = optimize(model, names=["BiasSoftmaxFusion", "BiasDropoutFusion"])
    assert ex.op_counts(ours) == {fused: 1}
    want, got = run(model, ex.feeds(model)), reference_run(ours, ex.feeds(model))
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)


# --- the model zoo exported at each opset: fusions as ORT's, outputs unchanged ---------------------

@pytest.fixture(scope="module")
def zoo():
    """{(name, opset): (export with the loss, weight names, feeds, torch's weight gradients)}:
    the MLP exported for inference; the transformers for training (as ORTModule exports them),
    dropout 0 so that torch and ORT draw no masks."""
    out = {}
    for name in models.ZOO:
        model = models.get(name) if name == "mlp" else models.get(name, dropout=0.0)
        inputs = model.example_inputs()
        model.zero_grad()
        model(*inputs).backward()
        params = dict(model.named_parameters())
        expected = {w: p.grad.numpy() for w, p in params.items()}
        feeds = {n: t.numpy() for n, t in zip(model.input_names, inputs)}
        for opset in OPSETS:
            onx = models.export(model, inputs, training=name != "mlp", opset=opset)
            weights = [i.name for i in onx.graph.initializer if i.name in params]
            out[name, opset] = onx, weights, feeds, expected
    return out


@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("name", list(models.ZOO))
def test_zoo_fusions_match_ort_at_opset(zoo, name, opset):
    model, _, feeds, _ = zoo[name, opset]
    assert default_opset(model) == opset
    ours = optimize(model, providers=CPU)
    mine, theirs = ex.op_counts(ours), ex.op_counts(ort_optimized(model))
    for op in COUNTED:
        assert mine.get(op, 0) == theirs.get(op, 0), (op, mine, theirs)
    if name != "mlp":
        assert mine["LayerNormalization"] == 5 and mine["com.microsoft:BiasGelu"] == 2
        assert "ReduceMean" not in mine and "Pow" not in mine
    assert_same_outputs(model, ours, feeds)


# gradients of the transformers' weights: of the fused graph (LayerNormalizationGrad, below opset 17
# too) at each opset, and of the exported graph (ReduceMean, Pow, Sqrt... builders) at 14
ZOO_GRADIENTS = [(n, o, "fused") for n in ("bert", "gpt") for o in OPSETS] + [(n, 14, "exported")
                                                                             for n in ("bert", "gpt")]


@pytest.mark.parametrize("name, opset, graph", ZOO_GRADIENTS, ids=["-".join(map(str, p)) for p in ZOO_GRADIENTS])
def test_zoo_gradients_equal_torch_and_ort_at_opset(zoo, name, opset, graph):
    onx, weights, feeds, expected = zoo[name, opset]
    model = onx
    if graph == "fused":
        model, _ = optimize_for_training(onx, weights)
        assert ex.op_counts(model)["LayerNormalization"] == 5
    ours = run(build_gradient_graph(model, weights, "loss"), feeds)
    theirs = run(ort_gradient_graph(model, weights, "loss"), feeds)
    for w in weights:
        np.testing.assert_allclose(ours[f"{w}_grad"], expected[w], rtol=1e-4, atol=1e-5, err_msg=w)
        np.testing.assert_allclose(theirs[f"{w}_grad"], expected[w], rtol=1e-4, atol=1e-5, err_msg=w)


# --- gradient builders: the one-op cases of test_gradients.py at each opset ------------------------

@pytest.mark.parametrize("opset", OPSETS)
@pytest.mark.parametrize("case", GRADIENT_CASES, ids=lambda c: c.id)
def test_op_gradient_equals_torch_and_ort_at_opset(case, opset):
    model = at_opset(case.model(), opset)
    expected = case.torch_gradients()
    got = run(build_gradient_graph(model, case.x_names, "loss"), case.feeds)
    for name in case.x_names:
        np.testing.assert_allclose(got[f"{name}_grad"], expected[name], rtol=1e-4, atol=1e-5, err_msg=name)
    try:
        theirs = run(ort_gradient_graph(model, case.x_names, "loss"), case.feeds)
    except OrtlabError:
        assert case.id in ORT_LACKS, f"ORT could not build {case.id} at opset {opset}"
        return
    assert case.id not in ORT_LACKS, f"ORT now builds {case.id} at opset {opset}"
    agree = all(np.allclose(got[f"{n}_grad"], theirs[f"{n}_grad"], rtol=1e-4, atol=1e-5) for n in case.x_names)
    assert agree == (case.id not in ORT_WRONG)


# --- opset 18: ReduceMean's axes become an input, Split gains num_outputs ------------------------

OPSET_18 = [
    Case("ReduceMean", [x(2, 3, 4), const(np.array([-1]))], lambda a, s: a.mean(-1, keepdim=True),
         id="ReduceMean-axes-input"),
    Case("ReduceMean", [x(2, 3, 4), const(np.array([0, 2]))], lambda a, s: a.mean((0, 2)), {"keepdims": 0},
         id="ReduceMean-axes-input-keepdims0"),
    Case("Split", [x(2, 4)], lambda a: torch.split(a, [2, 2], 1), {"axis": 1, "num_outputs": 2}, outputs=2,
         id="Split-num-outputs"),
]


@pytest.mark.parametrize("case", OPSET_18, ids=lambda c: c.id)
def test_opset_18_signatures(case):
    model = at_opset(case.model(), 18)
    expected = case.torch_gradients()
    for build in (build_gradient_graph, ort_gradient_graph):
        got = run(build(model, case.x_names, "loss"), case.feeds)
        for name in case.x_names:
            np.testing.assert_allclose(got[f"{name}_grad"], expected[name], rtol=1e-4, atol=1e-5,
                                       err_msg=f"{build.__name__}: {name}")


def layer_norm_at_18(axis):
    """ex.layer_norm at opset 18, where ReduceMean takes its axes as an input."""
    model = at_opset(ex.layer_norm(axis=axis), 18)
    model.graph.initializer.append(numpy_helper.from_array(np.array([axis], np.int64), "axes"))
    for node in model.graph.node:
        if node.op_type == "ReduceMean":
            del node.attribute[:]
            node.input.append("axes")
    return model


@pytest.mark.parametrize("axis, fuses", [(-1, True), (1, False)])
def test_layer_norm_fusion_reads_reduce_mean_axes_from_the_input_at_opset_18(axis, fuses):
    model = layer_norm_at_18(axis)
    ours, theirs = optimize(model, providers=CPU), ort_optimized(model)
    assert ex.op_counts(ours) == ex.op_counts(theirs)
    assert ("LayerNormalization" in ex.op_counts(ours)) == fuses
    assert_same_outputs(model, ours, ex.feeds(model))

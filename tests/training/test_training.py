"""MiniORTModule against torch autograd; the schema and re-export rules; bad input.

The reference is always the same module run by plain PyTorch (autograd), never ortlab's output.
"""
import copy

import pytest
import torch

from ortlab import OrtlabError, models
from ortlab.training import ExportError, MiniORTModule, SchemaError
from ortlab.training.io import flatten_inputs

TOL = dict(rtol=1e-4, atol=1e-6)


def _grads(module):
    return {n: p.grad for n, p in module.named_parameters()}


def _assert_same_gradients(reference, wrapped):
    theirs = _grads(reference)
    for name, grad in _grads(wrapped.module).items():
        assert grad is not None, f"no gradient for {name}"
        torch.testing.assert_close(grad, theirs[name], **TOL, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("builder", ["ort", "ortlab"])
@pytest.mark.parametrize("name, kwargs", [("mlp", {}), ("bert", {}), ("gpt", {}),
                                          ("gpt", {"tie_embeddings": True})])
def test_loss_and_every_parameter_gradient_equal_torch(name, kwargs, builder):
    reference = models.get(name, dropout=0.0, **kwargs)
    wrapped = MiniORTModule(copy.deepcopy(reference), gradient_builder=builder)
    x, y = reference.example_inputs()
    expected, got = reference(x, y), wrapped(x, y)
    expected.backward()
    got.backward()
    torch.testing.assert_close(got, expected, **TOL)
    _assert_same_gradients(reference, wrapped)
    if kwargs.get("tie_embeddings"):
        assert wrapped.module.lm_head.weight is wrapped.module.tok.weight
        assert "lm_head.weight" not in wrapped._transition.model.parameter_names  # fed once


Nested = models.NestedIO


def _nested_inputs(seed=0, batch=5):
    g = torch.Generator().manual_seed(seed)
    left, right = torch.randn(batch, 4, generator=g), torch.randn(batch, 4, generator=g)
    return (left, right.requires_grad_()), {"bias": torch.randn(3, generator=g), "unused": None}


@pytest.mark.parametrize("builder", ["ort", "ortlab"])
def test_nested_inputs_and_outputs_keep_their_structure_and_gradients(builder):
    reference = Nested()
    wrapped = MiniORTModule(copy.deepcopy(reference), gradient_builder=builder)
    results = []
    for module in (reference, wrapped):
        pair, extras = _nested_inputs()
        out = module(pair, extras, scale=2.0)
        (out["h"].pow(2).sum() + out["pair"][0].sum()).backward()
        results.append((out, pair[1].grad))
    (expected, expected_dx), (got, got_dx) = results
    assert set(got) == {"h", "pair", "nothing", "n"} and got["nothing"] is None and got["n"] == 3
    torch.testing.assert_close(got["h"], expected["h"], **TOL)
    assert got["pair"][1].dtype == torch.int64 and int(got["pair"][1]) == int(expected["pair"][1])
    torch.testing.assert_close(got_dx, expected_dx, **TOL)  # a user input that requires grad
    _assert_same_gradients(reference, wrapped)


def test_a_non_tensor_argument_is_baked_in_and_its_change_reexports():
    reference, wrapped = Nested(), None
    wrapped = MiniORTModule(copy.deepcopy(reference))
    pair, extras = _nested_inputs()
    for scale, mode in [(2.0, "sum"), (2.0, "sum"), (3.0, "sum"), (3.0, "max")]:
        with torch.no_grad():
            torch.testing.assert_close(wrapped(pair, extras, scale, mode)["h"],
                                       reference(pair, extras, scale, mode)["h"], **TOL)
    assert len(wrapped.exports) == 3
    assert wrapped.exports[1] == ["args[2]: value 2.0 -> value 3.0"]
    assert wrapped.exports[2] == ["args[3]: value 'sum' -> value 'max'"]


def test_reexport_only_when_the_schema_changes():
    model = MiniORTModule(models.get("mlp", dropout=0.0))
    x, y = model.module.example_inputs(batch=8)
    model(x).sum().backward()
    model(model.module.example_inputs(batch=3, seed=1)[0])        # other shape, same schema
    assert len(model.exports) == 1 and model.exports[0] == ["first call: nothing exported yet"]
    with torch.no_grad():
        model(x + 1)                                              # same again
        assert len(model.exports) == 1
        model.module.double()
        model(x.double())                                         # dtype
        model.module.float()
        model(x[None])                                            # rank
    model(x.clone().requires_grad_())                             # requires_grad
    model(x, labels=y)                                            # structure: a keyword now
    model.eval()
    model(x, labels=y)                                            # train -> eval
    reasons = [r[0] for r in model.exports[1:]]
    assert reasons[0] == "args[0]: float32, rank 2 -> float64, rank 2"
    assert reasons[1] == "args[0]: float64, rank 2 -> float32, rank 3"
    assert reasons[2] == "args[0]: float32, rank 3 -> float32, rank 2, requires_grad"
    assert reasons[3].startswith("input structure changed")
    assert reasons[4] == "module mode: train -> eval"
    assert len(model.exports) == 6


def test_torch_optimizer_hooks_and_zero_grad_work_unchanged():
    def run(wrap):
        torch.manual_seed(0)
        module = models.get("bert", dropout=0.0)
        model = wrap(module)
        seen = []
        module.classifier.weight.register_hook(lambda g: seen.append(g.norm().item()))
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        losses = []
        for step in range(4):
            optimizer.zero_grad()
            loss = model(*module.example_inputs(seed=step))
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        return losses, seen

    (ort_losses, ort_seen), (torch_losses, torch_seen) = run(MiniORTModule), run(lambda m: m)
    assert len(ort_seen) == 4
    torch.testing.assert_close(ort_losses, torch_losses, rtol=1e-4, atol=0)
    torch.testing.assert_close(ort_seen, torch_seen, rtol=1e-4, atol=0)


def test_frozen_parameters_get_no_gradient_and_a_new_training_graph():
    model = MiniORTModule(models.get("mlp", dropout=0.0))
    x, y = model.module.example_inputs()
    model(x, y).backward()
    model.module.net[0].weight.requires_grad_(False)
    model.module.zero_grad(set_to_none=True)
    model(x, y).backward()
    assert model.module.net[0].weight.grad is None and model.module.net[3].weight.grad is not None
    assert len(model.exports) == 1 and len(model._managers) == 2


def test_inference_under_no_grad_runs_forward_only():
    reference = models.get("gpt", dropout=0.0)
    model = MiniORTModule(copy.deepcopy(reference)).eval()
    ids, _ = reference.eval().example_inputs()
    with torch.no_grad():
        torch.testing.assert_close(model(ids), reference(ids), **TOL)
    assert list(model._managers) == ["inference"]


def test_dropout_masks_are_stashed_so_backward_matches_forward():
    """With dropout the mask of the forward run must reach the backward: dx = dy·mask/(1-p)."""
    class Drop(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(x)

    model = MiniORTModule(Drop())
    x = torch.ones(64, 8, requires_grad=True)
    y = model(x)
    y.backward(torch.ones_like(y))
    kept = y.detach() != 0
    assert 0 < kept.float().mean() < 1
    torch.testing.assert_close(x.grad, kept.float() * 2.0)
    assert any("Dropout" in s for s in model.stashed())


def test_bad_input_is_explained():
    with pytest.raises(OrtlabError, match="wraps a torch.nn.Module, not function"):
        MiniORTModule(lambda x: x)
    with pytest.raises(SchemaError, match="args\\[1\\] is a ndarray"):
        flatten_inputs((torch.ones(2), __import__("numpy").ones(2)), {})

    class Unexportable(torch.nn.Module):
        def forward(self, x):
            return torch.special.bessel_j0(x)  # no ONNX symbolic in torch 2.6

    with pytest.raises(ExportError, match="special_bessel_j0.*no fallback"):
        MiniORTModule(Unexportable())(torch.ones(3))


class _Embed(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.e, self.ln, self.l = torch.nn.Embedding(10, 8), torch.nn.LayerNorm(8), torch.nn.Linear(8, 3)

    def forward(self, ids):
        return torch.nn.functional.gelu(self.l(self.ln(self.e(ids))), approximate="tanh").softmax(-1)


class _MHA(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.m = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, x):
        return self.m(x, x, x)[0]


class _Encoder(torch.nn.Module):
    def __init__(self):
        super().__init__()
        layer = torch.nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
        self.t = torch.nn.TransformerEncoder(layer, 1, enable_nested_tensor=False)

    def forward(self, x):
        return self.t(x)


@pytest.mark.parametrize("builder", ["ort", "ortlab"])
@pytest.mark.parametrize("make, inputs", [
    (_Embed, lambda: (torch.randint(0, 10, (2, 5)),)),       # torch's LayerNormalization op, tanh GELU
    (_MHA, lambda: (torch.randn(2, 4, 8),)),                  # nn.MultiheadAttention
    (_Encoder, lambda: (torch.randn(2, 5, 16),)),             # nn.TransformerEncoder
], ids=["embedding-layernorm-gelu", "multihead-attention", "transformer-encoder"])
def test_torch_nn_layers_train_like_torch(make, inputs, builder):
    torch.manual_seed(0)
    reference = make()
    wrapped = MiniORTModule(copy.deepcopy(reference), gradient_builder=builder)
    x = inputs()
    reference(*x).pow(2).sum().backward()
    wrapped(*x).pow(2).sum().backward()
    for (name, p), q in zip(reference.named_parameters(), wrapped.module.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_an_op_without_a_gradient_is_named():
    from ortlab.gradients import OrtGradientError, UnknownGradientError

    gru = torch.nn.GRU(4, 6, batch_first=True)
    x = torch.randn(2, 3, 4)
    with pytest.raises(OrtGradientError, match="not been registered: GRU"):
        MiniORTModule(copy.deepcopy(gru))(x)[0].sum().backward()
    with pytest.raises(UnknownGradientError, match="no gradient builder is registered for GRU"):
        MiniORTModule(copy.deepcopy(gru), gradient_builder="ortlab")(x)[0].sum().backward()


class _PassThrough(torch.nn.Module):
    """Returns an input unchanged next to a computed value; takes an unused tensor keyword."""

    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(3, 3)

    def forward(self, x, unused=None):
        return x, self.l(x)


class _KeywordOnly(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.l = torch.nn.Linear(3, 1)

    def forward(self, *, x, w=2.0):
        return (self.l(x) * w).sum()


class _ReturnsParameter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.linspace(0.5, 1.5, 3))

    def forward(self, x):
        return x * self.w, self.w


@pytest.mark.parametrize("builder", ["ort", "ortlab"])
@pytest.mark.parametrize("make, args, kwargs", [
    (_PassThrough, (torch.randn(2, 3).requires_grad_(),), {"unused": torch.ones(1)}),
    (_KeywordOnly, (), {"x": torch.randn(4, 3), "w": 3.0}),
    (_ReturnsParameter, (torch.randn(2, 3),), {}),
], ids=["input-returned", "keyword-only", "parameter-returned"])
def test_unusual_signatures_and_outputs(make, args, kwargs, builder):
    torch.manual_seed(0)
    reference = make()
    wrapped = MiniORTModule(copy.deepcopy(reference), gradient_builder=builder)
    grads = []
    for module in (reference, wrapped):
        a, k = copy.deepcopy((args, kwargs))
        out = module(*a, **k)
        sum(t.pow(2).sum() for t in (out if isinstance(out, tuple) else (out,))).backward()
        grads.append([t.grad for t in a if t.requires_grad])
    for p, q in zip(reference.parameters(), wrapped.module.parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6)
    for g, h in zip(*grads):
        torch.testing.assert_close(h, g, rtol=1e-4, atol=1e-6)


class _Flip(torch.nn.Module):
    """Data-dependent control flow: the branch depends on the input's values."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(3))

    def forward(self, x):
        s = (x * self.w).sum()
        return s * 2 if s > 0 else -s * 32


def test_data_dependent_control_flow_is_refused_naming_the_warning_and_the_line():
    from ortlab.training.graph_transition_manager import TracerWarningError

    assert _Flip()(-torch.ones(3)).item() == 96.0  # PyTorch takes the other branch for this input
    wrapped = MiniORTModule(_Flip())
    with pytest.raises(TracerWarningError, match=r"test_training\.py:\d+ \(return s \* 2 if s > 0 else "
                                                 r"-s \* 32\): torch\.jit\.TracerWarning: Converting a "
                                                 r"tensor to a Python boolean.*torch\.where"):
        wrapped(torch.ones(3))


def test_other_tracer_warnings_of_the_module_are_shown():
    class Constant(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.ones(3))

        def forward(self, x):
            return (x * self.w * torch.tensor(x.shape[0])).sum()

    with pytest.warns(RuntimeWarning, match=r"torch\.jit\.TracerWarning at .*test_training\.py:\d+"):
        MiniORTModule(Constant())(torch.ones(3))


@pytest.mark.parametrize("kwargs, words", [
    (dict(module=42), "wraps a torch.nn.Module, not int"),
    (dict(module=None), "wraps a torch.nn.Module, not NoneType"),
    (dict(level="fast"), "level must be one of \\['disable', 'basic', 'extended', 'all'\\].*not 'fast'"),
    (dict(level=None), "level must be one of"),
    (dict(gradient_builder="torch"), "gradient_builder must be one of \\('ort', 'ortlab'\\).*not 'torch'"),
    (dict(providers=["GPU"]), "providers must be a list of the execution providers"),
    (dict(opset="17"), "opset must be an int"),
])
def test_bad_constructor_arguments_are_refused_at_once(kwargs, words):
    kwargs = {"module": torch.nn.Linear(3, 1), **kwargs}
    with pytest.raises(OrtlabError, match=words):
        MiniORTModule(**kwargs)  # refused here, not at the first forward


def test_one_provider_may_be_given_as_a_str():
    wrapped = MiniORTModule(torch.nn.Linear(3, 1), providers="CPUExecutionProvider")
    assert wrapped.providers == ["CPUExecutionProvider"]
    assert wrapped(torch.ones(2, 3)).shape == (2, 1)

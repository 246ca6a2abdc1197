"""MiniORTModule against plain PyTorch and the real ORTModule, where a wrong answer would be silent:
eval mode, Embedding's padding_idx, a forward that updates a buffer, unsupported outputs, and a
loss whose ignore_index is computed in forward. Both configurations of MiniORTModule: ORT's
gradient builder with ORT's runtime, and ortlab's builder with ortlab's engine.

Tests named `test_ortmodule_*` pin what ORTModule 1.19.2 itself does (ORT's behaviour).
"""
import copy
import warnings

import pytest
import torch
import torch.nn.functional as F

from ortlab.errors import OrtlabError
from ortlab.training import MiniORTModule, SchemaError
from ortlab.ortmodule import driver as om
from ortlab.training.graph_transition_manager import StateUpdateError
from ortlab.ortmodule.training_agent import ModuleTrainingAgent, torch_gradients

CONFIGS = {"ort": dict(gradient_builder="ort"),
           "ortlab": dict(gradient_builder="ortlab", runtime="ortlab")}


@pytest.fixture(params=sorted(CONFIGS))
def wrap(request):
    return lambda module: MiniORTModule(module, **CONFIGS[request.param])


def ortmodule(module):
    """The real ORTModule, fallback to PyTorch disabled (a failure raises instead of hiding)."""
    from onnxruntime.training.ortmodule import ORTModule

    with om.ortmodule_env(FALLBACK_POLICY="FALLBACK_DISABLE", LOG_LEVEL="ERROR"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return ORTModule(module)


def _grads(module):
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


# --- eval mode ---------------------------------------------------------------------------------

class DropoutNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.dropout = torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.dropout(self.linear(x))


def test_eval_mode_stays_eval_across_calls_with_and_without_no_grad(wrap):
    torch.manual_seed(0)
    module = DropoutNet().eval()
    x = torch.randn(16, 8)
    expected = module(x).detach()
    wrapped = wrap(copy.deepcopy(module))
    assert not wrapped.training  # taken from the module, as ORTModule's constructor does
    for _ in range(3):
        with torch.no_grad():
            torch.testing.assert_close(wrapped(x), expected)
        torch.testing.assert_close(wrapped(x).detach(), expected)
        assert not wrapped.module.training and not wrapped.module.dropout.training and not wrapped.training


def test_train_after_eval_drops_out_and_backpropagates_through_the_mask(wrap):
    torch.manual_seed(0)
    module = DropoutNet().eval()
    x = torch.randn(16, 8, requires_grad=True)
    kept = module(x).detach()
    wrapped = wrap(module)
    with torch.no_grad():
        wrapped(x)
    wrapped.train()
    assert wrapped.module.training and wrapped.module.dropout.training
    y = wrapped(x)
    mask = y.detach() != 0
    assert 0 < mask.float().mean() < 1  # something was dropped, something kept
    torch.testing.assert_close(y.detach()[mask], 2 * kept[mask])  # torch's Dropout scales by 1/(1-p)
    y.sum().backward()
    # d sum(mask * 2 * (x W^T + b)) / dx = (2 * mask) W: torch's own maths on the observed mask
    torch.testing.assert_close(x.grad, (2.0 * mask) @ module.linear.weight.detach())


def test_ortmodule_keeps_eval_mode():
    """ORT's behaviour: ORTModule runs an eval module as eval (no dropout), and stays in eval."""
    torch.manual_seed(0)
    module = DropoutNet().eval()
    x = torch.randn(16, 8)
    expected = module(x).detach()
    wrapped = ortmodule(copy.deepcopy(module))
    for _ in range(2):
        with torch.no_grad():
            torch.testing.assert_close(wrapped(x), expected)
        torch.testing.assert_close(wrapped(x).detach(), expected)
    assert not wrapped.training and not wrapped.module.training


# --- Embedding(padding_idx) --------------------------------------------------------------------

class Padded(torch.nn.Module):
    """An embedding with a padding row, weighted so that every row gets a distinct gradient."""

    def __init__(self, tied=False):
        super().__init__()
        self.embedding = torch.nn.Embedding(7, 4, padding_idx=2)
        self.tied = tied
        with torch.no_grad():
            self.embedding.weight[2] = torch.tensor([0.5, -1.0, 2.0, 0.25])  # a non-zero padding row

    def forward(self, ids):
        h = self.embedding(ids)
        out = (h * torch.linspace(0.5, 2.0, 4)).tanh()
        if self.tied:  # the weight read a second time, by a MatMul: its padding row does get a gradient there
            out = out @ self.embedding.weight.t()
        return out


PADDING_BATCHES = {
    "repeated": torch.tensor([[0, 2, 2, 5], [2, 1, 2, 2]]),
    "no_padding": torch.tensor([[0, 1, 3, 5], [6, 4, 1, 1]]),
    "all_padding": torch.full((2, 3), 2),
}


@pytest.mark.parametrize("tied", [False, True])
@pytest.mark.parametrize("batch", sorted(PADDING_BATCHES))
def test_embedding_padding_row_gets_no_gradient(wrap, batch, tied):
    torch.manual_seed(0)
    ids = PADDING_BATCHES[batch]
    module = Padded(tied)
    reference = copy.deepcopy(module)
    grad_out = torch.randn_like(reference(ids))
    reference(ids).backward(grad_out)
    wrapped = wrap(module)
    for _ in range(2):  # the second call reuses the export
        module.zero_grad()
        out = wrapped(ids)
        torch.testing.assert_close(out.detach(), reference(ids).detach())
        out.backward(grad_out)
        torch.testing.assert_close(module.embedding.weight.grad, reference.embedding.weight.grad)
    if not tied:
        assert torch.equal(module.embedding.weight.grad[2], torch.zeros(4))


def test_embedding_padding_in_eval_mode_and_under_an_optimizer(wrap):
    """eval() changes the export mode, not the padding rule; SGD steps keep the padding row as it was."""
    torch.manual_seed(0)
    ids = PADDING_BATCHES["repeated"]
    module = Padded().eval()
    reference = copy.deepcopy(module)
    wrapped = wrap(module)
    optimizers = [torch.optim.SGD(m.parameters(), lr=0.5) for m in (module, reference)]
    for _ in range(3):
        for model, optimizer in zip((wrapped, reference), optimizers):
            optimizer.zero_grad()
            model(ids).square().sum().backward()
            optimizer.step()
    torch.testing.assert_close(module.embedding.weight, reference.embedding.weight)
    torch.testing.assert_close(module.embedding.weight[2], torch.tensor([0.5, -1.0, 2.0, 0.25]))


def test_functional_embedding_with_padding_idx_on_an_input_weight(wrap):
    class Functional(torch.nn.Module):
        def forward(self, ids, table):
            return F.embedding(ids, table, padding_idx=0).sum(-1)

    ids = torch.tensor([[0, 1, 0, 3]])
    table = torch.randn(4, 3)
    expected_in = table.clone().requires_grad_()
    Functional()(ids, expected_in).sum().backward()
    given = table.clone().requires_grad_()
    wrap(Functional())(ids, given).sum().backward()
    torch.testing.assert_close(given.grad, expected_in.grad)
    assert torch.equal(given.grad[0], torch.zeros(3))


def test_training_agent_keeps_the_padding_row_out_too():
    """ModuleTrainingAgent (ORT's OrtModuleGraphBuilder and TrainingAgent) on the same export."""
    ids = PADDING_BATCHES["repeated"]
    module = Padded()
    grad_out = torch.randn(2, 4, 4)
    agent = ModuleTrainingAgent(module, ids)
    _, grads = agent.gradients(ids, grad_outputs=[grad_out])
    _, expected = torch_gradients(module, ids, grad_outputs=[grad_out])
    torch.testing.assert_close(grads["embedding.weight"], expected["embedding.weight"])


def test_ortmodule_keeps_the_padding_row_gradient_at_zero():
    """ORT's behaviour: its ATen embedding export keeps padding_idx (row 2 gets 0)."""
    ids = PADDING_BATCHES["repeated"]
    module, reference = Padded(), Padded()
    reference.load_state_dict(module.state_dict())
    grad_out = torch.randn(2, 4, 4)
    reference(ids).backward(grad_out)
    ortmodule(module)(ids).backward(grad_out)
    torch.testing.assert_close(module.embedding.weight.grad, reference.embedding.weight.grad)
    assert torch.equal(module.embedding.weight.grad[2], torch.zeros(4))


# --- a forward that updates a buffer -----------------------------------------------------------

class Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.register_buffer("count", torch.zeros((), dtype=torch.int64))

    def forward(self, x):
        self.count += 1
        return self.linear(x)


class MovingAverage(torch.nn.Module):
    def __init__(self, in_place):
        super().__init__()
        self.linear, self.in_place = torch.nn.Linear(4, 4), in_place
        self.register_buffer("average", torch.zeros(4))

    def forward(self, x):
        if self.in_place:
            self.average.mul_(0.9).add_(0.1 * x.mean(0).detach())
        else:
            self.average = 0.9 * self.average + 0.1 * x.mean(0).detach()
        return self.linear(x - self.average)


BUFFER_MODULES = {"count": Counter, "average_in_place": lambda: MovingAverage(True),
                  "average_assigned": lambda: MovingAverage(False),
                  "batchnorm_running_stats": lambda: torch.nn.Sequential(torch.nn.Linear(4, 4),
                                                                        torch.nn.BatchNorm1d(4))}
UPDATED = {"count": "count", "average_in_place": "average", "average_assigned": "average",
           "batchnorm_running_stats": "1.running_mean"}


@pytest.mark.parametrize("kind", sorted(BUFFER_MODULES))
def test_forward_updating_a_buffer_is_refused_and_the_buffer_left_as_it_was(wrap, kind):
    torch.manual_seed(0)
    module = BUFFER_MODULES[kind]()
    before = {n: b.clone() for n, b in module.named_buffers()}
    with pytest.raises(StateUpdateError, match=rf"buffer '{UPDATED[kind]}'.*cannot write it back") as info:
        wrap(module)(torch.randn(3, 4))
    assert isinstance(info.value, OrtlabError)
    for name, buffer in module.named_buffers():
        torch.testing.assert_close(buffer, before[name])


def test_reading_buffers_without_writing_them_still_trains(wrap):
    """BatchNorm in eval mode reads its running statistics and writes nothing: accepted."""
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    with torch.no_grad():
        module[1].running_mean.uniform_(-1, 1)
    module.eval()
    x = torch.randn(5, 4)
    with torch.no_grad():
        torch.testing.assert_close(wrap(copy.deepcopy(module))(x), module(x))


def test_ortmodule_freezes_a_buffer_its_forward_updates():
    """ORT's behaviour, silently wrong: after 3 steps PyTorch's counter reads 3, ORTModule's 1 (the
    export's trace ran forward once; the graph never writes the buffer back)."""
    torch.manual_seed(0)
    module = Counter()
    reference, wrapped = copy.deepcopy(module), ortmodule(module)
    for _ in range(3):
        x = torch.randn(3, 4)
        torch.testing.assert_close(wrapped(x), reference(x))  # the outputs don't read the counter
    assert reference.count.item() == 3
    assert module.count.item() == 1


# --- what the refusals name --------------------------------------------------------------------

class Box:
    def __init__(self, tensor):
        self.tensor = tensor


class ReturnsBox(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 2)

    def forward(self, x):
        return {"logits": self.linear(x), "extra": Box(x)}


def test_custom_output_class_is_named_with_the_supported_types(wrap):
    with pytest.raises(SchemaError) as info:
        wrap(ReturnsBox())(torch.randn(3, 2))
    message = str(info.value)
    assert "['extra']" in message and "Box" in message and "not support" in message
    assert "tensors, None, str, int, bool and float" in message and "no tensor at all" not in message


def test_ortmodule_refuses_a_custom_output_class_as_unsupported():
    """ORT's behaviour: its output flattening knows only tensors, primitives, sequences and mappings."""
    from onnxruntime.training.utils.torch_io_helper import extract_data_and_schema

    with pytest.raises(TypeError, match="Unsupported flatten data type"):
        extract_data_and_schema({"logits": torch.zeros(1), "extra": Box(None)})


class LastClassIgnored(torch.nn.Module):
    """A classifier whose last class means 'no label': ignore_index taken from the logits' size."""

    def __init__(self, loss="cross_entropy"):
        super().__init__()
        self.linear, self.loss = torch.nn.Linear(4, 5), loss

    def forward(self, x, y):
        logits = self.linear(x)
        if self.loss == "nll":
            return F.nll_loss(logits.log_softmax(-1), y, ignore_index=logits.size(-1) - 1)
        return F.cross_entropy(logits, y, ignore_index=logits.size(-1) - 1)


@pytest.mark.parametrize("loss", ["cross_entropy", "nll"])
def test_ignore_index_from_a_size_trains_like_pytorch(wrap, loss):
    torch.manual_seed(0)
    module = LastClassIgnored(loss)
    reference = copy.deepcopy(module)
    wrapped = wrap(module)
    for y in (torch.tensor([0, 4, 2, 4, 1, 3]), torch.tensor([4, 4, 1]), torch.tensor([3, 0, 1, 2])):
        x = torch.randn(len(y), 4)
        module.zero_grad(), reference.zero_grad()
        got, expected = wrapped(x, y), reference(x, y)
        got.backward(), expected.backward()
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(_grads(module), _grads(reference))


def test_ortmodule_trains_an_ignore_index_from_a_size():
    """ORT's behaviour: SoftmaxCrossEntropyLossInternal takes ignore_index as an input."""
    torch.manual_seed(0)
    module = LastClassIgnored()
    reference = copy.deepcopy(module)
    x, y = torch.randn(6, 4), torch.tensor([0, 4, 2, 4, 1, 3])
    got, expected = ortmodule(module)(x, y), reference(x, y)
    got.backward(), expected.backward()
    torch.testing.assert_close(got, expected)
    torch.testing.assert_close(_grads(module), _grads(reference))


def test_export_error_says_what_is_unsupported_without_the_torch_ir():
    """A computed ignore_index with label smoothing: torch's symbolic refuses label smoothing."""

    class Smoothed(LastClassIgnored):
        def forward(self, x, y):
            logits = self.linear(x)
            return F.cross_entropy(logits, y, ignore_index=logits.size(-1) - 1, label_smoothing=0.1)

    with pytest.raises(OrtlabError, match="does not support label_smoothing") as info:
        MiniORTModule(Smoothed())(torch.randn(3, 4), torch.tensor([0, 4, 1]))
    assert "Caused by" not in str(info.value) and "Torch IR" not in str(info.value)


# --- more of what a forward may do -------------------------------------------------------------

class StepCounter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear, self.steps = torch.nn.Linear(2, 2), 0

    def forward(self, x):
        self.steps += 1
        return self.linear(x)


def test_forward_changing_a_python_attribute_is_refused(wrap):
    module = StepCounter()
    with pytest.raises(StateUpdateError, match="Python attribute.*steps"):
        wrap(module)(torch.randn(3, 2))
    assert module.steps == 0


def test_ortmodule_changes_a_python_attribute_at_the_export_only():
    """ORT's behaviour, silently wrong: 3 steps, the counter reads 1 (PyTorch: 3)."""
    module = StepCounter()
    wrapped = ortmodule(module)
    for _ in range(3):
        wrapped(torch.randn(3, 2)).sum().backward()
    assert module.steps == 1


class ReturnsSizes(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(2, 3)

    def forward(self, x):
        y = self.linear(x)
        return {"y": y, "rows": y.shape[0], "shape": y.shape, "constant": 7, "ratio": 0.5}


def test_sizes_returned_by_forward_are_the_current_ones(wrap):
    """PyTorch returns each call's sizes; the graph computes them (not the export's values)."""
    module = ReturnsSizes()
    wrapped = wrap(copy.deepcopy(module))
    for rows in (3, 5, 1):
        x = torch.randn(rows, 2)
        got, expected = wrapped(x), module(x)
        assert got["rows"] == expected["rows"] == rows and type(got["rows"]) is int
        assert tuple(got["shape"]) == tuple(expected["shape"]) and (got["constant"], got["ratio"]) == (7, 0.5)
        torch.testing.assert_close(got["y"], expected["y"])
        got["y"].sum().backward()


def test_ortmodule_returns_a_size_as_the_current_value():
    """ORT's behaviour: the size is a graph output, returned as a 0-d tensor of the current value
    (a torch.Size in the outputs it cannot take: "ORTModule fails to extract schema")."""

    class ReturnsRows(ReturnsSizes):
        def forward(self, x):
            y = self.linear(x)
            return y, y.shape[0]

    wrapped = ortmodule(ReturnsRows())
    for rows in (3, 5):
        assert int(wrapped(torch.randn(rows, 2))[1]) == rows


def test_lazy_module_materializes_and_trains(wrap):
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.LazyLinear(3), torch.nn.Tanh())
    wrapped = wrap(module)
    x = torch.randn(4, 5)
    y = wrapped(x)
    y.sum().backward()
    reference = copy.deepcopy(module)
    reference.zero_grad()
    reference(x).sum().backward()
    torch.testing.assert_close(y.detach(), reference(x).detach())
    torch.testing.assert_close(module[0].weight.grad, reference[0].weight.grad)


def test_returning_an_input_and_one_tensor_twice(wrap):
    class Echo(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.linear = torch.nn.Linear(2, 2)

        def forward(self, x):
            y = self.linear(x)
            return x, y, y

    module = Echo()
    x = torch.randn(3, 2, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_()
    got, expected = wrap(copy.deepcopy(module))(x), module(x_ref)
    for g, e in zip(got, expected):
        torch.testing.assert_close(g.detach(), e.detach())
    (got[0].sum() + 2 * got[1].sum() + 3 * got[2].sum()).backward()
    (expected[0].sum() + 2 * expected[1].sum() + 3 * expected[2].sum()).backward()
    torch.testing.assert_close(x.grad, x_ref.grad)


def test_padding_idx_on_a_weight_computed_in_forward_is_refused(wrap):
    class Scaled(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Parameter(torch.randn(4, 3))

        def forward(self, ids):
            return F.embedding(ids, self.table * 2, padding_idx=0)

    with pytest.raises(OrtlabError, match="padding_idx reads a weight computed inside forward"):
        wrap(Scaled())(torch.tensor([0, 1, 0]))


def test_ignore_index_from_the_data_is_still_refused(wrap):
    """int(y.max()) is baked into the trace: another batch would ignore the wrong class."""
    from ortlab.training import TracerWarningError

    class FromData(LastClassIgnored):
        def forward(self, x, y):
            return F.cross_entropy(self.linear(x), y, ignore_index=int(y.max()))

    with pytest.raises(TracerWarningError, match="Python integer"):
        wrap(FromData())(torch.randn(3, 4), torch.tensor([0, 4, 1]))


def test_a_refused_forward_leaves_buffers_and_attributes_as_they_were(wrap):
    class Both(Counter):
        def forward(self, x):
            self.seen = x.shape[0]
            return super().forward(x)

    module = Both()
    with pytest.raises(StateUpdateError, match="buffer 'count'"):
        wrap(module)(torch.randn(3, 4))
    assert module.count.item() == 0 and not hasattr(module, "seen")

"""Small models and batches that make ORTModule's optional features visible (L1_07).

    HalfGradTanh               a torch.autograd.Function whose backward is half the true gradient
    HalfGradTanhNet            Linear -> HalfGradTanh (or plain tanh) -> Linear -> cross-entropy
    CheckpointedBert           TinyBert with each block under torch.utils.checkpoint.checkpoint
    MaskedBert                 TinyBert whose attention adds a mask before Softmax (HF-BERT style)
    FirstTokenClassifier       a per-token MLP whose loss reads one position of the sequence (BERT's CLS head)
    sparse_label_batches       TinyGPT batches whose labels are ignore_index at a chosen density
    padded_id_batches          TinyGPT batches whose input ids are right-padded with padding_idx

Each one is built so that one ORT pass has something to act on: the custom Function becomes a
PythonOp (ortmodule/_custom_autograd_function_exporter.py), the checkpoint a CheckpointFunction
PythonOp or a recompute plan (ortmodule/__init__.py's _override_gradient_checkpoint), the masked
attention matches ortmodule/graph_optimizers/_aten_attn.py's patterns, the padding feeds the
sparsity hooks of ortmodule/_graph_transition_manager.py, and the classifier's one-position slice
is what the compute optimizer's UpStreamGatherGraphTransformer moves upstream
(onnxruntime/core/optimizer/compute_optimizer/upstream_gather.h).
"""
import math

import torch
from torch import nn

from ortlab.errors import OrtlabError
from ortlab.models import SelfAttention, TinyBert, TinyGPT, seeded


class FeatureModelError(OrtlabError):
    """A feature model or batch maker was given something it cannot use."""


class HalfGradTanh(torch.autograd.Function):
    """tanh forward; backward deliberately returns half the true gradient, (1 - y²)·g / 2.

    The wrong gradient is the point: when ORT runs this Function as a PythonOp, training follows
    PyTorch exactly; when ORT inlines it as a Tanh (custom autograd support off), ORT builds the
    true TanhGrad and the losses drift away from PyTorch's.
    """

    @staticmethod
    def forward(ctx, x):
        y = torch.tanh(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * (1 - y * y) * 0.5


class HalfGradTanhNet(nn.Module):
    """Linear -> HalfGradTanh -> Linear -> cross-entropy; custom=False uses torch.tanh instead
    (the model ORT trains when it ignores the custom backward)."""

    input_names = ("x", "labels")

    @seeded
    def __init__(self, d_in=16, d_hidden=32, classes=4, custom=True):
        super().__init__()
        self.d_in, self.classes, self.custom = d_in, classes, custom
        self.a, self.b = nn.Linear(d_in, d_hidden), nn.Linear(d_hidden, classes)

    def forward(self, x, labels):
        h = self.a(x)
        h = HalfGradTanh.apply(h) if self.custom else torch.tanh(h)
        return nn.functional.cross_entropy(self.b(h), labels)

    def example_inputs(self, batch=8, seed=0):
        """(x, labels) drawn from a generator seeded with `seed`."""
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, self.d_in, generator=g)
        return x, torch.randint(0, self.classes, (batch,), generator=g)

    def __repr__(self):
        what = "HalfGradTanh" if self.custom else "torch.tanh"
        return f"HalfGradTanhNet(Linear({self.d_in}) -> {what} -> Linear({self.classes}) -> cross_entropy)"


class CheckpointedBert(TinyBert):
    """TinyBert with each block run through torch.utils.checkpoint.checkpoint(block, x, use_reentrant=...).

    The checkpoint function is looked up at call time, so ORT's override (installed when
    onnxruntime.training.ortmodule is imported, ortmodule/__init__.py) is the one called.
    """

    def __init__(self, use_reentrant=True, **kwargs):
        if not isinstance(use_reentrant, bool):
            raise FeatureModelError(f"use_reentrant must be True or False, not {use_reentrant!r}")
        super().__init__(**kwargs)
        self.use_reentrant = use_reentrant

    def _encode(self, input_ids):
        import torch.utils.checkpoint  # heavy: torch

        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.drop(self.ln(self.tok(input_ids) + self.pos(positions)))
        for block in self.blocks:
            x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.use_reentrant)
        return x


class MaskedAttention(SelfAttention):
    """softmax(q kᵀ / √d + bias) v with an additive bias buffer: the Div -> Add -> Softmax chain of
    HuggingFace BERT that ORT's efficient-attention patterns look for (graph_optimizers/_aten_attn.py)."""

    def __init__(self, d_model, heads, dropout, max_len=64):
        super().__init__(d_model, heads, dropout, causal=False, max_len=max_len)
        self.register_buffer("attn_bias", torch.zeros(1, 1, max_len, max_len), persistent=False)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d_head) + self.attn_bias[:, :, :s, :s]
        probs = self.dropout(torch.softmax(scores, dim=-1))
        return self.out(torch.matmul(probs, v).transpose(1, 2).reshape(b, s, d))


class MaskedBert(TinyBert):
    """TinyBert whose attention layers are MaskedAttention (same weights as TinyBert with the same seed)."""

    def __init__(self, seed=0, **kwargs):
        super().__init__(seed=seed, **kwargs)
        with torch.random.fork_rng():  # the global RNG stays untouched, the weights are TinyBert's
            for block in self.blocks:
                plain = block.attn
                d_model = plain.heads * plain.d_head
                masked = MaskedAttention(d_model, plain.heads, plain.dropout.p, self.max_len)
                masked.load_state_dict(plain.state_dict())
                block.attn = masked


class FirstTokenClassifier(nn.Module):
    """x [batch, seq, d_in] -> Linear -> GELU -> Linear -> logits of position 0 only -> cross-entropy.

    Every position goes through both Linear layers, and the loss reads one of them (h[:, 0], a Gather
    on the sequence axis): seq - 1 of every seq rows of the matrix products are wasted. ORT's compute
    optimizer moves the Gather above the matmuls, so they run on one row per sequence.
    """

    input_names = ("x", "labels")

    @seeded
    def __init__(self, d_in=16, d_hidden=64, classes=4):
        super().__init__()
        self.d_in, self.classes = d_in, classes
        self.a, self.b = nn.Linear(d_in, d_hidden), nn.Linear(d_hidden, classes)

    def forward(self, x, labels):
        logits = self.b(nn.functional.gelu(self.a(x)))
        return nn.functional.cross_entropy(logits[:, 0, :], labels)

    def example_inputs(self, batch=4, seq=32, seed=0):
        """(x [batch, seq, d_in], labels [batch]) drawn from a generator seeded with `seed`."""
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(batch, seq, self.d_in, generator=g)
        return x, torch.randint(0, self.classes, (batch,), generator=g)


def _check_fraction(value, name, low_open=True):
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise FeatureModelError(f"{name} must be a number between 0 and 1, not {value!r}")
    if not (0 < value <= 1 if low_open else 0 <= value < 1):
        bounds = "0 < {} <= 1" if low_open else "0 <= {} < 1"
        raise FeatureModelError(f"{name}={value} is out of range: need {bounds.format(name)}")
    return float(value)


def _check_count(value, name):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FeatureModelError(f"{name} must be a positive int, not {value!r}")
    return value


def sparse_label_batches(model, density, count=2, batch=4, seq=8, ignore_index=-100):
    """`count` TinyGPT batches (ids, labels) in which exactly round(density·batch·seq) labels are
    valid and the rest are ignore_index, at positions drawn by a seeded permutation."""
    if not isinstance(model, TinyGPT):
        raise FeatureModelError(f"sparse_label_batches needs a TinyGPT, not {type(model).__name__}")
    density = _check_fraction(density, "density")
    count = _check_count(count, "count")
    batches = []
    for seed in range(count):
        ids, labels = model.example_inputs(batch=batch, seq=seq, seed=seed)
        keep = round(density * labels.numel())
        order = torch.randperm(labels.numel(), generator=torch.Generator().manual_seed(100 + seed))
        flat = torch.full((labels.numel(),), ignore_index, dtype=labels.dtype)
        flat[order[:keep]] = labels.reshape(-1)[order[:keep]]
        batches.append((ids, flat.reshape(labels.shape)))
    return batches


def padded_id_batches(model, pad_fraction, count=2, batch=4, seq=8, padding_idx=0):
    """`count` TinyGPT batches (ids, labels) whose last round(pad_fraction·seq) positions of each row
    are padding_idx (right padding); real tokens never equal padding_idx."""
    if not isinstance(model, TinyGPT):
        raise FeatureModelError(f"padded_id_batches needs a TinyGPT, not {type(model).__name__}")
    pad_fraction = _check_fraction(pad_fraction, "pad_fraction", low_open=False)
    count = _check_count(count, "count")
    batches = []
    for seed in range(count):
        ids, labels = model.example_inputs(batch=batch, seq=seq, seed=seed)
        ids = torch.where(ids == padding_idx, torch.full_like(ids, (padding_idx + 1) % model.vocab), ids)
        padded = round(pad_fraction * seq)
        if padded:
            ids[:, seq - padded:] = padding_idx
        batches.append((ids, labels))
    return batches

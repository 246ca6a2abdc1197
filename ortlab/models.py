"""Small torch models the whole lab shares, deterministic by seed, with an ONNX export helper.

Sized so a training step takes well under a second on 2 CPU cores, and written
so that their exported graphs hold the patterns ORT's fusions and gradient
builders look for: the LayerNorm subgraph (ReduceMean, Sub, Pow, Sqrt, Div),
Erf-based GELU, MatMul+Add, Transpose+MatMul with a scale, Softmax, Dropout,
Where (masking) and SoftmaxCrossEntropyLoss.
"""
import contextlib
import io
import math
import sys
import warnings

import onnx
import torch
from torch import nn

from ortlab.errors import OrtlabError


def seeded(init):
    """Run a module's __init__ with torch's RNG seeded, leaving the global RNG untouched."""
    def wrapper(self, *args, seed=0, **kwargs):
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            init(self, *args, **kwargs)
    return wrapper


class LayerNorm(nn.Module):
    """LayerNorm written out as in the original BERT: (x - mean) / sqrt(var + eps) * w + b.

    Exported, it is the subgraph ORT's LayerNormFusion turns into one
    LayerNormalization node (onnxruntime/core/optimizer/layer_norm_fusion.cc).
    """

    def __init__(self, size, eps=1e-5):
        super().__init__()
        self.weight, self.bias, self.eps = nn.Parameter(torch.ones(size)), nn.Parameter(torch.zeros(size)), eps

    def forward(self, x):
        mean = x.mean(-1, keepdim=True)
        var = (x - mean).pow(2).mean(-1, keepdim=True)
        return (x - mean) / torch.sqrt(var + self.eps) * self.weight + self.bias


class SelfAttention(nn.Module):
    """Multi-head self-attention from Linear, matmul, softmax: softmax(q kᵀ / √d + mask) v."""

    def __init__(self, d_model, heads, dropout, causal=False, max_len=64):
        super().__init__()
        self.heads, self.d_head, self.causal = heads, d_model // heads, causal
        self.q, self.k, self.v, self.out = (nn.Linear(d_model, d_model) for _ in range(4))
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)),
                             persistent=False)

    def _split(self, x):
        b, s, _ = x.shape
        return x.reshape(b, s, self.heads, self.d_head).transpose(1, 2)

    def forward(self, x):
        b, s, d = x.shape
        q, k, v = self._split(self.q(x)), self._split(self.k(x)), self._split(self.v(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.d_head)
        if self.causal:
            scores = scores.masked_fill(~self.mask[:s, :s], -1e4)
        probs = self.dropout(torch.softmax(scores, dim=-1))
        return self.out(torch.matmul(probs, v).transpose(1, 2).reshape(b, s, d))


class Block(nn.Module):
    """Attention and a GELU feed-forward, each with dropout and a residual; post-LN (BERT) or pre-LN (GPT)."""

    def __init__(self, d_model, heads, d_ff, dropout, causal):
        super().__init__()
        self.attn = SelfAttention(d_model, heads, dropout, causal)
        self.ff = nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))
        self.ln1, self.ln2 = LayerNorm(d_model), LayerNorm(d_model)
        self.drop, self.pre_ln = nn.Dropout(dropout), causal

    def forward(self, x):
        if self.pre_ln:
            x = x + self.drop(self.attn(self.ln1(x)))
            return x + self.drop(self.ff(self.ln2(x)))
        x = self.ln1(x + self.drop(self.attn(x)))
        return self.ln2(x + self.drop(self.ff(x)))


class MLP(nn.Module):
    """Linear, ReLU, Dropout, Linear; with labels, returns the cross-entropy loss."""

    input_names = ("x", "labels")

    @seeded
    def __init__(self, d_in=16, d_hidden=32, classes=4, dropout=0.1):
        super().__init__()
        self.d_in, self.classes = d_in, classes
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Dropout(dropout),
                                 nn.Linear(d_hidden, classes))

    def forward(self, x, labels=None):
        logits = self.net(x)
        return logits if labels is None else nn.functional.cross_entropy(logits, labels)

    def example_inputs(self, batch=8, seed=0):
        g = torch.Generator().manual_seed(seed)
        return torch.randn(batch, self.d_in, generator=g), torch.randint(0, self.classes, (batch,), generator=g)


class _Transformer(nn.Module):
    input_names = ("input_ids", "labels")

    def _init(self, vocab, d_model, heads, layers, d_ff, max_len, dropout, causal):
        self.vocab, self.max_len = vocab, max_len
        self.tok, self.pos = nn.Embedding(vocab, d_model), nn.Embedding(max_len, d_model)
        self.drop = nn.Dropout(dropout)
        if not causal:  # BERT normalizes the embeddings; GPT's pre-LN blocks do it themselves
            self.ln = LayerNorm(d_model)
        self.blocks = nn.ModuleList(Block(d_model, heads, d_ff, dropout, causal) for _ in range(layers))

    def _encode(self, input_ids):
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.tok(input_ids) + self.pos(positions)
        x = self.drop(x if self.blocks[0].pre_ln else self.ln(x))
        for block in self.blocks:
            x = block(x)
        return x

    def example_inputs(self, batch=4, seq=8, seed=0):
        if seq > self.max_len:
            raise OrtlabError(f"seq={seq} is longer than the model's max_len={self.max_len}")
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(0, self.vocab, (batch, seq), generator=g)
        return ids, self._example_labels(ids, g)


class TinyBert(_Transformer):
    """A BERT-like encoder: embeddings, post-LN blocks, first-token classifier, cross-entropy loss."""

    @seeded
    def __init__(self, vocab=64, d_model=32, heads=2, layers=2, d_ff=64, max_len=16, classes=3,
                 dropout=0.1):
        super().__init__()
        self._init(vocab, d_model, heads, layers, d_ff, max_len, dropout, causal=False)
        self.classes = classes
        self.classifier = nn.Linear(d_model, classes)

    def forward(self, input_ids, labels=None):
        logits = self.classifier(self._encode(input_ids)[:, 0])
        return logits if labels is None else nn.functional.cross_entropy(logits, labels)

    def _example_labels(self, ids, g):
        return torch.randint(0, self.classes, (ids.shape[0],), generator=g)


class TinyGPT(_Transformer):
    """A GPT-style decoder: causal pre-LN blocks, a final LayerNorm, an LM head, next-token loss."""

    @seeded
    def __init__(self, vocab=64, d_model=32, heads=2, layers=2, d_ff=64, max_len=16, dropout=0.1,
                 tie_embeddings=False):
        super().__init__()
        self._init(vocab, d_model, heads, layers, d_ff, max_len, dropout, causal=True)
        self.ln_f = LayerNorm(d_model)
        self.lm_head = nn.Linear(d_model, vocab)
        if tie_embeddings:  # one weight for the token embedding and the LM head, as GPT-2 does
            self.lm_head.weight = self.tok.weight

    def forward(self, input_ids, labels=None):
        logits = self.lm_head(self.ln_f(self._encode(input_ids)))
        if labels is None:
            return logits
        return nn.functional.cross_entropy(logits.reshape(-1, self.vocab), labels.reshape(-1))

    def _example_labels(self, ids, g):
        return torch.roll(ids, -1, dims=1)  # next token (wrapping around at the end)


class WithLossModule(nn.Module):
    """A zoo model whose loss is an nn.CrossEntropyLoss *module* (not the functional call).

    ORTModule's label-density inspector hooks CrossEntropyLoss modules
    (ortmodule/_graph_transition_manager.py, _add_check_label_sparsity_hook).
    """

    def __init__(self, model, ignore_index=-100):
        super().__init__()
        self.model, self.loss = model, nn.CrossEntropyLoss(ignore_index=ignore_index)

    def forward(self, inputs, labels):
        logits = self.model(inputs)
        return self.loss(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


class LgammaRegressor(nn.Module):
    """Linear then lgamma: torch 2.6 cannot export aten::lgamma to ONNX, so ORTModule falls back."""

    @seeded
    def __init__(self, features=4):
        super().__init__()
        self.linear = nn.Linear(features, 1)

    def forward(self, x):
        return torch.lgamma(self.linear(x).abs() + 1).mean()


class CountingModule(nn.Module):
    """Counts how often its Python forward runs (exports and schema checks run it too)."""

    @seeded
    def __init__(self, features=4):
        super().__init__()
        self.linear, self.calls = nn.Linear(features, 1), 0

    def forward(self, x):
        self.calls += 1
        return self.linear(x).pow(2).mean()


class NestedIO(nn.Module):
    """forward((left, right), {'bias': b or None}, scale=1.0, mode='sum') returns
    {'h': tensor, 'pair': (reduced, argmax), 'nothing': None, 'n': 3}: inputs and outputs of any nesting."""

    @seeded
    def __init__(self, features=4, out=3):
        super().__init__()
        self.a, self.b = nn.Linear(features, out), nn.Linear(features, out)

    def forward(self, pair, extras, scale=1.0, mode="sum"):
        left, right = pair
        h = self.a(left) * scale + self.b(right)
        if extras.get("bias") is not None:
            h = h + extras["bias"]
        reduced = h.sum(-1) if mode == "sum" else h.amax(-1)
        return {"h": h, "pair": (reduced, reduced.argmax()), "nothing": None, "n": 3}


ZOO = {"mlp": MLP, "bert": TinyBert, "gpt": TinyGPT}


def get(name, **kwargs):
    """A model of the zoo by name ('mlp', 'bert', 'gpt'); keyword arguments go to its constructor."""
    if name not in ZOO:
        raise OrtlabError(f"no model {name!r} in ortlab.models; choose one of {', '.join(ZOO)}")
    return ZOO[name](**kwargs)


def ortmodule_symbolics():
    """Names of the export symbolics ORTModule registers when constructed (its ATen and contrib ones),
    read from its registries if it was imported (ortmodule/_custom_op_symbolic_registry.py,
    onnxruntime/tools/pytorch_export_contrib_ops.py)."""
    names = set()
    registry = sys.modules.get("onnxruntime.training.ortmodule._custom_op_symbolic_registry")
    if registry is not None:
        names.update(registry.CustomOpSymbolicRegistry._SYMBOLICS)
    contrib = sys.modules.get("onnxruntime.tools.pytorch_export_contrib_ops")
    if contrib is not None:
        names.update(contrib._registered_ops)
    # "::embedding" (empty domain) and "embedding" both mean aten::embedding, as torch.onnx reads them
    return {f"aten{n}" if n.startswith("::") else n if "::" in n else f"aten::{n}" for n in names}


@contextlib.contextmanager
def plain_torch_export():
    """Export with torch's own symbolics: those ORTModule registered process-wide (embedding ->
    ATen, ...) are set aside for the duration and put back after; other custom symbolics stay.

    Uses torch/onnx/_internal/registration.py, where each custom symbolic is an override.
    """
    from torch.onnx._internal import registration  # heavy: torch

    saved = []
    for name in ortmodule_symbolics():
        group = registration.registry.get_function_group(name)
        for opset, function in list(group._functions._overrides.items()) if group else []:
            saved.append((name, opset, function))
            group.remove_custom(opset)
    try:
        yield
    finally:
        for name, opset, function in saved:
            registration.registry.register(name, opset, function, custom=True)


def export(model, inputs, training=False, opset=17):
    """Export with torch.onnx.export (as ORTModule does) and return the onnx.ModelProto.

    Give (x,) or (input_ids,) for a graph whose output is `logits`, or add the labels
    for one whose output is the scalar `loss`. training=True keeps the Dropout nodes
    (TrainingMode.TRAINING, and no constant folding, as ORTModule exports). torch's own
    symbolics are used even after an ORTModule registered its own (plain_torch_export).
    """
    inputs = tuple(inputs)
    names = list(getattr(model, "input_names", [f"input_{i}" for i in range(len(inputs))]))[:len(inputs)]
    with_loss = len(inputs) > 1
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    was_training = model.training
    model.train(training)
    buffer = io.BytesIO()
    try:
        with warnings.catch_warnings(), plain_torch_export():
            # torch 2.6 calls `training=` deprecated; ORTModule 1.19.2 passes it the same way.
            warnings.filterwarnings("ignore", message="Setting `training`", category=FutureWarning)
            torch.onnx.export(model, inputs, buffer, input_names=names,
                              output_names=["loss" if with_loss else "logits"], opset_version=opset,
                              training=mode, do_constant_folding=not training,
                              dynamic_axes={names[0]: {0: "batch"}})
    finally:
        model.train(was_training)
    return onnx.load_from_string(buffer.getvalue())

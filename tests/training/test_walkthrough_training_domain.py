"""D_01's FLOP counts against the matmul arithmetic worked out by hand."""
import torch

from ortlab import models
from ortlab.training import progression_batches
from ortlab.walkthroughs import training_domain_knowledge as tdk


def _gpt():
    return models.get("gpt", vocab=16, dropout=0.0, max_len=64)


def _batch(seq, batch=4):
    return progression_batches(1, batch=batch, seq=seq, vocab=16)[0]


def test_step_flops_equal_the_matmul_arithmetic():
    model, (ids, labels) = _gpt(), _batch(16)
    b, s = ids.shape
    d, layers = model.tok.embedding_dim, len(model.blocks)
    # every Linear(in, out) on N tokens: 2·N·in·out forward, as much again for each of its two gradients
    linear = sum(6 * b * s * m.in_features * m.out_features for m in model.modules()
                 if isinstance(m, torch.nn.Linear))
    # per layer, q @ k.T and probs @ v are 2·B·S²·D each forward; each has two gradients backward
    attention = 12 * b * s * s * d * layers
    assert tdk.step_flops(model, (ids, labels)) == {"linear": linear, "attention": attention}


def test_attention_grows_with_the_square_of_the_sequence_and_linear_layers_with_it():
    table = tdk.flops_by_sequence_length(_gpt, _batch, (8, 32))
    assert tdk.growth(table, "tokens per step") == 4
    assert tdk.growth(table, "linear FLOPs") == 4
    assert tdk.growth(table, "attention FLOPs") == 16

"""Small generated tasks, so that a training run has something to learn and a loss to reach.

`progressions`: sequences x_t = (start + stride·t) mod vocab; the next token is predictable once two
tokens are seen, so a tiny GPT's loss can fall far below log(vocab) in a few hundred steps.
"""
import torch

from ortlab.errors import OrtlabError


def progressions(batch, seq, vocab=64, max_stride=8, seed=0):
    """(input_ids, labels), both int64 [batch, seq]; labels are the next tokens (input_ids shifted by one)."""
    if seq < 2 or vocab < 2 or not 1 <= max_stride < vocab:
        raise OrtlabError(f"need seq >= 2, vocab >= 2 and 1 <= max_stride < vocab; got seq={seq}, "
                          f"vocab={vocab}, max_stride={max_stride}")
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (batch, 1), generator=g)
    stride = torch.randint(1, max_stride + 1, (batch, 1), generator=g)
    ids = (start + stride * torch.arange(seq + 1)) % vocab
    labels = ids[:, 1:].clone()
    return ids[:, :-1].contiguous(), labels


def progression_batches(n, batch, seq, vocab=64, max_stride=8, seed=0):
    """n batches of progressions (seeds seed, seed+1, ...)."""
    return [progressions(batch, seq, vocab, max_stride, seed + k) for k in range(n)]

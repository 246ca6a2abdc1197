"""D_01: what a longer sequence costs, counted in FLOPs (the same on every machine) instead of timed.

`torch.utils.flop_counter.FlopCounterMode` counts each matmul's multiply-adds (2 FLOPs each) during a
forward and backward. In the lab's GPT, the Linear layers run as `addmm`/`mm` on (tokens, features)
and grow with the number of tokens; attention's `q @ k.T` and `probs @ v` run as `bmm` on
(batch·heads, seq, seq) and grow with the square of the sequence length.
"""
from torch.utils.flop_counter import FlopCounterMode

from ortlab.viz import Table

ATTENTION = ("bmm",)           # q @ k.T, probs @ v and their gradients
LINEAR = ("addmm", "mm")       # every nn.Linear, forward and backward


def step_flops(model, batch):
    """{"linear": FLOPs, "attention": FLOPs} of one forward and backward of `model(*batch)`."""
    with FlopCounterMode(display=False) as counter:
        model(*batch).backward()
    counts = {str(op).split(".")[-1]: n for op, n in counter.get_flop_counts()["Global"].items()}
    return {"linear": sum(counts.get(op, 0) for op in LINEAR),
            "attention": sum(counts.get(op, 0) for op in ATTENTION)}


def flops_by_sequence_length(make_model, make_batch, seqs):
    """Table of one training step's FLOPs at each sequence length: tokens, linear, attention, per token."""
    rows = []
    for seq in seqs:
        batch = make_batch(seq)
        flops = step_flops(make_model(), batch)
        tokens = batch[0].numel()
        rows.append((seq, tokens, flops["linear"], flops["attention"],
                     (flops["linear"] + flops["attention"]) // tokens))
    return Table(("seq", "tokens per step", "linear FLOPs", "attention FLOPs", "FLOPs per token"), rows)


def growth(table, column):
    """How many times `column` grew from the table's first row to its last."""
    index = table.header.index(column)
    return table.rows[-1][index] / table.rows[0][index]

"""D_01: what a longer sequence costs, counted in FLOPs (the same on every machine) instead of timed; a
learning-rate range test and the rule for picking from it; a progress bar that stores one line.

`torch.utils.flop_counter.FlopCounterMode` counts each matmul's multiply-adds (2 FLOPs each) during a
forward and backward. In the lab's GPT, the Linear layers run as `addmm`/`mm` on (tokens, features)
and grow with the number of tokens; attention's `q @ k.T` and `probs @ v` run as `bmm` on
(batch·heads, seq, seq) and grow with the square of the sequence length.
"""
import math
from typing import NamedTuple

from torch.utils.flop_counter import FlopCounterMode

from ortlab.training import curve_shape, train
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


# --- picking the learning rate: a short range test (a sweep of short runs) --------------------------------

STABLE = ("decreasing", "plateau")   # curve shapes whose final loss is the same on every machine


class LrRun(NamedTuple):
    """One run of a learning-rate sweep: its lr, final loss (mean of the last few steps), shape and losses."""
    lr: float
    final: float
    shape: str
    losses: list


def lr_range_test(make_model, make_optimizer, batches, lrs, steps=20, tail=5):
    """[LrRun] for one short run per learning rate of `lrs` (a log-spaced grid, smallest first).

    A learning-rate range test (L. Smith, "Cyclical Learning Rates for Training Neural Networks", 2017):
    the same model from the same weights, trained for a few steps at each lr. make_model() -> a fresh
    model, the same each time; make_optimizer(params, lr) -> its optimizer.
    """
    runs = []
    for lr in lrs:
        model = make_model()
        history = train(model, batches, make_optimizer(model.parameters(), lr), steps, progress=False)
        end = history.losses[-tail:]
        runs.append(LrRun(lr, sum(end) / len(end), curve_shape(history.losses), history.losses))
    return runs


def pick_lr(runs):
    """(picked lr, lr of the lowest final loss): the rule of the range test. The lowest final loss among the
    runs whose curve is 'decreasing' marks the edge of stability (the next lr up does worse or blows up);
    take one grid step below it, where a longer run keeps that margin."""
    healthy = [r for r in runs if r.shape == "decreasing"]
    if not healthy:
        raise ValueError("no run of the sweep decreased: widen the grid towards smaller learning rates")
    best = min(healthy, key=lambda r: r.final)
    i = runs.index(best)
    return (runs[i - 1].lr if i > 0 else best.lr), best.lr


def lr_table(runs):
    """The sweep as a Table: lr, final loss (only where the curve is stable: a spiky or diverging run's
    last losses differ from machine to machine), shape."""
    return Table(("lr", "final loss", "shape"),
                 [(f"{r.lr:g}", f"{r.final:.3f}" if r.shape in STABLE else "-", r.shape) for r in runs])


def plot_lr_range(runs, picked=None, title="learning-rate range test"):
    """Final loss against lr (log axis), the runs that are not 'decreasing' marked, the picked lr a line."""
    import matplotlib.pyplot as plt  # heavy: matplotlib, for the plot only

    fig, ax = plt.subplots(figsize=(6, 3.5))
    finite = [r for r in runs if math.isfinite(r.final)]
    ax.plot([r.lr for r in finite], [r.final for r in finite], "o-", color="tab:blue", label="final loss")
    bad = [r for r in finite if r.shape != "decreasing"]
    if bad:
        ax.plot([r.lr for r in bad], [r.final for r in bad], "x", color="tab:red", markersize=10,
                label="not 'decreasing'")
    if picked is not None:
        ax.axvline(picked, color="tab:green", linestyle="--", label=f"picked lr {picked:g}")
    ax.set_xscale("log")
    ax.set_xlabel("learning rate")
    ax.set_ylabel("final loss (mean of the last steps)")
    ax.set_title(title)
    ax.legend()
    plt.show()

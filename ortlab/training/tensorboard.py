"""Training curves for TensorBoard: torch.utils.tensorboard writes the event files TensorBoard reads.

A run is one folder of event files (`events.out.tfevents.*`, protobuf records of
tensorboard/compat/proto/event.proto); TensorBoard, pointed at a parent folder such as runs/
(`make tensorboard`), shows each sub-folder as a run named after it.

    run_folder(name)                        runs/NAME in the checkout, the folder `make tensorboard` serves
    open_writer(run_dir)                    a SummaryWriter on a folder holding this run only
    log_step(writer, step, history, opt)    one step's train/loss, train/lr, train/grad_norm
    log_run(history, run_dir, lrs=None)     a finished History (or list of losses), after the fact
    read_scalars(run_dir)                   {tag: [(step, value)]}, read back by TensorBoard's own reader
    plot_scalars(scalars)                   one small chart per tag, steps on the x axis

`train(..., log_dir=run_dir)` (loop.py) logs through log_step as it trains. Values are stored
as float32 (the event proto's simple_value), so they read back as float32(loss), exactly.
ORT's own training examples log the same way (orttraining/tools/scripts and the ORTModule
samples call torch.utils.tensorboard.SummaryWriter.add_scalar).
"""
import os
from pathlib import Path

from ortlab.errors import OrtlabError

LOSS, LR, GRAD_NORM = "train/loss", "train/lr", "train/grad_norm"
EVENT_FILES = "events.out.tfevents.*"
CHECKOUT = Path(__file__).resolve().parents[2]  # the folder holding ortlab/, notebooks/ and runs/


class TensorBoardError(OrtlabError):
    """A run folder cannot be written or read as asked (the message says why and what to do)."""


def run_folder(name):
    """The folder of the run called `name` ('lab08', 'D_01/adam'): runs/NAME at the top of the
    checkout, whatever the current directory (a notebook runs in notebooks/), which is the folder
    `make tensorboard` serves. Outside a checkout (ortlab installed elsewhere), ./runs/NAME."""
    if not isinstance(name, str) or not name.strip() or Path(name).is_absolute() or ".." in Path(name).parts:
        raise TensorBoardError(f"a run name is a relative name like 'lab08' or 'D_01/adam', not {name!r}")
    root = CHECKOUT if (CHECKOUT / "pyproject.toml").is_file() else Path.cwd()
    return root / "runs" / name


def open_writer(run_dir, replace=True, flush_secs=5):
    """A torch SummaryWriter writing into run_dir, created if missing.

    replace=True first deletes the event files already there (only those), so the folder holds
    this run alone: re-running a notebook cell gives the same curves instead of a second run's
    steps appended to the first. A running TensorBoard sees new steps within flush_secs.
    """
    from torch.utils.tensorboard import SummaryWriter  # heavy: torch

    if not isinstance(run_dir, (str, Path)) or not str(run_dir).strip():
        raise TensorBoardError(f"a run's folder is a str or Path such as run_folder('lab08'), not {run_dir!r}")
    path = Path(run_dir)
    if path.exists() and not path.is_dir():
        raise TensorBoardError(f"{path} is a file, not a folder: give a folder for the run's event files")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TensorBoardError(f"cannot create the run folder {path}: {exc.strerror}; give a folder you can write "
                               "to, e.g. run_folder('lab08')") from None
    if not os.access(path, os.W_OK):
        raise TensorBoardError(f"the run folder {path} is not writable; give a folder you can write to, e.g. "
                               "run_folder('lab08')")
    if replace:
        for old in path.glob(EVENT_FILES):
            old.unlink()
    return SummaryWriter(log_dir=str(path), flush_secs=flush_secs)


def learning_rates(optimizer):
    """{tag: lr} for an optimizer: train/lr with one param group, train/lr/group<i> with several."""
    groups = getattr(optimizer, "param_groups", None) or []
    rates = [g["lr"] for g in groups if "lr" in g]
    if len(rates) == 1:
        return {LR: float(rates[0])}
    return {f"{LR}/group{i}": float(lr) for i, lr in enumerate(rates)}


def log_step(writer, step, history, optimizer=None):
    """Write the last entry of a History (loss, global norm) and the optimizer's lr at `step`."""
    writer.add_scalar(LOSS, history.losses[-1], step)
    writer.add_scalar(GRAD_NORM, history.grad_norms[-1], step)
    for tag, lr in (learning_rates(optimizer) if optimizer is not None else {}).items():
        writer.add_scalar(tag, lr, step)


def log_run(history, run_dir, lrs=None, replace=True):
    """Write a finished run into run_dir: a History's losses and norms, or a plain list of losses
    (a loop of your own), and lrs (one per step) if given."""
    if isinstance(history, (list, tuple)):
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in history):
            raise TensorBoardError("log_run takes a History or a list of losses as Python floats "
                                   "(loss.item()), not tensors or other values")
        losses, norms = list(history), []
    elif hasattr(history, "losses"):
        losses, norms = history.losses, getattr(history, "grad_norms", [])
    else:
        raise TensorBoardError(f"log_run takes a History (what train() returns) or a list of losses, "
                               f"not {type(history).__name__}")
    if lrs is not None and (isinstance(lrs, (str, bytes)) or not hasattr(lrs, "__len__")):
        raise TensorBoardError(f"lrs must be a list of learning rates, one per step, not {lrs!r}")
    if lrs is not None and len(lrs) != len(losses):
        raise TensorBoardError(f"lrs has {len(lrs)} values for {len(losses)} steps: "
                               "give one per step")
    writer = open_writer(run_dir, replace=replace)
    try:
        for step, loss in enumerate(losses):
            writer.add_scalar(LOSS, loss, step)
            if step < len(norms):
                writer.add_scalar(GRAD_NORM, norms[step], step)
            if lrs is not None:
                writer.add_scalar(LR, lrs[step], step)
    finally:
        writer.close()
    return Path(run_dir)


def read_scalars(run_dir):
    """{tag: [(step, value)]} from the event files in run_dir, read with TensorBoard's EventAccumulator.

    Every point is kept (size_guidance 0 = no sampling; TensorBoard's server keeps 1000 per tag).
    """
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator  # optional

    if not isinstance(run_dir, (str, Path)):
        raise TensorBoardError(f"read_scalars takes a run's folder (a str or Path), not {type(run_dir).__name__}")
    path = Path(run_dir)
    if not path.is_dir():
        raise TensorBoardError(f"{path} is not a folder: pass the log_dir given to train or log_run")
    if not any(path.glob(EVENT_FILES)):
        raise TensorBoardError(f"no event files in {path}: pass the run's folder (the log_dir given to "
                               "train or log_run), not its parent")
    accumulator = EventAccumulator(str(path), size_guidance={SCALARS: 0})
    accumulator.Reload()
    return {tag: [(e.step, e.value) for e in accumulator.Scalars(tag)]
            for tag in sorted(accumulator.Tags()[SCALARS])}


def plot_scalars(scalars, tags=None, title=""):
    """Plot {tag: [(step, value)]} (or a run folder), one small chart per tag; shows it, returns None."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    if not isinstance(scalars, dict):
        scalars = read_scalars(scalars)
    tags = list(scalars) if tags is None else list(tags)
    missing = [t for t in tags if t not in scalars]
    if missing or not tags:
        raise TensorBoardError(f"no scalars tagged {missing or tags}; the run has {sorted(scalars)}")
    figure, axes = plt.subplots(1, len(tags), figsize=(3.2 * len(tags), 3), squeeze=False)
    for ax, tag in zip(axes[0], tags):
        steps, values = zip(*scalars[tag]) if scalars[tag] else ((), ())
        ax.plot(steps, values, linewidth=2)
        ax.set(title=tag, xlabel="step")
        ax.grid(alpha=0.3)
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    plt.show()

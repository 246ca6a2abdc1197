"""plot_timeline(device): the lanes of a `runtime.Device` drawn as bars, one row per lane (host on top);
plot_timelines([(title, device), ...]): several of them on one time axis, to compare.

Host work is grey, the host's blocked stretches are hatched red, each stream's work is coloured by
kind (kernels, copies, memsets), and each cudaEventRecord is a black tick on its stream.
"""
from ortlab.cuda.runtime import HOST, Device
from ortlab.errors import OrtlabError

COLOURS = {"blocked": "#f4cccc", "host": "#cccccc", "cudaMemcpy": "#9fc5e8", "cudaMemset": "#b6d7a8",
           "kernel": "#f9cb9c"}


def _colour(interval):
    if interval.lane == HOST:
        return COLOURS["blocked"] if interval.name.startswith("blocked: ") else COLOURS["host"]
    for prefix in ("cudaMemcpy", "cudaMemset"):
        if interval.name.startswith(prefix):
            return COLOURS[prefix]
    return COLOURS["kernel"]


def _fit(label, chars):
    """`label` in at most `chars` characters: whole, else without its call's name ("cudaMemcpyAsync H2D"
    -> "H2D"), else cut with an ellipsis; "" when fewer than 4 characters fit."""
    if chars < 4:
        return ""
    if len(label) > chars and label.startswith("cuda") and " " in label:
        label = label.split(" ", 1)[1]
    return label if len(label) <= chars else label[:chars - 1] + "\u2026"


def _lanes(device):
    return [HOST] + [s.name for s in device.streams if device.lane(s.name) or s.index == 0]


def _end(device):
    return max([i.end for i in device.intervals] + [device.host_now, 1e-9])


def _draw(axes, device, end, title):
    lanes = _lanes(device)
    for row, lane in enumerate(lanes):
        y = len(lanes) - 1 - row
        for interval in device.lane(lane):
            width = interval.end - interval.start
            hatch = "//" if interval.name.startswith("blocked: ") else None
            axes.barh(y, max(width, end / 400), left=interval.start, height=0.6, color=_colour(interval),
                      edgecolor="black", linewidth=0.6, hatch=hatch)
            label = _fit(interval.name.removeprefix("blocked: "), int(width / end * 110))
            if label:
                axes.text(interval.start + width / 2, y, label, ha="center", va="center", fontsize=7, clip_on=True)
    for lane, name, time in device.markers:
        if lane in lanes:
            y = len(lanes) - 1 - lanes.index(lane)
            axes.plot([time, time], [y - 0.4, y + 0.4], color="black", linewidth=2)
            axes.text(time, y + 0.42, name, ha="center", va="bottom", fontsize=7)
    axes.set_yticks(range(len(lanes)), list(reversed(lanes)), fontsize=8)
    axes.set_xlim(0, end * 1.02)
    axes.set_title(title, fontsize=10)
    axes.grid(axis="x", alpha=0.3)


def plot_timelines(cases, show=True):
    """Draw several devices one above the other on one time axis: `cases` is [(title, Device), ...].
    Shows the figure (returns None) when `show`, else returns the matplotlib Figure."""
    cases = list(cases) if isinstance(cases, (list, tuple)) else None
    if not cases or not all(isinstance(c, tuple) and len(c) == 2 and isinstance(c[1], Device) for c in cases):
        raise OrtlabError("plot_timelines takes a list of (title, ortlab.cuda.runtime.Device) pairs")
    import matplotlib.pyplot as plt  # heavy: matplotlib

    rows = [len(_lanes(device)) for _, device in cases]
    end = max(_end(device) for _, device in cases)
    figure, axes = plt.subplots(len(cases), 1, figsize=(9, 0.5 + sum(0.55 * r + 0.45 for r in rows)),
                                sharex=True, height_ratios=rows, squeeze=False)
    for ax, (title, device) in zip(axes[:, 0], cases):
        _draw(ax, device, end, title)
    axes[-1, 0].set_xlabel("time (model ms)")
    figure.tight_layout()
    if not show:
        return figure
    plt.show()


def plot_timeline(device, title="", show=True):
    """Draw one device's intervals: one row per lane, bars labelled with the work's name. Shows the
    figure (returns None) when `show`, else returns the matplotlib Figure."""
    if not isinstance(device, Device):
        raise OrtlabError(f"plot_timeline takes an ortlab.cuda.runtime.Device, not {type(device).__name__}")
    return plot_timelines([(title, device)], show)

"""plot_timeline(device): the lanes of a `runtime.Device` drawn as bars, one row per lane (host on top).

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


def plot_timeline(device, title="", show=True):
    """Draw `device`'s intervals: one row per lane, bars labelled with the work's name. Returns the
    matplotlib Figure (after plt.show() when `show`)."""
    if not isinstance(device, Device):
        raise OrtlabError(f"plot_timeline takes an ortlab.cuda.runtime.Device, not {type(device).__name__}")
    import matplotlib.pyplot as plt

    lanes = [HOST] + [s.name for s in device.streams if device.lane(s.name) or s.index == 0]
    end = max([i.end for i in device.intervals] + [device.host_now, 1e-9])
    figure, axes = plt.subplots(figsize=(9, 0.6 + 0.55 * len(lanes)))
    for row, lane in enumerate(lanes):
        y = len(lanes) - 1 - row
        for interval in device.lane(lane):
            width = interval.end - interval.start
            hatch = "//" if interval.name.startswith("blocked: ") else None
            axes.barh(y, max(width, end / 400), left=interval.start, height=0.6, color=_colour(interval),
                      edgecolor="black", linewidth=0.6, hatch=hatch)
            if width > end / 25:
                label = interval.name.removeprefix("blocked: ")
                axes.text(interval.start + width / 2, y, label, ha="center", va="center", fontsize=7, clip_on=True)
    for lane, name, time in device.markers:
        if lane in lanes:
            y = len(lanes) - 1 - lanes.index(lane)
            axes.plot([time, time], [y - 0.4, y + 0.4], color="black", linewidth=2)
            axes.text(time, y + 0.42, name, ha="center", va="bottom", fontsize=7)
    axes.set_yticks(range(len(lanes)), list(reversed(lanes)), fontsize=8)
    axes.set_xlim(0, end * 1.02)
    axes.set_xlabel("time (model ms)")
    axes.set_title(title, fontsize=10)
    axes.grid(axis="x", alpha=0.3)
    figure.tight_layout()
    if show:
        plt.show()
    return figure

"""A profile as plain data: kernel events and run spans from a Chrome trace, with the views a
performance investigation starts from (ORTModule's Performance Investigation guide): top kernels,
time by op type, two profiles compared, and a timeline.

Both ORT's profiler (onnxruntime/core/common/profiler.cc writes the trace) and torch.profiler
(`export_chrome_trace`) write the Chrome trace-event format; ort_profile.py and
torch_profile.py turn each into a Profile.
"""
from collections import defaultdict
from dataclasses import dataclass, field

from ortlab.errors import OrtlabError
from ortlab.viz import Table


class ProfileError(OrtlabError):
    """A trace could not be read or used (the message says what was wrong with it)."""


@dataclass(frozen=True)
class Event:
    """One kernel (node) execution: its name, op type, start and duration in microseconds."""

    name: str
    op_type: str
    ts: float
    dur: float
    provider: str = ""
    output_shapes: tuple = ()  # ORT only: the shapes of the node's outputs in this run
    output_bytes: int = 0      # ORT only: the bytes those outputs take


@dataclass
class Profile:
    """Kernel events and run spans (one per session run, or per marked step) of one trace."""

    source: str
    events: list
    runs: list = field(default_factory=list)  # (label, ts, dur)

    @property
    def total_us(self):
        return sum(e.dur for e in self.events)

    def by_op_type(self):
        """{op type: (calls, total µs)}, largest total first."""
        found = defaultdict(lambda: [0, 0.0])
        for e in self.events:
            found[e.op_type][0] += 1
            found[e.op_type][1] += e.dur
        return dict(sorted(((k, tuple(v)) for k, v in found.items()), key=lambda kv: -kv[1][1]))

    def op_type_table(self, n=None):
        """Time by op type: calls, total µs, share of all kernel time."""
        total = self.total_us or 1.0
        rows = [(op, calls, f"{us:.0f}", f"{100 * us / total:.1f}%")
                for op, (calls, us) in list(self.by_op_type().items())[:n]]
        return Table(("op type", "calls", "total µs", "share"), rows)

    def top(self, n=10):
        """The n kernels (by name) with the most time: the top hitters."""
        found = defaultdict(lambda: [0, 0.0, ""])
        for e in self.events:
            entry = found[e.name]
            entry[0] += 1
            entry[1] += e.dur
            entry[2] = e.op_type
        total = self.total_us or 1.0
        ranked = sorted(found.items(), key=lambda kv: -kv[1][1])[:n]
        return Table(("kernel", "op type", "calls", "total µs", "share"),
                     [(name, op, calls, f"{us:.0f}", f"{100 * us / total:.1f}%")
                      for name, (calls, us, op) in ranked])

    def compare(self, other, names=("a", "b"), by="time"):
        """Per op type in two profiles, and the gap (b - a), largest gap first.

        by="time": total µs (what differs in speed); by="calls": kernel calls per run (what
        differs in the graph, e.g. the kernels that scale with the number of layers).
        """
        if by not in ("time", "calls"):
            raise ProfileError(f"compare by 'time' or 'calls', not {by!r}")
        mine, theirs = self.by_op_type(), other.by_op_type()

        def value(profile, found, op):
            calls, us = found.get(op, (0, 0.0))
            return us if by == "time" else calls / max(len(profile.runs), 1)

        rows = [(op, value(self, mine, op), value(other, theirs, op)) for op in set(mine) | set(theirs)]
        rows = sorted(((op, a, b, b - a) for op, a, b in rows), key=lambda r: (-abs(r[3]), r[0]))
        unit = "µs" if by == "time" else "calls/run"
        fmt = "{:.0f}" if by == "time" else "{:g}"
        return Table(("op type", f"{names[0]} {unit}", f"{names[1]} {unit}", "gap"),
                     [(op, fmt.format(a), fmt.format(b), ("+" if gap > 0 else "") + fmt.format(gap))
                      for op, a, b, gap in rows])

    def timeline(self, title="", max_events=4000):
        """A picture: one bar per kernel, coloured by op type, runs (steps) shaded behind."""
        import matplotlib.pyplot as plt  # heavy: matplotlib

        if not self.events:
            raise ProfileError(f"{self.source}: no kernel events to draw")
        start = min([e.ts for e in self.events] + [r[1] for r in self.runs])
        ops = list(self.by_op_type())[:9]
        colours = dict(zip(ops, plt.cm.tab10.colors))
        figure, axes = plt.subplots(figsize=(9, 2.6))
        for k, (label, ts, dur) in enumerate(self.runs):
            axes.axvspan((ts - start) / 1e3, (ts + dur - start) / 1e3, color="0.9" if k % 2 else "0.8", zorder=0)
        for e in self.events[:max_events]:
            axes.barh(0, e.dur / 1e3, left=(e.ts - start) / 1e3, height=0.6,
                      color=colours.get(e.op_type, "0.5"), linewidth=0)
        handles = [plt.Rectangle((0, 0), 1, 1, color=c) for c in colours.values()]
        axes.legend(handles, ops, ncol=5, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.35))
        axes.set(title=title or self.source, xlabel="ms since the first event", yticks=[])
        figure.tight_layout()
        plt.show()

    def __repr__(self):
        return (f"Profile({self.source}: {len(self.events)} kernel events, {len(self.runs)} runs, "
                f"{len(self.by_op_type())} op types)")

"""Tables and curves: what a notebook prints and plots."""
import html
from dataclasses import dataclass
from pathlib import Path

import onnx


@dataclass
class Table:
    """Rows of strings that print as aligned text and render as HTML in JupyterLab."""

    header: tuple
    rows: list

    @classmethod
    def from_dicts(cls, rows):
        """A Table from a list of dicts sharing their keys (the first row's keys are the header)."""
        header = tuple(rows[0]) if rows else ()
        return cls(header, [tuple(r.get(h, "") for h in header) for r in rows])

    def __repr__(self):
        cells = [tuple(str(h) for h in self.header)] + [tuple(str(c) for c in r) for r in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.header))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def _repr_html_(self):
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                       for r in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def within(gap, tolerance=1e-6):
    """A difference as a table cell: '<= 1e-06' when it is float32 rounding (printed the same on every
    CPU, where the rounding itself is not), else the value to two digits."""
    return f"<= {tolerance:.0e}" if gap <= tolerance else f"{gap:.1e}"


def node_table(model):
    """One row per node, in graph order: index, name, op type (with domain), inputs, outputs."""
    if isinstance(model, (str, Path)):
        model = onnx.load(str(model))
    rows = []
    for index, node in enumerate(model.graph.node):
        op = f"{node.domain}:{node.op_type}" if node.domain else node.op_type
        rows.append((index, node.name or "(no name)", op, ", ".join(node.input),
                     ", ".join(node.output)))
    return Table(("index", "name", "op", "inputs", "outputs"), rows)


def plot_curves(curves, title="", xlabel="step", ylabel="loss", logy=False):
    """Plot named curves ({label: values}) in one figure and show it (returns None)."""
    import matplotlib.pyplot as plt  # heavy: matplotlib

    figure, axes = plt.subplots(figsize=(6, 3.5))
    for (label, values), style in zip(curves.items(), ("-", "--", ":", "-.") * 8):
        axes.plot(range(len(values)), list(values), style, label=label, linewidth=2)
    axes.set(title=title, xlabel=xlabel, ylabel=ylabel)
    if logy:
        axes.set_yscale("log")
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    plt.show()

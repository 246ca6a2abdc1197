"""Seeing graphs: Netron served on 127.0.0.1 and shown inline, and graphs as tables.

Netron (https://netron.app) is the viewer the ORT team uses for the graphs
ORTModule dumps (see DebugOptions in
orttraining/orttraining/python/training/ortmodule/options.py).
"""
import atexit
import hashlib
import html
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ortlab.errors import OrtlabError

HOST = "127.0.0.1"
MAX_SERVERS = 8
_DATE_META = re.compile(rb'<meta name="date" content="[^"]*">')
_servers = {}  # model path -> NetronView, oldest first
_cache = Path(tempfile.gettempdir()) / "ortlab-netron"


class VizError(OrtlabError):
    """A model could not be shown (missing file, unreadable model, wrong type)."""


@dataclass
class NetronView:
    """A model served by Netron; JupyterLab shows it inline as an iframe."""

    path: Path
    port: int
    height: int = 500
    thread: object = field(default=None, repr=False, compare=False)
    name: str = ""

    @property
    def url(self):
        return f"http://{HOST}:{self.port}/"

    def __repr__(self):
        return f"NetronView('{self.name or self.path.name}' served on {HOST})"

    def _repr_html_(self):
        return (f'<iframe src="{html.escape(self.url)}" width="100%" height="{self.height}" '
                f'title="Netron: {html.escape(self.path.name)}" style="border:1px solid #ccc">'
                "</iframe>")

    def stop(self):
        """Stop this server and wait for its thread to end."""
        self.thread.stop()
        self.thread.join(timeout=5)
        if _servers.get(self.path) is self:
            del _servers[self.path]


def _undated_handler():
    from netron import server

    class UndatedHandler(server._HTTPRequestHandler):
        """Netron's handler without the build-date meta tag.

        Netron's page refuses to show models 180 days after its build date and
        asks for an update; the lab pins netron, so the page is served undated.
        """

        def _write(self, status_code, content_type, content):
            if content_type == "text/html" and content:
                content = _DATE_META.sub(b"", content)
            super()._write(status_code, content_type, content)

    return UndatedHandler


def _serve(path):
    """Start one Netron server for `path` on 127.0.0.1 and a free port; return its thread.

    netron.serve() keeps the served model on its request-handler *class*, so two
    servers in one process would both serve the latest model; each server here
    gets a handler subclass of its own (netron 9.3.3's server module).
    """
    from netron import server

    address = server._make_port((HOST, 0))
    content = server._ContentProvider(None, str(path), str(path), path.name)
    thread = server._HTTPServerThread(content, address)
    thread.server.RequestHandlerClass = type(
        "OrtlabNetronHandler", (_undated_handler(),), {"content": content})
    thread.start()
    while not thread.alive():
        time.sleep(0.01)
    return thread


def _model_file(model_or_path):
    """A path on disk for a ModelProto, bytes, or an existing .onnx path."""
    if isinstance(model_or_path, onnx.ModelProto):
        data = model_or_path.SerializeToString()
    elif isinstance(model_or_path, (bytes, bytearray)):
        data = bytes(model_or_path)
    elif isinstance(model_or_path, (str, Path)):
        path = Path(model_or_path)
        if not path.is_file():
            raise VizError(f"{path}: no such model file; save the model first or pass the "
                           "onnx.ModelProto itself")
        return path.resolve()
    else:
        raise VizError(f"show() takes an onnx.ModelProto, a path or bytes, not "
                       f"{type(model_or_path).__name__}")
    _cache.mkdir(exist_ok=True)
    path = _cache / f"model-{hashlib.sha256(data).hexdigest()[:12]}.onnx"
    if not path.exists():
        path.write_bytes(data)
    return path


def show(model_or_path, height=500):
    """Serve a model with Netron on 127.0.0.1 (a free port) and return a view that displays inline.

    Showing the same model again replaces its server; at most MAX_SERVERS run at once.
    """
    path = _model_file(model_or_path)
    if path in _servers:
        _servers[path].stop()
    while len(_servers) >= MAX_SERVERS:
        next(iter(_servers.values())).stop()
    thread = _serve(path)
    name = model_or_path.graph.name if isinstance(model_or_path, onnx.ModelProto) else ""
    view = NetronView(path, thread.address[1], height, thread, name)
    _servers[path] = view
    return view


def running():
    """The NetronViews currently served."""
    return list(_servers.values())


def stop_all():
    """Stop every Netron server that show() started."""
    for view in list(_servers.values()):
        view.stop()


atexit.register(stop_all)


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
        cells = [self.header] + [tuple(str(c) for c in r) for r in self.rows]
        widths = [max(len(r[i]) for r in cells) for i in range(len(self.header))]
        lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in cells]
        lines.insert(1, "  ".join("-" * w for w in widths))
        return "\n".join(lines)

    def _repr_html_(self):
        head = "".join(f"<th>{html.escape(str(h))}</th>" for h in self.header)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>"
                       for r in self.rows)
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


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
    import matplotlib.pyplot as plt

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

"""Netron served on 127.0.0.1 and shown inline, beside a static picture of the graph.

Netron (https://netron.app) is the viewer the ORT team uses for the graphs
ORTModule dumps (see DebugOptions in
orttraining/orttraining/python/training/ortmodule/options.py).
A served view lives only as long as its kernel; a stored notebook (or one read on a
code-hosting site) shows the static picture of `ortlab.viz.picture` instead.
"""
import atexit
import base64
import hashlib
import html
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import onnx

from ortlab.errors import OrtlabError
from ortlab.viz import picture

HOST = "127.0.0.1"
MAX_SERVERS = 8
MIN_HEIGHT, MAX_HEIGHT = 100, 3000
_DATE_META = re.compile(rb'<meta name="date" content="[^"]*">')
_servers = {}  # model path -> NetronView, oldest first
_cache = None  # this process's folder of served models, removed at exit


class VizError(OrtlabError):
    """A model could not be shown (missing file, unreadable model, wrong type)."""


@dataclass
class NetronView:
    """A model served by Netron: a static picture of its graph beside the live Netron iframe.

    The display never holds the model's file name or bytes, only its structure (the picture) and
    a loopback URL, so the same graph with other weights displays the same.
    """

    path: Path
    port: int
    height: int = 500
    thread: object = field(default=None, repr=False, compare=False)
    name: str = ""
    model: object = field(default=None, repr=False, compare=False)

    @property
    def url(self):
        return f"http://{HOST}:{self.port}/"

    def __repr__(self):
        return f"NetronView('{self.name}' served on {HOST})"

    def _repr_html_(self):
        # The picture is an <img> of the SVG, not inline SVG: JupyterLab's sanitizer keeps an image in a
        # notebook it does not trust (a fresh clone's), and strips inline SVG and the iframe.
        svg = base64.b64encode(picture.to_svg(self.model, self.name).encode()).decode()
        alt = html.escape(f"the graph {self.name}: a static picture")
        return (f'<div style="display:flex;gap:8px;align-items:flex-start">'
                f'<div style="max-height:{self.height}px;overflow:auto;flex:0 0 auto">'
                f'<img src="data:image/svg+xml;base64,{svg}" alt="{alt}"></div>'
                f'<iframe src="{html.escape(self.url)}" width="100%" height="{self.height}" '
                f'title="Netron: {html.escape(self.name)}" style="border:1px solid #ccc"></iframe></div>')

    def _repr_png_(self):
        return picture.to_png(self.model)

    def stop(self):
        """Stop this server and wait for its thread to end."""
        self.thread.stop()
        self.thread.join(timeout=5)
        if _servers.get(self.path) is self:
            del _servers[self.path]


def _undated_handler():
    from netron import server  # optional: netron

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
    from netron import server  # optional: netron

    address = server._make_port((HOST, 0))
    content = server._ContentProvider(None, str(path), str(path), path.name)
    thread = server._HTTPServerThread(content, address)
    thread.server.RequestHandlerClass = type(
        "OrtlabNetronHandler", (_undated_handler(),), {"content": content})
    thread.start()
    while not thread.alive():
        time.sleep(0.01)
    return thread


def _parse(data, what):
    """The ModelProto in `data`, or a VizError saying that `what` is not an ONNX model."""
    try:
        model = onnx.load_from_string(data)
    except Exception as error:  # protobuf's DecodeError and friends
        raise VizError(f"{what} is not an ONNX model ({type(error).__name__}: {error}); "
                       "pass an onnx.ModelProto or the path of a .onnx file") from None
    if not model.graph.node and not model.graph.input and not model.graph.output:
        raise VizError(f"{what} parsed as an empty ONNX model (no graph): is it an ONNX file?")
    return model


def _load(model_or_path):
    """(ModelProto, path on disk to serve, display name) for a ModelProto, bytes or .onnx path."""
    if isinstance(model_or_path, (str, Path)):
        path = Path(model_or_path)
        if path.is_dir():
            raise VizError(f"{path} is a folder; pass the path of a .onnx file in it")
        if not path.is_file():
            raise VizError(f"{path}: no such model file; save the model first or pass the "
                           "onnx.ModelProto itself")
        model = _parse(path.read_bytes(), str(path))
        return model, path.resolve(), path.name
    if isinstance(model_or_path, onnx.ModelProto):
        model = model_or_path
    elif isinstance(model_or_path, (bytes, bytearray)):
        model = _parse(bytes(model_or_path), "these bytes")
    else:
        raise VizError(f"show() takes an onnx.ModelProto, a path or bytes, not "
                       f"{type(model_or_path).__name__}")
    data = model.SerializeToString()
    path = _cache_dir() / f"model-{hashlib.sha256(data).hexdigest()[:12]}.onnx"
    if not path.exists():
        path.write_bytes(data)
    return model, path, model.graph.name or "model"


def _cache_dir():
    """This process's folder for the models it serves (removed at exit)."""
    global _cache
    if _cache is None or not _cache.is_dir():
        _cache = Path(tempfile.mkdtemp(prefix="ortlab-netron-"))
    return _cache


def _check_height(height):
    if isinstance(height, bool) or not isinstance(height, int):
        raise VizError(f"height must be an int number of pixels, got {height!r}")
    if not MIN_HEIGHT <= height <= MAX_HEIGHT:
        raise VizError(f"height {height} is out of range: use {MIN_HEIGHT} to {MAX_HEIGHT} pixels")
    return height


def show(model_or_path, height=500):
    """Serve a model with Netron on 127.0.0.1 (a free port) and return a view that displays inline.

    The view displays a static picture of the graph (kept in the notebook) beside the live
    Netron page (gone with the kernel). Showing the same model again replaces its server; at
    most MAX_SERVERS run at once.
    """
    height = _check_height(height)
    model, path, name = _load(model_or_path)
    if path in _servers:
        _servers[path].stop()
    while len(_servers) >= MAX_SERVERS:
        next(iter(_servers.values())).stop()
    thread = _serve(path)
    view = NetronView(path, thread.address[1], height, thread, name, model)
    _servers[path] = view
    return view


def running():
    """The NetronViews currently served."""
    return list(_servers.values())


def stop_all():
    """Stop every Netron server that show() started."""
    for view in list(_servers.values()):
        view.stop()


def _clean_up():
    """Stop every server and remove this process's cached models."""
    stop_all()
    if _cache is not None:
        shutil.rmtree(_cache, ignore_errors=True)


atexit.register(_clean_up)

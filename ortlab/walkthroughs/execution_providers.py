"""Tables and pictures of where an ortlab.engine session put each node: what notebooks show.

Nothing here partitions, copies or runs anything: every function reads what a session already
decided (`sess.state`, `sess.log`) or what a partitioned model records (the metadata
'ortlab.execution_provider' that `SessionState.partitioned_model()` writes, i.e. the file saved
with SessionOptions(optimized_model_filepath=...)). ORT shows the same facts in its verbose log
(onnxruntime/core/framework/session_state.cc, VerifyEachNodeIsAssignedToAnEp: "Node placements").

    provider_table(names)          the EPs: device, what their buffers are, the ORT EP they mirror
    placement_table(source)        one row per node: node, op, EP
    placement_counts(source)       one row per EP: nodes, Memcpy nodes, op types
    kernel_def_table(source)       one row per kernel used: its KernelDef in KernelDefBuilder's words
    placement_log(lines)           the "Node placements" lines of ORT's or ortlab's log, prefixes removed
    partition_figure(source)       the graph, each node filled with its EP's colour
    plan_figure(sess)              the plan as a strip of steps coloured by EP
    show(figure)                   a figure as a PNG image a notebook displays (and stores)
"""
import io
import re
from collections import Counter
from pathlib import Path

import numpy as np
import onnx

from ortlab.engine.execution_provider import EXECUTION_PROVIDERS
from ortlab.errors import OrtlabError
from ortlab.onnx_defs import op_name
from ortlab.viz import Table, picture

EP_KEY = "ortlab.execution_provider"  # the metadata key SessionState.partitioned_model() writes
COLOURS = {"CPUExecutionProvider": "#d8e6f5", "TritonExecutionProvider": "#f7c873"}
OTHER_COLOURS = ("#b9e3b0", "#e3b0d8", "#f5d8d8", "#d5d0f0", "#cfe8e8")
MEMCPY_HATCH = "////"
_PLACEMENT_LINE = re.compile(r"^\[[VIWEF]:[^\]]*VerifyEachNodeIsAssignedToAnEp\] ?(.*)$")


class ViewError(OrtlabError):
    """A view was given something that records no placements (not a session, not a partitioned model)."""


# --- reading placements -------------------------------------------------------------------------
def _is_session(source):
    return hasattr(source, "state") and hasattr(source.state, "steps")


def _partitioned(source):
    """The partitioned ModelProto of a session, or the model / path given (checked to record EPs)."""
    if _is_session(source):
        return source.state.partitioned_model()
    if isinstance(source, (str, Path)):
        source = onnx.load(str(source))
    if not isinstance(source, onnx.ModelProto):
        raise ViewError(f"expected an ortlab.engine.InferenceSession or a partitioned model (ModelProto or "
                        f"path), not {type(source).__name__}")
    if source.graph.node and not any(p.key == EP_KEY for n in source.graph.node for p in n.metadata_props):
        raise ViewError("the model records no execution provider per node; save the partitioned graph with "
                        "SessionOptions(optimized_model_filepath=...) or pass the session itself")
    return source


def _node_ep(node):
    return next((p.value for p in node.metadata_props if p.key == EP_KEY), "")


def placements(source):
    """[(node name, op, EP)]: a session's nodes in plan order, or a partitioned model's in graph order."""
    if _is_session(source):
        return [(s.node.name or s.node.output_names[0], op_name(s.node.op_type, s.node.domain),
                 s.provider.type) for s in source.state.steps]
    model = _partitioned(source)
    return [(n.name or n.output[0], op_name(n.op_type, n.domain), _node_ep(n)) for n in model.graph.node]


def placement_table(source):
    """One row per node (plan order for a session): step, node, op, EP."""
    return Table(("step", "node", "op", "EP"), [(k, *row) for k, row in enumerate(placements(source))])


def _op_summary(ops):
    ordered = sorted(Counter(ops).items(), key=lambda kv: (-kv[1], kv[0]))  # most frequent first
    return ", ".join(f"{op}×{n}" if n > 1 else op for op, n in ordered)


def placement_counts(source):
    """One row per EP (in order of first use): how many nodes, how many of them Memcpy, which ops."""
    by_ep = {}
    for _, op, ep in placements(source):
        by_ep.setdefault(ep, []).append(op)
    rows = [(ep, len(ops), sum(op.startswith("Memcpy") for op in ops),
             _op_summary([op for op in ops if not op.startswith("Memcpy")]))
            for ep, ops in by_ep.items()]
    return Table(("EP", "nodes", "Memcpy nodes", "other ops"), rows)


def provider_table(names):
    """One row per EP name: its device, what its allocator hands out (the type of a 1-element buffer
    it allocates), and the ORT EP whose graph transformers and kernels it mirrors."""
    rows = []
    for name in ([names] if isinstance(names, str) else list(names)):
        ep = EXECUTION_PROVIDERS.lookup(name)()
        buffer = ep.allocate((1,), np.float32)
        kind = f"{type(buffer).__module__}.{type(buffer).__name__}"
        rows.append((name, f"{ep.device.type}:{ep.device.id}", kind, ep.ort_equivalent or "-"))
    return Table(("EP", "device", "buffers", "mirrors ORT's"), rows)


def kernel_def_table(source):
    """One row per kernel a session created, first use in plan order, one per (op, EP): op, EP, kernel
    class, and its KernelDef as KernelDefBuilder would write it. Also takes KernelDefs directly."""
    if _is_session(source):
        items = [(s.provider.type, s.kernel.kernel_def, type(s.kernel).__name__) for s in source.state.steps]
    else:
        try:
            items = [(k.provider, k, "-") for k in source]
        except (TypeError, AttributeError):
            raise ViewError(f"expected an ortlab.engine.InferenceSession or KernelDefs, not "
                            f"{type(source).__name__}") from None
    rows, seen = [], set()
    for ep, kdef, kernel in items:
        key = (kdef.op_type, kdef.domain, ep)
        if key not in seen:
            seen.add(key)
            rows.append((op_name(kdef.op_type, kdef.domain), ep, kernel, kdef.describe()))
    return Table(("op", "EP", "kernel", "declares"), rows)


def placement_log(lines):
    """The "Node placements" lines of a log, without ORT's or ortlab's prefix: `lines` is a list of
    str (ortlab.session.initialization_log gives ORT's), an ortlab Logger or a session."""
    if _is_session(lines):
        lines = lines.log
    if hasattr(lines, "lines"):
        lines = [text for _, text in lines.lines]
    found = []
    for line in lines:
        match = _PLACEMENT_LINE.match(line)
        if match:
            found.append(match.group(1))
    return found


# --- pictures -----------------------------------------------------------------------------------
def colours(eps):
    """{EP: fill colour}: the CPU and Triton EPs always the same, any other EP the next spare colour."""
    found, spare = {}, iter(OTHER_COLOURS * 4)
    for ep in eps:
        if ep not in found:
            found[ep] = COLOURS.get(ep) or next(spare)
    return found


def _legend(axes, palette, memcpy):
    from matplotlib.patches import Patch  # heavy: matplotlib

    handles = [Patch(facecolor=c, edgecolor="#555", label=ep) for ep, c in palette.items()]
    if memcpy:
        handles.append(Patch(facecolor="white", edgecolor="#555", hatch=MEMCPY_HATCH, label="Memcpy node"))
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)


def partition_figure(source, title=""):
    """The graph as ortlab.viz draws it (same layout), each node filled with the colour of its EP and
    Memcpy nodes hatched; graph inputs and outputs white. Returns a matplotlib Figure."""
    from matplotlib.figure import Figure  # heavy: matplotlib
    from matplotlib.patches import FancyBboxPatch  # heavy: matplotlib


    model = _partitioned(source)
    boxes, edges = picture.layout(model)
    nodes, _ = picture.drawn_nodes(model)
    initializers = {t.name for t in model.graph.initializer}
    first = sum(i.name not in initializers for i in model.graph.input)  # layout puts the graph inputs first
    node_of = {first + k: n for k, n in enumerate(nodes)}
    palette = colours(_node_ep(n) for n in nodes)
    width, height = picture._size(boxes)
    figure = Figure(figsize=(width / 80 + 2.4, height / 80 + 0.3), dpi=80)
    axes = figure.add_axes((0, 0, width / (width + 192), 1))
    axes.set(xlim=(0, width), ylim=(height, 0))
    axes.axis("off")
    w, h = picture.BOX_W, picture.BOX_H
    for a, b in edges:
        start, end = boxes[a], boxes[b]
        axes.plot([start.x + w / 2, end.x + w / 2], [start.y + h, end.y], color="#888", lw=0.8)
    for k, box in enumerate(boxes):
        node = node_of.get(k)
        fill = "#ffffff" if node is None else palette[_node_ep(node)]
        hatch = MEMCPY_HATCH if node is not None and node.op_type.startswith("Memcpy") else None
        radius = h // 2 if node is None else 4
        shape = f"round,pad=0,rounding_size={radius}"
        axes.add_patch(FancyBboxPatch((box.x, box.y), w, h, boxstyle=shape, facecolor=fill, hatch=hatch,
                                      edgecolor="#555", lw=0.8))
        label_box = {"facecolor": fill, "edgecolor": "none", "pad": 0.5} if hatch else None  # over the hatch
        axes.text(box.x + w / 2, box.y + h / 2, picture._short(box.label), ha="center", va="center",
                  fontsize=8, bbox=label_box)
    _legend(axes, palette, any(n.op_type.startswith("Memcpy") for n in nodes))
    if title:
        axes.set_title(title, fontsize=9, loc="left")
    return figure


def plan_figure(sess, title=""):
    """A session's plan as one strip: a cell per step, in execution order, filled with its EP's colour,
    Memcpy steps hatched; the title (after `title`) counts the steps and the copies. Returns a Figure."""
    from matplotlib.figure import Figure  # heavy: matplotlib
    from matplotlib.patches import Rectangle  # heavy: matplotlib

    if not _is_session(sess):
        raise ViewError(f"plan_figure needs an ortlab.engine.InferenceSession, not {type(sess).__name__}")
    rows = placements(sess)
    palette = colours(ep for _, _, ep in rows)
    figure = Figure(figsize=(9, 1.3), dpi=80)
    axes = figure.add_axes((0.02, 0.15, 0.7, 0.6))
    axes.set(xlim=(0, max(len(rows), 1)), ylim=(0, 1))
    axes.set_yticks([])
    axes.set_xlabel("step", fontsize=8)
    axes.tick_params(labelsize=7)
    copies = 0
    for k, (_, op, ep) in enumerate(rows):
        memcpy = op.startswith("Memcpy")
        copies += memcpy
        edge = "#555" if memcpy else palette[ep]
        axes.add_patch(Rectangle((k, 0), 1, 1, facecolor=palette[ep], edgecolor=edge, lw=0.5,
                                 hatch=MEMCPY_HATCH if memcpy else None))
    _legend(axes, palette, copies > 0)
    counts = f"{len(rows)} steps, {copies} of them Memcpy"
    axes.set_title(f"{title}: {counts}" if title else counts, fontsize=9, loc="left")
    return figure


def show(figure, dpi=80):
    """A Figure as an IPython PNG image (what a cell displays and a stored notebook keeps; pyplot and
    the notebook's backend are left alone)."""
    from IPython.display import Image  # optional: IPython

    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi, bbox_inches="tight")
    return Image(data=buffer.getvalue(), format="png")

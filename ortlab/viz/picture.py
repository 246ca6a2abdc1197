"""A static picture of a graph's structure: what a stored notebook shows without a Netron server.

The layout is Netron's in miniature, Constant nodes left out (graph inputs on top, each node one layer below its lowest
producer, graph outputs at the bottom) and depends only on the graph's structure (op types,
edges, names), never on its weights: the picture of a model whose weights changed is the same
picture. Two renderers share one layout: SVG text (deterministic, compared by the notebook tests)
and a PNG (matplotlib; shown where HTML is not trusted).
"""
import html
import io
from dataclasses import dataclass

from ortlab.onnx_defs import domain_of

BOX_W, BOX_H, GAP_X, GAP_Y, MARGIN = 120, 26, 16, 22, 10
MAX_NODES = 120  # a bigger graph is drawn up to here (a thumbnail); Netron shows all of it
MAX_PIXELS = 1000
# Netron-like colours by op family; anything else is grey.
COLOURS = {
    "layer": ("Conv", "ConvTranspose", "Gemm", "MatMul", "FusedGemm", "FusedMatMul", "Attention"),
    "activation": ("Relu", "Gelu", "FastGelu", "BiasGelu", "Sigmoid", "Tanh", "Erf", "Softmax",
                   "LogSoftmax", "QuickGelu"),
    "normalization": ("LayerNormalization", "SkipLayerNormalization", "BatchNormalization",
                      "SimplifiedLayerNormalization", "Dropout"),
    "shape": ("Reshape", "Transpose", "Shape", "Gather", "Concat", "Slice", "Squeeze",
              "Unsqueeze", "Expand", "Flatten", "Split", "Cast"),
}
FILL = {"layer": "#d8e6f5", "activation": "#f5d8d8", "normalization": "#dff0d8",
        "shape": "#efe6d5", "other": "#e8e8e8", "io": "#ffffff"}


@dataclass(frozen=True)
class Box:
    """One drawn item: a node, a graph input or a graph output, at (x, y) of its top-left corner."""

    label: str
    kind: str
    x: int
    y: int


def _family(op_type):
    return next((name for name, ops in COLOURS.items() if op_type in ops), "other")


def _label(node):
    """The op type, prefixed by the last part of a non-ONNX domain: 'microsoft:Gelu'."""
    domain = domain_of(node.domain)
    return f"{domain.split('.')[-1]}:{node.op_type}" if domain else node.op_type


def drawn_nodes(model):
    """(the nodes drawn, how many more there are): Constants are left out, the rest up to MAX_NODES."""
    nodes = [n for n in model.graph.node if n.op_type != "Constant"]
    return nodes[:MAX_NODES], max(len(nodes) - MAX_NODES, 0)


def layout(model):
    """Boxes and edges ((from index, to index) into boxes) of a model's main graph."""
    graph = model.graph
    nodes, more = drawn_nodes(model)
    initializers = {i.name for i in graph.initializer}
    inputs = [i.name for i in graph.input if i.name not in initializers]
    items = [(name, "io", None) for name in inputs] + [(_label(n), "node", n) for n in nodes]
    # graph inputs and nodes without inputs (Constants) wait, then sit just above their first consumer
    layer, producer = [None] * len(inputs), {name: i for i, name in enumerate(inputs)}
    edges = []
    for index, node in enumerate(nodes, start=len(inputs)):
        sources = sorted({producer[n] for n in node.input if n in producer})
        edges += [(s, index) for s in sources]
        placed = [layer[s] for s in sources if layer[s] is not None]
        layer.append(1 + max(placed, default=0) if sources else None)
        producer.update({name: index for name in node.output if name})
    for index, row in enumerate(layer):
        if row is None:
            below = [layer[b] for a, b in edges if a == index and layer[b] is not None]
            layer[index] = max(min(below, default=1) - 1, 0)
    bottom = max(layer, default=0) + 1
    for output in graph.output:  # graph outputs just below their producer (if it is drawn)
        source = producer.get(output.name)
        if source is None and more:
            continue
        if source is not None:
            edges.append((source, len(items)))
        items.append((output.name, "io", None))
        layer.append(bottom if source is None else layer[source] + 1)
    return _place(items, layer), edges


def _place(items, layer):
    column = {}
    boxes = []
    for (label, kind, node), row in zip(items, layer):
        col = column.get(row, 0)
        column[row] = col + 1
        family = "io" if kind == "io" else _family(node.op_type)
        boxes.append(Box(label, family, MARGIN + col * (BOX_W + GAP_X),
                         MARGIN + row * (BOX_H + GAP_Y)))
    return boxes


def _size(boxes):
    width = max((b.x for b in boxes), default=0) + BOX_W + MARGIN
    height = max((b.y for b in boxes), default=0) + BOX_H + MARGIN
    return width, height


def _short(text, limit=18):
    return text if len(text) <= limit else text[:limit - 1] + "…"


def to_svg(model, title=""):
    """The picture as SVG text: integer coordinates, no ids or dates, so the same graph gives the same text."""
    boxes, edges = layout(model)
    width, height = _size(boxes)
    more = drawn_nodes(model)[1]
    height += 20 if more else 0
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'viewBox="0 0 {width} {height}" font-family="sans-serif" font-size="11">',
             f"<title>{html.escape(title or model.graph.name or 'graph')}</title>"]
    for a, b in edges:
        start, end = boxes[a], boxes[b]
        parts.append(f'<line x1="{start.x + BOX_W // 2}" y1="{start.y + BOX_H}" '
                     f'x2="{end.x + BOX_W // 2}" y2="{end.y}" stroke="#888"/>')
    for box in boxes:
        radius = BOX_H // 2 if box.kind == "io" else 4
        parts.append(f'<rect x="{box.x}" y="{box.y}" width="{BOX_W}" height="{BOX_H}" rx="{radius}" '
                     f'fill="{FILL[box.kind]}" stroke="#555"/>')
        parts.append(f'<text x="{box.x + BOX_W // 2}" y="{box.y + 17}" text-anchor="middle">'
                     f"{html.escape(_short(box.label))}</text>")
    if more:
        parts.append(f'<text x="{MARGIN}" y="{height - 6}">… and {more} more nodes: open Netron to see '
                     "the whole graph</text>")
    parts.append("</svg>")
    return "\n".join(parts)


def to_png(model, dpi=80):
    """The same picture as PNG bytes (matplotlib), for viewers that do not render HTML."""
    from matplotlib.figure import Figure  # heavy: matplotlib; no pyplot: the notebook's backend is left alone
    from matplotlib.patches import FancyBboxPatch  # heavy: matplotlib

    boxes, edges = layout(model)
    width, height = _size(boxes)
    scale = min(1.0, MAX_PIXELS / max(width, height))  # a thumbnail of a few hundred kB at most
    figure = Figure(figsize=(width * scale / dpi, height * scale / dpi), dpi=dpi)
    axes = figure.add_axes((0, 0, 1, 1))
    axes.set(xlim=(0, width), ylim=(height, 0))
    axes.axis("off")
    for a, b in edges:
        start, end = boxes[a], boxes[b]
        axes.plot([start.x + BOX_W / 2, end.x + BOX_W / 2], [start.y + BOX_H, end.y], color="#888", lw=0.8)
    for box in boxes:
        axes.add_patch(FancyBboxPatch((box.x, box.y), BOX_W, BOX_H, boxstyle="round,pad=0,rounding_size=4",
                                      facecolor=FILL[box.kind], edgecolor="#555", lw=0.8))
        axes.text(box.x + BOX_W / 2, box.y + BOX_H / 2, _short(box.label), ha="center", va="center",
                  fontsize=8 * scale)
    more = drawn_nodes(model)[1]
    if more:
        axes.text(MARGIN, height - MARGIN / 2, f"… and {more} more nodes: open Netron to see the whole graph",
                  fontsize=8 * scale)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()


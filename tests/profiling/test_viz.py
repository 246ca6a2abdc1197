"""ortlab.viz: Netron served on loopback, stable displays, no leaked servers."""
import base64
import threading
import urllib.request
from pathlib import Path

import numpy as np
import onnx
import onnx.numpy_helper
import pytest
from onnx import TensorProto, helper

from ortlab import OrtlabError, viz
from repo_paths import ROOT


def tiny_model():
    node = helper.make_node("Relu", ["X"], ["Y"], name="relu_node")
    graph = helper.make_graph([node], "tiny",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2])])
    return helper.make_model(graph)


def netron_threads():
    return [t for t in threading.enumerate() if type(t).__name__ == "_HTTPServerThread" and t.alive()]


@pytest.fixture(autouse=True)
def _clean():
    viz.stop_all()
    yield
    viz.stop_all()


def test_show_serves_on_loopback_and_the_page_and_model_load():
    view = viz.show(tiny_model())
    assert view.url.startswith("http://127.0.0.1:")
    assert all(t.address[0] == "127.0.0.1" for t in netron_threads())
    page = urllib.request.urlopen(view.url, timeout=10).read().decode()
    assert "netron" in page.lower()
    assert '<meta name="date"' not in page  # else Netron stops 180 days after its release
    data = urllib.request.urlopen(view.url + "data/" + view.path.name, timeout=10).read()
    assert onnx.load_from_string(data).graph.node[0].name == "relu_node"


def test_display_is_stable_across_runs():
    first = viz.show(tiny_model())
    text, html = repr(first), first._repr_html_()
    viz.stop_all()
    second = viz.show(tiny_model())
    assert repr(second) == text  # no port, no temp path: nbval compares it as is
    assert html.replace(str(first.port), "P") == second._repr_html_().replace(str(second.port), "P")


def test_repeated_shows_do_not_leak_or_collide():
    views = [viz.show(tiny_model()) for _ in range(3)]
    assert len(viz.running()) == 1 and len(netron_threads()) == 1
    assert views[-1].path == views[0].path
    for i in range(viz.MAX_SERVERS + 3):
        model = tiny_model()
        model.graph.name = f"g{i}"
        viz.show(model)
    ports = [v.port for v in viz.running()]
    assert len(ports) == viz.MAX_SERVERS == len(set(ports)) == len(netron_threads())
    viz.stop_all()
    assert viz.running() == [] and netron_threads() == []


def test_show_a_path(tmp_path):
    path = tmp_path / "m.onnx"
    onnx.save(tiny_model(), path)
    assert viz.show(path).path == path.resolve()


@pytest.mark.parametrize("bad, words", [("missing.onnx", "no such model file"), (42, "not int"),
                                       ("/", "is a folder"), (b"", "empty ONNX model")])
def test_bad_input_is_explained(bad, words):
    with pytest.raises(OrtlabError, match=words):
        viz.show(bad)


def test_node_table_lists_every_node_including_unnamed_ones():
    model = tiny_model()
    model.graph.node.append(helper.make_node("Gelu", ["Y"], ["Z"], domain="com.microsoft"))
    table = viz.node_table(model)
    assert table.rows == [(0, "relu_node", "Relu", "X", "Y"), (1, "(no name)", "com.microsoft:Gelu", "Y", "Z")]
    assert repr(table).splitlines()[0].split() == ["index", "name", "op", "inputs", "outputs"]
    assert "<td>com.microsoft:Gelu</td>" in table._repr_html_()


def test_two_models_served_at_once_each_serve_their_own():
    a, b = tiny_model(), tiny_model()
    b.graph.node[0].name = "other_node"
    va, vb = viz.show(a), viz.show(b)
    for view, name in ((va, "relu_node"), (vb, "other_node")):
        page = urllib.request.urlopen(view.url, timeout=10).read().decode()
        assert f'content="/data/{view.path.name}"' in page
        data = urllib.request.urlopen(view.url + "data/" + view.path.name, timeout=10).read()
        assert onnx.load_from_string(data).graph.node[0].name == name


def test_plot_curves_draws_one_labelled_line_per_curve():
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from ortlab.viz import plot_curves
    assert plot_curves({"ORT": [3, 2, 1], "torch": [3, 2.5, 1.5]}, title="loss") is None
    lines = plt.gcf().axes[0].get_lines()
    assert [line.get_label() for line in lines] == ["ORT", "torch"]
    assert list(lines[1].get_ydata()) == [3, 2.5, 1.5]
    plt.close("all")


def weighted_model(weight):
    """MatMul by an initializer, then Relu: the same structure for any weight value."""
    w = onnx.numpy_helper.from_array(np.full((2, 2), weight, np.float32), "W")
    nodes = [helper.make_node("MatMul", ["X", "W"], ["H"], name="mm"),
             helper.make_node("Relu", ["H"], ["Y"], name="act")]
    graph = helper.make_graph(nodes, "weighted",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [1, 2])], [w])
    return helper.make_model(graph)


def test_the_display_shows_the_graph_and_not_the_weights():
    a, b = viz.show(weighted_model(1.0)), viz.show(weighted_model(2.0))
    assert a.path != b.path  # two models served...
    html_a, html_b = (v._repr_html_().replace(str(v.port), "PORT") for v in (a, b))
    assert html_a == html_b and repr(a) == repr(b)  # ...that display the same
    assert "model-" not in html_a and str(a.path) not in html_a
    assert "<svg" not in html_a  # an <img> of the SVG: it survives an untrusted notebook's sanitizer
    image = html_a.split('<img src="data:image/svg+xml;base64,', 1)[1].split('"', 1)[0]
    svg = base64.b64decode(image).decode()
    assert svg.startswith("<svg") and svg.endswith("</svg>")
    texts = [t.split(">", 1)[1] for t in svg.split("</text>")[:-1]]
    texts = [t.rsplit(">", 1)[-1] for t in texts]
    assert texts == ["X", "MatMul", "Relu", "Y"]  # inputs, nodes in order, outputs; no initializer
    assert svg.count("<line") == 3  # X->MatMul->Relu->Y
    assert '<iframe src="http://127.0.0.1:PORT/"' in html_a


def test_the_static_picture_is_a_png_and_the_svg_is_deterministic():
    from ortlab.viz import picture
    view = viz.show(tiny_model())
    png = view._repr_png_()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 500
    assert picture.to_svg(tiny_model()) == picture.to_svg(tiny_model())


def test_the_picture_layers_follow_the_edges():
    from ortlab.viz import picture
    model = weighted_model(1.0)
    model.graph.node.append(helper.make_node("Relu", ["H"], ["Z"], name="side"))
    model.graph.output.append(helper.make_tensor_value_info("Z", TensorProto.FLOAT, [1, 2]))
    boxes, edges = picture.layout(model)
    by_label = {}
    for box in boxes:
        by_label.setdefault(box.label, []).append(box)
    relu_a, relu_b = by_label["Relu"]
    assert relu_a.y == relu_b.y > by_label["MatMul"][0].y > by_label["X"][0].y  # siblings share a row
    assert relu_a.x != relu_b.x
    for a, b in edges:
        assert boxes[a].y < boxes[b].y  # every edge points down


@pytest.mark.parametrize("height, words", [("300", "must be an int"), (50, "out of range"),
                                           ('500" onload="alert(1)', "must be an int"), (True, "must be an int")])
def test_bad_heights_are_refused(height, words):
    with pytest.raises(OrtlabError, match=words):
        viz.show(tiny_model(), height=height)


def test_a_file_that_is_not_onnx_is_refused(tmp_path):
    path = tmp_path / "notes.onnx"
    path.write_text("this is a text file, not a model\n" * 10)
    with pytest.raises(OrtlabError, match="not an ONNX model"):
        viz.show(path)
    with pytest.raises(OrtlabError, match="not an ONNX model"):
        viz.show(b"\xff\xfe garbage bytes")


def test_the_model_cache_is_removed_at_exit(tmp_path):
    import subprocess
    import sys
    code = ("import sys; sys.path.insert(0, 'tests')\n"  # where test_viz finds repo_paths, as under pytest
            "from ortlab import viz; from tests.profiling.test_viz import tiny_model; "
            "v = viz.show(tiny_model()); print(v.path.parent)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    folder = Path(out.stdout.strip().splitlines()[-1])
    assert folder.name.startswith("ortlab-netron-") and not folder.exists()


def test_a_table_prints_any_header_and_cells():
    table = viz.Table(("step", 0, 10), [("loss", 2.5, None)])
    assert repr(table).splitlines() == ["step  0    10", "----  ---  ----", "loss  2.5  None"]


def test_a_big_graph_is_drawn_as_a_thumbnail_without_constants():
    from ortlab.viz import picture
    nodes = [helper.make_node("Constant", [], ["c"], value=onnx.numpy_helper.from_array(np.ones(2, np.float32)))]
    names = ["X"] + [f"h{i}" for i in range(picture.MAX_NODES + 30)]
    nodes += [helper.make_node("Add", [a, "c"], [b]) for a, b in zip(names, names[1:])]
    graph = helper.make_graph(nodes, "long", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info(names[-1], TensorProto.FLOAT, [2])])
    model = helper.make_model(graph)
    boxes, _ = picture.layout(model)
    assert [b.label for b in boxes].count("Add") == picture.MAX_NODES and "Constant" not in [b.label for b in boxes]
    svg = picture.to_svg(model)
    assert "and 30 more nodes" in svg and len(svg) < 100_000
    assert len(picture.to_png(model)) < 400_000

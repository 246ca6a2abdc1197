"""ortlab.walkthroughs.execution_providers: the tables and pictures agree with ORT's rules, ORT's own log and the saved
partitioned graph (read with onnx, not through the engine)."""
import onnx
import pytest
from matplotlib.colors import to_hex
from matplotlib.patches import FancyBboxPatch, Rectangle

from engine_models import chain_model, reduce_sum_model
from ortlab import session
from ortlab.engine import InferenceSession, KernelDef, SessionOptions
from ortlab.walkthroughs import execution_providers as views

TRITON = ["TritonExecutionProvider"]
CPU, DEVICE = "CPUExecutionProvider", "TritonExecutionProvider"


@pytest.fixture(scope="module")
def chain(tmp_path_factory):
    """Softmax -> Relu -> Softmax with the Triton EP first, and the partitioned graph it saved."""
    path = tmp_path_factory.mktemp("views") / "partitioned.onnx"
    options = SessionOptions(log_severity_level=3, optimized_model_filepath=str(path))
    sess = InferenceSession(chain_model(), options, providers=TRITON)
    return sess, path


def saved_eps(path):
    """{node name: EP} read straight from the saved file's metadata."""
    return {n.name: {p.key: p.value for p in n.metadata_props}["ortlab.execution_provider"]
            for n in onnx.load(str(path)).graph.node}


def test_placement_table_follows_orts_rules_on_a_chain(chain):
    sess, _ = chain
    rows = {node: (op, ep) for _, node, op, ep in views.placement_table(sess).rows}
    assert rows["n1"] == ("Relu", CPU)  # no Triton kernel for Relu: the CPU EP takes it
    assert rows["n0"] == rows["n2"] == ("Softmax", DEVICE)
    ops = [op for _, _, op, _ in views.placement_table(sess).rows]
    relu = ops.index("Relu")
    assert ops[relu - 1] == "MemcpyToHost" and ops[relu + 1] == "MemcpyFromHost"  # the sandwich
    assert ops.count("MemcpyToHost") == 1  # v0 down to the host; the graph output y is copied by the run


def test_a_session_and_its_saved_partitioned_graph_give_the_same_placements(chain):
    sess, path = chain
    from_session = sorted(views.placements(sess))
    from_file = sorted(views.placements(path))
    assert from_session == from_file
    assert {name: ep for name, _, ep in from_file} == saved_eps(path)


def test_placement_counts_add_up_to_the_saved_graph(chain):
    sess, path = chain
    model = onnx.load(str(path))
    table = views.placement_counts(sess)
    assert table.header == ("EP", "nodes", "Memcpy nodes", "other ops")
    assert sum(row[1] for row in table.rows) == len(model.graph.node)
    assert sum(row[2] for row in table.rows) == sum(n.op_type.startswith("Memcpy") for n in model.graph.node)
    by_ep = {row[0]: row for row in table.rows}
    assert by_ep[DEVICE][3] == "Softmax×2" and by_ep[CPU][3] == "Relu"


def test_kernel_def_table_one_row_per_op_and_ep_with_orts_declarations():
    options = SessionOptions(graph_optimization_level=0, log_severity_level=3)
    sess = InferenceSession(reduce_sum_model(), options, providers=TRITON)
    rows = {(op, ep): declares for op, ep, _, declares in views.kernel_def_table(sess).rows}
    assert "InputMemoryType(CPU, 1)" in rows[("ReduceSum", DEVICE)]  # ORT's CUDA ReduceSum: axes on the host
    assert rows[("MemcpyFromHost", DEVICE)] == "InputMemoryType(CPU, 0)"
    assert rows[("Relu", CPU)] == "MayInplace(0, 0)"
    chain_rows = views.kernel_def_table(InferenceSession(chain_model(), SessionOptions(log_severity_level=3),
                                                         providers=TRITON)).rows
    assert sum(op == "Softmax" for op, *_ in chain_rows) == 1  # two Softmax nodes, one kernel definition
    chain_declares = {(op, ep): declares for op, ep, _, declares in chain_rows}
    assert chain_declares[("MemcpyToHost", DEVICE)] == "OutputMemoryType(CPU, 0)"


def test_kernel_def_table_takes_kernel_defs():
    defs = [KernelDef("Reshape", alias=((0, 0),)), KernelDef("Relu", may_inplace=((0, 0),))]
    table = views.kernel_def_table(defs)
    assert table.rows == [("Reshape", CPU, "-", "Alias(0, 0)"), ("Relu", CPU, "-", "MayInplace(0, 0)")]
    with pytest.raises(views.ViewError, match="KernelDefs"):
        views.kernel_def_table(42)


def test_placement_log_reads_orts_log_and_ortlabs_alike():
    model = chain_model()
    ort_lines = session.initialization_log(model, severity=0, providers=[CPU], level="disable")
    ours = InferenceSession(model, SessionOptions(graph_optimization_level=0, log_severity_level=3))
    assert views.placement_log(ort_lines) == views.placement_log(ours) == views.placement_log(ours.log)
    assert views.placement_log(ort_lines) == ["Node placements",
                                              f" All nodes placed on [{CPU}]. Number of nodes: 3"]
    assert views.placement_log(["unrelated", "[I:onnxruntime:, x.cc:1 F] other"]) == []


def test_provider_table_shows_what_each_allocator_hands_out():
    rows = {row[0]: row for row in views.provider_table([CPU, DEVICE]).rows}
    assert rows[CPU][1:] == ("CPU:0", "numpy.ndarray", CPU)
    assert rows[DEVICE][1:] == ("GPU:0", "torch.Tensor", "CUDAExecutionProvider")
    with pytest.raises(Exception, match="TritonExecutionProvider"):
        views.provider_table(["TritonExecutionProvder"])


def _boxes(figure):
    return [p for p in figure.axes[0].patches if isinstance(p, FancyBboxPatch)]


def test_partition_figure_colours_each_node_by_its_ep(chain):
    sess, path = chain
    eps = saved_eps(path)
    palette = views.colours([DEVICE, CPU])
    for source in (sess, path):
        boxes = _boxes(views.partition_figure(source))
        fills = [to_hex(b.get_facecolor()) for b in boxes]
        assert fills.count(palette[DEVICE]) == sum(ep == DEVICE for ep in eps.values())
        assert fills.count(palette[CPU]) == sum(ep == CPU for ep in eps.values())
        assert fills.count("#ffffff") == 2  # the graph input x and output y
        assert sum(bool(b.get_hatch()) for b in boxes) == 2  # the two Memcpy nodes


def test_partition_figure_needs_placements():
    with pytest.raises(views.ViewError, match="records no execution provider"):
        views.partition_figure(chain_model())
    with pytest.raises(views.ViewError, match="InferenceSession"):
        views.placements([1, 2])


def test_plan_figure_has_one_cell_per_step(chain):
    sess, _ = chain
    figure = views.plan_figure(sess, "chain")
    cells = [p for p in figure.axes[0].patches if type(p) is Rectangle]
    assert len(cells) == len(sess.state.steps)
    assert sum(bool(c.get_hatch()) for c in cells) == sess.memcpy_count == 2
    assert figure.axes[0].get_title(loc="left") == "chain: 5 steps, 2 of them Memcpy"
    with pytest.raises(views.ViewError, match="InferenceSession"):
        views.plan_figure(chain_model())


def test_show_gives_a_png():
    sess = InferenceSession(chain_model(), SessionOptions(log_severity_level=3))
    image = views.show(views.plan_figure(sess))
    assert image.data[:8] == b"\x89PNG\r\n\x1a\n"


def test_colours_are_stable_and_distinct():
    palette = views.colours(["A", CPU, "B", DEVICE, "A"])
    assert palette[CPU] == views.COLOURS[CPU] and palette[DEVICE] == views.COLOURS[DEVICE]
    assert len(set(palette.values())) == 4 and list(palette) == ["A", CPU, "B", DEVICE]

"""L1_02's exercises are judged by ortlab.engine's partitioner and memcpy transformer (the ORT installed here is a
CPU build, with no device EP to partition for). Here those decisions agree with an independent reading of ORT's
rules: 'placements' with the Triton kernels' declared input types (the input types are those of the values ORT
computes), and first claim wins; 'memcpy_nodes' with where each value is made and where it is read; and the
partitioned models compute what ORT 1.19.2 computes, copies and all.
"""
import numpy as np
import onnx
import pytest

from ortlab import session
from ortlab.engine import InferenceSession, SessionOptions
from ortlab.triton_kernels.registry import KERNELS, load_builtin_kernels
from ortlab.labs import l1_02
from ortlab.labs.judges.l1_02 import ortlab_copies, ortlab_placements

CPU, TRITON = "CPUExecutionProvider", "TritonExecutionProvider"


def _value_types(model, feeds):
    """{value name: numpy dtype name}: the feeds', the initializers' and, for every other value, the dtype of what
    ORT computes for it (session.node_outputs: every value made a graph output)."""
    types = {name: value.dtype.name for name, value in feeds.items()}
    types.update({t.name: onnx.helper.tensor_dtype_to_np_dtype(t.data_type).name for t in model.graph.initializer})
    types.update({output: np.asarray(value).dtype.name for _, _, output, value in session.node_outputs(model, feeds)})
    return types


def test_the_triton_ep_claims_the_nodes_whose_kernel_takes_their_input_types_and_the_first_claim_wins():
    load_builtin_kernels()
    model = l1_02.placement_model()
    types = _value_types(model, l1_02.placement_feeds())
    expected = {}
    for node in model.graph.node:
        kernel = KERNELS.get((node.op_type, node.domain))
        takes = kernel is not None and all(types[name] in arg.types for name, arg in zip(node.input, kernel.inputs))
        expected[node.name] = TRITON if takes else CPU
    assert ortlab_placements([TRITON]) == expected
    assert ortlab_placements([CPU, TRITON]) == {name: CPU for name in expected}
    assert sorted(n for n, ep in expected.items() if ep == TRITON) == ["bias_gelu", "layer_norm", "reduce_sum",
                                                                        "softmax"]


@pytest.mark.parametrize("providers", list(l1_02.PLACEMENT_PROVIDERS.values()), ids=list(l1_02.PLACEMENT_PROVIDERS))
def test_the_placement_model_computes_orts_outputs(providers):
    model, feeds = l1_02.placement_model(), l1_02.placement_feeds()
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0, log_severity_level=3),
                            providers=providers)
    theirs = session.run_model(model, feeds)
    for name, ours in zip(["total", "y64"], sess.run(None, feeds)):
        assert ours.dtype == theirs[name].dtype
        np.testing.assert_allclose(ours, theirs[name], rtol=1e-4, atol=1e-5)


def _copies_from_value_flow(graph):
    """The Memcpy nodes, read off where each value is made and where it is read: a value made on the host (or
    fed, when the host reads it too) and read in device memory is copied once to the device; a value made on the
    device and read on the host is copied once back; an initializer is never copied by a node."""
    made, read = {}, {}
    for name in graph.inputs:
        made[name] = "fed"
    for node in graph.nodes:
        for value in node.outputs:
            made[value] = "device" if node.ep != CPU else "host"
        for i, value in enumerate(node.inputs):
            where = "device" if node.ep != CPU and i not in node.cpu_inputs else "host"
            read.setdefault(value, set()).add(where)
    copies = []
    for value, places in read.items():
        origin = made.get(value, "initializer")
        if origin == "host" and "device" in places or origin == "fed" and places == {"host", "device"}:
            copies.append(("MemcpyFromHost", value))
        if origin == "device" and "host" in places:
            copies.append(("MemcpyToHost", value))
    return sorted(copies)


@pytest.mark.parametrize("name", list(l1_02.MEMCPY_MODELS))
def test_the_memcpy_nodes_follow_where_each_value_is_made_and_read(name):
    model = l1_02.memcpy_model(name)
    assert sorted(ortlab_copies(model)) == _copies_from_value_flow(l1_02.placed(model))


@pytest.mark.parametrize("name", list(l1_02.MEMCPY_MODELS))
def test_each_memcpy_model_with_its_copies_computes_orts_outputs_and_logs_each_copy(name):
    model = l1_02.memcpy_model(name)
    feeds = {i.name: np.random.default_rng(0).standard_normal((3, 5)).astype(np.float32) for i in model.graph.input}
    if "axis" in feeds:
        feeds["axis"] = np.array(1, np.int64)
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=0, log_severity_level=3),
                            providers=[TRITON])
    theirs = session.run_model(model, feeds)
    for output, ours in zip([o.name for o in model.graph.output], sess.run(None, feeds)):
        np.testing.assert_allclose(ours, theirs[output], rtol=1e-4, atol=1e-5)
    logged = session.grep(sess.log.text().splitlines(), "Add Memcpy")
    assert sess.memcpy_count == len(ortlab_copies(model)) == len(logged)
    for kind, value in ortlab_copies(model):
        where = "after" if kind == "MemcpyFromHost" else "before"
        assert any(f"Add {kind} {where} {value} for {TRITON}" in line for line in logged), (kind, value, logged)

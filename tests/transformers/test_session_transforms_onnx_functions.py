"""InlineNodes for ONNX ops: ORT 1.19.2's CPU EP has no kernel for some ONNX ops that have a function body
(CastLike, CenterCropPad, GroupNormalization, SequenceMap), so its partitioner replaces each such node by the body
ONNX builds for it. The engine does the same (ortlab.transformers.session_transforms).

Checked against ORT live on onnx's backend cases: which function ops ORT keeps and which it inlines (the table is
ORT's), the ops of the graph the engine runs against ORT's saved graph, and the values.
"""
import collections
import glob
import os

import numpy as np
import onnx
import onnx.defs
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from ortlab import session
from ortlab.engine import InferenceSession, SessionOptions
from ortlab.transformers.session_transforms import ORT_CPU_INLINED_ONNX_OPS
from test_engine_backend_cases import assert_same, load_case, probe, run_ort

FUNCTION_OPS = sorted({s.name for s in onnx.defs.get_all_schemas_with_history()
                       if s.domain == "" and (s.has_function or s.has_context_dependent_function)})


def _single_node_cases():
    """One backend case (not an expanded one) per ONNX function op: (op, case directory)."""
    found = {}
    for case in sorted(glob.glob(os.path.join(probe.node_test_dir(), "test_*"))):
        if "expanded" in case:
            continue
        nodes = onnx.load(os.path.join(case, "model.onnx")).graph.node
        if len(nodes) == 1 and nodes[0].op_type in FUNCTION_OPS:
            found.setdefault(nodes[0].op_type, case)
    return sorted(found.items())


CASES = _single_node_cases()


def ort_saved_ops(model):
    return collections.Counter(n.op_type for n in session.optimized_model(
        model, level="disable", providers=["CPUExecutionProvider"]).graph.node)


@pytest.mark.parametrize("op, case", CASES, ids=[op for op, _ in CASES])
def test_the_table_of_inlined_ops_is_orts(op, case):
    model, _ = load_case(case)
    try:
        theirs = ort_saved_ops(model)
    except Exception as exc:  # noqa: BLE001 (an opset ORT 1.19.2 does not take: nothing to learn)
        pytest.skip(f"ORT 1.19.2 refuses it: {str(exc)[:100]}")
    assert (op not in theirs) == (op in ORT_CPU_INLINED_ONNX_OPS), dict(theirs)


INLINED_CASES = [pytest.param(c, id=os.path.basename(c)[len("test_"):])
                 for pattern in ("castlike_*", "center_crop_pad_*", "group_normalization_*", "sequence_map_*")
                 for c in sorted(glob.glob(os.path.join(probe.node_test_dir(), "test_" + pattern)))
                 if "expanded" not in c]


@pytest.mark.parametrize("case", INLINED_CASES)
def test_the_engine_runs_the_inlined_body_as_ort(case):
    model, feeds = load_case(case)
    try:
        theirs = ort_saved_ops(model)
        expected = run_ort(model, feeds)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"ORT 1.19.2 refuses it: {str(exc)[:100]}")
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=0))
    assert collections.Counter(s.node.op_type for s in sess.state.steps) == theirs
    if any(isinstance(o, tuple) for o in expected):
        return  # a bfloat16 or float8 output: run() returns none (ORT's only through OrtValues)
    for o, e, name in zip(expected, sess.run(None, feeds), [v.name for v in model.graph.output]):
        assert_same(o, e, name)


def test_a_castlike_becomes_a_cast_to_the_like_inputs_type_and_rounds_as_ort():
    """The body ONNX builds for CastLike is one Cast to the second input's type; ORT's Cast rounds float to
    float16 to nearest even, as the engine's Cast does."""
    x = np.array([1.0009765625, 1.00146484375, 65520.0, -0.0], np.float32)  # ties, overflow to inf
    graph = h.make_graph([h.make_node("CastLike", ["x", "like"], ["y"], name="cl")], "g",
                         [h.make_tensor_value_info("x", T.FLOAT, [4]),
                          h.make_tensor_value_info("like", T.FLOAT16, [1])],
                         [h.make_tensor_value_info("y", T.FLOAT16, [4])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 19)], ir_version=9)
    feeds = {"x": x, "like": np.zeros(1, np.float16)}
    sess = InferenceSession(model)
    assert [s.node.op_type for s in sess.state.steps] == ["Cast"]
    assert "Inlined the function body of CastLike" in sess.log.text()
    np.testing.assert_array_equal(sess.run(None, feeds)[0], run_ort(model, feeds)[0])


def test_the_memory_planners_session_graph_inlines_as_ort():
    """ortlab.memory.session_graph, the graph the allocation planner plans, makes the same nodes as ORT's."""
    from ortlab.memory.session_graph import session_graph

    nodes = [h.make_node("Relu", ["x"], ["r"]), h.make_node("CastLike", ["r", "like"], ["c"]),
             h.make_node("GroupNormalization", ["c", "s", "b"], ["y"], num_groups=2, epsilon=1e-3)]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", T.FLOAT, [1, 4, 3]),
                                      h.make_tensor_value_info("like", T.DOUBLE, [1]),
                                      h.make_tensor_value_info("s", T.DOUBLE, [4]),
                                      h.make_tensor_value_info("b", T.DOUBLE, [4])],
                         [h.make_tensor_value_info("y", T.DOUBLE, [1, 4, 3])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 21)], ir_version=10)
    theirs = ort_saved_ops(model)
    assert "CastLike" not in theirs and "GroupNormalization" not in theirs
    assert collections.Counter(n.op_type for n in session_graph(model).graph.nodes()) == theirs
    feeds = {"x": np.linspace(-1, 1, 12, dtype=np.float32).reshape(1, 4, 3), "like": np.zeros(1),
             "s": np.array([1.0, 2.0, 0.5, -1.0]), "b": np.array([0.0, 0.1, 0.2, 0.3])}
    np.testing.assert_allclose(InferenceSession(model).run(None, feeds)[0], run_ort(model, feeds)[0], rtol=1e-12)

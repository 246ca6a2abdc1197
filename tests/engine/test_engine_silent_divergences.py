"""Silent divergences between ortlab's engine and ORT 1.19.2 (a wrong result, no error), each pinned against the
real ORT (CPUExecutionProvider). What ORT does, per case:

- A Loop without a condition input (cond = "") inside another Loop's body or an If branch runs until its trip
  count, as at the top level (onnxruntime/core/providers/cpu/controlflow/loop.cc: no condition is 'true');
  onnx.reference's Loop, which ran the bodies, read the missing condition as false and ran zero times.
- A float16 node of an op ORT's CPU EP has no float16 kernel for (Add, Sub, Mul, Div, MatMul, Relu...) runs in
  float32 between Casts, and RemoveDuplicateCastTransformer then drops the Cast pairs between such nodes, and a
  user's float -> float16 Cast feeding one (onnxruntime/core/optimizer/insert_cast_transformer.cc): float32
  70000.5 cast to float16 and added to itself is 140001, not inf; float16 (60000 + 60000) - 60000 is 60000.
- A float -> bfloat16 Cast inside an If, Loop or Scan body rounds to nearest even, as at the top level
  (onnxruntime/core/providers/cpu/tensor/cast_op.cc, Eigen's bfloat16(float)); onnx.reference truncates.
"""
import numpy as np
import onnxruntime as ort
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper as h

from ortlab.engine import InferenceSession
from ortlab.transformers.insert_cast_transformer import NO_FLOAT16_KERNEL

vi = h.make_tensor_value_info


def model(nodes, inputs, outputs, opset=18, initializers=()):
    m = h.make_model(h.make_graph(nodes, "g", inputs, outputs, list(initializers)),
                     opset_imports=[h.make_opsetid("", opset)])
    m.ir_version = 8 if opset < 21 else 10
    return m


def both(m, feeds):
    theirs = ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    return InferenceSession(m).run(None, feeds), theirs


# --- 1. A Loop without a condition, nested -----------------------------------------------------
def counting_loop(trip, x_in, x_out):
    """Loop(trip, "", x_in) -> x_out whose body adds 1 to x and passes the condition on."""
    body = h.make_graph([h.make_node("Identity", ["k_in"], ["k_out"]), h.make_node("Add", ["x", "one"], ["x2"])],
                        "count", [vi("i", T.INT64, []), vi("k_in", T.BOOL, []), vi("x", T.FLOAT, [])],
                        [vi("k_out", T.BOOL, []), vi("x2", T.FLOAT, [])], [h.make_tensor("one", T.FLOAT, [], [1.0])])
    return h.make_node("Loop", [trip, "", x_in], [x_out], body=body)


def test_loop_without_condition_inside_a_loop_body_runs_as_ort():
    outer = h.make_graph([h.make_node("Identity", ["c_in"], ["c_out"]), counting_loop("M", "y", "y2")], "outer",
                         [vi("j", T.INT64, []), vi("c_in", T.BOOL, []), vi("y", T.FLOAT, [])],
                         [vi("c_out", T.BOOL, []), vi("y2", T.FLOAT, [])])
    m = model([h.make_node("Loop", ["N", "", "x0"], ["y"], body=outer)],
              [vi("x0", T.FLOAT, []), vi("N", T.INT64, []), vi("M", T.INT64, [])], [vi("y", T.FLOAT, [])])
    ours, theirs = both(m, {"x0": np.array(0.5, np.float32), "N": np.array(3), "M": np.array(6)})
    assert float(theirs[0]) == 18.5  # 0.5 + 3 * 6
    np.testing.assert_array_equal(ours[0], theirs[0])


def test_loop_without_condition_inside_an_if_branch_runs_as_ort():
    branch = h.make_graph([counting_loop("M", "x0", "y")], "branch", [], [vi("y", T.FLOAT, [])])
    m = model([h.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
              [vi("c", T.BOOL, []), vi("x0", T.FLOAT, []), vi("M", T.INT64, [])], [vi("y", T.FLOAT, [])])
    ours, theirs = both(m, {"c": np.array(True), "x0": np.array(0.5, np.float32), "M": np.array(4)})
    assert float(theirs[0]) == 4.5
    np.testing.assert_array_equal(ours[0], theirs[0])


def test_nested_loop_scan_output_of_scalars_stacks_to_n_as_ort():
    body = h.make_graph([h.make_node("Identity", ["c"], ["co"]), h.make_node("Cast", ["i"], ["o"], to=T.FLOAT)],
                        "b", [vi("i", T.INT64, []), vi("c", T.BOOL, [])], [vi("co", T.BOOL, []), vi("o", T.FLOAT, [])])
    branch = h.make_graph([h.make_node("Loop", ["N", ""], ["ys"], body=body)], "branch", [],
                          [vi("ys", T.FLOAT, None)])
    m = model([h.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
              [vi("c", T.BOOL, []), vi("N", T.INT64, [])], [vi("y", T.FLOAT, None)])
    ours, theirs = both(m, {"c": np.array(True), "N": np.array(3)})
    assert theirs[0].shape == (3,)
    np.testing.assert_array_equal(ours[0], theirs[0])


# --- 2. InsertCastTransformer: float16 computed in float32 ---------------------------------------
def test_float_cast_to_float16_then_added_is_computed_in_float32_as_ort():
    nodes = [h.make_node("Cast", ["x"], ["h"], to=T.FLOAT16), h.make_node("Add", ["h", "h"], ["s"]),
             h.make_node("Cast", ["s"], ["y"], to=T.FLOAT)]
    m = model(nodes, [vi("x", T.FLOAT, [2])], [vi("y", T.FLOAT, [2])])
    ours, theirs = both(m, {"x": np.array([70000.5, 1], np.float32)})
    assert theirs[0][0] == np.float32(70000.5) * 2  # float32 arithmetic: the float16 Casts went
    np.testing.assert_array_equal(ours[0], theirs[0])


def test_float16_chain_keeps_float32_between_nodes_as_ort():
    nodes = [h.make_node("Add", ["a", "a"], ["s"]), h.make_node("Sub", ["s", "a"], ["y"]),
             h.make_node("Mul", ["y", "a"], ["p"]), h.make_node("Div", ["p", "a"], ["q"])]
    m = model(nodes, [vi("a", T.FLOAT16, [3])], [vi("q", T.FLOAT16, [3]), vi("s", T.FLOAT16, [3])])
    ours, theirs = both(m, {"a": np.array([60000, 1, -40000], np.float16)})
    np.testing.assert_array_equal(theirs[0], np.array([60000, 1, -40000], np.float16))  # no inf on the way
    assert np.isinf(theirs[1][0])  # the graph output s is float16
    for o, t in zip(ours, theirs):
        assert o.dtype == t.dtype
        np.testing.assert_array_equal(o, t)


def ort_inserts_casts(op, tmp_path):
    """Whether ORT's optimized model computes a float16 `op` node between Casts."""
    binary = op in ("Add", "Sub", "Mul", "Div", "MatMul", "Max", "Min")
    m = model([h.make_node(op, ["a", "b"] if binary else ["a"], ["y"])],
              [vi("a", T.FLOAT16, [2, 2]), vi("b", T.FLOAT16, [2, 2])], [vi("y", T.FLOAT16, [2, 2])])
    options = ort.SessionOptions()
    options.optimized_model_filepath, options.log_severity_level = str(tmp_path / "opt.onnx"), 3
    ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return any(n.op_type == "Cast" for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node)


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div", "MatMul", "Relu", "Exp", "Sqrt",
                                "Tanh", "Neg", "Abs", "Softmax", "Max", "Min", "Identity", "Round", "Sign"])
def test_the_table_of_ops_without_float16_kernels_agrees_with_ort(op, tmp_path):
    assert (op in NO_FLOAT16_KERNEL) == ort_inserts_casts(op, tmp_path)


def test_float16_relu_of_a_sum_inside_an_if_branch_as_ort():
    branch = h.make_graph([h.make_node("Add", ["a", "a"], ["s"]), h.make_node("Sub", ["s", "a"], ["o"])], "branch",
                          [], [vi("o", T.FLOAT16, [2])])
    m = model([h.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
              [vi("c", T.BOOL, []), vi("a", T.FLOAT16, [2])], [vi("y", T.FLOAT16, [2])])
    ours, theirs = both(m, {"c": np.array(True), "a": np.array([60000, 2], np.float16)})
    np.testing.assert_array_equal(ours[0], theirs[0])

def float16_chain():
    """a (float16 [n, 8]) -> Add(a, a) -> Sub(., a) -> Mul(., a) -> Exp -> q (float16): four nodes ORT's CPU EP
    computes in float32."""
    nodes = [h.make_node("Add", ["a", "a"], ["s"]), h.make_node("Sub", ["s", "a"], ["y"]),
             h.make_node("Mul", ["y", "a"], ["p"]), h.make_node("Exp", ["p"], ["q"])]
    return model(nodes, [vi("a", T.FLOAT16, ["n", 8])], [vi("q", T.FLOAT16, None)])


def test_the_engine_runs_the_graph_ort_runs_for_float16_nodes(tmp_path):
    m = float16_chain()
    options = ort.SessionOptions()
    options.optimized_model_filepath, options.log_severity_level = str(tmp_path / "opt.onnx"), 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    ort.InferenceSession(m.SerializeToString(), options, providers=["CPUExecutionProvider"])
    theirs = [(n.op_type, len(n.input)) for n in onnx.load(str(tmp_path / "opt.onnx")).graph.node]
    sess = InferenceSession(m)
    ours = [(n.op_type, len(n.inputs)) for n in sess.graph.topological_order()]
    assert theirs == [("Cast", 1), ("Add", 2), ("Sub", 2), ("Mul", 2), ("Exp", 1), ("Cast", 1)]
    assert ours == theirs


def test_the_memory_plan_of_float16_nodes_is_orts_block():
    from ortlab.memory import plan
    from ortlab.memory.ort_arena_log import arena_requests, ort_first_run_log

    m, feeds = float16_chain(), {"a": np.ones((65536, 8), np.float16)}
    block = arena_requests(ort_first_run_log(m, feeds))[0]
    assert block == 3 * 65536 * 8 * 4  # three float32 buffers: the nodes between the Casts reuse them
    assert plan(m, feeds).peak_bytes == block


# --- 3. float -> bfloat16 Cast in a subgraph body ------------------------------------------------
BFLOAT16_CASES = np.array([1.00390625, np.nextafter(np.float32(1.00390625), np.float32(2)), 1.01171875,
                           3.14159, -2.0078125, 65504.0, 1e-40, np.inf, np.nan], np.float32)


def bfloat16_round_trip_model(where):
    casts = [h.make_node("Cast", ["x"], ["t"], to=T.BFLOAT16), h.make_node("Cast", ["t"], ["o"], to=T.FLOAT)]
    shape = list(BFLOAT16_CASES.shape)
    if where == "top":
        return model(casts[:1] + [h.make_node("Cast", ["t"], ["y"], to=T.FLOAT)], [vi("x", T.FLOAT, shape)],
                     [vi("y", T.FLOAT, shape)])
    if where == "if":
        branch = h.make_graph(casts, "branch", [], [vi("o", T.FLOAT, shape)])
        return model([h.make_node("If", ["c"], ["y"], then_branch=branch, else_branch=branch)],
                     [vi("c", T.BOOL, []), vi("x", T.FLOAT, shape)], [vi("y", T.FLOAT, shape)])
    body = h.make_graph([h.make_node("Identity", ["k"], ["k2"])] + casts, "body",
                        [vi("i", T.INT64, []), vi("k", T.BOOL, [])], [vi("k2", T.BOOL, []), vi("o", T.FLOAT, shape)])
    return model([h.make_node("Loop", ["n", ""], ["y"], body=body)], [vi("n", T.INT64, []), vi("x", T.FLOAT, shape)],
                 [vi("y", T.FLOAT, None)])


@pytest.mark.parametrize("where", ["top", "if", "loop"])
def test_cast_to_bfloat16_rounds_to_nearest_even_in_every_graph_as_ort(where):
    feeds = {"x": BFLOAT16_CASES, "c": np.array(True), "n": np.array(1)}
    m = bfloat16_round_trip_model(where)
    feeds = {k: v for k, v in feeds.items() if k in {i.name for i in m.graph.input}}
    ours, theirs = both(m, feeds)
    rounded = theirs[0].reshape(-1)
    # nearest, ties to even, independently of ORT: 1 + 2**-8 is halfway between 1 (even) and 1 + 2**-7: down;
    # a float32 ulp above it: up; 1 + 3 * 2**-8 halfway between 1 + 2**-7 (odd) and 1 + 2**-6: up (truncating
    # gives 1, 1, 1 + 2**-7)
    assert list(rounded[:4]) == [1.0, 1.0078125, 1.015625, 3.140625]
    np.testing.assert_array_equal(ours[0], theirs[0])


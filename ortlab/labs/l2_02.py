"""Exercises of the walkthrough L2_02_memory: which buffer each value lives in, and the block the memory
pattern asks for.

The model the exercises are about is built here, so the notebook can show it; the checks live in
ortlab.labs.judges.l2_02 (compared with ortlab.memory.plan, the mirror of ORT's PlannerImpl in
onnxruntime/core/framework/allocation_planner.cc and of MemPatternPlanner in mem_pattern_planner.h, whose
block is ORT's own arena request, tests/labs/test_exercise_facts_l2_02.py), and the reference answers in
solutions/walkthroughs/L2_02_memory.py, outside the package.
"""
from onnx import TensorProto, helper

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe

ROWS = 100_000  # n in exercise 'block_bytes': x is float32 [100000, 3]


def buffers_model():
    """x: float [n, 3], n symbolic; ten nodes where the planner's rules (in place, freelist, alias, graph
    output) each decide at least once. ORT's default order runs `add` (b + x) second to last."""
    f = TensorProto.FLOAT
    steps = [("exp", "Exp", ["x"], "a"), ("sigmoid", "Sigmoid", ["a"], "b"), ("tanh", "Tanh", ["b"], "c"),
             ("add", "Add", ["b", "x"], "q"), ("transpose", "Transpose", ["c"], "t"),
             ("transpose_back", "Transpose", ["t"], "s"), ("relu", "Relu", ["s"], "m"),
             ("mul", "Mul", ["m", "a"], "p"), ("reshape", "Reshape", ["p", "shape"], "r"),
             ("add_out", "Add", ["r", "q"], "y")]
    nodes = [helper.make_node(op, inputs, [out], name=name) for name, op, inputs, out in steps]
    graph = helper.make_graph(nodes, "buffers", [helper.make_tensor_value_info("x", f, ["n", 3])],
                              [helper.make_tensor_value_info("y", f, None)],
                              [helper.make_tensor("shape", TensorProto.INT64, [2], [-1, 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def execution_order():
    """The node names of buffers_model() in ORT's default execution order (what the planner walks)."""
    from ortlab.memory import plan  # lazy: loaded when this runs, not when the notebook imports the exercises

    return [node.name for node in plan(buffers_model(), {"x": (4, 3)}).order]


@probe
def predicted_buffers(fn):
    """The learner's fn(), as a dict {value: str or None}."""
    found = fn()
    if not isinstance(found, dict):
        raise CheckFailed(f"return a dict {{value name: the value owning its buffer, or None}}, not "
                          f"{type(found).__name__}")
    return {str(k): (v if v is None or isinstance(v, str) else repr(v)) for k, v in found.items()}


@probe
def predicted_bytes(fn):
    """The learner's fn(), as an int (or the repr of what it returned)."""
    found = fn()
    if isinstance(found, bool) or not isinstance(found, (int, float)) or found != int(found):
        raise CheckFailed(f"return a whole number of bytes, not {found!r}"[:160])
    return int(found)


def check_buffer_of(fn):
    """Exercise 'buffer_of': fn() -> {node output of buffers_model(): the value that owns the buffer it lives
    in, or None for a buffer of its own}, checked against ortlab.memory.plan (ORT's planner's decisions)."""
    judge("buffer_of", "l2_02.buffer_of", learner(fn))


def check_block_bytes(fn):
    """Exercise 'block_bytes': fn() -> the bytes of the memory-pattern block ORT asks its arena for on the
    first run of buffers_model() fed x of shape [100000, 3]."""
    judge("block_bytes", "l2_02.block_bytes", learner(fn))

"""Small models the engine tests share: a chain, models with a Triton-claimable op, and the zoo; and a Relu
kernel swapped in for one block (relu_kernel)."""
from contextlib import contextmanager

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ortlab.onnx_defs import make_model

F = TensorProto.FLOAT


def chain_model(ops=("Softmax", "Relu", "Softmax"), shape=(3, 5)):
    """x -> op0 -> op1 -> ... -> y, each node named n<k>, all on [3, 5] float."""
    nodes, value = [], "x"
    for k, op in enumerate(ops):
        attrs = {"axis": -1} if op == "Softmax" else {}
        nodes.append(helper.make_node(op, [value], [f"v{k}"], name=f"n{k}", **attrs))
        value = f"v{k}"
    nodes[-1].output[0] = "y"
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", F, list(shape))],
                              [helper.make_tensor_value_info("y", F, list(shape))])
    return make_model(graph)


def reduce_sum_model():
    """x -> Relu -> ReduceSum(axes from Shape -> Slice: a host value) -> y."""
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("ReduceSum", ["r", "axes"], ["y"], name="sum", keepdims=0)]
    graph = helper.make_graph(nodes, "reduce", [helper.make_tensor_value_info("x", F, [3, 5])],
                              [helper.make_tensor_value_info("y", F, [3])], [axes])
    return make_model(graph)


def feeds_for(session_or_model, seed=0):
    """Random feeds for every graph input of a model (float normal, int64 in [0, 4))."""
    rng = np.random.default_rng(seed)
    graph = session_or_model.graph
    inits = {t.name for t in graph.initializer}
    feeds = {}
    for vi in graph.input:
        if vi.name in inits:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else 2 for d in vi.type.tensor_type.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        feeds[vi.name] = (rng.standard_normal(dims).astype(dtype) if dtype.kind == "f"
                          else rng.integers(0, 4, dims).astype(dtype))
    return feeds


def training_graph(name, builder, batch=None, seq=16):
    """(forward + backward graph of a zoo model's training export, feeds): the float initializers are
    the x's, each output's incoming gradient is 1. batch=None: the model's example inputs as they are."""
    from ortlab import models
    from ortlab.training.training_manager import GRAD_OUTPUT, build_training_graph

    module = models.get(name, dropout=0.0)
    if batch is None:
        inputs = module.example_inputs()
    else:
        inputs = module.example_inputs(batch) if name == "mlp" else module.example_inputs(batch, seq)
    exported = models.export(module, inputs, training=True)
    xs = [t.name for t in exported.graph.initializer if t.data_type == onnx.TensorProto.FLOAT]
    outputs = [o.name for o in exported.graph.output]
    training, differentiable = build_training_graph(exported, outputs, xs, builder)
    feeds = dict(zip([i.name for i in exported.graph.input], (t.numpy() for t in inputs)))
    feeds.update({GRAD_OUTPUT.format(o): np.ones((), np.float32) for o in differentiable})
    return training, feeds


@contextmanager
def relu_kernel(fn, **kernel_def):
    """`fn` as the CPU EP's Relu kernel inside the block; whatever was registered before comes back after."""
    from ortlab.engine import kernel_registry, register_op_kernel, unregister_op_kernel

    registry = kernel_registry("CPUExecutionProvider")
    old = registry.kernels.get("Relu")
    register_op_kernel("Relu", override=True, **kernel_def)(fn)
    try:
        yield
    finally:
        unregister_op_kernel("Relu")
        if old is not None:
            registry.register(old, override=True)

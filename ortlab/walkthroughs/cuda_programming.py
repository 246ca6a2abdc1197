"""Triton's program model made visible: which program touched which element, and printing
from inside a kernel.

A launch runs `grid` programs (CUDA: a grid of thread blocks); each program handles a BLOCK of
elements as one vector (CUDA: the threads of one block, each doing one lane). tl.program_id is
CUDA's blockIdx, tl.arange(0, BLOCK) plays the role of threadIdx, and `mask` switches off the
lanes past the end, as `if (i < n)` does in a CUDA kernel
(onnxruntime/core/providers/cuda/cu_inc/common.cuh: CALCULATE_ELEMENTWISE_INDEX_OR_EXIT).

Also, for notebook L1_08: ORT's CUDA C++ training kernels (ortlab/cuda/kernels) inside ortlab's engine,
on its CUDAExecutionProvider (ortlab/engine/cuda_execution_provider.py): a small training step, its
partition (which EP runs which node) and its outputs against ORT 1.19.2's CPU EP.
"""
import numpy as np
import torch
from onnx import TensorProto, helper, numpy_helper
from ortlab import env  # noqa: F401 - before triton: it sets TRITON_INTERPRET (no GPU), which Triton reads once
import triton
import triton.language as tl

from ortlab.engine import InferenceSession, SessionOptions
from ortlab.env import kernel_device
from ortlab.triton_kernels.executor import launch
from ortlab.session import run_model
from ortlab.viz.tables import within


@triton.jit
def where_am_i_kernel(program_out, lane_out, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    lanes = tl.arange(0, BLOCK)
    offsets = pid * BLOCK + lanes
    mask = offsets < n
    tl.store(program_out + offsets, pid + lanes * 0, mask=mask)
    tl.store(lane_out + offsets, lanes, mask=mask)


@triton.jit
def print_inside_kernel(x_ptr, n, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(x_ptr + offsets, mask=offsets < n, other=0.0)
    tl.device_print("program", pid)
    tl.device_print("sum of my block", tl.sum(x, axis=0))


def where_am_i(n, block):
    """For each of n elements: the program that handled it and its lane within the block."""
    program = torch.full((n,), -1, dtype=torch.int32, device=kernel_device())
    lane = torch.full_like(program, -1)
    grid = triton.cdiv(n, block)
    launch(where_am_i_kernel, grid, program, lane, n, BLOCK=block)
    return {"grid": grid, "program": program.cpu().numpy(), "lane": lane.cpu().numpy(),
            "idle lanes": grid * block - n}


def program_table(n, block):
    """Rows: program id, the elements it handled, and how many of its lanes were masked off."""
    seen = where_am_i(n, block)
    rows = []
    for pid in range(seen["grid"]):
        elements = np.flatnonzero(seen["program"] == pid)
        rows.append({"program_id": pid, "elements": f"{elements[0]}..{elements[-1]}",
                     "active lanes": len(elements), "masked lanes": block - len(elements)})
    return rows


def print_from_a_kernel(values, block):
    """Launch print_inside_kernel: under the interpreter its prints run as Python prints."""
    x = torch.tensor(values, dtype=torch.float32, device=kernel_device())
    launch(print_inside_kernel, triton.cdiv(len(values), block), x, len(values), BLOCK=block)


# ---- L1_08: the CUDA C++ kernels inside ortlab's engine ------------------------------------------
def training_step(tokens=37, hidden=300, classes=10, seed=0):
    """(model, feeds): LayerNormalization -> MatMul -> SoftmaxCrossEntropyLoss, then back through
    SoftmaxCrossEntropyLossGrad, the MatMul's input gradient and LayerNormalizationGrad, with ReduceSum
    giving the loss gradient per row; every ignore_index label (1) left out of the mean."""
    rng = np.random.default_rng(seed)
    values = {"s": rng.standard_normal(hidden), "b": rng.standard_normal(hidden),
              "w": rng.standard_normal((hidden, classes)) / np.sqrt(hidden), "one": np.array(1.0)}
    values["wt"] = values["w"].T
    inits = [numpy_helper.from_array(np.ascontiguousarray(v, np.float32), k) for k, v in values.items()]
    inits.append(numpy_helper.from_array(np.array([-1], np.int64), "axes"))
    node = helper.make_node
    nodes = [node("LayerNormalization", ["x", "s", "b"], ["h", "mean", "inv_std"], name="layer_norm"),
             node("MatMul", ["h", "w"], ["logits"], name="projection"),
             node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["loss", "log_prob"], name="loss", ignore_index=1),
             node("SoftmaxCrossEntropyLossGrad", ["one", "log_prob", "labels"], ["dlogits"], name="loss_grad",
                  domain="com.microsoft", ignore_index=1),
             node("MatMul", ["dlogits", "wt"], ["dh"], name="projection_grad"),
             node("LayerNormalizationGrad", ["dh", "x", "s", "mean", "inv_std"], ["dx", "ds", "db"],
                  name="layer_norm_grad", domain="com.microsoft"),
             node("ReduceSum", ["dlogits", "axes"], ["dlogits_rows"], name="row_sums", keepdims=0)]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [tokens, hidden]),
              helper.make_tensor_value_info("labels", TensorProto.INT64, [tokens])]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("loss", "dx", "ds", "db")]
    model = helper.make_model(helper.make_graph(nodes, "training_step", inputs, outputs, inits),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    labels = rng.integers(0, classes, tokens).astype(np.int64)
    labels[::4] = 1
    return model, {"x": (rng.standard_normal((tokens, hidden)) * 2 + 1).astype(np.float32), "labels": labels}


def cuda_ep_session(providers=("CUDAExecutionProvider", "CPUExecutionProvider")):
    """(session, rows of the partition: node, op, EP, and why the CUDA EP declined it, rows of the outputs:
    shape, dtype, max |ortlab - ORT 1.19.2's CPU EP| as float32 rounding when within 1e-5) for training_step()."""
    model, feeds = training_step()
    sess = InferenceSession(model.SerializeToString(), SessionOptions(graph_optimization_level=0, log_severity_level=3),
                            providers=list(providers))
    cuda_ep = sess.providers[0]
    placement = [{"node": s.node.name, "op": s.node.op_type, "EP": s.provider.type,
                  "CUDA EP declined it because": "" if s.provider.type == cuda_ep.type
                  else cuda_ep.find_kernel(s.node)[1]} for s in sess.state.steps]
    got = dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))
    want = run_model(model, feeds)
    outputs = [{"output": name, "shape": tuple(want[name].shape), "dtype": str(got[name].dtype),
                "max |ortlab - ORT|": within(float(np.abs(got[name] - want[name]).max()), 1e-5)} for name in want]
    return sess, placement, outputs

"""The training build works here: ORTModule trains, and ORT's C++ gradient builder runs.

These prove the pinned torch / onnxruntime-training / onnx versions fit together
(see ../shared/notes/stack.md); every later issue builds on them.
"""
import io

import numpy as np
import onnx
import torch
from onnx import TensorProto, helper

from ortlab.env import seed_everything


def test_ortmodule_trains_an_mlp_like_pytorch():
    from onnxruntime.training.ortmodule import ORTModule

    def train(wrap):
        seed_everything(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
        model = wrap(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        x, y = torch.randn(32, 8), torch.randint(0, 2, (32,))
        losses = []
        for _ in range(5):
            opt.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            losses.append(loss.item())
        return losses

    ort_losses, torch_losses = train(ORTModule), train(lambda m: m)
    assert all(b < a for a, b in zip(ort_losses, ort_losses[1:])), ort_losses
    np.testing.assert_allclose(ort_losses, torch_losses, rtol=1e-5)


def test_ort_cpp_gradient_graph_builder_differentiates_matmul_sqrt_reducesum():
    from onnxruntime.capi._pybind_state import GradientGraphBuilder

    nodes = [helper.make_node("MatMul", ["X", "W"], ["M"]),
             helper.make_node("Sqrt", ["M"], ["S"]),
             helper.make_node("ReduceSum", ["S"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
                              [helper.make_tensor("W", TensorProto.FLOAT, [3, 4], [1.0] * 12)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)])
    builder = GradientGraphBuilder(model.SerializeToString(), {"loss"}, {"W"}, "loss")
    builder.build()
    grad = onnx.load_from_string(builder.get_model())
    ops = [n.op_type for n in grad.graph.node]
    assert "W_grad" in {o.name for o in grad.graph.output} | {out for n in grad.graph.node for out in n.output}
    assert ops.count("MatMul") == 1 and "Sqrt" in ops and len(ops) > len(nodes)

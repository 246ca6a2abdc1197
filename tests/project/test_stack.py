"""The training build works here: ORTModule trains, and ORT's C++ gradient builder runs.

These prove the pinned torch / onnxruntime-training / onnx versions fit together
(see ../shared/notes/stack.md); every later issue builds on them.
"""
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
    """loss = sum(sqrt(X·W)) so dloss/dW = Xᵀ · (0.5 / sqrt(X·W)), computed here by hand."""
    from onnxruntime.capi._pybind_state import GradientGraphBuilder

    from ortlab import session
    from ortlab.onnx_defs import make_model

    w = np.linspace(0.5, 1.5, 12, dtype=np.float32).reshape(3, 4)
    x = np.linspace(0.1, 1.0, 6, dtype=np.float32).reshape(2, 3)
    nodes = [helper.make_node("MatMul", ["X", "W"], ["M"]),
             helper.make_node("Sqrt", ["M"], ["S"]),
             helper.make_node("ReduceSum", ["S"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "g",
                              [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, 3])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])],
                              [helper.make_tensor("W", TensorProto.FLOAT, [3, 4], w.ravel())])
    model = make_model(graph, opset=12, domains=())
    builder = GradientGraphBuilder(model.SerializeToString(), {"loss"}, {"W"}, "loss")
    builder.build()
    grad_model = onnx.load_from_string(builder.get_model())
    assert [o.name for o in grad_model.graph.output] == ["loss", "W_grad"]
    outputs = session.run_model(grad_model, {"X": x})
    loss, w_grad = outputs["loss"], outputs["W_grad"]
    np.testing.assert_allclose(loss, np.sqrt(x @ w).sum(), rtol=1e-6)
    np.testing.assert_allclose(w_grad, x.T @ (0.5 / np.sqrt(x @ w)), rtol=1e-5)

"""One-op models with a loss, and the same computation in torch, for the gradient tests.

loss = Σ_k sum(output_k · R_k) with fixed random R_k, so every output element matters.
"""
from dataclasses import dataclass, field

import numpy as np
import torch
import torch.nn.functional as tf
from onnx import helper, numpy_helper

MS = "com.microsoft"


@dataclass
class Case:
    op: str
    inputs: list            # (array, differentiable) per input; None for an absent optional input
    torch_fn: object
    attrs: dict = field(default_factory=dict)
    domain: str = ""
    outputs: int = 1
    id: str = ""
    loss_outputs: int = 0   # how many outputs feed the loss (0: all)

    def model(self, seed=0):
        rng = np.random.default_rng(seed)
        names = [f"in{i}" if spec is not None else "" for i, spec in enumerate(self.inputs)]
        outs = [f"out{k}" for k in range(self.outputs)]
        values = self.torch_outputs(grad=False)
        graph_inputs, inits, nodes = [], [], []
        for name, spec in zip(names, self.inputs):
            if spec is None:
                continue
            array, diff = spec
            if diff:
                graph_inputs.append(helper.make_tensor_value_info(
                    name, helper.np_dtype_to_tensor_dtype(array.dtype), list(array.shape)))
            else:
                inits.append(numpy_helper.from_array(array, name))
        nodes.append(helper.make_node(self.op, names, outs, domain=self.domain or None, **self.attrs))
        terms = []
        for k, (out, value) in enumerate(zip(outs, values[:self.loss_outputs or None])):
            r = rng.standard_normal(value.shape).astype(value.numpy().dtype)
            inits.append(numpy_helper.from_array(np.asarray(r), f"r{k}"))
            nodes += [helper.make_node("Mul", [out, f"r{k}"], [f"p{k}"]),
                      helper.make_node("ReduceSum", [f"p{k}"], [f"s{k}"], keepdims=0)]
            terms.append(f"s{k}")
        while len(terms) > 1:  # Add, not Sum: ORT 1.19.2 has no gradient builder for Sum
            nodes.append(helper.make_node("Add", terms[:2], [f"acc{len(terms)}"]))
            terms = [f"acc{len(terms)}"] + terms[2:]
        nodes.append(helper.make_node("Identity", terms, ["loss"]))
        loss_type = helper.np_dtype_to_tensor_dtype(values[0].numpy().dtype)
        graph = helper.make_graph(nodes, self.op, graph_inputs,
                                  [helper.make_tensor_value_info("loss", loss_type, [])], inits)
        imports = [helper.make_opsetid("", 17)] + ([helper.make_opsetid(MS, 1)] if self.domain else [])
        model = helper.make_model(graph, opset_imports=imports)
        model.ir_version = 8
        return model

    @property
    def x_names(self):
        return [f"in{i}" for i, s in enumerate(self.inputs) if s is not None and s[1]]

    @property
    def feeds(self):
        return {f"in{i}": s[0] for i, s in enumerate(self.inputs) if s is not None and s[1]}

    def torch_outputs(self, grad=True):
        tensors = [None if s is None else torch.tensor(s[0], requires_grad=grad and s[1]) for s in self.inputs]
        outs = self.torch_fn(*tensors)
        outs = outs if isinstance(outs, (tuple, list)) else (outs,)
        outs = outs[:self.loss_outputs or None]
        self._tensors = tensors
        return [o if grad else o.detach() for o in outs]

    def torch_gradients(self, seed=0):
        rng = np.random.default_rng(seed)
        outs = self.torch_outputs()
        loss = sum((o * torch.tensor(rng.standard_normal(o.shape).astype(o.detach().numpy().dtype))).sum()
                   for o in outs)
        loss.backward()
        return {f"in{i}": t.grad.numpy() for i, t in enumerate(self._tensors)
                if t is not None and t.requires_grad}


rng = np.random.default_rng(42)


def f(*shape, low=None):
    a = rng.standard_normal(shape).astype(np.float32)
    return np.abs(a) + 0.5 if low == "positive" else a


def x(*shape, **kw):
    return (f(*shape, **kw), True)


def const(array):
    return (np.asarray(array), False)


CASES = [
    Case("Add", [x(2, 3), x(3)], lambda a, b: a + b, id="Add-broadcast"),
    Case("Add", [x(2, 1, 4), x(3, 1)], lambda a, b: a + b, id="Add-both-broadcast"),
    Case("Add", [x(2, 3), x()], lambda a, b: a + b, id="Add-scalar"),
    Case("Sum", [x(2, 3), x(3), x(2, 1)], lambda a, b, c: a + b + c, id="Sum-broadcast"),
    Case("Sub", [x(2, 3, 4), x(1, 3, 1)], lambda a, b: a - b, id="Sub-broadcast"),
    Case("Mul", [x(2, 3, 4), x(4)], lambda a, b: a * b, id="Mul-broadcast"),
    Case("Mul", [x(3, 4), x(3, 4)], lambda a, b: a * b, id="Mul"),
    Case("Div", [x(2, 3), x(2, 1, low="positive")], lambda a, b: a / b, id="Div-broadcast"),
    Case("Div", [x(2, 3), const(f(3, low="positive"))], lambda a, b: a / b, id="Div-by-constant"),
    Case("Neg", [x(3, 4)], lambda a: -a, id="Neg"),
    Case("Pow", [x(2, 3, low="positive"), const(np.array(3.0, np.float32))], lambda a, p: a ** p, id="Pow"),
    Case("Sqrt", [x(2, 3, low="positive")], torch.sqrt, id="Sqrt"),
    Case("Exp", [x(2, 3)], torch.exp, id="Exp"),
    Case("Log", [x(2, 3, low="positive")], torch.log, id="Log"),
    Case("Sin", [x(3, 4)], torch.sin, id="Sin"),
    Case("Cos", [x(3, 4)], torch.cos, id="Cos"),
    Case("Softsign", [x(3, 4)], tf.softsign, id="Softsign"),
    Case("Relu", [x(3, 4)], torch.relu, id="Relu"),
    Case("Sigmoid", [x(3, 4)], torch.sigmoid, id="Sigmoid"),
    Case("Tanh", [x(3, 4)], torch.tanh, id="Tanh"),
    Case("Erf", [x(3, 4)], torch.erf, id="Erf"),
    Case("Gelu", [x(3, 4)], tf.gelu, domain=MS, id="Gelu"),
    Case("MatMul", [x(3, 4), x(4, 5)], torch.matmul, id="MatMul-2d"),
    Case("MatMul", [x(2, 3, 4), x(4, 5)], torch.matmul, id="MatMul-3d-2d"),
    Case("MatMul", [x(2, 1, 3, 4), x(3, 4, 5)], torch.matmul, id="MatMul-broadcast-batch"),
    Case("Gemm", [x(4, 3), x(5, 4), x(5)], lambda a, b, c: 0.5 * a.T @ b.T + 2.0 * c,
         {"transA": 1, "transB": 1, "alpha": 0.5, "beta": 2.0}, id="Gemm-trans-alpha-beta"),
    Case("Gemm", [x(3, 4), x(4, 5), x(1, 5)], lambda a, b, c: a @ b + c, id="Gemm"),
    Case("Gemm", [x(3, 4), x(5, 4)], lambda a, b: a @ b.T, {"transB": 1}, id="Gemm-no-C"),
    Case("Transpose", [x(2, 3, 4)], lambda a: a.permute(2, 0, 1), {"perm": [2, 0, 1]}, id="Transpose"),
    Case("Reshape", [x(2, 3, 4), const(np.array([0, -1]))], lambda a, s: a.reshape(2, -1), id="Reshape"),
    Case("Flatten", [x(2, 3, 4)], lambda a: a.reshape(2, -1), {"axis": 1}, id="Flatten"),
    Case("Squeeze", [x(3, 1, 4), const(np.array([1]))], lambda a, s: a.squeeze(1), id="Squeeze"),
    Case("Unsqueeze", [x(3, 4), const(np.array([0, 2]))], lambda a, s: a[None, :, None, :], id="Unsqueeze"),
    Case("Concat", [x(2, 3), x(2, 1)], lambda a, b: torch.cat([a, b], 1), {"axis": 1}, id="Concat"),
    Case("Split", [x(2, 3), const(np.array([1, 2]))], lambda a, s: torch.split(a, [1, 2], 1),
         {"axis": 1}, outputs=2, id="Split"),
    Case("Slice", [x(2, 4, 3), const(np.array([1])), const(np.array([3])), const(np.array([1]))],
         lambda a, *_: a[:, 1:3], id="Slice"),
    Case("Slice", [x(2, 5, 3), const(np.array([0])), const(np.array([5])), const(np.array([1])),
                   const(np.array([2]))], lambda a, *_: a[:, 0:5:2], id="Slice-step"),
    Case("Gather", [x(5, 3), const(np.array([0, 2, 2, 4]))], lambda a, i: a[i], id="Gather-repeats"),
    Case("Gather", [x(2, 4, 3), const(np.array(0))], lambda a, i: a[:, 0], {"axis": 1}, id="Gather-axis1-scalar"),
    Case("Cast", [x(2, 3)], lambda a: a.double(), {"to": 11}, id="Cast"),
    Case("Identity", [x(2, 3)], lambda a: a * 1, id="Identity"),
    Case("Dropout", [x(2, 3), const(np.array(0.0, np.float32)), const(np.array(True))],
         lambda a, *_: a * 1, outputs=2, loss_outputs=1, id="Dropout-ratio0"),
    Case("Softmax", [x(2, 3, 4)], lambda a: torch.softmax(a, -1), id="Softmax"),
    Case("Softmax", [x(2, 3, 4)], lambda a: torch.softmax(a, 1), {"axis": 1}, id="Softmax-axis1"),
    Case("LogSoftmax", [x(3, 5)], lambda a: torch.log_softmax(a, -1), id="LogSoftmax"),
    Case("LayerNormalization", [x(2, 3, 4), x(4), x(4)],
         lambda a, w, b: tf.layer_norm(a, (4,), w, b, eps=1e-5), {"axis": -1, "epsilon": 1e-5},
         outputs=3, loss_outputs=1, id="LayerNorm"),
    Case("ReduceSum", [x(2, 3, 4), const(np.array([1]))], lambda a, s: a.sum(1), {"keepdims": 0}, id="ReduceSum"),
    Case("ReduceSum", [x(2, 3)], lambda a: a.sum(), {"keepdims": 0}, id="ReduceSum-all"),
    Case("ReduceMean", [x(2, 3, 4)], lambda a: a.mean(-1, keepdim=True), {"axes": [-1]}, id="ReduceMean"),
    Case("SoftmaxCrossEntropyLoss", [x(4, 5), const(np.array([0, 3, 1, 4]))],
         lambda s, y: tf.cross_entropy(s, y), id="SCELoss-mean"),
    Case("SoftmaxCrossEntropyLoss", [x(4, 5), const(np.array([0, 3, 1, 4]))],
         lambda s, y: tf.cross_entropy(s, y, reduction="sum", ignore_index=3),
         {"reduction": "sum", "ignore_index": 3}, id="SCELoss-sum-ignore"),
    Case("Where", [const(rng.random((2, 3)) > 0.5), x(2, 3), x(3)], torch.where, id="Where-broadcast"),
]
# Builders added after the list above (tests/gradients/test_gradient_conv_pool_piecewise.py checks them further)
CASES += [
    Case("Max", [x(2, 3), x(3)], torch.maximum, id="Max-broadcast"),
    Case("Min", [x(2, 3), x(2, 1)], torch.minimum, id="Min-broadcast"),
    Case("Abs", [x(3, 4)], torch.abs, id="Abs"),
    Case("Clip", [x(3, 4), const(np.array(-0.5, np.float32)), const(np.array(0.7, np.float32))],
         lambda a, lo, hi: torch.clamp(a, lo, hi), id="Clip"),
    Case("LeakyRelu", [x(3, 4)], lambda a: tf.leaky_relu(a, 0.2), {"alpha": 0.2}, id="LeakyRelu"),
    Case("GatherElements", [x(3, 4), const(np.array([[0, 2], [1, 1], [3, 0]]))],
         lambda a, i: torch.gather(a, 1, i), {"axis": 1}, id="GatherElements"),
    Case("Expand", [x(3, 1), const(np.array([2, 3, 4]))], lambda a, s: a.expand(2, 3, 4), id="Expand"),
    Case("Tile", [x(2, 3), const(np.array([2, 1]))], lambda a, r: a.repeat(2, 1), id="Tile"),
    Case("Conv", [x(1, 4, 5, 5), x(6, 2, 3, 3), x(6)],
         lambda a, w, b: tf.conv2d(a, w, b, stride=2, padding=1, groups=2),
         {"group": 2, "strides": [2, 2], "pads": [1, 1, 1, 1]}, id="Conv"),
    Case("GlobalAveragePool", [x(2, 3, 4, 5)], lambda a: a.mean((2, 3), keepdim=True), id="GlobalAveragePool"),
    # distinct values far apart, so central differences never cross from one maximum to another
    Case("MaxPool", [(rng.permutation(84).reshape(1, 2, 7, 6).astype(np.float32) * 0.1, True)],
         lambda a: tf.max_pool2d(a, 3, 2, padding=1),
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, id="MaxPool"),
    Case("AveragePool", [x(1, 2, 7, 6)], lambda a: tf.avg_pool2d(a, 3, 2, padding=1, count_include_pad=False),
         {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}, id="AveragePool"),
]

"""Property tests: on random graphs built from the patterns the transformers look for (and broken
variants of them, with intermediates exposed as extra outputs), every level preserves every output
when ORT runs the optimized model."""
import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

from ortlab import session
from ortlab.transformers import optimize

CPU = ["CPUExecutionProvider"]
BLOCKS = ["relu", "identity", "cast", "dropout", "scale", "bias", "matmul_add", "transpose_matmul",
          "layer_norm", "gelu", "residual", "softmax", "duplicate"]


class Builder:
    """Appends blocks to a [2, 3, 4] float value; names are unique per block. `values` holds the blocks'
    outputs, all [2, 3, 4], which a residual block may add to the current one."""

    def __init__(self, seed):
        self.rng = np.random.default_rng(seed)
        self.nodes, self.inits, self.values, self.k = [], [], ["x"], 0

    def const(self, value):
        self.k += 1
        name = f"c{self.k}"
        self.inits.append(numpy_helper.from_array(np.asarray(value, dtype=np.float32), name))
        return name

    def node(self, op, inputs, **attrs):
        self.k += 1
        out = f"v{self.k}"
        self.nodes.append(helper.make_node(op, inputs, [out], **attrs))
        return out

    def add(self, block, x, pick):
        r = self.rng.standard_normal
        if block == "relu":
            return self.node("Relu", [x])
        if block == "identity":
            return self.node("Identity", [x])
        if block == "cast":
            return self.node("Cast", [x], to=TensorProto.FLOAT)
        if block == "dropout":
            return self.node("Dropout", [x, self.const(0.3)])
        if block == "scale":
            return self.node("Mul", [x, self.const(r())])
        if block == "bias":
            return self.node("Add", [x, self.const(r(4))])
        if block == "matmul_add":
            return self.node("Add", [self.node("MatMul", [x, self.const(r((4, 4)))]), self.const(r(4))])
        if block == "transpose_matmul":  # softmax-free attention: (x @ x^T / 2) @ x
            scores = self.node("MatMul", [x, self.node("Transpose", [x], perm=[0, 2, 1])])
            return self.node("MatMul", [self.node("Div", [scores, self.const(2.0)]), x])
        if block == "layer_norm":
            mean = self.node("ReduceMean", [x], axes=[-1])
            d = self.node("Sub", [x, mean])
            var = self.node("ReduceMean", [self.node("Pow", [d, self.const(2.0)])], axes=[-1])
            std = self.node("Sqrt", [self.node("Add", [var, self.const(1e-5)])])
            return self.node("Add", [self.node("Mul", [self.node("Div", [d, std]), self.const(r(4))]),
                                     self.const(r(4))])
        if block == "gelu":
            e = self.node("Add", [self.node("Erf", [self.node("Div", [x, self.const(1.4142135)])]), self.const(1.0)])
            return self.node("Mul", [self.node("Mul", [x, e]), self.const(0.5)])
        if block == "residual":
            return self.node("Add", [x, self.values[pick % len(self.values)]])
        if block == "softmax":
            return self.node("Softmax", [self.node("Add", [x, self.const(r((3, 4)))])], axis=-1)
        if block == "duplicate":
            return self.node("Add", [self.node("Tanh", [x]), self.node("Tanh", [x])])
        raise AssertionError(block)

    def model(self, exposed):
        outputs = [self.values[-1]] + [v for v in exposed if v != self.values[-1]]
        graph = helper.make_graph(self.nodes, "random",
                                  [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
                                  [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                                  self.inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        return model


@st.composite
def random_models(draw):
    builder = Builder(draw(st.integers(0, 2**16)))
    intermediates = []  # exposable as outputs, never read by a later block: their shapes vary ([2, 4, 3]...)
    for block in draw(st.lists(st.sampled_from(BLOCKS), min_size=1, max_size=6)):
        before = len(builder.nodes)
        builder.values.append(builder.add(block, builder.values[-1], draw(st.integers(0, 10))))
        inner = [n.output[0] for n in builder.nodes[before:-1]]
        if inner and draw(st.booleans()):  # expose an intermediate: the pattern is no longer private
            intermediates.append(draw(st.sampled_from(inner)))
    exposed = draw(st.lists(st.sampled_from(builder.values[1:] + intermediates), max_size=2, unique=True))
    return builder.model(exposed)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_models(), st.sampled_from([1, 2, 3]))
def test_every_level_preserves_outputs(model, level):
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)}
    want = session.run_model(model, feeds)
    got = session.run_model(optimize(model, level=level, providers=CPU), feeds)
    assert list(got) == list(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=1e-4, atol=1e-5, err_msg=name)

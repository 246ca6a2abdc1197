"""Hostile inputs found by review: each gets an OrtlabError that says what is wrong (never a raw
traceback, a hang or a silently wrong result)."""
import numpy as np
import pytest

from engine_models import chain_model, feeds_for, relu_kernel  # relu_kernel restores the kernel it replaced
from ortlab.engine import (ExecutionProvider, InferenceSession, OpKernel, SessionOptions, register_execution_provider,
                           kernel_registry)
from ortlab.engine.execution_provider import EXECUTION_PROVIDERS
from ortlab.errors import OrtlabError
from ortlab.memory import BFCArena, plan
from ortlab.env import quiet_import

pytestmark = pytest.mark.hostile

ort = quiet_import("onnxruntime")


def run_with_relu(kernel):
    with relu_kernel(kernel):
        return InferenceSession(chain_model()).run(None, feeds_for(chain_model()))


@pytest.mark.parametrize("kernel, phrase", [
    (lambda ctx: [ctx.input(0).tolist()], "returned a list"),
    (lambda ctx: {"y": ctx.input(0)}, "returned a dict"),
    (lambda ctx: (ctx.input(0), ctx.input(0)), "returned 2 values"),
    (lambda ctx: ctx.output(0, (3.0, 5.9)), "tuple of ints"),
    (lambda ctx: ctx.output(0, 15), "tuple of ints"),
    (lambda ctx: __import__("torch").from_numpy(ctx.input(0)), "Relu node 'n1'"),
])
def test_a_kernels_bad_results_are_named(kernel, phrase):
    with pytest.raises(OrtlabError, match=phrase):
        run_with_relu(kernel)


def test_a_kernel_class_built_wrongly_and_an_ep_that_raises():
    class NoInfo(OpKernel):
        def __init__(self):  # forgets info
            pass

    with relu_kernel(NoInfo), pytest.raises(OrtlabError, match=r"built as\s+cls\(info\)"):
        InferenceSession(chain_model())

    @register_execution_provider
    class RaisingExecutionProvider(ExecutionProvider):
        type = "RaisingExecutionProvider"

        def get_capability(self, graph, kernel_lookup):
            raise RuntimeError("oops")

    try:
        with pytest.raises(OrtlabError, match="get_capability raised RuntimeError: oops"):
            InferenceSession(chain_model(), providers=["RaisingExecutionProvider"])
    finally:
        EXECUTION_PROVIDERS.unregister("RaisingExecutionProvider")

    @register_execution_provider
    class NoOptionsExecutionProvider(ExecutionProvider):
        type = "NoOptionsExecutionProvider"

        def __init__(self):
            super().__init__()

    try:
        with pytest.raises(OrtlabError, match="does not take the provider options"):
            InferenceSession(chain_model(), providers=[("NoOptionsExecutionProvider", {"nope": 1})])
    finally:
        EXECUTION_PROVIDERS.unregister("NoOptionsExecutionProvider")
    with pytest.raises(OrtlabError, match="must be an OrtDevice"):
        register_execution_provider(type("BadDevice", (ExecutionProvider,), {"type": "BadDevice", "device": "GPU"}))


def test_options_and_feeds():
    with pytest.raises(OrtlabError, match="does not exist"):
        InferenceSession(chain_model(), SessionOptions(optimized_model_filepath="/nonexistent/dir/m.onnx"))
    with pytest.raises(OrtlabError, match="Unexpected input data type"):
        InferenceSession(chain_model()).run(None, {"x": np.ones((3, 5), ">f8")})


@pytest.mark.parametrize("shapes, phrase", [
    ({"x": (-3, 5)}, "ints >= 0"), ({"x": (3, 4)}, "declares"), ({"x": ("a", 5)}, "ints >= 0"),
    ({"x": 8}, "ints >= 0"), ({"x": (3, 5), "z": (1,)}, "not a graph input"),
])
def test_plan_refuses_shapes_the_model_cannot_take(shapes, phrase):
    with pytest.raises(OrtlabError, match=phrase):
        plan(chain_model(), shapes)


@pytest.mark.parametrize("size", [0, -1, 1.5, True])
def test_an_arena_with_no_room_to_grow_is_refused_not_a_hang(size):
    with pytest.raises(OrtlabError, match="positive int"):
        BFCArena(initial_chunk_size_bytes=size)


def test_option_types_and_outputs_that_are_inputs_or_weights():
    for bad in (dict(enable_mem_pattern="no"), dict(profile_file_prefix=None), dict(log_severity_level="0")):
        with pytest.raises(OrtlabError, match="takes"):
            SessionOptions(**bad)
    from onnx import TensorProto, helper, numpy_helper
    from ortlab.onnx_defs import make_model

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [2]) for n in ("y", "x", "w")],
                              [numpy_helper.from_array(np.ones(2, np.float32), "w")])
    x = np.array([-1.0, 2.0], np.float32)
    model = make_model(graph)
    for session in (InferenceSession(model), ort.InferenceSession(model.SerializeToString(),
                                                                  providers=["CPUExecutionProvider"])):
        y, x_out, w_out = session.run(None, {"x": x})
        # ORT 1.19.2 hands back the caller's own array for a graph input that is also an output (writing to the
        # output writes to the input); a weight comes back as a fresh, writable copy each run
        assert np.shares_memory(x_out, x) and x_out.ctypes.data == x.ctypes.data, type(session)
        w_out[:] = 5
        assert session.run(["w"], {"x": x})[0].tolist() == [1.0, 1.0], type(session)


def test_overriding_relu_here_leaves_the_builtin_kernel_for_later_tests():
    """The tests above override Relu; the CPU EP's own Relu kernel (OrtRelu) must be back afterwards."""
    registry = kernel_registry("CPUExecutionProvider")
    before = registry.kernels.get("Relu")
    run_with_relu(lambda ctx: ctx.input(0))
    test_a_kernel_class_built_wrongly_and_an_ep_that_raises()
    assert registry.kernels.get("Relu") is before

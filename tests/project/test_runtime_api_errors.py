"""Hostile inputs at the engine's session API, ortlab.memory, the optimizers and the training loop: a
silently wrong result becomes the right one or an OrtlabError, and a raw error becomes an OrtlabError
that says what is wrong and what to do. Expected behaviour comes from real ORT 1.19.2, torch, numpy and
ORT's sources (named where used), never from ortlab's own output."""
import math
import os

import numpy as np
import pytest
import torch
from onnx import TensorProto, helper, numpy_helper

from engine_models import chain_model, feeds_for, relu_kernel
from ortlab.engine import (ExecutionProvider, InferenceSession, SessionOptions, kernel_registry,
                           register_execution_provider, register_op_kernel, unregister_op_kernel)
from ortlab.engine.execution_provider import EXECUTION_PROVIDERS
from ortlab.env import quiet_import
from ortlab.errors import OrtlabError
from ortlab.memory import BFCArena, CachingAllocator, greedy_by_size, plan, validate
from ortlab.onnx_defs import make_model, one_node_model
from ortlab.training import LAMB, SGD, Adam, AdamW, train
from ortlab.ortmodule import fused_adam as fa
from ortlab.training import tensorboard
from ortlab.training.loop import curve_shape

pytestmark = pytest.mark.hostile

ort = quiet_import("onnxruntime")
F = TensorProto.FLOAT
NAN, INF = float("nan"), float("inf")


def two_live_model(n=64):
    """x -> Relu -> a, x -> Sigmoid -> b, a + b -> c, Relu(c) -> y: a and b are planned and live together."""
    nodes = [helper.make_node("Relu", ["x"], ["a"], name="relu_a"),
             helper.make_node("Sigmoid", ["x"], ["b"], name="sigmoid_b"),
             helper.make_node("Add", ["a", "b"], ["c"], name="add"),
             helper.make_node("Relu", ["c"], ["y"], name="relu_y")]
    graph = helper.make_graph(nodes, "two_live", [helper.make_tensor_value_info("x", F, [n, n])],
                              [helper.make_tensor_value_info("y", F, [n, n])])
    return make_model(graph)


# --- wrong results with no error ----------------------------------------------------------------
def test_a_kernel_for_a_misspelt_provider_is_refused_not_silently_unused():
    relu = lambda ctx: np.full(ctx.input(0).shape, 42.0, np.float32)  # noqa: E731 (would be visible if used)
    try:
        with pytest.raises(OrtlabError, match="CPUExecutionProvder.*did you mean CPUExecutionProvider"):
            register_op_kernel("Relu", provider="CPUExecutionProvder")(relu)
    finally:
        from ortlab.engine.kernel_registry import KERNEL_REGISTRIES

        KERNEL_REGISTRIES.unregister("CPUExecutionProvder")  # what an accepted typo left behind
    with pytest.raises(OrtlabError, match="did you mean CPUExecutionProvider"):
        unregister_op_kernel("Relu", provider="CPUExecutionProvder")


def test_a_provider_registered_first_takes_kernels():
    @register_execution_provider
    class OrderedExecutionProvider(ExecutionProvider):
        type = "OrderedExecutionProvider"

    try:
        register_op_kernel("Relu", provider="OrderedExecutionProvider")(lambda ctx: np.maximum(ctx.input(0), 0))
        assert unregister_op_kernel("Relu", provider="OrderedExecutionProvider") is not None
    finally:
        EXECUTION_PROVIDERS.unregister("OrderedExecutionProvider")


def _writing_relu(ctx):
    x = ctx.input(0)
    np.maximum(x, 0, out=x)  # writes into its input: ORT's Input<Tensor>(0) is const
    return x


def test_a_kernel_cannot_write_into_the_callers_feed():
    x = np.array([-1.0, 2.0, -3.0], np.float32)
    before = x.copy()
    with relu_kernel(_writing_relu), \
            pytest.raises(OrtlabError, match="read-only.*inputs are const.*OpKernelContext::Input"):
        InferenceSession(one_node_model("Relu", [x])).run(None, {"x0": x})
    np.testing.assert_array_equal(x, before)  # the caller's array, as numpy holds it, untouched


def test_a_kernel_cannot_write_into_a_weight_shared_by_every_run():
    w = np.array([-1.0, 2.0], np.float32)
    graph = helper.make_graph([helper.make_node("Relu", ["w"], ["r"]), helper.make_node("Add", ["x", "r"], ["y"])],
                              "g", [helper.make_tensor_value_info("x", F, [2])],
                              [helper.make_tensor_value_info("y", F, [2])], [numpy_helper.from_array(w, "w")])
    model = make_model(graph)
    x = np.ones(2, np.float32)
    with relu_kernel(_writing_relu), pytest.raises(OrtlabError, match="inputs are const"):
        InferenceSession(model, SessionOptions(graph_optimization_level=0)).run(None, {"x": x})
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    np.testing.assert_allclose(InferenceSession(model).run(None, {"x": x})[0], expected[0])


def test_plan_refuses_a_reuse_flag_that_is_not_a_bool():
    with pytest.raises(OrtlabError, match="enable_mem_reuse takes True or False.*'no'"):
        plan(two_live_model(), {"x": (64, 64)}, enable_mem_reuse="no")
    assert plan(two_live_model(), {"x": (64, 64)}, enable_mem_reuse=np.bool_(False)).enable_mem_reuse is False


def test_validate_sees_live_tensors_sharing_bytes_whatever_their_sizes():
    p = plan(two_live_model(), {"x": (64, 64)})
    a, b = p.value("a"), p.value("b")
    assert a.planned and b.planned and a.start <= b.end and b.start <= a.end  # live together
    b.offset = a.offset
    a.size = -a.size   # bytes [a.offset, a.offset + 16384) and [a.offset, ...) now overlap in truth
    with pytest.raises(OrtlabError, match="'a'.*size=-16384.*byte count"):
        validate(p)


def test_a_negative_reserve_is_refused_and_zero_is_orts_nullptr():
    arena = BFCArena()
    with pytest.raises(OrtlabError, match="reserve takes a byte count"):
        arena.reserve(-100)
    assert arena.stats.bytes_in_use == 0 and arena.stats.num_reserves == 0
    assert arena.reserve(0) is None  # bfc_arena.cc Reserve: `if (size == 0) return nullptr;`
    assert arena.stats.num_allocs == 0


@pytest.mark.parametrize("make, torch_refuses", [
    (lambda p: Adam(p, lr=NAN), lambda p: torch.optim.Adam(p, lr=NAN)),
    (lambda p: Adam(p, weight_decay=NAN), lambda p: torch.optim.Adam(p, weight_decay=NAN)),
    (lambda p: AdamW(p, eps=NAN), lambda p: torch.optim.AdamW(p, eps=NAN)),
    (lambda p: Adam(p, betas=(NAN, 0.999)), lambda p: torch.optim.Adam(p, betas=(NAN, 0.999))),
    (lambda p: LAMB(p, lr=INF), None),      # torch.optim.Adam accepts inf (0.0 <= inf); ortlab refuses it
    (lambda p: SGD(p, lr=NAN), None),       # torch.optim.SGD checks `lr < 0.0`, which NaN passes
    (lambda p: SGD(p, momentum=0.0, nesterov=True), lambda p: torch.optim.SGD(p, lr=0.1, nesterov=True)),
])
def test_optimizers_refuse_what_trains_to_nan(make, torch_refuses):
    params = [torch.nn.Parameter(torch.ones(3))]
    if torch_refuses is not None:
        with pytest.raises(ValueError):
            torch_refuses(params)
    with pytest.raises(OrtlabError):
        make(params)


def test_what_refused_hyperparameters_would_have_done():
    """The reason for refusing inf where torch accepts it: one step of torch's own Adam at lr=inf."""
    p = torch.nn.Parameter(torch.tensor([1.0, 0.0]))
    optimizer = torch.optim.Adam([p], lr=INF)
    p.grad = torch.tensor([1.0, 0.0])
    optimizer.step()
    assert not torch.isfinite(p).all()


@pytest.mark.parametrize("kwargs", [dict(lr=-1, eps=-1), dict(lr=NAN), dict(weight_decay=NAN), dict(eps=INF)])
def test_fused_adam_params_refuses_what_orts_fused_adam_does_not_check(kwargs):
    # ORT's FusedAdam.__init__ takes any value: constructing it (before it looks for its CUDA extension) passes
    fused_adam, _ = fa.fused_adam_class()
    with fa.cpu_fused_ops():
        fused_adam([torch.nn.Parameter(torch.ones(2))], **kwargs)
    with pytest.raises(OrtlabError, match="FusedAdam.__init__.*does not check"):
        fa.fused_adam_params(steps=1, **kwargs)


# --- raw or unhelpful errors: the engine ------------------------------------------------------------------
def test_a_profile_prefix_in_a_missing_folder_fails_at_session_creation(tmp_path):
    options = SessionOptions(enable_profiling=True, profile_file_prefix=str(tmp_path / "missing" / "prof"))
    with pytest.raises(OrtlabError, match="profile_file_prefix.*does not exist"):
        InferenceSession(chain_model(), options)
    # ORT 1.19.2 creates the session and returns the name of a file it never wrote
    so = ort.SessionOptions()
    so.enable_profiling, so.profile_file_prefix = True, str(tmp_path / "missing" / "prof")
    session = ort.InferenceSession(chain_model().SerializeToString(), so, providers=["CPUExecutionProvider"])
    assert not os.path.exists(session.end_profiling())


def test_an_optimized_model_path_that_cannot_be_written(tmp_path, monkeypatch):
    with pytest.raises(OrtlabError, match="is a folder; give a file path"):
        InferenceSession(chain_model(), SessionOptions(optimized_model_filepath=str(tmp_path)))
    (tmp_path / "afile").write_text("")
    with pytest.raises(OrtlabError, match="does not exist \\(or is not a folder\\)"):
        InferenceSession(chain_model(), SessionOptions(optimized_model_filepath=str(tmp_path / "afile" / "m.onnx")))
    monkeypatch.setattr(os, "access", lambda path, mode: False)  # a read-only folder (the tests run as root)
    with pytest.raises(OrtlabError, match="is not writable"):
        InferenceSession(chain_model(), SessionOptions(optimized_model_filepath=str(tmp_path / "m.onnx")))


@pytest.mark.parametrize("kernel_def, words", [
    (dict(may_inplace="yes"), "may_inplace takes a tuple of \\(input index, output index\\) pairs"),
    (dict(may_inplace=(0, 0)), "trailing comma"),
    (dict(alias=((0, -1),)), "alias must hold indices"),
    (dict(input_memory=0), "input_memory takes a tuple of indices"),
    (dict(type_constraints={0: "float"}), "did you mean 'float64'"),
    (dict(type_constraints=[0]), "type_constraints takes"),
    (dict(since_version=0), "an int >= 1"),
])
def test_kernel_def_keywords_are_checked_when_registered(kernel_def, words):
    before = kernel_registry("CPUExecutionProvider").kernels.get("Relu")
    with pytest.raises(OrtlabError, match=words):
        register_op_kernel("Relu", override=True, **kernel_def)(lambda ctx: ctx.input(0))
    assert kernel_registry("CPUExecutionProvider").kernels.get("Relu") is before  # nothing was registered


def test_a_big_endian_feed_is_refused_where_ort_reads_it_wrongly():
    x = feeds_for(chain_model())["x"]
    ort_session = ort.InferenceSession(chain_model().SerializeToString(), providers=["CPUExecutionProvider"])
    right = ort_session.run(None, {"x": x})[0]
    # ORT 1.19.2 takes the big-endian array and reads its bytes in the machine's order: a wrong result
    assert not np.allclose(ort_session.run(None, {"x": x.astype(">f4")})[0], right)
    with pytest.raises(OrtlabError, match="non-native byte order.*astype\\(np.float32\\)"):
        InferenceSession(chain_model()).run(None, {"x": x.astype(">f4")})
    with pytest.raises(OrtlabError, match="Actual: \\(tensor\\(double\\)\\) , expected: \\(tensor\\(float\\)\\)"):
        InferenceSession(chain_model()).run(None, {"x": x.astype(">f8")})  # ORT's own message for a wrong type


def test_get_capability_returning_none_is_named():
    @register_execution_provider
    class ForgetfulExecutionProvider(ExecutionProvider):
        type = "ForgetfulExecutionProvider"

        def get_capability(self, graph, kernel_lookup):
            [n.index for n in graph.nodes()]  # no return

    try:
        with pytest.raises(OrtlabError, match="returned NoneType None.*forget a return"):
            InferenceSession(chain_model(), providers=["ForgetfulExecutionProvider"])
    finally:
        EXECUTION_PROVIDERS.unregister("ForgetfulExecutionProvider")


# --- raw errors: ortlab.memory -------------------------------------------------------------------------------
def test_plan_refuses_a_shape_no_feed_can_have():
    with pytest.raises(OrtlabError, match="more than ORT's TensorShape::Size\\(\\) counts in an int64"):
        plan(chain_model(shape=("N", 5)), {"x": (2 ** 62, 5)})
    huge = plan(chain_model(shape=("N", 5)), {"x": (2 ** 40, 5)})  # exact Python ints, no int64 wrap
    assert huge.peak_bytes == 2 ** 40 * 5 * 4 and huge.lower_bound_bytes == 2 ** 40 * 5 * 4


@pytest.mark.parametrize("call, words", [
    (lambda: validate(None), "validate takes a Plan"),
    (lambda: greedy_by_size(None), "greedy_by_size takes a Plan"),
    (lambda: BFCArena().replay([("alloc",)]), "trace event 0 is \\('alloc',\\)"),
    (lambda: BFCArena().replay(None), "a trace is a list of events"),
    (lambda: BFCArena().replay([("alloc", -5)]), "byte count"),
    (lambda: BFCArena().alloc(8.0), "alloc takes a byte count"),
    (lambda: BFCArena().alloc(True), "alloc takes a byte count"),
    (lambda: BFCArena().free(12345), "free\\(0x3039\\): no chunk in use"),
    (lambda: CachingAllocator().replay([("free", 0)]), "not an allocation made earlier"),
    (lambda: CachingAllocator(memory_limit=-1), "memory_limit.*byte count"),
    (lambda: CachingAllocator(memory_limit="1GB"), "memory_limit.*str '1GB'"),
    (lambda: CachingAllocator().malloc(None), "malloc takes a byte count"),
])
def test_memory_functions_explain_bad_arguments(call, words):
    with pytest.raises(OrtlabError, match=words):
        call()


def test_validate_names_a_value_without_a_size():
    p = plan(two_live_model(), {"x": (64, 64)})
    p.value("a").size = None
    with pytest.raises(OrtlabError, match="'a'.*size=None"):
        validate(p)


def test_allocators_take_numpy_integers_and_a_null_free():
    arena, plain = BFCArena(), BFCArena()
    assert arena.alloc(np.int64(8)) == plain.alloc(8)
    assert arena.stats == plain.stats
    arena.free(None)  # bfc_arena.cc Free: `if (p == nullptr) return;`
    assert arena.stats == plain.stats
    allocator = CachingAllocator(memory_limit=np.int64(1 << 30))
    allocator.free(allocator.malloc(0))  # malloc(0) is a null pointer, freeing it does nothing
    assert allocator.malloc(np.uint32(100)) is not None


# --- raw errors: training ----------------------------------------------------------------------------------
def test_log_run_into_a_folder_that_cannot_be_made(tmp_path):
    (tmp_path / "afile").write_text("")
    with pytest.raises(OrtlabError, match="cannot create the run folder.*Not a directory"):
        tensorboard.log_run([1.0, 0.5], tmp_path / "afile" / "run")
    with pytest.raises(OrtlabError, match="run's folder is a str or Path"):
        tensorboard.log_run([1.0, 0.5], None)


@pytest.mark.parametrize("make, words", [
    (lambda p: SGD(p, lr="0.1"), "lr must be a number.*str '0.1'"),
    (lambda p: Adam(p, betas=None), "betas must be a pair"),
    (lambda p: Adam(p, betas=(0.9, 1.0)), "betas must lie in \\[0, 1\\)"),
    (lambda p: SGD(p, momentum=-0.5), "momentum must lie in"),
    (lambda p: SGD(p, lr=None), "lr must be a number"),
])
def test_optimizer_arguments_of_the_wrong_type(make, words):
    with pytest.raises(OrtlabError, match=words):
        make([torch.nn.Parameter(torch.ones(2))])


def test_an_optimizer_takes_a_one_element_tensor_lr_as_torch_does():
    p = torch.nn.Parameter(torch.ones(2))
    SGD([p], lr=torch.tensor(0.1))
    torch.optim.SGD([p], lr=torch.tensor(0.1))


def _linear_run():
    model = torch.nn.Linear(2, 1)
    return (lambda x: model(x).sum()), [(torch.ones(3, 2),)], SGD(model.parameters(), lr=0.1)


@pytest.mark.parametrize("change, words", [
    (dict(steps="5"), "steps must be an int >= 1, not str '5'"),
    (dict(steps=0), "steps must be an int >= 1"),
    (dict(batches=None), "batches must be a list of input tuples"),
    (dict(batches=[]), "batches is empty"),
    (dict(optimizer=None), "optimizer must be a torch.optim.Optimizer"),
    (dict(loss_scale=0), "loss_scale must be a positive finite number"),
    (dict(clip_norm=-1.0), "clip_norm must be a positive finite number or None"),
])
def test_train_explains_its_arguments(change, words):
    model, batches, optimizer = _linear_run()
    args = dict(model=model, batches=batches, optimizer=optimizer, steps=2, **{"progress": False})
    args.update(change)
    with pytest.raises(OrtlabError, match=words):
        train(**args)


def test_build_extension_refuses_what_no_compiler_could_build_before_compiling(monkeypatch):
    from ortlab.engine import cpp_extension as cpp

    def no_compiler():
        raise AssertionError("a compiler was started")

    monkeypatch.setattr(cpp, "_cpp_extension", no_compiler)
    module = "PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {}"
    for args, words in (((None,), "C\\+\\+ source as a non-empty str, not NoneType"),
                        (("int twice(int x) { return 2 * x; }",), "defines no PYBIND11_MODULE"),
                        ((module, "my kernels"), "Python identifier"),
                        ((module, "mine", "-O3"), "cflags must be a list of str")):
        with pytest.raises(OrtlabError, match=words):
            cpp.build_extension(*args)
    with pytest.raises(OrtlabError, match="did you mean CPUExecutionProvider"):
        cpp.register_cpp_kernels(provider="CPUExecutionProvder")


def test_finite_checks_agree_with_math():
    """The optimizers' rule in one line per value, against math.isfinite and torch's `0.0 <= x`."""
    for value in (0.0, 1e-3, 5, NAN, INF, -INF, -1e-9):
        expected_ok = math.isfinite(value) and value >= 0
        try:
            Adam([torch.nn.Parameter(torch.ones(1))], lr=value)
            ok = True
        except OrtlabError:
            ok = False
        assert ok == expected_ok, value


# --- found while trying more hostile inputs -------------------------------------------------------------------
def test_an_empty_fetch_list_fetches_every_output_as_ort_does():
    model, feeds = chain_model(), feeds_for(chain_model())
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run([], feeds)
    got = InferenceSession(model).run([], feeds)
    assert len(got) == len(expected) == 1
    np.testing.assert_allclose(got[0], expected[0], rtol=1e-6)


def test_get_capability_may_return_numpy_indices():
    @register_execution_provider
    class NumpyExecutionProvider(ExecutionProvider):
        type = "NumpyExecutionProvider"

        def get_capability(self, graph, kernel_lookup):
            return np.flatnonzero([kernel_lookup(n) is not None for n in graph.nodes()])  # np.int64 indices

    register_op_kernel("Relu", provider="NumpyExecutionProvider")(lambda ctx: np.maximum(ctx.input(0), 0))
    try:
        session = InferenceSession(chain_model(), providers=["NumpyExecutionProvider"])
        assert session.state.placements()["NumpyExecutionProvider"]
    finally:
        EXECUTION_PROVIDERS.unregister("NumpyExecutionProvider")


def test_a_kernel_for_domain_none_is_the_onnx_domains():
    registry = kernel_registry("CPUExecutionProvider")
    with registry.kernels.using(("Relu", ""), None):
        register_op_kernel("Relu", domain=None, override=True)(mine := lambda ctx: np.maximum(ctx.input(0), 0))
        assert registry.kernels.get(("Relu", "")).kernel_class.fn is mine


@pytest.mark.parametrize("call, words", [
    (lambda: Adam([]), "Adam's params must be the parameters to train.*empty parameter list"),
    (lambda: SGD(None), "SGD's params must be the parameters to train"),
    (lambda: train(*_linear_run(), 2, progress=False, on_step="print"), "on_step must be a function"),
    (lambda: curve_shape(None), "takes a list of losses"),
    (lambda: curve_shape([1.0] * 10, window=0), "window must be"),
    (lambda: tensorboard.log_run([1.0, 2.0], "unused", lrs=5), "lrs must be a list"),
])
def test_more_training_arguments_are_explained(call, words):
    with pytest.raises(OrtlabError, match=words):
        call()


def test_the_cpp_sgd_step_refuses_a_nan_rate_before_building(monkeypatch):
    from ortlab.engine import cpp_extension as cpp

    monkeypatch.setattr(cpp, "build", lambda: (_ for _ in ()).throw(AssertionError("built")))
    w = np.ones(3, np.float32)
    with pytest.raises(OrtlabError, match="lr must be a finite number >= 0, not nan"):
        cpp.sgd_step(w, np.ones(3, np.float32), NAN)
    with pytest.raises(OrtlabError, match="momentum must be a finite number"):
        cpp.sgd_step(w, np.ones(3, np.float32), 0.1, momentum="0.9")
    np.testing.assert_array_equal(w, np.ones(3, np.float32))


def test_outputs_a_node_also_read_come_back_writable_as_orts_do():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Sigmoid", ["a"], ["y"])]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", F, [3])],
                              [helper.make_tensor_value_info(n, F, [3]) for n in ("a", "y")])
    model, x = make_model(graph), np.array([-1.0, 0.5, 2.0], np.float32)
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    got = InferenceSession(model).run(None, {"x": x})
    assert [v.flags.writeable for v in got] == [v.flags.writeable for v in expected] == [True, True]
    for g, e in zip(got, expected):
        np.testing.assert_allclose(g, e, rtol=1e-6)
    assert x.flags.writeable  # the caller's feed keeps its flags: the kernels saw a read-only view


def test_a_kernel_reads_the_very_array_its_producer_wrote():
    """Inputs are const without a copy: the next node's ctx.input is the array the producer wrote into its
    slot (what L2_01's frame walk shows), made read-only; the caller gets the outputs writable."""
    from ortlab.walkthroughs import execution_engine as plan_views

    seen = {}

    def relu(ctx):
        seen["x"] = ctx.input(0)
        np.maximum(seen["x"], 0, out=ctx.output(0, seen["x"].shape))

    with relu_kernel(relu):
        session = InferenceSession(chain_model(), SessionOptions(graph_optimization_level=0, enable_mem_pattern=False))
        trace = plan_views.trace_run(session, feeds_for(chain_model()))
    after = {row.step.node.name: row.values for row in trace.steps}
    assert seen["x"] is after["n0"][session.state.index_of["v0"]]
    assert not seen["x"].flags.writeable


def test_orts_missing_gradient_builder_comes_with_what_to_do():
    import onnx
    from onnx import TensorProto, helper

    from ortlab.gradients import OrtGradientError, ort_gradient_graph

    c = 3
    inits = [helper.make_tensor(n, TensorProto.FLOAT, [c], v) for n, v in
             (("scale", [1.0] * c), ("bias", [0.0] * c), ("mean", [0.0] * c), ("var", [1.0] * c))]
    nodes = [helper.make_node("BatchNormalization", ["X", "scale", "bias", "mean", "var"], ["Y"]),
             helper.make_node("ReduceSum", ["Y"], ["loss"], keepdims=0)]
    graph = helper.make_graph(nodes, "bn", [helper.make_tensor_value_info("X", TensorProto.FLOAT, [2, c])],
                              [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 15)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    with pytest.raises(OrtGradientError) as caught:
        ort_gradient_graph(model, ["scale"], "loss")
    said = str(caught.value)
    assert "has not been registered: BatchNormalization" in said  # ORT's own words
    assert "BatchNormReplacement" in said and "register_ort_gradient" in said

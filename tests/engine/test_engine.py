"""ortlab.engine against onnxruntime 1.19.2: same outputs, ORT's partitioning and memcpy rules,
ORT's errors, the executor's releases, and extension by registration."""
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings

from engine_models import chain_model, feeds_for, reduce_sum_model, training_graph
from ortlab import models, session
from ortlab.engine import (ExecutionProvider, InferenceSession, InvalidArgument, InvalidGraph, KernelFailure,
                           NotImplementedKernel, OrtDevice, RunOptions, SessionOptions, register_execution_provider,
                           register_op_kernel, unregister_op_kernel)
from ortlab.engine.execution_provider import EXECUTION_PROVIDERS
from ortlab.profiling import diagnose, load_ort_profile
from ortlab.training import MiniORTModule
from test_transformer_properties import random_models

TRITON = ["TritonExecutionProvider"]
RTOL, ATOL = 1e-5, 1e-6


def ort_outputs(model, feeds, level="disable"):
    return session.run_model(model, feeds, level=level)


def engine_outputs(model, feeds, level=0, providers=None):
    sess = InferenceSession(model, SessionOptions(graph_optimization_level=level), providers)
    return dict(zip([o.name for o in sess.get_outputs()], sess.run(None, feeds)))


def assert_same(got, want, rtol=RTOL, atol=ATOL):
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_allclose(got[name], want[name], rtol=rtol, atol=atol, err_msg=name)


def zoo_exports():
    """{name: (model, feeds)}: each zoo model exported for logits and for its loss, for inference and
    for training (Dropout nodes kept, in training mode; ratio 0 so that both runtimes agree)."""
    for name in ("mlp", "bert", "gpt"):
        model = models.get(name, dropout=0.0)
        for with_loss, training in ((False, False), (True, False), (True, True)):
            inputs = model.example_inputs()
            inputs = inputs if with_loss else inputs[:1]
            exported = models.export(model, inputs, training=training)
            names = [i.name for i in exported.graph.input]
            kind = ("loss" if with_loss else "logits") + ("-training" if training else "")
            yield f"{name}-{kind}", (exported, dict(zip(names, (t.numpy() for t in inputs))))


ZOO = dict(zoo_exports())


# --- outputs equal ORT's ----------------------------------------------------------------------
@pytest.mark.parametrize("name", list(ZOO))
@pytest.mark.parametrize("level", [0, 1, 2, 99])
def test_zoo_outputs_equal_ort(name, level):
    model, feeds = ZOO[name]
    assert_same(engine_outputs(model, feeds, level), ort_outputs(model, feeds))


@pytest.mark.parametrize("name", list(ZOO))
@pytest.mark.parametrize("ort_level", ["basic", "extended"])
def test_orts_optimized_graph_runs_equal(name, ort_level, tmp_path):
    """ORT's own optimized graph (optimized_model_filepath), run by the engine, gives ORT's outputs."""
    path = tmp_path / "ort_optimized.onnx"
    model, feeds = ZOO[name]
    session.create(model, session.session_options(ort_level, optimized_model_filepath=str(path)))
    optimized = onnx.load(str(path))
    assert_same(engine_outputs(optimized, feeds), ort_outputs(model, feeds), rtol=1e-5, atol=1e-5)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_models())
def test_random_graphs_equal_ort(model):
    """Same outputs; and a graph ORT refuses (a residual Add across a Transpose), the engine refuses too."""
    feeds = {"x": np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)}
    try:
        want = ort_outputs(model, feeds)
    except session.SessionError:
        with pytest.raises(InvalidGraph):
            engine_outputs(model, feeds)
        return
    assert_same(engine_outputs(model, feeds), want)


def test_both_execution_orders_give_the_same_outputs():
    model, feeds = ZOO["bert-logits"]
    runs = [InferenceSession(model, SessionOptions(execution_order=o)).run(None, feeds)[0]
            for o in ("default", "priority")]
    np.testing.assert_array_equal(runs[0], runs[1])


# --- partitioning and memcpy, by ORT's rules ----------------------------------------------------
def placements(sess):
    return {s.node.name: s.provider.type for s in sess.state.steps}


def op_count(sess, op):
    return sum(s.node.op_type == op for s in sess.state.steps)


def test_cpu_ep_alone_by_default_added_last_and_the_order_kept():
    assert InferenceSession(chain_model()).get_providers() == ["CPUExecutionProvider"]
    assert InferenceSession(chain_model(), providers=TRITON).get_providers() == TRITON + ["CPUExecutionProvider"]
    first = InferenceSession(chain_model(), providers=["CPUExecutionProvider", "TritonExecutionProvider"])
    assert first.get_providers() == ["CPUExecutionProvider", "TritonExecutionProvider"]
    assert set(placements(first).values()) == {"CPUExecutionProvider"}  # named first, the CPU EP claims all
    twice = InferenceSession(chain_model(), SessionOptions(log_severity_level=3), providers=TRITON * 2)
    assert twice.get_providers() == TRITON + ["CPUExecutionProvider"]
    assert "Duplicate provider TritonExecutionProvider" in twice.log.text()
    with_options = InferenceSession(chain_model(), providers=[("TritonExecutionProvider", {"device_id": 0})])
    assert with_options.get_provider_options()["TritonExecutionProvider"] == {"device_id": 0}


def test_an_ep_claiming_a_node_it_has_no_kernel_for_or_lacking_memcpy_is_explained():
    @register_execution_provider
    class GreedyExecutionProvider(ExecutionProvider):
        type = "GreedyExecutionProvider"

        def get_capability(self, graph, kernel_lookup):
            return [n.index for n in graph.nodes() if n.op_type == "Relu"]

    @register_execution_provider
    class NoCopyExecutionProvider(ExecutionProvider):
        type = "NoCopyExecutionProvider"
        device = OrtDevice("GPU", 0, "pretend device memory")

    register_op_kernel("Relu", provider="NoCopyExecutionProvider")(lambda ctx: np.maximum(ctx.input(0), 0))
    try:
        with pytest.raises(NotImplementedKernel, match="claimed Relu node 'n1'.*has no kernel"):
            InferenceSession(chain_model(), providers=["GreedyExecutionProvider"])
        with pytest.raises(NotImplementedKernel, match="registers no MemcpyFromHost"):
            InferenceSession(chain_model(), providers=["NoCopyExecutionProvider"])
    finally:
        unregister_op_kernel("Relu", provider="NoCopyExecutionProvider")
        EXECUTION_PROVIDERS.unregister("GreedyExecutionProvider")
        EXECUTION_PROVIDERS.unregister("NoCopyExecutionProvider")


def test_one_op_missing_from_the_device_ep_gets_exactly_a_pair_of_copies():
    sess = InferenceSession(chain_model(), providers=TRITON)
    assert placements(sess)["n1"] == "CPUExecutionProvider"
    assert placements(sess)["n0"] == placements(sess)["n2"] == "TritonExecutionProvider"
    # n0 -> host, host -> n2; y, a graph output computed on the device, gets no node (ORT's ModifyGraph adds
    # none: utils::CopyOutputsAcrossDevices copies it to the fetch's device at the end of the run)
    assert (op_count(sess, "MemcpyToHost"), op_count(sess, "MemcpyFromHost")) == (1, 1)
    y = sess.run(None, feeds_for(chain_model()))[0]
    assert type(y).__module__ == "numpy"
    order = [s.node.op_type for s in sess.state.steps]
    assert order.index("Relu") - 1 == order.index("MemcpyToHost") and order[order.index("Relu") + 1] == "MemcpyFromHost"


def test_a_graph_output_made_on_the_device_gets_no_copy_node_and_comes_back_on_the_host():
    """ORT's MemcpyTransformer adds no node for a graph output (its ModifyGraph never counts graph outputs as
    host reads, whatever the file's overview comment says); the run copies it to the fetch's device at the end
    (utils::CopyOutputsAcrossDevices)."""
    sess = InferenceSession(chain_model(("Softmax",)), providers=TRITON)
    assert (op_count(sess, "MemcpyToHost"), op_count(sess, "MemcpyFromHost")) == (0, 0)
    x = feeds_for(chain_model(("Softmax",)))
    y, = sess.run(None, x)
    assert isinstance(y, np.ndarray)
    np.testing.assert_allclose(y, ort_outputs(chain_model(("Softmax",)), x)["y"], rtol=1e-5, atol=1e-6)


def test_a_shape_input_declared_as_cpu_memory_needs_no_copy():
    sess = InferenceSession(reduce_sum_model(), SessionOptions(graph_optimization_level=0), providers=TRITON)
    assert placements(sess)["sum"] == "TritonExecutionProvider"
    copies = [s.node.input_names for s in sess.state.steps if s.node.op_type.startswith("Memcpy")]
    assert all("axes" not in names for names in copies)
    assert op_count(sess, "MemcpyFromHost") == 1 and op_count(sess, "MemcpyToHost") == 0  # r in; y copied by the run


def test_triton_ep_outputs_equal_ort_within_the_kernels_tolerance():
    for model, feeds in ((chain_model(), feeds_for(chain_model())), (reduce_sum_model(), feeds_for(reduce_sum_model())),
                         ZOO["gpt-logits"]):
        assert_same(engine_outputs(model, feeds, providers=TRITON), ort_outputs(model, feeds), 1e-4, 1e-5)


def test_partitioned_graph_records_each_nodes_ep_and_the_doctor_finds_the_sandwich(tmp_path):
    path = tmp_path / "partitioned.onnx"
    InferenceSession(chain_model(), SessionOptions(optimized_model_filepath=str(path)), providers=TRITON)
    saved = onnx.load(str(path))
    eps = {n.name: {p.key: p.value for p in n.metadata_props}["ortlab.execution_provider"] for n in saved.graph.node}
    assert eps["n1"] == "CPUExecutionProvider" and eps["n0"] == "TritonExecutionProvider"
    findings = [f for f in diagnose(saved).findings if f.check == "memcpy"]
    assert any("n1" in f.node and "between Memcpy" in f.message for f in findings)


# --- ORT's errors -----------------------------------------------------------------------------
@pytest.mark.parametrize("feeds, fetches, phrase", [
    ({}, None, "Required inputs (['x']) are missing from input feed"),
    ({"x": np.ones((3, 5), np.float32), "z": np.ones(1)}, None, "Invalid input name: z"),
    ({"x": np.ones((3, 5))}, None, "Unexpected input data type. Actual: (tensor(double)) , expected: (tensor(float))"),
    ({"x": np.ones((3, 5, 1), np.float32)}, None, "Invalid rank for input: x Got: 3 Expected: 2"),
    ({"x": np.ones((3, 4), np.float32)}, None, "Got invalid dimensions for input: x for the following indices"),
    ({"x": np.ones((3, 5), np.float32)}, ["q"], "Invalid output name:q"),
])
def test_bad_feeds_fail_in_orts_words(feeds, fetches, phrase):
    model = chain_model()
    with pytest.raises(Exception) as ort_error:
        session.create(model).run(fetches, feeds)
    with pytest.raises(InvalidArgument) as ours:
        InferenceSession(model).run(fetches, feeds)
    assert phrase in str(ours.value) and phrase in str(ort_error.value)


def test_an_unknown_op_names_the_eps_asked_and_what_they_register():
    model = chain_model()
    model.graph.node[1].op_type, model.graph.node[1].domain = "NoSuchOp", "com.microsoft"
    model.opset_import.append(onnx.helper.make_opsetid("com.microsoft", 1))
    with pytest.raises(NotImplementedKernel, match="com.microsoft:NoSuchOp") as error:
        InferenceSession(model, providers=TRITON)
    assert "TritonExecutionProvider:" in str(error.value) and "CPUExecutionProvider:" in str(error.value)


def test_a_model_that_does_not_resolve():
    model = chain_model()
    model.graph.node[1].input[0] = "nowhere"
    with pytest.raises(InvalidGraph, match="nowhere"):
        InferenceSession(model)
    with pytest.raises(InvalidArgument, match="ModelProto, a path or bytes"):
        InferenceSession(42)


def test_a_kernel_that_raises_names_the_node_and_op():
    @register_op_kernel("Relu", override=True)
    def broken(ctx):
        raise ValueError("boom")

    try:
        with pytest.raises(KernelFailure, match="Relu node 'n1'.*boom"):
            InferenceSession(chain_model()).run(None, feeds_for(chain_model()))
    finally:
        unregister_op_kernel("Relu")


def test_a_kernel_that_returns_the_wrong_shape_or_type():
    for wrong, phrase in ((lambda x: x[:, :2], r"has shape \[3, 2\].*says \[3, 5\]"),
                          (lambda x: x.astype(np.float64), "float64, the graph says float32")):
        register_op_kernel("Relu", override=True)(lambda ctx, wrong=wrong: wrong(ctx.input(0)))
        try:
            with pytest.raises(KernelFailure, match=phrase):
                InferenceSession(chain_model()).run(None, feeds_for(chain_model()))
        finally:
            unregister_op_kernel("Relu")


def test_a_graph_output_of_another_shape_than_declared_warns_as_ort_does():
    model = chain_model(("Relu",))
    model.graph.output[0].type.tensor_type.shape.dim[1].dim_value = 4  # declared [3, 4], computed [3, 5]
    feeds = feeds_for(chain_model(("Relu",)))
    assert ort_outputs(model, feeds)["y"].shape == (3, 5)
    sess = InferenceSession(model, SessionOptions(log_severity_level=3, graph_optimization_level=0))
    assert sess.run(None, feeds)[0].shape == (3, 5)
    assert "Expected shape from model of [3, 4] does not match actual shape of [3, 5] for output y" in sess.log.text()


def test_string_tensors_feed_and_run():
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("StringConcat", ["a", "b"], ["y"])], "s",
                              [helper.make_tensor_value_info(n, TensorProto.STRING, [2]) for n in "ab"],
                              [helper.make_tensor_value_info("y", TensorProto.STRING, [2])])
    model = onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20)], ir_version=9)
    feeds = {"a": np.array(["x", "y"]), "b": np.array(["1", "2"], dtype=object)}
    assert list(InferenceSession(model).run(None, feeds)[0]) == list(ort_outputs(model, feeds)["y"]) == ["x1", "y2"]


def test_the_input_model_is_never_modified(tmp_path):
    model, feeds = ZOO["gpt-logits"]
    before = model.SerializeToString()
    InferenceSession(model, providers=TRITON).run(None, feeds)
    assert model.SerializeToString() == before


# --- the executor -------------------------------------------------------------------------------
def test_values_are_released_after_their_last_use():
    sess = InferenceSession(chain_model(), SessionOptions(graph_optimization_level=0, enable_mem_pattern=False))
    released = {sess.state.value_names[v] for s in sess.state.steps for v in s.releases}
    assert released == {"v0", "v1"}  # not the feed x, not the graph output y
    sess.run(None, feeds_for(chain_model()))
    assert sess.last_run.peak_bytes == 2 * 3 * 5 * 4  # never more than two [3, 5] floats alive
    with_pattern = InferenceSession(chain_model(), SessionOptions(graph_optimization_level=0))
    with_pattern.run(None, feeds_for(chain_model()))
    # one 256-byte block: v1 = Relu(v0) takes v0's buffer (MayInplace); y, a graph output, is apart
    assert with_pattern.last_run.pattern_bytes == 256 and with_pattern.last_run.peak_bytes == 256 + 60


def test_run_options_path_to_fetches_and_terminate():
    model, feeds = ZOO["mlp-loss"]
    sess = InferenceSession(model)
    sess.run(None, feeds, RunOptions(only_execute_path_to_fetches=True))
    assert sess.last_run.steps <= len(sess.state.steps)
    with pytest.raises(Exception, match="Exiting due to terminate flag being set to true"):
        sess.run(None, feeds, RunOptions(terminate=True))


def test_profile_reads_like_orts(tmp_path):
    prefix = str(tmp_path / "engine")
    sess = InferenceSession(chain_model(), SessionOptions(enable_profiling=True, profile_file_prefix=prefix),
                            providers=TRITON)
    sess.run(None, feeds_for(chain_model()))
    profile = load_ort_profile(sess.end_profiling())
    assert {e.provider for e in profile.events} == {"CPUExecutionProvider", "TritonExecutionProvider"}
    assert len(profile.runs) == 1 and len(profile.events) == len(sess.state.steps)


def test_verbose_log_in_orts_words():
    sess = InferenceSession(chain_model(), SessionOptions(log_severity_level=3), providers=TRITON)
    text = sess.log.text()
    assert "Add MemcpyFromHost after v1 for TritonExecutionProvider" in text
    assert "Node(s) placed on [TritonExecutionProvider]. Number of nodes: 4" in text  # n0, n2 and two copies


def test_accepts_onnxruntimes_own_options():
    ort = session.ort
    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.execution_order = ort.ExecutionOrder.PRIORITY_BASED
    sess = InferenceSession(chain_model(), so)
    assert sess.options.level() == 0 and sess.options.order() == "priority"


# --- extension by registration ----------------------------------------------------------------
def test_a_learner_ep_with_its_own_get_capability():
    @register_execution_provider
    class ReluOnlyExecutionProvider(ExecutionProvider):
        type = "ReluOnlyExecutionProvider"
        device = OrtDevice("CPU", 0, "host memory")

        def get_capability(self, graph, kernel_lookup):
            return [n.index for n in graph.nodes() if n.op_type == "Relu"]

    @register_op_kernel("Relu", provider="ReluOnlyExecutionProvider")
    def relu(ctx):
        x = ctx.input(0)
        np.maximum(x, 0, out=ctx.output(0, x.shape))

    try:
        sess = InferenceSession(chain_model(), providers=["ReluOnlyExecutionProvider"])
        assert placements(sess)["n1"] == "ReluOnlyExecutionProvider" and sess.memcpy_count == 0
        feeds = feeds_for(chain_model())
        np.testing.assert_allclose(sess.run(None, feeds)[0], ort_outputs(chain_model(), feeds)["y"], rtol=1e-6)
    finally:
        EXECUTION_PROVIDERS.unregister("ReluOnlyExecutionProvider")


def test_an_unknown_provider_name_lists_the_known_ones():
    with pytest.raises(Exception, match="TritonExecutionProvider"):
        InferenceSession(chain_model(), providers=["TritonExecutionProvder"])


# --- gradient graphs: ortlab's builder and ORT's C++ builder ------------------------------------
@pytest.mark.parametrize("name", ["mlp", "bert", "gpt"])
@pytest.mark.parametrize("builder", ["ortlab", "ort"])
def test_gradient_graphs_equal_ort(name, builder):
    model, feeds = training_graph(name, builder)
    want = ort_outputs(model, feeds)
    assert_same(engine_outputs(model, feeds), want, rtol=1e-5, atol=1e-6)
    assert_same(engine_outputs(model, feeds, level=99), want, rtol=1e-4, atol=1e-5)  # ortlab's transformers too


@pytest.mark.parametrize("name", ["bert", "gpt"])
def test_orts_optimized_gradient_graphs_run_equal(name, tmp_path):
    """ORT's own optimized training graph (its ReduceSumTraining, FusedGemm...), run by the engine."""
    model, feeds = training_graph(name, "ort")
    path = tmp_path / "ort_optimized_training.onnx"
    session.create(model, session.session_options("all", optimized_model_filepath=str(path)))
    assert_same(engine_outputs(onnx.load(str(path)), feeds), ort_outputs(model, feeds), rtol=1e-4, atol=1e-5)


def test_bench_breakdown_adds_up():
    """The benchmark's split of the engine's run time: kernels plus overhead is the run."""
    from ortlab.benchmarks.engine import engine_breakdown

    module = models.get("mlp", dropout=0.0)
    model = MiniORTModule(module, gradient_builder="ortlab", runtime="ortlab")
    batch = module.example_inputs()
    model(*batch).backward()
    table = engine_breakdown(model, batch, runs=2)
    for _, nodes, run, kernel, overhead, _ in table.rows:
        assert nodes > 0 and abs(float(run) - float(kernel) - float(overhead)) < 0.02


@pytest.mark.parametrize("make, phrase", [
    (lambda: register_op_kernel("Foo", aliass=((0, 0),)), "unknown keyword"),
    (lambda: register_op_kernel("Foo")(3), "decorates a function"),
    (lambda: register_execution_provider(type("NoName", (ExecutionProvider,), {})), "sets no `type`"),
    (lambda: InferenceSession(chain_model(), SessionOptions(graph_optimization_level="fast")),
     "graph_optimization_level"),
    (lambda: InferenceSession(chain_model(), {"level": 1}), "sess_options must be"),
    (lambda: InferenceSession(chain_model(), providers=[3]), "EP names"),
    (lambda: InferenceSession(b"garbage"), "not an ONNX model"),
    (lambda: InferenceSession(chain_model()).run(None, [1]), "must be a dict"),
])
def test_hostile_arguments_get_clear_errors(make, phrase):
    from ortlab.errors import OrtlabError

    with pytest.raises(OrtlabError, match=phrase):
        make()


def test_a_get_capability_returning_names_is_explained():
    @register_execution_provider
    class NamesExecutionProvider(ExecutionProvider):
        type = "NamesExecutionProvider"

        def get_capability(self, graph, kernel_lookup):
            return ["n0"]

    try:
        with pytest.raises(NotImplementedKernel, match="must return a list of node indices"):
            InferenceSession(chain_model(), providers=["NamesExecutionProvider"])
    finally:
        EXECUTION_PROVIDERS.unregister("NamesExecutionProvider")


# --- where ORT 1.19.2 is wrong: pinned, and the engine's answer is the maths ------------------
def test_orts_fusedmatmul_ignores_transA_with_a_1d_b():
    """contrib_ops/cpu/fused_matmul.cc with matmul_helper.h: A[4, 3] with transA=1 times b[4] should
    be A^T b ([3]); ORT 1.19.2 silently drops the transpose. The engine computes A^T b."""
    from ortlab.onnx_defs import MS_DOMAIN, one_node_model

    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((4, 3)).astype(np.float32), rng.standard_normal(4).astype(np.float32)
    model = one_node_model("FusedMatMul", [a, b], {"transA": 1}, domain=MS_DOMAIN)
    feeds = {"x0": a, "x1": b}
    theirs = list(ort_outputs(model, feeds).values())[0]
    ours = InferenceSession(model).run(None, feeds)[0]
    np.testing.assert_allclose(ours, a.T @ b, rtol=1e-6)
    assert theirs.shape != (3,) or not np.allclose(theirs, a.T @ b)  # ORT's bug, pinned

"""ortlab.triton_kernels: every Triton kernel against its numpy reference and ORT's own kernel
(op_test), the gradients against torch autograd, and clear errors on bad input.

Shapes are small (Triton's interpreter runs each program in Python) but include lengths that
are not powers of two, tails past a full block, repeated indices, ignored labels and axes
other than the last. Cases marked `gpu_sizes` are the large ones, run only on a GPU.
"""
import numpy as np
import pytest
import torch

import ortlab.triton_kernels as K
from ortlab import OrtlabError
from ortlab.env import kernel_device, triton_mode
from ortlab.onnx_defs import MS_DOMAIN, op_name
from ortlab.triton_kernels.op_tester import OpTestFailure

MS = MS_DOMAIN
GPU = kernel_device() == "cuda"
gpu_only = pytest.mark.skipif(not GPU, reason="large sizes: compiled Triton on a GPU only")


def rand(*shape, seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def t(a, grad=False):
    return torch.tensor(a, dtype=torch.float64 if a.dtype == np.float32 else None,
                        requires_grad=grad)


# -- op_test: ortlab vs numpy reference vs ORT's CPU kernel ------------------------------
@pytest.mark.parametrize("key", list(K.KERNELS), ids=lambda key: op_name(*key))
def test_every_registered_kernel_matches_its_reference_and_ort_on_its_example(key):
    """A kernel registered anywhere (a new module of ortlab.triton_kernels.ops included) is tested here
    on Kernel.example, with no other edit; ORT's CPU EP is compared where it has the op."""
    kernel_cls = K.KERNELS[key]
    inputs, attributes = kernel_cls.example(np.random.default_rng(0))
    result = K.op_test(kernel_cls.op_type, inputs, attributes, domain=kernel_cls.domain)
    compared = {row["against"] for row in result.rows}
    assert ("numpy reference" in compared or kernel_cls.random) and "ORT CPU" in compared
    if not kernel_cls.ort_cpu:
        assert "no CPU kernel in ORT (CUDA only)" in repr(result)


ELEMENTWISE = [(7,), (3, 37), (1030,), (2, 3, 129)]  # 1030 > BLOCK 1024: a masked tail


@pytest.mark.parametrize("shape", ELEMENTWISE)
def test_gelu_grad_and_bias_gelu(shape):
    x, dy = rand(*shape), rand(*shape, seed=1)
    K.op_test("GeluGrad", [dy, x], domain=MS)
    K.op_test("BiasGelu", [x, rand(shape[-1], seed=2)], domain=MS)


@pytest.mark.parametrize("shape,axis", [((5, 37), -1), ((4, 6, 3), 1), ((3, 5, 7), 0), ((300,), 0)])
def test_softmax_and_grad(shape, axis):
    x = rand(*shape)
    K.op_test("Softmax", [x], {"axis": axis})
    y = K.run("Softmax", x, axis=axis)[0]
    K.op_test("SoftmaxGrad_13", [rand(*shape, seed=1), y], {"axis": axis}, domain=MS)


@pytest.mark.parametrize("shape,axis", [((6, 37), -1), ((3, 4, 10), -1), ((3, 4, 10), 1), ((40, 129), -1)])
def test_layer_norm_and_grad(shape, axis):
    x = rand(*shape)
    params = x.shape[axis % x.ndim:]
    scale, bias = rand(*params, seed=1), rand(*params, seed=2)
    K.op_test("LayerNormalization", [x, scale, bias], {"axis": axis, "epsilon": 1e-3})
    K.op_test("LayerNormalization", [x, scale], {"axis": axis})
    _, mean, inv_std = K.run("LayerNormalization", x, scale, axis=axis)
    K.op_test("LayerNormalizationGrad", [rand(*shape, seed=3), x, scale, mean, inv_std],
              {"axis": axis}, domain=MS)


@pytest.mark.parametrize("shape,axes,keepdims", [((5, 37), [1], 1), ((4, 6, 3), [0, 2], 0),
                                                 ((3, 5, 7), [-2], 1), ((2, 1100), None, 0),
                                                 ((3, 4), [], 1)])
def test_reduce_sum(shape, axes, keepdims):
    inputs = [rand(*shape)] + ([] if axes is None else [np.array(axes, dtype=np.int64)])
    K.op_test("ReduceSum", inputs, {"keepdims": keepdims})


def test_reduce_sum_noop_with_empty_axes():
    x = rand(3, 4)
    K.op_test("ReduceSum", [x, np.array([], dtype=np.int64)], {"noop_with_empty_axes": 1})
    assert np.array_equal(K.run("ReduceSum", x, np.array([], np.int64), noop_with_empty_axes=1)[0], x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("scores_shape", [(6, 11), (2, 5, 3, 4)])
def test_softmax_cross_entropy_and_grad(reduction, scores_shape):
    rng = np.random.default_rng(0)
    scores = rand(*scores_shape)
    labels = rng.integers(0, scores_shape[1], (scores_shape[0],) + scores_shape[2:])
    labels.reshape(-1)[[1, 4]] = -100  # ignored
    weights = rng.random(scores_shape[1]).astype(np.float32)
    attrs = {"reduction": reduction, "ignore_index": -100}
    K.op_test("SoftmaxCrossEntropyLoss", [scores, labels, weights], attrs)
    _, log_prob = K.run("SoftmaxCrossEntropyLoss", scores, labels, weights, **attrs)
    dy = rand(*labels.shape, seed=3) if reduction == "none" else np.array(0.7, np.float32)
    K.op_test("SoftmaxCrossEntropyLossGrad", [dy, log_prob, labels, weights], attrs, domain=MS)
    K.op_test("SoftmaxCrossEntropyLossGrad", [dy, log_prob, labels], attrs, domain=MS)


@pytest.mark.parametrize("shape,indices,axis", [
    ((5, 7), [0, 3, 0, 0, 4, 3], 0),                 # repeated indices
    ((4, 6, 3), [[5, 0], [5, -1]], 1),               # 2-D indices, negative index, middle axis
    ((3, 1100), [2, 2, 0], 0),                       # rows longer than one block
    ((2, 3, 9), [8, 8, 1], -1),                      # last axis: inner size 1
])
def test_gather_grad(shape, indices, axis):
    indices = np.array(indices, dtype=np.int64)
    a = axis % len(shape)
    dy = rand(*(shape[:a] + indices.shape + shape[a + 1:]))
    K.op_test("GatherGrad", [np.array(shape, np.int64), indices, dy], {"axis": axis}, domain=MS)


def test_dropout_and_grad():
    x = rand(40, 33)
    ratio, train = np.array(0.3, np.float32), np.array(True)
    K.op_test("Dropout", [x, ratio, train], {"seed": 7})
    K.op_test("Dropout", [x, ratio])  # inference mode: identity, mask all true
    y, mask = K.run("Dropout", x, ratio, train, seed=7)
    K.op_test("DropoutGrad", [rand(40, 33, seed=1), mask, ratio], domain=MS)
    K.op_test("DropoutGrad", [rand(40, 33, seed=1), mask], domain=MS)  # default ratio 0.5


def test_dropout_is_reproducible_by_seed_and_drops_the_ratio():
    x, ratio, train = np.ones((64, 65), np.float32), np.array(0.25, np.float32), np.array(True)
    y1, m1 = K.run("Dropout", x, ratio, train, seed=11)
    y2, m2 = K.run("Dropout", x, ratio, train, seed=11)
    _, m3 = K.run("Dropout", x, ratio, train, seed=12)
    assert np.array_equal(m1, m2) and np.array_equal(y1, y2)
    assert not np.array_equal(m1, m3)
    assert abs(m1.mean() - 0.75) < 0.03
    assert np.allclose(y1[m1], 1 / 0.75) and (y1[~m1] == 0).all()


@pytest.mark.parametrize("shape,bias_shape,axis,inner", [
    ((2, 3, 4, 5), (4, 5), 3, 0), ((2, 3, 4, 5), (2, 1, 1, 5), 3, 1),
    ((2, 3, 4, 37), (1, 3, 4, 37), 3, 0), ((2, 3, 4, 5), (3, 4, 5), 2, 0)])
def test_bias_softmax_against_reference_and_torch(shape, bias_shape, axis, inner):
    x, bias = rand(*shape), rand(*bias_shape, seed=1)
    result = K.op_test("BiasSoftmax", [x, bias], {"axis": axis, "is_inner_broadcast": inner},
                       domain=MS)
    assert "no CPU kernel in ORT" in repr(result)  # ORT has BiasSoftmax on CUDA only
    y = K.run("BiasSoftmax", x, bias, axis=axis, is_inner_broadcast=inner, domain=MS)[0]
    z = torch.tensor(x + bias).flatten(axis)
    expected = torch.softmax(z, dim=-1).reshape(shape)
    np.testing.assert_allclose(y, expected.numpy(), atol=1e-6)


# -- gradients against torch autograd ---------------------------------------------------
def test_gelu_grad_equals_torch():
    x, dy = rand(3, 130), rand(3, 130, seed=1)
    xt = t(x, grad=True)
    torch.nn.functional.gelu(xt).backward(t(dy))
    np.testing.assert_allclose(K.run("GeluGrad", dy, x, domain=MS)[0], xt.grad.numpy(), atol=1e-5)


def test_softmax_grad_equals_torch():
    x, dy = rand(4, 6, 5), rand(4, 6, 5, seed=1)
    xt = t(x, grad=True)
    torch.softmax(xt, dim=1).backward(t(dy))
    y = K.run("Softmax", x, axis=1)[0]
    np.testing.assert_allclose(K.run("SoftmaxGrad_13", dy, y, axis=1, domain=MS)[0],
                               xt.grad.numpy(), atol=1e-5)


def test_layer_norm_grad_equals_torch():
    x, dy, scale, bias = rand(9, 37), rand(9, 37, seed=1), rand(37, seed=2), rand(37, seed=3)
    xt, st, bt = t(x, True), t(scale, True), t(bias, True)
    torch.nn.functional.layer_norm(xt, (37,), st, bt, eps=1e-5).backward(t(dy))
    _, mean, inv_std = K.run("LayerNormalization", x, scale, bias)
    dx, dscale, dbias = K.run("LayerNormalizationGrad", dy, x, scale, mean, inv_std, domain=MS)
    for ours, theirs in ((dx, xt), (dscale, st), (dbias, bt)):
        np.testing.assert_allclose(ours, theirs.grad.numpy(), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("reduction", ["mean", "sum"])
def test_softmax_cross_entropy_grad_equals_torch(reduction):
    scores, weights = rand(7, 5), np.random.default_rng(1).random(5).astype(np.float32)
    labels = np.array([0, 4, -1, 2, 2, 1, -1])
    st = t(scores, True)
    loss = torch.nn.functional.cross_entropy(st, torch.tensor(labels), weight=t(weights),
                                             ignore_index=-1, reduction=reduction)
    loss.backward()
    out, log_prob = K.run("SoftmaxCrossEntropyLoss", scores, labels, weights,
                          reduction=reduction, ignore_index=-1)
    assert abs(float(out) - loss.item()) < 1e-5
    grad = K.run("SoftmaxCrossEntropyLossGrad", np.array(1.0, np.float32), log_prob, labels,
                 weights, reduction=reduction, ignore_index=-1, domain=MS)[0]
    np.testing.assert_allclose(grad, st.grad.numpy(), atol=1e-6)


def test_gather_grad_equals_torch_embedding_backward():
    table, ids, dy = rand(10, 6), np.array([[1, 1, 9], [0, 1, 3]]), rand(2, 3, 6, seed=1)
    tt = t(table, True)
    torch.nn.functional.embedding(torch.tensor(ids), tt).backward(t(dy))
    dx = K.run("GatherGrad", np.array([10, 6]), ids, dy, domain=MS)[0]
    np.testing.assert_allclose(dx, tt.grad.numpy(), atol=1e-6)


def test_dropout_grad_equals_torch():
    x, dy = rand(5, 40), rand(5, 40, seed=1)
    y, mask = K.run("Dropout", x, np.array(0.4, np.float32), np.array(True), seed=3)
    xt = t(x, True)
    (xt * t(mask.astype(np.float32)) / 0.6).backward(t(dy))
    dx = K.run("DropoutGrad", dy, mask, np.array(0.4, np.float32), domain=MS)[0]
    np.testing.assert_allclose(dx, xt.grad.numpy(), atol=1e-6)


@gpu_only
@pytest.mark.parametrize("op,shape", [("Softmax", (4096, 4096)), ("LayerNormalization", (8192, 2048))])
def test_large_sizes_on_gpu(op, shape):
    x = rand(*shape)
    inputs = [x] if op == "Softmax" else [x, rand(shape[-1], seed=1)]
    ours = K.run(op, *inputs)[0]
    np.testing.assert_allclose(ours, K.run_reference(op, *inputs)[0], atol=1e-4)


# -- bad input, registry, environment ---------------------------------------------------
@pytest.mark.parametrize("call,message", [
    (lambda: K.run("GeluGrad", rand(3), domain=MS), "GeluGrad: takes 2 inputs (dY, X), got 1"),
    (lambda: K.run("GeluGrad", rand(3), rand(3).astype(np.float64), domain=MS),
     "input 1 'X' must be float32, got float64"),
    (lambda: K.run("GeluGrad", rand(3), rand(4), domain=MS), "must have the same shape"),
    (lambda: K.run("BiasGelu", rand(3, 4), rand(2, 4), domain=MS), "input 1 'B' must have rank 1"),
    (lambda: K.run("Dropout", rand(3), np.array(1.0, np.float32)), "ratio' must be in [0, 1)"),
    (lambda: K.run("Softmax", rand(3, 4), axis=2), "axis=2 is out of range for rank 2"),
    (lambda: K.run("SoftmaxCrossEntropyLoss", rand(3, 4), np.array([0, 4, 1])),
     "holds [4] outside [0, 4)"),
    (lambda: K.run("SoftmaxCrossEntropyLoss", rand(3, 4), np.array([0, 1])),
     "input 1 'labels' must have shape (3,)"),
    (lambda: K.run("GatherGrad", np.array([3, 2]), np.array([3]), rand(1, 2), domain=MS),
     "outside [-3, 3)"),
    (lambda: K.run("LayerNormalization", rand(3, 4), rand(5)), "input 1 'Scale' must hold"),
    (lambda: K.run("ReduceSum", rand(3, 4), np.array([1, -1])), "repeats an axis"),
    (lambda: K.run("Softmax", rand(3), axes=1), "Softmax has no attribute 'axes'"),
    (lambda: K.run("GeluGrad", rand(3), rand(3)), "did you mean com.microsoft:GeluGrad?"),
])
def test_bad_input_names_the_op_and_the_input(call, message):
    with pytest.raises(OrtlabError) as info:
        call()
    assert message in str(info.value)
    assert isinstance(info.value, OrtlabError)


def test_op_test_reports_a_wrong_kernel_with_its_worst_element():
    original = K.get_kernel("GeluGrad", MS)

    class WrongGeluGrad(original):
        def compute(self, dy, x):
            (dx,) = super().compute(dy, x)
            dx.view(-1)[-1] += 1.0  # wrong in the tail only
            return (dx,)

    with K.KERNELS.using(("GeluGrad", MS), WrongGeluGrad), pytest.raises(OpTestFailure) as info:
        K.op_test("GeluGrad", [rand(1030), rand(1030, seed=1)], domain=MS)
    assert K.get_kernel("GeluGrad", MS) is original
    message = str(info.value)
    assert "com.microsoft:GeluGrad on inputs of shapes (1030,), (1030,)" in message
    assert "ORT CPU" in message and "worst at index (1029,)" in message


def test_registry_rejects_duplicates_and_lists_what_it_has():
    class Extra(K.Kernel):
        op_type, domain = "Relu", ""
        inputs, outputs = (K.Arg("X"),), (K.Arg("Y"),)

    K.register_kernel(Extra)
    try:
        with pytest.raises(OrtlabError, match="already registered"):
            K.register_kernel(type("Other", (Extra,), {}))
        assert any(row["op"] == "Relu" for row in K.registered())
    finally:
        K.unregister_kernel("Relu")
    with pytest.raises(K.KernelNotFound, match="Registered: .*Softmax"):
        K.get_kernel("Relu")
    assert isinstance(K.KernelNotFound("x"), OrtlabError)


def test_the_numpy_side_loads_without_torch_or_triton_and_the_api_on_first_use():
    """ortlab.triton_kernels and its numpy references (which contrib_ops uses) load neither torch nor
    Triton; the public names load on first use, `launch` the function even when a tool module
    imported ortlab.triton_kernels.executor first."""
    import subprocess
    import sys

    code = ("import sys, ortlab.triton_kernels, ortlab.ops.contrib_ops\n"
            "print(sorted(m for m in ('torch', 'triton', 'ortlab.env') if m in sys.modules))\n"
            "from ortlab.walkthroughs import cuda_programming as programs\n"
            "from ortlab.triton_kernels import launch, registered\n"
            "print(callable(launch), len(registered()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split("\n")[:2] == ["[]", f"True {len(K.KERNELS)}"]


def test_launches_are_counted():
    inputs = _layer_norm_grad_inputs()
    with K.count_launches() as launches:
        K.run("LayerNormalizationGrad", *inputs, domain=MS)
    assert [name for name, _ in launches] == ["layer_norm_grad_dx_kernel", "column_sum_kernel",
                                              "column_sum_kernel"]
    assert launches[0][1] == (3,)  # 40 rows in groups of 16


def _layer_norm_grad_inputs():
    x, scale = rand(40, 8), rand(8, seed=1)
    _, mean, inv_std = K.run("LayerNormalization", x, scale)
    return rand(40, 8, seed=2), x, scale, mean, inv_std


def test_environment_chooses_the_interpreter_without_a_gpu():
    import os

    if torch.cuda.is_available():
        assert triton_mode() == "compiled (cuda)"
    else:
        assert os.environ["TRITON_INTERPRET"] == "1" and triton_mode() == "interpreter (cpu)"
        assert kernel_device() == "cpu"
    from ortlab.env import report
    assert report()["triton kernels"] == triton_mode()


# -- attribute types, ORT's errors, NaN -------------------------------------------------
@pytest.mark.parametrize("call,message", [
    (lambda: K.run("Softmax", rand(3, 4), axis="1"), "Softmax: attribute 'axis' must be int, got str '1'"),
    (lambda: K.run("Softmax", rand(3, 4), axis=1.5), "Softmax: attribute 'axis' must be int, got float 1.5"),
    (lambda: K.run("Softmax", rand(3, 4), axis=None), "Softmax: attribute 'axis' must be int, got NoneType"),
    (lambda: K.run("Softmax", rand(3, 4), axis=True), "got bool True (use 1 or 0)"),
    (lambda: K.run("LayerNormalization", rand(3, 4), rand(4), epsilon="1e-5"),
     "LayerNormalization: attribute 'epsilon' must be float, got str"),
    (lambda: K.run("SoftmaxCrossEntropyLoss", rand(3, 4), np.array([0, 1, 2]), ignore_index=1.5),
     "attribute 'ignore_index' must be int or None, got float 1.5"),
    (lambda: K.run("Softmax", rand(3, 4), axiss=1), "Softmax has no attribute 'axiss' (did you mean 'axis'?)"),
])
def test_attribute_types_are_checked_against_the_declaration(call, message):
    with pytest.raises(K.KernelInputError) as info:
        call()
    assert message in str(info.value)


def test_numpy_and_int_attribute_values_are_taken_as_onnx_would():
    x = rand(3, 4)
    np.testing.assert_array_equal(K.run("Softmax", x, axis=np.int64(0))[0], K.run("Softmax", x, axis=0)[0])
    scale = rand(4, seed=1)
    kernel = K.get_kernel("LayerNormalization")(epsilon=1)
    assert kernel.epsilon == 1.0 and isinstance(kernel.epsilon, float)
    K.op_test("LayerNormalization", [x, scale], {"epsilon": 1})  # an INT attribute would make ORT refuse


class _NegWithBadAttribute(K.Kernel):
    """Claims ORT has no CPU kernel, and carries an attribute ONNX's Neg does not have: ORT fails
    for that reason (INVALID_GRAPH), not for a missing kernel."""
    op_type, domain = "Neg", ""
    inputs, outputs = (K.Arg("X"),), (K.Arg("Y"),)
    attributes = {"flavour": 1}
    ort_cpu = False

    def reference(self, x):
        return (-x,)

    def compute(self, x):
        return (-x,)


def test_op_test_shows_orts_own_error_unless_it_is_a_missing_kernel():
    with K.KERNELS.using("Neg", _NegWithBadAttribute), \
            pytest.raises(OpTestFailure, match="ORT failed: .*Unrecognized attribute: flavour"):
        K.op_test("Neg", [rand(3)], {"flavour": 2})
    # a real missing kernel (BiasSoftmax has none on ORT's CPU EP) is still reported as such
    result = K.op_test("BiasSoftmax", [rand(2, 3), rand(2, 3, seed=1)], domain=MS,
                       providers=["CPUExecutionProvider"])
    assert "no CPU kernel in ORT (CUDA only)" in repr(result)


class _Log(K.Kernel):
    op_type, domain = "Log", ""
    inputs, outputs = (K.Arg("X"),), (K.Arg("Y"),)
    nan_at = None  # an index where compute writes a NaN of its own

    def reference(self, x):
        with np.errstate(invalid="ignore", divide="ignore"):
            return (np.log(x),)

    def compute(self, x):
        y = torch.log(x)
        if self.nan_at is not None:
            y.view(-1)[self.nan_at] = float("nan")
        return (y,)


def test_op_test_takes_nan_in_the_same_places_as_equal_and_nan_on_one_side_as_a_mismatch():
    x = np.array([1.0, -1.0, 0.0, 2.0, np.nan, np.inf], np.float32)  # log: 0, nan, -inf, .69, nan, inf
    with K.KERNELS.using("Log", _Log):
        assert K.op_test("Log", [x]).ok
    with K.KERNELS.using("Log", type("_LogWrong", (_Log,), {"nan_at": 3})), \
            pytest.raises(OpTestFailure, match=r"worst at index \(3,\): got nan, expected 0\.69"):
        K.op_test("Log", [x])
    assert "Log" not in K.KERNELS


def test_a_kernel_launches_from_a_module_that_holds_numpy_arrays(tmp_path):
    """A notebook holds numpy arrays at top level; Triton 3.2's interpreter compares every global of a kernel's
    module with `in [tl, tl.core]`, which an array turns into numpy's "truth value ... is ambiguous". launch
    runs such a kernel as it would run anywhere else (and the copy it launches leaves the module untouched)."""
    import importlib.util

    (tmp_path / "nb_like.py").write_text(
        "import numpy as np\nimport triton\nimport triton.language as tl\n"
        "weights = np.arange(6.0)\n"
        "@triton.jit\n"
        "def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):\n"
        "    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)\n"
        "    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) * 2, mask=i < n)\n")
    spec = importlib.util.spec_from_file_location("nb_like", tmp_path / "nb_like.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from ortlab.triton_kernels.executor import to_device

    x = to_device(np.arange(10, dtype=np.float32))
    y = torch.zeros_like(x)
    with K.count_launches() as launches:
        K.launch(module.double, 1, x, y, 10, BLOCK=16)
    np.testing.assert_array_equal(y.cpu().numpy(), np.arange(10, dtype=np.float32) * 2)
    assert launches == [("double", (1,))] and module.weights.shape == (6,)

"""ortlab.cuda.kernels: ORT's training kernels in CUDA C++, run on the CPU runner and checked
against ORT 1.19.2's own CPU kernels (ortlab.session.run_node builds a one-node model and runs it
in ORT), and compiled by NVRTC + ptxas for sm_80 and sm_90 without spills.

Shapes have tails (columns not a multiple of the block) and grids smaller than the rows, so the
grid-stride loops run more than once. Dropout's forward is checked through its invariants only:
ORT draws its mask with curand's Philox generator, which no CPU kernel reproduces here.
"""
import numpy as np
import pytest

import ortlab.cuda as cuda
from ortlab.cuda import kernels
from ortlab.errors import OrtlabError
from ortlab.session import run_node

ROWS, COLS, BLOCK, GRID = 37, 300, 128, 8


@pytest.fixture(scope="module")
def built():
    """Every registered source's kernels, one g++ build per source."""
    return {name: cuda.cpu_kernels(kernels.source(name), entry.kernels) for name, entry in kernels.SOURCES.items()}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", sorted(kernels.SOURCES))
def test_each_source_compiles_for_the_gpu_without_spills(name, arch):
    result = cuda.compile(kernels.source(name), arch)
    assert set(result.kernels) == set(kernels.SOURCES[name].kernels)
    for k in result.kernels.values():
        assert (k.spills, k.local_bytes) == (0, 0), k
        assert k.registers <= 64, k


def rng(seed=0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("rows, cols", [(ROWS, COLS), (5, 1), (3, 1000), (1, 33)])
def test_reduce_sum_last_axis_matches_ort(built, rows, cols):
    x = rng().standard_normal((rows, cols)).astype(np.float32)
    y = np.zeros(rows, np.float32)
    cuda.launch(built["reduce_sum"]["reduce_sum_last_axis"], GRID, BLOCK, x, y, rows, cols)
    (expected,) = run_node("ReduceSum", [x, np.array([-1], np.int64)], {"keepdims": 0})
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_dropout_grad_with_a_given_mask_matches_ort(built):
    """ORT's CUDA kernel (dropout_grad_impl.cu) multiplies by scale = 1 / (1 - ratio): equal to that
    formula in numpy bit for bit; ORT's CPU kernel divides by 1 - ratio, so within one rounding of
    it; ratio 0 copies dy in both (the mask is not read)."""
    dy = rng().standard_normal((ROWS, COLS)).astype(np.float32)
    mask = rng(1).random((ROWS, COLS)) < 0.7
    for ratio in (0.3, 0.0, 0.9):
        dx = np.zeros_like(dy)
        cuda.launch(built["dropout"]["dropout_grad"], GRID, BLOCK, dy, mask, dx, ratio, dy.size)
        (expected,) = run_node("DropoutGrad", [dy, mask, np.array(ratio, np.float32), np.array(True)],
                               domain="com.microsoft")
        if ratio == 0:
            np.testing.assert_array_equal(dx, dy)
            np.testing.assert_array_equal(expected, dy)
            continue
        scale = np.float32(1) / (np.float32(1) - np.float32(ratio))
        np.testing.assert_array_equal(dx, dy * mask.astype(np.float32) * scale)
        np.testing.assert_allclose(dx, expected, rtol=2 ** -23, atol=0)


def test_dropout_forward_invariants(built):
    """ORT's mask comes from curand's Philox; ours from a hash: compare what any correct Dropout
    must satisfy. Kept elements are x / (1 - ratio), dropped ones 0, the kept fraction is 1 - ratio
    within 5 binomial standard deviations, ratio 0 keeps all, and one seed gives one mask."""
    x = rng().standard_normal(20011).astype(np.float32)
    kernel = built["dropout"]["dropout"]
    for ratio in (0.1, 0.5, 0.8):
        y, mask = np.zeros_like(x), np.zeros(x.size, np.bool_)
        cuda.launch(kernel, GRID, BLOCK, x, y, mask, ratio, x.size, 1234)
        scale = np.float32(1) / (np.float32(1) - np.float32(ratio))
        np.testing.assert_array_equal(y[mask], x[mask] * scale)
        assert not y[~mask].any()
        sd = np.sqrt(ratio * (1 - ratio) / x.size)
        assert abs(mask.mean() - (1 - ratio)) < 5 * sd
        again_y, again_mask = np.zeros_like(x), np.zeros(x.size, np.bool_)
        cuda.launch(kernel, 3, 64, x, again_y, again_mask, ratio, x.size, 1234)  # another grid
        np.testing.assert_array_equal(again_mask, mask)
    y, mask = np.zeros_like(x), np.zeros(x.size, np.bool_)
    cuda.launch(kernel, GRID, BLOCK, x, y, mask, 0.0, x.size, 7)
    assert mask.all() and np.array_equal(y, x)
    # ORT's own Dropout obeys the same invariants (its y and mask, training mode)
    ort_y, ort_mask = run_node("Dropout", [x, np.array(0.5, np.float32), np.array(True)], outputs=2)
    np.testing.assert_array_equal(ort_y[ort_mask], x[ort_mask] * np.float32(2))
    assert not ort_y[~ort_mask].any()


def layer_norm(built, x, scale, bias, epsilon=1e-5):
    rows, cols = x.shape
    y, mean, inv_std = np.zeros_like(x), np.zeros(rows, np.float32), np.zeros(rows, np.float32)
    cuda.launch(built["layer_norm"]["layer_norm"], GRID, BLOCK, x, scale, bias, y, mean, inv_std, rows, cols,
                epsilon)
    return y, mean, inv_std


@pytest.mark.parametrize("rows, cols", [(ROWS, COLS), (4, 1), (3, 1000), (9, 33)])
def test_layer_norm_forward_matches_ort(built, rows, cols):
    x = (rng().standard_normal((rows, cols)) * 3 + 5).astype(np.float32)  # a mean far from 0
    scale = rng(1).standard_normal(cols).astype(np.float32)
    bias = rng(2).standard_normal(cols).astype(np.float32)
    y, mean, inv_std = layer_norm(built, x, scale, bias)
    ort_y, ort_mean, ort_inv_std = run_node("LayerNormalization", [x, scale, bias], {"axis": -1, "epsilon": 1e-5},
                                            outputs=3)
    np.testing.assert_allclose(mean, ort_mean.reshape(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(inv_std, ort_inv_std.reshape(-1), rtol=1e-4)
    np.testing.assert_allclose(y, ort_y, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("rows, cols", [(ROWS, COLS), (3, 1000), (9, 33)])
def test_layer_norm_grad_matches_ort(built, rows, cols):
    x = (rng().standard_normal((rows, cols)) * 2 + 1).astype(np.float32)
    scale = rng(1).standard_normal(cols).astype(np.float32)
    dy = rng(3).standard_normal((rows, cols)).astype(np.float32)
    _, mean, inv_std = layer_norm(built, x, scale, np.zeros(cols, np.float32))
    dx, dscale, dbias = np.zeros_like(x), np.zeros(cols, np.float32), np.zeros(cols, np.float32)
    grads = built["layer_norm"]
    cuda.launch(grads["layer_norm_grad_input"], GRID, BLOCK, dy, x, scale, mean, inv_std, dx, rows, cols)
    cuda.launch(grads["layer_norm_grad_scale_bias"], 2, 64, dy, x, mean, inv_std, dscale, dbias, rows, cols)
    expected = run_node("LayerNormalizationGrad",
                        [dy, x, scale, mean.reshape(rows, 1), inv_std.reshape(rows, 1)], {"axis": -1},
                        domain="com.microsoft", outputs=3)
    for got, ort in zip((dx, dscale, dbias), expected):
        np.testing.assert_allclose(got, ort, rtol=1e-4, atol=1e-4)


def cross_entropy(built, logits, labels, ignore_index):
    n, classes = logits.shape
    sce = built["softmax_cross_entropy"]
    log_prob = np.zeros_like(logits)
    cuda.launch(sce["log_softmax_rows"], GRID, BLOCK, logits, log_prob, n, classes)
    term, weight = np.zeros(n, np.float32), np.zeros(n, np.float32)
    cuda.launch(sce["cross_entropy_terms"], 2, 32, log_prob, labels, term, weight, n, classes, ignore_index)
    loss, weight_sum = np.zeros(1, np.float32), np.zeros(1, np.float32)
    cuda.launch(sce["cross_entropy_mean"], 1, 96, term, weight, loss, weight_sum, n)
    return loss, log_prob, weight_sum


@pytest.mark.parametrize("n, classes, ignore_index", [(ROWS, COLS, -100), (ROWS, 10, 3), (50, 1000, 0)])
def test_softmax_cross_entropy_and_grad_match_ort(built, n, classes, ignore_index):
    logits = (rng().standard_normal((n, classes)) * 4).astype(np.float32)
    labels = rng(1).integers(0, classes, size=n).astype(np.int64)
    labels[::5] = ignore_index if ignore_index >= 0 else labels[::5]
    loss, log_prob, weight_sum = cross_entropy(built, logits, labels, ignore_index)
    attributes = {"reduction": "mean", "ignore_index": ignore_index}
    ort_loss, ort_log_prob = run_node("SoftmaxCrossEntropyLoss", [logits, labels], attributes, outputs=2)
    np.testing.assert_allclose(log_prob, ort_log_prob, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(loss[0], ort_loss, rtol=1e-5)
    dy = np.array(0.7, np.float32)
    dlogits = np.zeros_like(logits)
    cuda.launch(built["softmax_cross_entropy"]["cross_entropy_grad"], GRID, BLOCK, dy.reshape(1), log_prob, labels,
                weight_sum, dlogits, n, classes, ignore_index)
    (expected,) = run_node("SoftmaxCrossEntropyLossGrad", [dy, ort_log_prob, labels], attributes,
                           domain="com.microsoft")
    np.testing.assert_allclose(dlogits, expected, rtol=1e-5, atol=1e-7)


def test_a_label_out_of_range_is_caught_by_the_runner(built):
    logits = rng().standard_normal((4, 10)).astype(np.float32)
    with pytest.raises(OrtlabError, match=r"log_prob\[40\] is out of bounds \(log_prob has 40 elements\)"):
        cross_entropy(built, logits, np.array([1, 2, 3, 10], np.int64), -100)


def gather_grad(built, shape, axis, indices, dy, path):
    outer, gather_dim = int(np.prod(shape[:axis])), shape[axis]
    inner, n = int(np.prod(shape[axis + 1:])), indices.size
    dx = np.zeros(shape, np.float32)
    g = built["gather_grad"]
    flat = indices.reshape(-1)
    if path == "atomic":
        cuda.launch(g["gather_grad_atomic"], GRID, BLOCK, dy, flat, dx, outer, n, gather_dim, inner)
    else:
        sorted_index, sorted_position = np.zeros(n, np.int64), np.zeros(n, np.int64)
        cuda.launch(g["gather_grad_sort"], 2, 64, flat, sorted_index, sorted_position, n, gather_dim)
        np.testing.assert_array_equal(sorted_index, np.sort(flat % gather_dim, kind="stable"))
        cuda.launch(g["gather_grad_sorted"], GRID, BLOCK, dy, sorted_index, sorted_position, dx, outer, n,
                    gather_dim, inner)
    return dx


@pytest.mark.parametrize("path", ["atomic", "sorted"])
@pytest.mark.parametrize("shape, axis, indices_shape", [((7, 5, 3), 1, (4, 3)), ((50, 33), 0, (130,)),
                                                         ((2, 3, 11), 2, (6,))])
def test_gather_grad_matches_ort(built, path, shape, axis, indices_shape):
    indices = rng().integers(-shape[axis], shape[axis], size=indices_shape).astype(np.int64)  # repeats, negatives
    dy_shape = shape[:axis] + indices_shape + shape[axis + 1:]
    dy = rng(1).standard_normal(dy_shape).astype(np.float32)
    dx = gather_grad(built, shape, axis, indices, dy, path)
    (expected,) = run_node("GatherGrad", [np.array(shape, np.int64), indices, dy], {"axis": axis},
                           domain="com.microsoft")
    if path == "sorted":  # sums each element's terms in position order, as ORT's CPU kernel does
        np.testing.assert_array_equal(dx, expected)
    else:
        np.testing.assert_allclose(dx, expected, rtol=1e-5, atol=1e-5)


def test_gather_grads_atomic_path_depends_on_the_order_and_the_sorted_path_does_not(built):
    # four terms into one element: (1e8 + 1) - 1e8 + 1 = 1 in thread order, 0 in reverse order
    indices = np.zeros(4, np.int64)
    dy = np.array([[1e8], [1], [-1e8], [1]], np.float32)
    g = built["gather_grad"]
    args = (dy, indices, np.zeros((1, 1), np.float32), 1, 4, 1, 1)
    assert cuda.schedule_differences(g["gather_grad_atomic"], 1, 32, *args) == ["dx"]
    sorted_index, sorted_position = np.zeros(4, np.int64), np.arange(4, dtype=np.int64)
    assert cuda.schedule_differences(g["gather_grad_sorted"], 1, 32, dy, sorted_index, sorted_position,
                                     np.zeros((1, 1), np.float32), 1, 4, 1, 1) == []


def test_the_block_reductions_have_no_race(built):
    x = rng().standard_normal((ROWS, COLS)).astype(np.float32)
    assert cuda.schedule_differences(built["reduce_sum"]["reduce_sum_last_axis"], GRID, BLOCK, x,
                                     np.zeros(ROWS, np.float32), ROWS, COLS) == []
    args = (x, np.ones(COLS, np.float32), np.zeros(COLS, np.float32), np.zeros_like(x), np.zeros(ROWS, np.float32),
            np.zeros(ROWS, np.float32), ROWS, COLS, 1e-5)
    assert cuda.schedule_differences(built["layer_norm"]["layer_norm"], GRID, BLOCK, *args) == []


def test_registry_refuses_unknown_and_duplicate_sources():
    with pytest.raises(OrtlabError, match="no CUDA source named 'softmax'"):
        kernels.source("softmax")
    with pytest.raises(OrtlabError, match="already registered"):
        kernels.register_source(kernels.SOURCES["dropout"])


def test_a_block_that_is_not_whole_warps_is_caught_at_the_shuffle(built):
    """The block reductions assume whole warps (common.cuh); a block of 48 threads makes lane 0 of
    the second warp read lane 16, which that block does not have: undefined on a GPU, an error here."""
    x = rng().standard_normal((5, 77)).astype(np.float32)
    kernel = built["reduce_sum"]["reduce_sum_last_axis"]
    with pytest.raises(OrtlabError, match=r"thread \(32, 0, 0\).*lane 0 reads lane 16, which is not a thread"):
        cuda.launch(kernel, 3, 48, x, np.zeros(5, np.float32), 5, 77)
    for block in (32, 96, 1024):
        y = np.zeros(5, np.float32)
        cuda.launch(kernel, 3, block, x, y, 5, 77)
        np.testing.assert_allclose(y, x.sum(axis=1), rtol=1e-5, atol=1e-5)


def test_each_cu_file_is_registered_once_by_the_module_beside_it_with_the_ops_that_launch_it():
    from ortlab.cuda.kernels import registration

    folder = registration.FOLDER
    cu_files = {p.name for p in folder.glob("*.cu")}
    assert {entry.file for entry in kernels.SOURCES.values()} == cu_files
    for name, entry in kernels.SOURCES.items():
        assert entry.file == f"{name}.cu" and (folder / f"{name}.py").is_file()
        text = (folder / f"{name}.py").read_text()
        assert text.count("register_source(") == 1, name
    for key, op in kernels.OPS.items():  # an op's recipe lives in its source's module, nowhere else
        assert op.source in kernels.SOURCES and op.run.__module__ == f"ortlab.cuda.kernels.{op.source}", key
    with pytest.raises(OrtlabError, match="register its CUDA source 'nowhere' first"):
        registration.register_cuda_op("Nowhere", "", registration.CudaSource("nowhere", "x.cu", (), ()),
                                      check=lambda spec: None)

"""Level 3 helpers: naive vs fused kernels, multi-tensor apply, the roofline figures and the
GPU benchmark script (run here at tiny sizes under the interpreter)."""
import numpy as np
import pytest
import torch

import ortlab.triton_kernels as K
from ortlab.env import kernel_device
from ortlab.benchmarks import kernels as bench
from ortlab.triton_kernels import optimization as opt, roofline
from ortlab.triton_kernels.ops.layer_norm import LayerNormalization
from ortlab.triton_kernels.ops.softmax import row_softmax

H100 = roofline.DATASHEET["H100 SXM (datasheet)"]


def test_naive_and_fused_softmax_agree_and_differ_in_launches():
    x = torch.randn(19, 77)
    with K.count_launches() as naive:
        y_naive = opt.naive_softmax(x)
    with K.count_launches() as fused:
        y_fused = row_softmax(x)
    torch.testing.assert_close(y_naive, torch.softmax(x, -1))
    torch.testing.assert_close(y_fused, torch.softmax(x, -1))
    assert len(naive) == 3 and len(fused) == 1


def test_naive_and_fused_layer_norm_agree():
    x, s, b = torch.randn(21, 50), torch.randn(50), torch.randn(50)
    expected = torch.nn.functional.layer_norm(x, (50,), s, b)
    torch.testing.assert_close(opt.naive_layer_norm(x, s, b), expected, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(LayerNormalization().compute(x, s, b)[0], expected, atol=1e-5, rtol=1e-5)


def test_fusion_halves_the_traffic():
    for op in ("softmax", "layernorm"):
        naive, fused = opt.traffic(1024, 1024, "naive", op), opt.traffic(1024, 1024, "fused", op)
        assert 1.9 < naive / fused < 2.1


def test_multi_tensor_sgd_is_one_launch_and_equals_torch():
    shapes = [(30, 20), (20,), (7, 3, 5), (1,)]
    per_tensor, multi = opt.FlatParameters(shapes), opt.FlatParameters(shapes)
    reference = [p.clone().requires_grad_(True) for p in per_tensor.views("param")]
    sgd = torch.optim.SGD(reference, lr=0.1, momentum=0.9)
    for step in range(3):
        for p, g in zip(reference, per_tensor.views("grad")):
            p.grad = g.clone()
        sgd.step()
        with K.count_launches() as loop:
            opt.sgd_step_per_tensor(per_tensor)
        with K.count_launches() as one:
            opt.sgd_step_multi_tensor(multi)
    assert len(loop) == len(shapes) and len(one) == 1
    for ours, other, theirs in zip(multi.views("param"), per_tensor.views("param"), reference):
        torch.testing.assert_close(ours, theirs.detach())
        torch.testing.assert_close(other, theirs.detach())


def test_cost_counts_bytes_from_the_shapes():
    x = np.zeros((64, 256), np.float32)
    c = roofline.cost("Softmax", [x])
    assert c.bytes == 2 * 64 * 256 * 4  # read x, write y
    scale = np.ones(256, np.float32)
    ln = roofline.cost("LayerNormalization", [x, scale, scale])
    assert ln.bytes == (2 * 64 * 256 + 2 * 256 + 2 * 64) * 4  # x, y, scale, bias, mean, rstd
    row = roofline.cost_table([c], H100)[0]
    assert row["bound"] == "memory"  # < 1 FLOP/byte, far below the ridge (20 FLOP/byte)
    assert row["floor (us)"] == pytest.approx(1e6 * c.bytes / H100["bandwidth"], abs=0.01)


def test_roofline_plot_and_benchmark_on_this_machine():
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    ax = roofline.roofline_plot([roofline.cost("Softmax", [x])], H100)
    assert ax.get_xlabel().startswith("arithmetic intensity")
    result = roofline.benchmark("Softmax", [x])
    assert result["median ms"] > 0
    if kernel_device() == "cpu":
        assert result["timed on"].startswith("CPU interpreter")


def test_gpu_bench_script_runs_here(capsys):
    report = bench.main(["--small"])
    assert all(row["ok"] for row in report["correctness"])
    assert [row["op"] for row in report["correctness"]] == [cls.op_type for cls in K.KERNELS.values()]
    assert {row["kernel"] for row in report["bandwidth"]} >= {"Softmax (ortlab)", "LayerNorm (torch)"}
    assert '"correctness"' in capsys.readouterr().out


def test_gpu_only_helpers_have_a_labelled_cpu_path():
    rows = roofline.copy_costs(1 << 20)
    if kernel_device() == "cpu":
        assert [r["copy"] for r in rows] == ["host -> host (no GPU here)"]
        with pytest.raises(RuntimeError, match="autotune under the interpreter fails: .*on CPU use block_sweep"):
            opt.autotune_gelu_grad(1000)
    else:
        assert {r["copy"] for r in rows} >= {"host (pinned) -> GPU", "GPU -> GPU"}
        assert opt.autotune_gelu_grad(1 << 20)["configs tried"] == 6


def test_block_sweep_counts_programs_and_masked_lanes():
    rows = opt.block_sweep(1000, [128, 1024])
    assert rows[0]["programs"] == 8 and rows[0]["masked lanes"] == 24   # 8 * 128 - 1000
    assert rows[1]["programs"] == 1 and rows[1]["masked lanes"] == 24


def test_measured_rates_are_labelled_not_zero_on_cpu():
    # on CPU (Triton's interpreter) a GB/s from Python's time would print 0.0: labelled instead
    assert roofline.rates(1e9, 2e9, 1.0, on_gpu=False) == {"GB/s": roofline.NA_ON_CPU, "GFLOP/s": roofline.NA_ON_CPU}
    assert roofline.rates(1e9, 2e9, 1.0, on_gpu=True) == {"GB/s": 1000.0, "GFLOP/s": 2000.0}
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    row = roofline.benchmark("Softmax", [x])
    assert row["MB moved"] == round(roofline.cost("Softmax", [x]).bytes / 1e6, 3) and row["MFLOP"] > 0
    if kernel_device() == "cpu":
        assert row["GB/s"] == row["GFLOP/s"] == "n/a on CPU (interpreter)"
        assert row["floor on H100 (us, datasheet)"] == round(roofline.cost("Softmax", [x]).floor_us(H100), 3)
    else:
        assert isinstance(row["GB/s"], float) and row["GB/s"] > 0


def test_fusion_timings_label_cpu_rates_and_give_analytic_bytes_and_floor():
    rows = opt.fusion_timings((4, 32), H100, "H100 datasheet")
    assert [r["kernel"] for r in rows] == ["softmax naive", "softmax fused", "softmax torch",
                                           "layernorm naive", "layernorm fused", "layernorm torch"]
    for r in rows:
        version, op = r["kernel"].split()[1], r["kernel"].split()[0]
        moved = opt.traffic(4, 32, "naive" if version == "naive" else "fused", op)
        assert r["MB moved"] == round(moved / 1e6, 3) and r["median ms"] > 0
        assert r["floor (us, H100 datasheet)"] == round(1e6 * moved / H100["bandwidth"], 3)
        if kernel_device() == "cpu":
            assert r["GB/s"] == r["% of peak"] == roofline.NA_ON_CPU
            assert r["timed on"].startswith("CPU")
        else:
            assert r["GB/s"] > 0 and r["timed on"] == "GPU (CUDA events)"


def test_bench_labels_cpu_bandwidth():
    rows = bench.bandwidth_rows([(4, 32)], H100["bandwidth"])
    assert len(rows) == 4
    if kernel_device() == "cpu":
        assert {(r["GB/s"], r["% of copy peak"]) for r in rows} == {(roofline.NA_ON_CPU, roofline.NA_ON_CPU)}


def test_bandwidth_rates_on_a_gpu_and_on_cpu():
    from ortlab.triton_kernels.roofline import NA_ON_CPU, bandwidth_rates
    # 2 GB in 1 ms is 2000 GB/s; against a 4 TB/s peak that is 50%
    assert bandwidth_rates(2e9, 1.0, 4e12, True) == {"GB/s": 2000.0, "% of peak": 50.0}
    assert bandwidth_rates(2e9, 1.0, 4e12, False, "% of copy peak") == {"GB/s": NA_ON_CPU, "% of copy peak": NA_ON_CPU}

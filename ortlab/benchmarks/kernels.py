"""`python -m ortlab.benchmarks.kernels`: the GPU check of ortlab's kernels, in one call.

On a GPU: every registered kernel against its numpy reference on its example at moderate sizes
(4096 rows of 257: Kernel.example; random ones, Dropout, through their invariant), then LayerNorm and
softmax forward at large sizes timed with CUDA events and compared with this GPU's measured
copy bandwidth (the goal: at least 80% of it) and with torch's own kernels. Needs torch, Triton,
numpy and onnx (the registry's op keys), not onnxruntime, so it runs on a GPU image without the
training build.
On CPU (`--small` is implied) it runs the same steps at tiny sizes under the interpreter, so the
script itself is tested by CI; its timings are then not GPU figures.
"""
import argparse
import json

import numpy as np
import torch

from ortlab.env import kernel_device, triton_mode
from ortlab.triton_kernels import KERNELS, run, run_reference
from ortlab.triton_kernels.ops.layer_norm import LayerNormalization
from ortlab.triton_kernels.ops.softmax import row_softmax
from ortlab.triton_kernels.roofline import DATASHEET, bandwidth_rates, cuda_time_ms, measure_peaks, wall_time_ms

COLS = 257  # one past a power of two: every row-wise kernel has a masked tail


def check(kernel_cls, rows, rng):
    """One registered kernel on its example: the largest |difference| from its numpy reference
    (a random kernel: whether its invariant holds)."""
    inputs, attributes = kernel_cls.example(rng, rows=rows, cols=COLS)
    op, call = kernel_cls.op_type, {"domain": kernel_cls.domain, **attributes}
    ours = run(op, *inputs, **call)
    if kernel_cls.random:
        problems = kernel_cls(**attributes).invariant(inputs, ours)
        return {"max abs diff vs numpy": "; ".join(problems) or "random: invariant holds", "ok": not problems}
    reference = run_reference(op, *inputs, **call)
    worst = max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(ours, reference))
    return {"max abs diff vs numpy": worst, "ok": worst < 1e-3}


def check_all(rows):
    """Every registered kernel, checked on `rows` x COLS examples."""
    rng = np.random.default_rng(0)
    return [{"op": cls.op_type, **check(cls, rows, rng)} for cls in KERNELS.values()]


def time_fn(fn):
    return cuda_time_ms(fn) if kernel_device() == "cuda" else wall_time_ms(fn, warmup=0, repeat=1)


def bandwidth_rows(shapes, peak):
    rows = []
    device = kernel_device()
    for rows_, cols in shapes:
        x = torch.randn(rows_, cols, device=device)
        scale, bias = torch.randn(cols, device=device), torch.randn(cols, device=device)
        layer_norm = LayerNormalization()
        moved = 2 * x.numel() * 4
        cases = {"Softmax (ortlab)": lambda: row_softmax(x),
                 "Softmax (torch)": lambda: torch.softmax(x, -1),
                 "LayerNorm (ortlab)": lambda: layer_norm.compute(x, scale, bias),
                 "LayerNorm (torch)": lambda: torch.nn.functional.layer_norm(x, (cols,), scale, bias)}
        for name, fn in cases.items():
            ms = time_fn(fn)
            rows.append({"kernel": name, "shape": [rows_, cols], "median ms": round(ms, 4),
                         **bandwidth_rates(moved, ms, peak, device == "cuda", "% of copy peak")})
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--small", action="store_true", help="tiny sizes (implied on CPU)")
    args = parser.parse_args(argv)
    small = args.small or kernel_device() == "cpu"
    if kernel_device() == "cuda":
        peaks = measure_peaks()
        device = torch.cuda.get_device_name(0)
    else:
        peaks, device = DATASHEET["H100 SXM (datasheet)"], "cpu (interpreter; timings are not GPU figures)"
    shapes = [(8, 256)] if small else [(16384, 1024), (8192, 4096), (4096, 8192)]
    report = {"device": device, "triton": triton_mode(),
              "peak copy GB/s": round(peaks["bandwidth"] / 1e9, 1),
              "peak FP32 GFLOP/s": round(peaks["flops"] / 1e9, 1),
              "correctness": check_all(8 if small else 4096),
              "bandwidth": bandwidth_rows(shapes, peaks["bandwidth"])}
    print(json.dumps(report, indent=1))
    return report


if __name__ == "__main__":
    main()

"""`python -m ortlab.kernels.bench`: the GPU check of ortlab's kernels, in one call.

On a GPU: every kernel against its numpy reference at moderate sizes, then LayerNorm and
softmax forward at large sizes timed with CUDA events and compared with this GPU's measured
copy bandwidth (the goal: at least 80% of it) and with torch's own kernels. Needs only torch,
Triton and numpy (no onnxruntime), so it runs on a GPU image without the training build.
On CPU (`--small` is implied) it runs the same steps at tiny sizes under the interpreter, so the
script itself is tested by CI; its timings are then not GPU figures.
"""
import argparse
import json

import numpy as np
import torch

from ortlab.env import kernel_device, triton_mode
from ortlab.kernels import run, run_reference
from ortlab.kernels.layer_norm import LayerNormalization
from ortlab.kernels.roofline import DATASHEET, bandwidth_rates, cuda_time_ms, measure_peaks, wall_time_ms
from ortlab.kernels.softmax import row_softmax

MS = "com.microsoft"


def correctness_cases(n):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((n, 257)).astype(np.float32)
    w = rng.standard_normal(257).astype(np.float32)
    labels = rng.integers(0, 257, n)
    return [("Softmax", [x], {}, ""), ("LayerNormalization", [x, w, w], {}, ""),
            ("GeluGrad", [x, x], {}, MS), ("BiasGelu", [x, w], {}, MS),
            ("ReduceSum", [x, np.array([0])], {}, ""),
            ("SoftmaxCrossEntropyLoss", [x, labels], {}, ""),
            ("GatherGrad", [np.array([300, 257]), labels, x], {}, MS),
            ("BiasSoftmax", [x.reshape(1, n, 257), x[:1]], {"axis": 2}, MS)]


def check_all(n):
    rows = []
    for op, inputs, attrs, domain in correctness_cases(n):
        ours = run(op, *inputs, domain=domain, **attrs)
        ref = run_reference(op, *inputs, domain=domain, **attrs)
        worst = max(float(np.abs(a.astype(np.float64) - b).max()) for a, b in zip(ours, ref))
        rows.append({"op": op, "max abs diff vs numpy": worst, "ok": worst < 1e-3})
    return rows


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

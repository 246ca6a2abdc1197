"""Benchmarks, each a command: `python -m ortlab.benchmarks.engine` (ortlab's runtime against ORT, per
step) and `python -m ortlab.benchmarks.kernels` (every Triton kernel checked, LayerNorm and softmax timed
against the copy peak: the GPU check)."""

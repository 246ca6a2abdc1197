"""Benchmarks, each a command: `python -m ortlab.benchmarks.engine` (ortlab's runtime against ORT, per
step), `python -m ortlab.benchmarks.kernels` (every Triton kernel checked, LayerNorm and softmax timed
against the copy peak) and `python -m ortlab.benchmarks.gpu_check` (`make gpu-check`: every GPU check in one
run, one JSON record in gpu_records/; gpu_record reads it back)."""

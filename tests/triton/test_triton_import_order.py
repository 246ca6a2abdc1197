"""Importing triton before ortlab on a CPU: the first launch says what happened and what to do."""
import subprocess
import sys

import pytest
import torch

RUN_SOFTMAX = """
import numpy as np
from ortlab.kernels import executor
try:
    print(executor.run("Softmax", np.array([[0.0, 0.0]], dtype=np.float32))[0].tolist())
except Exception as exc:
    print(type(exc).__name__, exc)
"""


def _run(first_lines):
    env = {k: v for k, v in __import__("os").environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", first_lines + RUN_SOFTMAX], capture_output=True,
                          text=True, timeout=300, env=env)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


@pytest.mark.skipif(torch.cuda.is_available(), reason="with a GPU Triton compiles: no interpreter, no order")
def test_triton_first_is_named_at_the_first_launch_and_ortlab_first_runs():
    assert _run("import ortlab.env\nimport triton\n") == "[[0.5, 0.5]]"
    said = _run("import triton\n")
    assert said.startswith("TritonImportOrderError triton was imported before ortlab")
    assert "import ortlab before triton" in said

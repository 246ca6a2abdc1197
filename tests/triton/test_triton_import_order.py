"""Importing triton before ortlab on a CPU: the first launch says what happened and what to do."""
import subprocess
import sys

import pytest
import torch

RUN_SOFTMAX = """
import numpy as np
from ortlab.triton_kernels import executor
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


def test_every_module_that_imports_triton_imports_ortlab_env_before_it():
    """Triton reads TRITON_INTERPRET once, when it is first imported; ortlab.env sets it (no GPU). A module of
    ortlab that imports triton at its top must import ortlab.env first, or whichever of them a notebook (or a
    test process) imports first decides, silently, whether Triton's own helpers run in the interpreter."""
    import ast

    from repo_paths import ROOT

    late = []
    for path in sorted((ROOT / "ortlab").rglob("*.py")):
        env_seen = False
        for node in ast.parse(path.read_text()).body:
            names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                     [f"{node.module}.{a.name}" for a in node.names] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "ortlab.env" or n.startswith("ortlab.env.") for n in names):
                env_seen = True
            if any(n == "triton" or n.startswith("triton.") for n in names) and not env_seen:
                late.append(str(path.relative_to(ROOT)))
                break
    assert late == [], f"these import triton before ortlab.env: {late}"

"""The conda route of the README: `conda env create -f environment.yml`, then `ORTLAB_USE_ACTIVE_ENV=1 make test`.

Where conda (or mamba, or micromamba) is installed, this creates the environment in a temporary prefix and runs
the suite's environment checks inside it; where none is installed (this lab's CI machine has none) it skips and
says so. Building the environment downloads the CUDA wheels of torch and ORT (a few GB) from conda-forge, PyPI
and PyTorch's index, so it also needs the network. That environment.yml pins what pyproject.toml pins is checked
everywhere, by tests/project/test_env.py.
"""
import os
import shutil
import subprocess

import pytest

from processes import stop_group
from repo_paths import ROOT

CONDA = next((shutil.which(name) for name in ("micromamba", "mamba", "conda") if shutil.which(name)), None)


def _run(args, timeout, env=None):
    """(exit status, output) of `args` in a session of its own, the whole group stopped for certain after."""
    proc = subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        stop_group(proc)
    return proc.returncode, out


@pytest.mark.skipif(CONDA is None, reason="conda, mamba and micromamba are not installed on this machine: "
                                          "install one (e.g. Miniforge) to check the environment.yml route")
@pytest.mark.timeout(3600)
def test_environment_yml_builds_an_environment_the_suite_runs_in(tmp_path):
    prefix = tmp_path / "env"
    status, log = _run([CONDA, "env", "create", "-y", "-p", str(prefix), "-f", str(ROOT / "environment.yml")], 3000)
    assert status == 0, f"{CONDA} env create failed:\n{log[-4000:]}"
    python = str(prefix / "bin" / "python")
    env = dict(os.environ, ORTLAB_USE_ACTIVE_ENV="1", PATH=f"{prefix / 'bin'}{os.pathsep}{os.environ['PATH']}")
    status, out = _run([python, "-c", "import onnxruntime, torch, ortlab; print(onnxruntime.__version__)"], 300, env)
    assert status == 0 and out.strip().splitlines()[-1] == "1.19.2", out
    status, out = _run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests/project/test_env.py",
                        "tests/notebooks/test_lesson_shape.py"], 900, env)
    assert status == 0, out[-4000:]

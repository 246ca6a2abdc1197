"""torch's "No CUDA runtime is found" note stays off a learner's screen once ortlab drives ORTModule."""
import os
import subprocess
import sys

import pytest
import torch

NOTE = "No CUDA runtime is found"


def _stderr(code, tmp_path):
    # CUDA_HOME set and no GPU: torch.utils.cpp_extension's _find_cuda_home prints its note at import
    env = dict(os.environ, CUDA_HOME=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="torch prints the note only where CUDA is unavailable")
def test_torch_prints_the_note_and_ortlab_keeps_it_from_the_ortmodule_import_but_not_real_warnings(tmp_path):
    assert NOTE in _stderr("import torch.utils.cpp_extension", tmp_path)
    quiet = _stderr("import sys\nimport ortlab.ortmodule.driver\nimport onnxruntime.training.ortmodule\n"
                    "print('a real warning', file=sys.stderr)", tmp_path)
    assert NOTE not in quiet
    assert "a real warning" in quiet

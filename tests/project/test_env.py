"""ortlab.env and the pinned stack: the training build is what the lab is about."""
import re
import tomllib

import numpy as np
import pytest
import torch

from repo_paths import ROOT
from ortlab import OrtlabError, env


def test_report_names_the_stack_and_the_device(run_cli):
    import onnx
    import onnxruntime

    report = env.report()
    assert report["onnx"] == onnx.__version__
    assert report["onnxruntime"].startswith(onnxruntime.__version__)
    assert report["torch"] == torch.__version__.split("+")[0] or report["torch"] == torch.__version__
    assert report["training build"] == "yes"
    assert report["ORTModule extensions"] == "built"
    assert report["device"].split()[0] == env.device()
    assert set(report["providers used"].split(", ")) <= set(onnxruntime.get_available_providers())
    out = run_cli("ortlab.env").stdout
    assert re.search(r"^onnxruntime\s+1\.19\.2 \(onnxruntime-training", out, re.M), out


def test_device_follows_the_gpu_and_the_override(monkeypatch):
    monkeypatch.delenv(env.DEVICE_VARIABLE, raising=False)
    assert env.device() == ("cuda" if env.cuda_available() else "cpu")
    assert env.providers()[-1] == "CPUExecutionProvider"
    monkeypatch.setenv(env.DEVICE_VARIABLE, "cpu")
    assert env.device() == "cpu" and env.providers() == ["CPUExecutionProvider"]
    monkeypatch.setenv(env.DEVICE_VARIABLE, "tpu")
    with pytest.raises(OrtlabError, match="not a device ortlab knows; use one of cpu, cuda"):
        env.device()
    if not env.cuda_available():
        monkeypatch.setenv(env.DEVICE_VARIABLE, "cuda")
        with pytest.raises(env.DeviceError, match="no CUDA GPU is usable here"):
            env.device()


def test_seed_everything_makes_numpy_and_torch_repeat():
    env.seed_everything(7)
    a = (np.random.rand(3), torch.rand(3))
    env.seed_everything(7)
    b = (np.random.rand(3), torch.rand(3))
    assert np.array_equal(a[0], b[0]) and torch.equal(a[1], b[1])


def _pins_from_pyproject():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + [d for ds in project["optional-dependencies"].values() for d in ds]
    return {n.lower(): v for n, v in (d.split("==") for d in deps if "==" in d)}


def _pins_from_environment_yml():
    pins = {}
    for line in (ROOT / "environment.yml").read_text().splitlines():
        m = re.match(r"\s*-\s*([A-Za-z0-9_.-]+)\s*==?\s*([0-9][^\s#]*)", line)
        if m:
            pins[m[1].lower()] = m[2]
    return pins


def test_environment_yml_pins_agree_with_pyproject():
    ours, conda = _pins_from_pyproject(), _pins_from_environment_yml()
    assert conda["python"].startswith("3.11")
    assert conda["onnxruntime-training"] == ours["onnxruntime-training"] == ours["onnxruntime-training-cpu"]
    for name, version in ours.items():
        if name in ("onnxruntime-training-cpu",):
            continue  # the GPU flavour installs onnxruntime-training instead
        assert name in conda, f"environment.yml lacks {name}=={version}"
        assert conda[name].split("+")[0] == version, (name, conda[name], version)
    assert "onnxruntime-training-cpu" not in conda and "onnxruntime" not in conda


def test_os_level_streams_lends_file_descriptors_only_when_missing(capsys):
    import sys

    from ortlab.capture import os_level_streams
    with pytest.raises(Exception):
        sys.stdout.fileno()  # pytest's capture, like nbval's kernels, has none
    captured = sys.stdout
    with os_level_streams():
        assert sys.stdout.fileno() >= 0 and sys.stderr.fileno() >= 0
    assert sys.stdout is captured

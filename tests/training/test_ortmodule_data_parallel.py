"""ORTModule and torch.nn.DataParallel (L0_02): both wrap orders on this machine, against the same step in PyTorch
(torch autograd) and against what torch's DataParallel and ORT's ORTModule do by their own code."""
import pytest
import torch
import torch.nn.functional as F

from ortlab.ortmodule import driver as om
from ortlab.ortmodule.distributed import make_model, rank_batch

no_gpu = pytest.mark.skipif(torch.cuda.is_available(), reason="DataParallel behaves differently with GPUs")


@pytest.fixture(scope="module")
def rows():
    x, y = rank_batch(0)
    found = om.data_parallel_cases(make_model, x, y)
    assert [row["wrapping"] for row in found] == [
        "DataParallel(ORTModule(model)), this machine", "ORTModule(DataParallel(model))",
        "ORTModule(DataParallel(model)), FALLBACK_DISABLE",
        "DataParallel(ORTModule(model)), 2+ GPUs: what replicate() calls"]
    return found


def test_fell_back_is_true_for_an_ortmodule_switched_to_pytorch_at_construction():
    # before: AttributeError ('TorchModulePytorch' object has no attribute '_execution_manager')
    x, _ = rank_batch(0)
    with om.captured_logs():
        wrapped = om.ortmodule(torch.nn.DataParallel(make_model()))
        out = wrapped(x)
    assert type(wrapped._torch_module).__name__ == "TorchModulePytorch"
    assert om.fell_back(wrapped) is True
    assert torch.equal(out, make_model()(x))
    with om.captured_logs():
        plain = om.ortmodule(make_model())
        plain(x)
    assert om.fell_back(plain) is False


@no_gpu
def test_data_parallel_of_ortmodule_without_gpus_just_calls_ortmodule(rows):
    assert torch.nn.DataParallel(torch.nn.Linear(2, 2)).device_ids == []  # torch's own rule without CUDA
    row = rows[0]
    assert row["outcome"] == "trains; DataParallel device_ids []" and row["ORT ran it"] == "yes"
    assert float(row["gradient gap to PyTorch"]) < 1e-6


def test_ortmodule_of_data_parallel_runs_pytorch_silently_or_refuses(rows):
    silent = rows[1]
    assert (silent["ORT ran it"], silent["ORT says it fell back"]) == ("no (PyTorch)", "no")
    assert float(silent["gradient gap to PyTorch"]) == 0.0
    x, _ = rank_batch(0)
    with om.captured_logs() as log:
        om.ortmodule(torch.nn.DataParallel(make_model()), log_level="INFO")(x)
    assert "orttraining [INFO] - Fallback for policy FALLBACK_UNSUPPORTED_TORCH_MODEL is pending." in log
    refused = rows[2]
    assert refused["outcome"].startswith("ORTModuleTorchModelException: ORTModule is not compatible with "
                                         "torch.nn.DataParallel")


def test_replication_on_several_gpus_is_refused_by_ortmodule(rows):
    row = rows[3]
    assert "DistributedDataParallel instead" in row["outcome"]
    # torch's replicate() asks every submodule for a replica through this method (torch/nn/parallel/replicate.py)
    assert torch.nn.Linear(2, 2)._replicate_for_data_parallel() is not None


def test_bad_arguments_end_in_an_ortmodule_error():
    x, y = rank_batch(0)
    with pytest.raises(om.OrtModuleError, match="make_model must be a function"):
        om.data_parallel_cases(make_model(), x, y)
    with pytest.raises(om.OrtModuleError, match="PyTorch step fails"):
        om.data_parallel_cases(make_model, torch.randn(4, 3), y)
    with pytest.raises(om.OrtModuleError, match="PyTorch step fails"):
        om.data_parallel_cases(make_model, x, F.pad(y, (0, 1)))

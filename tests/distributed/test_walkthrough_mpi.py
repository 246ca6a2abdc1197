"""L2_03's MPI section: MPI_Allreduce under mpirun (Open MPI, mpi4py) against arithmetic and against the same
all-reduce in torch.distributed (gloo) started by ortlab.distributed.launch; the job's network is loopback only."""
import shutil
import sys

import pytest

from ortlab.distributed import launch
from ortlab.walkthroughs import distributed_mpi as dm

try:
    import mpi4py  # noqa: F401
    HAVE_MPI4PY = True
except ImportError:
    HAVE_MPI4PY = False

needs_mpi = pytest.mark.skipif(shutil.which("mpirun") is None or not HAVE_MPI4PY,
                               reason="needs Open MPI's mpirun (.ci/run installs openmpi-bin) and mpi4py")


@needs_mpi
@pytest.mark.parametrize("world_size", [2, 3])
def test_mpi_allreduce_equals_arithmetic_and_torch_distributed(world_size):
    reports = dm.mpi_all_reduce(world_size, timeout=240)
    # 3 ranks on 2 busy cores each import torch before the first collective: minutes, not seconds
    by_torch = launch(dm.torch_all_reduce, world_size, timeout=240)
    arithmetic = [sum(i * (r + 1) for r in range(world_size)) for i in range(4)]
    assert [r["rank"] for r in reports] == list(range(world_size))
    for mpi, torch_rank in zip(reports, by_torch):
        assert mpi["sum"] == torch_rank["sum"] == arithmetic
        assert mpi["size"] == world_size and mpi["library"].startswith("Open MPI")
        assert mpi["env"]["OMPI_COMM_WORLD_RANK"] == str(mpi["rank"])
        assert mpi["env"]["OMPI_COMM_WORLD_SIZE"] == str(world_size)


@needs_mpi
def test_the_job_sees_only_the_loopback_interface_whatever_its_listeners_bind_to():
    reports = dm.mpi_all_reduce(2)
    assert all(r["interfaces"] == ["lo"] for r in reports)
    addresses = {address for address, _ in reports[0]["listeners"]}
    assert addresses and addresses <= {"127.0.0.1", "0.0.0.0", "::"}


@pytest.mark.parametrize("bad", [0, 9, "2", 2.0, True, None])
def test_bad_world_sizes_are_refused_before_mpirun_starts(bad):
    with pytest.raises(dm.MpiError, match="world_size must be an int from 1 to 8"):
        dm.mpi_all_reduce(bad)


def test_missing_mpirun_and_missing_mpi4py_say_what_to_install(monkeypatch):
    monkeypatch.setattr(dm.shutil, "which", lambda name: None)
    with pytest.raises(dm.MpiError, match="apt-get install openmpi-bin"):
        dm.mpirun_command(2, isolated=False)
    with pytest.raises(dm.MpiError, match="unshare"):
        dm.namespace_prefix()
    monkeypatch.setitem(sys.modules, "mpi4py", None)
    with pytest.raises(dm.MpiError, match="pip install mpi4py==4.1.2"):
        dm.mpi_all_reduce(2)


@needs_mpi
def test_a_rank_that_fails_is_reported_with_mpiruns_output(monkeypatch):
    isolated_prefix = dm.namespace_prefix()  # mpirun's listeners stay inside a loopback-only namespace here too
    monkeypatch.setattr(dm, "mpirun_command", lambda n, isolated=True: [*isolated_prefix, "mpirun", "-n", str(n),
                                                                         "--oversubscribe", "--allow-run-as-root",
                                                                         sys.executable, "-c", "raise SystemExit(3)"])
    with pytest.raises(dm.MpiError, match="0 of 2 ranks reported"):
        dm.mpi_all_reduce(2)

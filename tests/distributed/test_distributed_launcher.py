"""ortlab.distributed.launch: real ranks on gloo, their results and output, failures, hangs, bad input.

Each 2-rank launch costs several seconds of process start-up, so one launch (the `facts` fixture)
carries most checks; the failure and hang launches are the only others.
"""
import glob
import ipaddress
import multiprocessing
import os
import subprocess
import sys
import tempfile
import threading
import types

import pytest
import torch

import processes

from ortlab.distributed import LaunchError, LaunchResult, launch, launcher
from ortlab.walkthroughs import distributed_training as examples
from repo_paths import ROOT as REPO_ROOT

ROOT = str(REPO_ROOT)


def _children():
    """Process ids whose parent is this process, except multiprocessing's resource tracker, which
    lives as long as this process once anything was spawned."""
    tracker = getattr(multiprocessing.resource_tracker._resource_tracker, "_pid", None)
    return processes.children(exclude=[tracker])


@pytest.fixture(scope="module", autouse=True)
def private_tmp(tmp_path_factory):
    """This module's launches make their folders in a temporary directory of their own (for the spawned
    ranks and scripts too, through TMPDIR), so that another launch running on the machine at the same time,
    a notebook's or another test run's, cannot look like a folder left behind."""
    folder = str(tmp_path_factory.mktemp("launch-tmp"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", folder)
        patch.setenv("TMPDIR", folder)
        yield folder


def _launch_dirs():
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "ortlab-launch-*")))


def test_launch_folders_go_to_this_modules_own_tmp(private_tmp, monkeypatch):
    made, mkdtemp = [], tempfile.mkdtemp
    monkeypatch.setattr(tempfile, "mkdtemp", lambda **kw: made.append(mkdtemp(**kw)) or made[-1])
    assert launch(examples.launch_facts, world_size=1)[0]["rank"] == 0
    assert len(made) == 1 and os.path.dirname(made[0]) == private_tmp
    assert os.path.basename(made[0]).startswith("ortlab-launch-") and not os.path.exists(made[0])


def _before():
    """What exists before a launch: its folders and this process's children (another test's
    leftover must not fail this module's "nothing left" checks)."""
    return _launch_dirs(), _children()


def assert_nothing_left(pids, before):
    dirs_before, children_before = before
    assert pids and all(not os.path.exists(f"/proc/{pid}") for pid in pids)
    assert _children() - children_before == set()
    assert _launch_dirs() - dirs_before == set()


@pytest.fixture(scope="module")
def facts():
    """One 2-rank launch of examples.launch_facts, told this machine has 1 core (so 2 ranks > cores)."""
    dirs = _before()
    saved = launcher.cores
    launcher.cores = lambda: 1
    try:
        with pytest.warns(launcher.LaunchWarning, match=r"2 ranks x 1 thread\(s\) on 1 cores") as caught:
            result = launch(examples.launch_facts, world_size=2)
    finally:
        launcher.cores = saved
    return result, caught, dirs


def test_all_reduce_is_the_sum_and_results_come_in_rank_order(facts):
    result, _, _ = facts
    assert isinstance(result, LaunchResult) and isinstance(result, list) and len(result) == 2
    expected = sum(torch.arange(4, dtype=torch.float64) * (r + 1) for r in range(2)).tolist()
    for rank, value in enumerate(result):
        assert value["rank"] == value["group_rank"] == rank
        assert value["world_size"] == value["group_size"] == 2
        assert value["backend"] == "gloo" == result.backend
        assert value["sum"] == expected
    assert [value["pid"] for value in result] == result.pids == result[0]["pids"]


def test_each_rank_runs_one_thread_with_torchrun_variables(facts):
    result, _, _ = facts
    for rank, value in enumerate(result):
        assert value["threads"] == value["interop_threads"] == 1
        assert value["env"] == {"RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
                                "OMP_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}


def test_output_is_captured_per_rank(facts, capsys):
    result, _, _ = facts
    assert result.outputs == [f"rank {r} of 2: all_reduce {result[r]['sum']}\n" for r in range(2)]
    assert all(f"rank {r} says hello on stderr" in result.stderr[r] for r in range(2))
    result.show()
    assert capsys.readouterr().out.splitlines() == [
        f"[rank {r}] rank {r} of 2: all_reduce {result[r]['sum']}" for r in range(2)]


def test_more_ranks_than_cores_runs_with_a_warning(facts):
    result, caught, _ = facts
    assert len(result) == 2
    assert [str(w.message) for w in caught if "cores" in str(w.message)]


def test_nothing_listens_beyond_loopback_and_nothing_is_left(facts):
    result, _, dirs = facts
    for value in result:
        # gloo's pair sockets listen; the FileStore rendezvous opens no TCP store at all
        assert value["listeners"], "no listening socket found: the /proc/net/tcp* check saw nothing"
        assert all(examples.is_loopback(address) for address, _ in value["listeners"]), value["listeners"]
    assert_nothing_left(result.pids, dirs)


def test_proc_net_addresses_are_decoded():
    assert str(examples._address("0100007F")) == "127.0.0.1"
    assert str(examples._address("00000000000000000000000001000000")) == "::1"
    mapped = examples._address("0000000000000000FFFF00000100007F")
    assert mapped == ipaddress.ip_address("::ffff:127.0.0.1")
    assert examples.is_loopback("::ffff:127.0.0.1") and not examples.is_loopback("0.0.0.0")
    assert not examples.is_loopback("::")


def test_a_failing_rank_is_named_with_its_exception():
    dirs = _before()
    with pytest.raises(LaunchError) as info:
        launch(examples.fail_on_rank, world_size=2, args=(1,))
    error = info.value
    assert (error.rank, error.kind) == (1, "raised")
    message = str(error)
    assert message.startswith("rank 1 of 2 raised ValueError: rank 1 fails on purpose")
    assert "in fail_on_rank" in message and "in _fail" in message
    assert "launcher.py" not in message and "rank_worker.py" not in message and "multiprocessing" not in message
    assert "The other ranks were stopped." in message
    assert_nothing_left(error.pids, dirs)


def test_a_hung_rank_is_stopped_and_its_stack_shown(facts):
    started = facts[0].seconds  # this machine's start-up time for 2 ranks, now
    timeout = min(max(10.0, 2.0 * started), 45.0)
    dirs = _before()
    with pytest.raises(LaunchError) as info:
        launch(examples.hang_on_rank, world_size=2, args=(1,), timeout=timeout)
    error = info.value
    assert (error.rank, error.kind) == (1, "timeout")
    message = str(error)
    assert message.startswith(f"rank 1 of 2 did not finish within the time limit (timeout={timeout:g} s)")
    assert "rank 1 was inside fn" in message
    assert "in stuck_forever" in message and "in hang_on_rank" in message
    assert "rank 0 had returned from fn and was waiting at the final barrier" in message
    assert_nothing_left(error.pids, dirs)


def _cell_function(rank, world_size):
    return rank


def test_a_function_from_a_notebook_cell_is_refused(monkeypatch):
    # A Jupyter kernel's __main__ has neither __file__ nor __spec__: spawned ranks cannot import it.
    kernel_main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", kernel_main)
    fn = types.FunctionType(_cell_function.__code__, kernel_main.__dict__, "worker")
    fn.__module__, fn.__qualname__ = "__main__", "worker"
    kernel_main.worker = fn
    with pytest.raises(LaunchError, match=r"worker is defined in __main__ .*spawn.*Put worker in a module"):
        launch(fn)


def test_python_c_function_is_refused_before_anything_starts():
    code = ("from ortlab.distributed import launch, LaunchError\n"
            "def worker(rank, world_size):\n    return rank\n"
            "try:\n    launch(worker)\nexcept LaunchError as e:\n    print('LaunchError:', e)\n"
            "import multiprocessing, torch.distributed as dist\n"
            "print('children', len(multiprocessing.active_children()), 'initialized', dist.is_initialized())\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "LaunchError: worker is defined in __main__" in out.stdout, out.stderr
    assert "Put worker in a module" in out.stdout
    assert out.stdout.rstrip().endswith("children 0 initialized False")  # refused before any rank started


def test_a_program_read_from_stdin_is_refused_before_anything_starts():
    """`python -` names its main program '<stdin>': spawned ranks would run that path again and crash."""
    code = ("from ortlab.distributed import launch, LaunchError\n"
            "from ortlab.walkthroughs import distributed_training as examples\n"
            "try:\n    launch(examples.all_reduce_sum)\nexcept LaunchError as e:\n    print('LaunchError:', e)\n")
    out = subprocess.run([sys.executable, "-"], input=code, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "LaunchError: the main program is '<stdin>', not a file" in out.stdout, out.stderr


def test_a_script_without_main_guard_gets_the_fix(tmp_path):
    # A script's own function is fine (the ranks import the script again), but the script must call
    # launch under a __main__ guard: here each rank stops at its own launch() and exits with code 1.
    script = tmp_path / "unguarded.py"
    script.write_text("from ortlab.distributed import launch\n"
                      "def worker(rank, world_size):\n    return rank\n"
                      "launch(worker, 2)\n")
    dirs = _launch_dirs()
    env = dict(os.environ, PYTHONPATH=ROOT)
    out = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 1
    last = out.stderr[out.stderr.index("LaunchError: rank"):]
    assert "of 2 exited with code 1 without raising a Python exception" in last
    assert 'call it under `if __name__ == "__main__":`' in last and "The other ranks were stopped." in last
    assert "called while a spawned rank imported the caller's script again" in out.stderr
    assert _launch_dirs() - dirs == set()


def _nested_holder():
    def nested(rank, world_size):
        return rank
    return nested


@pytest.mark.parametrize("world_size", [0, -1, 2.0, True, "2", None])
def test_world_size_must_be_a_positive_int(world_size):
    with pytest.raises(LaunchError, match="world_size must be a positive int"):
        launch(examples.all_reduce_sum, world_size=world_size)


@pytest.mark.parametrize("fn, match", [
    (lambda rank, world_size: rank, "cannot be sent to the ranks"),
    (_nested_holder(), "cannot be sent to the ranks"),
    (42, "fn must be a function"),
])
def test_fn_must_be_importable(fn, match):
    with pytest.raises(LaunchError, match=match):
        launch(fn)


@pytest.mark.parametrize("kwargs, match", [
    ({"args": (threading.Lock(),)}, "args cannot be pickled.*build other objects .* inside fn"),
    ({"args": 3}, r"args must be a tuple.*args=\(3,\)"),
    ({"timeout": 0}, "timeout must be a positive number"),
    ({"threads_per_rank": 0}, "threads_per_rank must be a positive int"),
    ({"backend": "mpi"}, "backend must be one of gloo, nccl"),
])
def test_bad_arguments_are_refused_before_anything_starts(kwargs, match):
    with pytest.raises(LaunchError, match=match):
        launch(examples.all_reduce_sum, **kwargs)


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has the GPUs NCCL needs")
def test_nccl_needs_one_gpu_per_rank():
    with pytest.raises(LaunchError, match="2 ranks need 2 GPUs"):
        launch(examples.all_reduce_sum, backend="nccl")

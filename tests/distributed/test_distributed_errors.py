"""Hostile inputs to ortlab.distributed (wrong arguments): each case ends in a clear OrtlabError or the right result.

One 2-rank launch (`mismatch`) carries every case where the ranks disagree (different sizes, dtypes,
models, settings, world sizes): each must end in the same error on every rank, naming the rank and both
shapes, where it used to end in a gloo abort or a hang. The other checks start no process at all, except
one launch with a time limit too short for the ranks to start.
"""
import glob
import math
import os
import tempfile
import time

import numpy as np
import pytest
import torch

from ortlab.distributed import LaunchError, launch, launch_report, launcher
from ortlab.walkthroughs import distributed_training as examples
from ortlab.distributed.collectives import CollectiveError, ring_bytes_per_rank
from ortlab.distributed.data_parallel import DataParallelError, assign_buckets
from ortlab.distributed.checks.data_parallel import MLP
from ortlab.distributed.moe import DistributedMoE, MoE, MoEError, expert_capacity, route
from ortlab.distributed.pipeline import PipelineError, microbatches
from ortlab.errors import OrtlabError

pytestmark = pytest.mark.hostile

WORLD = 2


@pytest.fixture(scope="module", autouse=True)
def private_tmp(tmp_path_factory):
    """This module's launches make their folders in a temporary directory of their own."""
    folder = str(tmp_path_factory.mktemp("hostile-tmp"))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tempfile, "tempdir", folder)
        patch.setenv("TMPDIR", folder)
        yield folder


@pytest.fixture(scope="module")
def mismatch():
    return launch(examples.mismatch_check, world_size=WORLD, timeout=150)


def _errors(mismatch, case):
    texts = [result["errors"][case] for result in mismatch]
    return texts


# ---------------------------------------------------------------------------------------------
# Ranks that disagree: one launch.


def test_every_mismatch_ends_in_an_error_and_the_launch_goes_on(mismatch):
    """Before: the first case (10 elements on rank 0, 7 on rank 1) made gloo abort rank 0 with SIGABRT."""
    assert len(mismatch) == WORLD
    for case in mismatch[0]["errors"]:
        texts = _errors(mismatch, case)
        assert all(text != "no error" for text in texts), (case, texts)
    # the group still works afterwards: a ring all-reduce of rank + 1 sums to 1 + 2 on every rank
    for result in mismatch:
        assert torch.equal(result["after"], torch.full((10,), 3.0))


def test_all_reduce_sizes_and_dtypes_are_named_on_every_rank(mismatch):
    sizes = _errors(mismatch, "all_reduce sizes")
    assert sizes[0] == sizes[1]
    assert "ring_all_reduce needs the same tensor shape and dtype on every rank" in sizes[0]
    assert "rank 0: (10,) float32; rank 1: (7,) float32 (rank 1 differs from rank 0)" in sizes[0]
    dtypes = _errors(mismatch, "all_reduce dtypes")
    assert dtypes[0] == dtypes[1] and "rank 0: (4,) float32; rank 1: (4,) float64" in dtypes[0]
    scatter = _errors(mismatch, "reduce_scatter shapes")
    assert scatter[0] == scatter[1] and "rank 0: (4,) float32; rank 1: (8,) float32" in scatter[0]
    to_all = _errors(mismatch, "all_to_all dtypes")
    assert to_all[0] == to_all[1] and "rank 0: float32, rank 1: int64" in to_all[0]


def test_one_rank_with_bad_input_stops_every_rank(mismatch):
    """Rank 1's bool tensor is its own error; rank 0 is told, instead of waiting for a message."""
    texts = _errors(mismatch, "all_reduce one bad rank")
    assert texts[1].startswith("tensor has dtype torch.bool, which a SUM collective cannot carry")
    assert texts[0] == "ring_all_reduce: rank 1 got an input it cannot use (its own error says what), " \
                       "so no rank sends anything"


def test_the_shape_exchange_is_not_counted_in_the_payload_bytes(mismatch):
    for result in mismatch:
        trace = result["trace"]
        nbytes = 10 * 4  # ten float32
        assert trace["bytes_sent"] == 2 * (WORLD - 1) * nbytes / WORLD == ring_bytes_per_rank(
            "all_reduce", nbytes, WORLD)
        assert trace["meta_bytes_sent"] == (WORLD - 1) * 11 * 8  # one row of 11 int64 per step


def test_ddp_and_zero_name_the_rank_the_parameter_and_both_shapes(mismatch):
    # the shapes as torch reports them for the two models each rank built
    big, small = tuple(MLP(hidden=16).fc1.weight.shape), tuple(MLP(hidden=8).fc1.weight.shape)
    ddp = _errors(mismatch, "ddp models")
    assert ddp[0] == ddp[1]
    assert ddp[0].startswith(f"the ranks do not hold the same model: parameter 0 is 'fc1.weight' with shape "
                             f"{small} float32, requires_grad=True on rank 1, but 'fc1.weight' with shape "
                             f"{big} float32, requires_grad=True on rank 0")
    assert "build the same model with the same settings on every rank" in ddp[0]
    names = [name for name, _ in MLP().named_parameters()]
    extra = _errors(mismatch, "ddp extra parameter")
    assert extra[0] == extra[1]
    assert f"rank 1 has {len(names) + 2} parameters and rank 0 has {len(names)}" in extra[0]
    assert "'extra.weight' with shape (2, 2) float32" in extra[0]
    caps = _errors(mismatch, "ddp bucket caps")
    assert caps[0] == caps[1] and "'bucket_cap_mb' with value 1.0 on rank 1, but 'bucket_cap_mb' with value " \
                                  "25.0 on rank 0" in caps[0]
    zero = _errors(mismatch, "zero models")
    assert zero[0] == zero[1]
    assert f"'fc1.weight' with shape {small} float32 on rank 1, but 'fc1.weight' with shape {big} float32 " \
           f"on rank 0" in zero[0] and "call zero() with the same stage and optimizer" in zero[0]
    stages = _errors(mismatch, "zero stages")
    assert stages[0] == stages[1] and "'stage' with value 2 on rank 1, but 'stage' with value 1 on rank 0" \
        in stages[0]


def test_moe_built_for_another_world_or_other_settings(mismatch):
    world = _errors(mismatch, "moe world size")
    assert world[0] == f"this layer was built for rank 0 of {2 * WORLD}, but runs on rank 0 of {WORLD} " \
                       f"of its process group: build it with rank=None, world_size=None to read them from the group"
    assert world[1].startswith(f"this layer was built for rank 1 of {2 * WORLD}")
    settings = _errors(mismatch, "moe settings")
    assert settings[0] == settings[1] and "'k' with value 2 on rank 1, but 'k' with value 1 on rank 0" in settings[0]


# ---------------------------------------------------------------------------------------------
# launch: how many ranks, how long.


def test_a_hundred_ranks_on_two_cores_is_refused_at_once(monkeypatch):
    """Before: the launch started 100 processes, waited its whole timeout and printed ~300 lines."""
    monkeypatch.setattr(launcher, "cores", lambda: 2)
    monkeypatch.setattr(launcher, "available_memory_mb", lambda: 64 * 1024)
    started = time.monotonic()
    with pytest.raises(LaunchError) as info:
        launch(examples.all_reduce_sum, 100)
    assert time.monotonic() - started < 5 and info.value.pids == []
    message = str(info.value)
    assert message.startswith("world_size=100 is more than this machine can run: at most 8 ranks here "
                              "(4 per core on 2 cores)")
    assert "Use world_size <= 8" in message and len(message.splitlines()) == 1


def test_the_free_memory_bounds_the_ranks_too(monkeypatch):
    monkeypatch.setattr(launcher, "cores", lambda: 64)
    monkeypatch.setattr(launcher, "available_memory_mb", lambda: 1024)
    assert launcher.max_world_size() == (4, "256 MB each in 1024 MB of free memory")
    with pytest.raises(LaunchError, match=r"at most 4 ranks here \(256 MB each in 1024 MB of free memory\)"):
        launch(examples.all_reduce_sum, 5)
    monkeypatch.setattr(launcher, "available_memory_mb", lambda: None)  # no /proc/meminfo: cores only
    assert launcher.max_world_size() == (256, "4 per core on 64 cores")


@pytest.mark.parametrize("timeout", [math.inf, -math.inf, math.nan, 0, -1, 1e9, "60", None, True, [60]])
def test_timeout_must_be_finite_and_positive(timeout):
    """Before: timeout=inf raised OverflowError from the wait for the ranks, after they had started."""
    with pytest.raises(LaunchError, match=r"timeout must be a positive number of seconds, finite and at most "
                                          r"604800 \(a week\)"):
        launch(examples.all_reduce_sum, timeout=timeout)


def test_more_threads_per_rank_than_cores_is_refused(monkeypatch):
    monkeypatch.setattr(launcher, "cores", lambda: 2)
    with pytest.raises(LaunchError, match="threads_per_rank=1000000 is more than the 2 cores"):
        launch(examples.all_reduce_sum, threads_per_rank=10 ** 6)


def test_numpy_numbers_are_numbers():
    assert launcher._check_timeout(np.float64(2.5)) == 2.5 and launcher._check_timeout(launcher.MAX_TIMEOUT_S)
    assert launcher._positive_int(np.int64(3), "world_size") == 3
    with pytest.raises(LaunchError, match="world_size must be a positive int"):
        launcher._positive_int(np.float64(3), "world_size")


def test_rank_ranges():
    assert launch_report.rank_ranges([5, 0, 1, 2, 3, 7, 8, 10]) == "0-3, 5, 7, 8, 10"
    assert launch_report.rank_ranges([1]) == "1" and launch_report.rank_ranges([]) == ""


def test_a_timeout_of_many_ranks_is_summarised():
    phases = {r: "not started" for r in range(4, 100)}
    phases.update({0: "fn", 1: "fn", 2: "fn", 3: "starting"})
    stacks = {0: "    A", 1: "    A", 2: "    B", 3: "    C"}
    lines, hung = launch_report.timeout_summary(100, 60, phases, stacks, workers=2)
    assert hung == list(range(100)) and len(lines) == 9
    assert lines[0] == "ranks 0-99 of 100 did not finish within the time limit (timeout=60 s)"
    assert lines[1].startswith("ranks 4-99 had not started: their processes were still being created")
    assert "100 ranks on 2 cores need about 65 s to start). Raise timeout or use fewer ranks." in lines[1]
    assert lines[2:4] == ["ranks 0, 1 were inside fn; their Python stack (the same on each, most recent call "
                          "first):", "    A"]
    assert lines[4] == "rank 2 was inside fn; its Python stack (most recent call first):"
    assert lines[6].startswith("rank 3 was starting") and lines[-1] == "All ranks were stopped."
    many = {r: "fn" for r in range(8)}
    lines, _ = launch_report.timeout_summary(8, 5, many, {r: f"    line {r}" for r in range(8)}, workers=2)
    assert lines[-2] == "ranks 3-7 had other stacks, not shown: read them in the error's .stacks"
    assert len(lines) == 1 + 2 * launch_report.STACKS_SHOWN + 2


def test_a_timeout_before_the_ranks_start_says_so():
    """A limit shorter than start-up: the ranks are not sent SIGUSR1 (it would kill a rank that has no
    handler yet), the error says they had not started, and nothing is left behind."""
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), "ortlab-launch-*")))
    with pytest.raises(LaunchError) as info:
        launch(examples.all_reduce_sum, WORLD, timeout=0.05)
    error = info.value
    assert error.kind == "timeout" and str(error).startswith(
        f"ranks 0, 1 of {WORLD} did not finish within the time limit (timeout=0.05 s)")
    assert "had not started" in str(error) and len(str(error).splitlines()) <= 4
    assert all(not os.path.exists(f"/proc/{pid}") for pid in error.pids)
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), "ortlab-launch-*"))) == before


# ---------------------------------------------------------------------------------------------
# Functions of one process.


TENSORS = [torch.zeros(3), torch.zeros(5, dtype=torch.float64)]


@pytest.mark.parametrize("call, match", [
    (lambda: assign_buckets(TENSORS, "big"), "bucket_cap_mb must be a positive number of MiB"),
    (lambda: assign_buckets(TENSORS, None), "bucket_cap_mb must be a positive number"),
    (lambda: assign_buckets(TENSORS, math.nan), "bucket_cap_mb must be a positive number"),
    (lambda: assign_buckets(TENSORS, -1), "bucket_cap_mb must be a positive number"),
    (lambda: assign_buckets(torch.zeros(3), 25), "tensors must be a list of tensors"),
    (lambda: assign_buckets(None, 25), "tensors must be a list of tensors"),
    (lambda: assign_buckets([torch.zeros(2), 3.0], 25), r"tensors\[1\] must be a torch.Tensor, got float"),
    (lambda: route(torch.randn(4, 3), 5, 2), "k must be 1 .Switch. or 2 .GShard., got 5"),
    (lambda: route(torch.randn(4, 3), 0, 2), "k must be 1 .Switch. or 2 .GShard., got 0"),
    (lambda: route(torch.randn(4, 3), True, 2), "k must be 1"),
    (lambda: route(torch.randn(4, 3), 1.0, 2), "k must be 1"),
    (lambda: route(torch.randn(4, 1), 2, 2), "k=2 choices need at least 2 experts, the logits have 1"),
    (lambda: route(torch.randn(4, 3), 1, 0), "capacity must be a positive int"),
    (lambda: route(torch.randn(4, 3), 1, 2.5), "capacity must be a positive int"),
    (lambda: route(torch.randn(4), 1, 2), r"logits must be a floating-point tensor \(tokens, experts\)"),
    (lambda: route(torch.ones(4, 3, dtype=torch.int64), 1, 2), "logits must be a floating-point tensor"),
    (lambda: route(None, 1, 2), "logits must be a floating-point tensor.*got NoneType"),
    (lambda: route(torch.tensor([[0.0, math.nan]]), 1, 2), "logits hold NaN or inf"),
    (lambda: expert_capacity(10, 2, 1, math.inf), "capacity_factor must be a positive number, finite"),
    (lambda: expert_capacity(10, 2, 1, -math.inf), "capacity_factor must be a positive number"),
    (lambda: expert_capacity(10, 2, 1, math.nan), "capacity_factor must be a positive number"),
    (lambda: expert_capacity(10, 2, 1, None), "capacity_factor must be a positive number"),
    (lambda: expert_capacity(10, 2, 1, 1e308), "overflows a float .capacity_factor=1e.308.; a capacity_factor "
                                                 "of 2 already"),
    (lambda: expert_capacity(10 ** 400, 2, 1, 1.0), "overflows a float .capacity_factor=1.0.; split the tokens"),
    (lambda: microbatches(torch.zeros(4, 2), 0), "n_microbatches must be a positive int, got 0"),
    (lambda: microbatches(torch.zeros(4, 2), -2), "n_microbatches must be a positive int"),
    (lambda: microbatches(torch.zeros(4, 2), 2.0), "n_microbatches must be a positive int"),
    (lambda: microbatches(torch.zeros(0, 2), 2), r"at least one row, got shape \(0, 2\)"),
    (lambda: microbatches(torch.tensor(3.0), 1), r"at least one row, got shape \(\)"),
    (lambda: microbatches([1, 2], 2), "at least one row, got list"),
    (lambda: ring_bytes_per_rank("all_reduce", 8, 0), "world_size must be a positive int"),
    (lambda: ring_bytes_per_rank("all_reduce", 8, -2), "world_size must be a positive int"),
    (lambda: ring_bytes_per_rank("all_reduce", 8, 2.0), "world_size must be a positive int"),
    (lambda: ring_bytes_per_rank("all_reduce", 8.0, 10 ** 400), "world_size must be a positive int"),
    (lambda: ring_bytes_per_rank("all_reduce", -8, 2), "nbytes must be a non-negative, finite number"),
    (lambda: ring_bytes_per_rank("all_reduce", math.inf, 2), "nbytes must be a non-negative, finite number"),
    (lambda: ring_bytes_per_rank("all_reduce", math.nan, 2), "nbytes must be a non-negative, finite number"),
    (lambda: ring_bytes_per_rank("all_reduce", "8", 2), "nbytes must be a non-negative, finite number"),
    (lambda: ring_bytes_per_rank("all_reduce", 10 ** 400, 2), "nbytes must be a non-negative, finite number"),
    (lambda: ring_bytes_per_rank(None, 8, 2), "collective must be one of"),
    (lambda: ring_bytes_per_rank(["all_reduce"], 8, 2), "collective must be one of"),
])
def test_bad_arguments_are_named(call, match):
    """Before: TypeError ('big' * MiB compared with an int), RuntimeError from topk, OverflowError from
    ceil(inf), ZeroDivisionError from % 0 and / 0."""
    with pytest.raises(OrtlabError, match=match):
        call()


def test_good_arguments_still_give_the_formulas():
    assert assign_buckets(TENSORS, math.inf) == [[0], [1]]  # one bucket per dtype, nothing closes a bucket
    assert ring_bytes_per_rank("all_reduce", np.int64(40), np.int64(2)) == 40.0
    assert ring_bytes_per_rank("all_gather", 0, 1) == 0.0
    assert expert_capacity(10, 2, 1, 2) == 10  # ceil(1 * 10 * 2 / 2): one expert can take every token
    assert [c.tolist() for c in microbatches(torch.arange(4), 2)] == [[0, 1], [2, 3]]
    routing = route(torch.tensor([[2.0, 1.0, 0.0]]), 2, 1)
    probs = torch.softmax(torch.tensor([2.0, 1.0, 0.0]), dim=0)
    assert routing.expert.tolist() == [[0, 1]]
    assert torch.allclose(routing.gate, probs[:2] / probs[:2].sum())


def test_distributed_moe_outside_a_group_is_named():
    layer = DistributedMoE(MoE(4, 8, 2), rank=0, world_size=2)
    with pytest.raises(MoEError, match="exchanges tokens between ranks with all_to_all_single: call it inside"):
        layer(torch.ones(3, 4))


def test_errors_are_ortlab_errors():
    for error in (LaunchError, CollectiveError, DataParallelError, MoEError, PipelineError):
        assert issubclass(error, OrtlabError)

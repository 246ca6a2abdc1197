"""ortlab.distributed.data_parallel: the DDP mirror on 2 real gloo ranks, against one process and torch's DDP.

One launch (the `ranks` fixture) trains the mirror and torch's DistributedDataParallel for 3 SGD steps on
the same shards (ranks start from different weights), checks no_sync and bad use; the reference is one
process training rank 0's initial model on the global batch, computed here.
"""
import pytest
import torch
import torch.distributed as dist

from ortlab.distributed import launch
from ortlab.distributed.data_parallel import (MIB, DataParallelError, DistributedDataParallel, assign_buckets,
                                              bucket_layout, bucket_table, bucket_timeline)
from ortlab.distributed.checks.data_parallel import MLP, ddp_check, make_model, one_process_grads, train_one_process
from ortlab.errors import OrtlabError

TOL = 1e-6
WORLD, STEPS, PER_RANK, LR, SEED, CAP = 2, 3, 4, 0.1, 0, 0.0001


@pytest.fixture(scope="module")
def ranks():
    return launch(ddp_check, world_size=WORLD, args=(STEPS, PER_RANK, LR, SEED, CAP), timeout=150)


@pytest.fixture(scope="module")
def reference():
    return train_one_process(WORLD, STEPS, PER_RANK, LR, SEED)


def _max_diff(a, b):
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


# ---------------------------------------------------------------------------------------------
# Training: equal to one process on the global batch and to torch's DDP.


def test_wrapping_broadcasts_rank_0_parameters(ranks):
    rank0 = {name: p.detach() for name, p in make_model(SEED).named_parameters()}
    assert _max_diff(ranks[1]["initial"], rank0) > 0.1  # rank 1 started from other weights
    for result in ranks:
        assert _max_diff(result["wrapped"], rank0) == 0.0


def test_mirror_equals_one_process_on_the_global_batch(ranks, reference):
    for step in range(STEPS):
        mean_loss = sum(result["mirror"]["losses"][step] for result in ranks) / WORLD
        assert mean_loss == pytest.approx(reference["losses"][step], abs=TOL)
        for result in ranks:
            assert _max_diff(result["mirror"]["grads"][step], reference["grads"][step]) < TOL
            assert _max_diff(result["mirror"]["params"][step], reference["params"][step]) < TOL


def test_mirror_equals_torch_ddp(ranks, reference):
    for result in ranks:
        assert result["mirror"]["losses"] == pytest.approx(result["torch"]["losses"], abs=TOL)
        for step in range(STEPS):
            assert _max_diff(result["mirror"]["params"][step], result["torch"]["params"][step]) < TOL
            assert _max_diff(result["torch"]["params"][step], reference["params"][step]) < TOL


# ---------------------------------------------------------------------------------------------
# Buckets.


def _torch_rule(tensors, cap_mb):
    indices, _ = dist._compute_bucket_assignment_by_size(list(tensors), [int(cap_mb * MIB)])
    return [list(bucket) for bucket in indices]


def test_buckets_follow_torchs_bucketing_rule_in_reverse_order(ranks):
    named = list(MLP().named_parameters())[::-1]
    expected = [[named[i][0] for i in bucket] for bucket in _torch_rule([p for _, p in named], CAP)]
    for result in ranks:
        layout = result["layout"]
        assert [b["params"] for b in layout] == expected
        assert len(layout) == 3 and layout[0]["params"][0] == "fc3.bias"
        assert sum(b["numel"] for b in layout) == sum(p.numel() for p in MLP().parameters())


def test_buckets_equal_torch_ddps_rebuilt_buckets_from_step_2(ranks):
    for result in ranks:
        seen = result["torch"]["buckets_per_step"]
        assert len(seen) == STEPS
        assert len(seen[0]) == 1  # DDP's first iteration: one bucket, then rebuilt in ready order
        for step in range(1, STEPS):
            assert seen[step] == [b["params"] for b in result["layout"]]


def test_assign_buckets_matches_torch_on_mixed_sizes_and_dtypes():
    generator = torch.Generator().manual_seed(3)
    sizes = torch.randint(1, 400, (25,), generator=generator).tolist()
    dtypes = [torch.float32, torch.float64, torch.float16]
    tensors = [torch.zeros(n, dtype=dtypes[i % 3]) for i, n in enumerate(sizes)]
    for cap in (0.0001, 0.001, 0.01, 25):
        assert assign_buckets(tensors, cap) == _torch_rule(tensors, cap)


def test_each_bucket_is_reduced_as_soon_as_its_gradients_are_ready(ranks):
    for result in ranks:
        assert len(result["history"]) == STEPS
        names = [b["params"] for b in result["layout"]]
        for record in result["history"]:
            events = record["events"]
            launches = [e[1] for e in events if e[0] == "all_reduce"]
            assert launches == list(range(len(names)))
            assert events[-1] == ["done"]
            for index, bucket in enumerate(names):
                at = events.index(["all_reduce", index, bucket])
                grads_before = {e[1] for e in events[:at] if e[0] == "grad"}
                assert set(bucket) <= grads_before  # all its gradients were ready
                if index + 1 < len(names):  # and it went before the next bucket's gradients
                    assert not set(names[index + 1]) & grads_before


def test_bucket_table_and_timeline_text(ranks):
    table = bucket_table(ranks[0]["layout"])
    assert table.splitlines()[1].split("|")[3].strip() == "fc3.bias, fc3.weight"
    text = bucket_timeline(ranks[0]["history"][0])
    assert text.splitlines()[0] == "backward 0:"
    assert text.count("all_reduce") == 3 and text.count("grad ready") == 6


# ---------------------------------------------------------------------------------------------
# no_sync.


def test_no_sync_accumulates_locally_then_reduces_the_sum(ranks):
    full = one_process_grads(WORLD, PER_RANK, SEED)
    inside = [result["no_sync"]["mirror"][0] for result in ranks]
    assert _max_diff(inside[0], inside[1]) > 1e-3  # no all-reduce inside no_sync
    for result in ranks:
        for impl in ("mirror", "torch"):
            local, after = result["no_sync"][impl]
            assert _max_diff(after, full) < TOL
        assert _max_diff(result["no_sync"]["mirror"][0], result["no_sync"]["torch"][0]) < TOL
        assert len(result["no_sync"]["history"]) == 1  # only the synced backward reduced


# ---------------------------------------------------------------------------------------------
# Bad use.


def test_bad_use_inside_a_group(ranks):
    assert ranks[0]["hostile"] == ranks[1]["hostile"]
    found = ranks[0]["hostile"]
    assert "bucket_cap_mb must be a positive number" in found["cap"]
    assert "must be a torch.nn.Module" in found["not a module"]
    assert "['fc1.bias', 'fc1.weight'] got no gradient" in found["unused parameter"]
    assert "find_unused_parameters" in found["unused parameter"]


def test_outside_a_process_group_and_bad_arguments():
    with pytest.raises(DataParallelError, match="no process group.*launch"):
        DistributedDataParallel(MLP())
    with pytest.raises(DataParallelError, match="bucket_cap_mb must be a positive number"):
        DistributedDataParallel(MLP(), bucket_cap_mb="25")
    frozen = MLP().requires_grad_(False)
    with pytest.raises(DataParallelError, match="no parameter that requires grad"):
        DistributedDataParallel(frozen)
    with pytest.raises(DataParallelError, match="needs a DistributedDataParallel"):
        bucket_layout(MLP())
    with pytest.raises(DataParallelError, match="model.history"):
        bucket_timeline({})
    assert issubclass(DataParallelError, OrtlabError)


def test_check_table_reads_every_rank_and_flags_a_difference(ranks):
    from ortlab.distributed.checks.data_parallel import check_table

    table = check_table(ranks)
    assert [row[0] for row in table.rows] == ["ortlab DistributedDataParallel", "torch DistributedDataParallel"]
    assert all(cell == "<= 1e-06" for row in table.rows for cell in row[1:])
    assert all(cell != "<= 1e-06" for cell in check_table(ranks, lr=0.2).rows[0][2:])  # another run: seen
    with pytest.raises(OrtlabError, match="launch"):
        check_table([{"x": 1}])

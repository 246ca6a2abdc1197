"""ORT's distributed side: DDP and ORTModule wrap orders on 2 real ranks, ORT's load-balancing sampler.

One launch trains the three wrap orders (ortlab.ortmodule.distributed.wrap_order_job); the references are
plain torch in this process. The sampler needs no process group (world_size= and rank= given).
"""
import pickle

import pytest
import torch
import torch.nn.functional as F

from ortlab.distributed import launch
from ortlab.ortmodule.distributed import (
    WRAP_ORDERS, OrtDistributedError, RankLoad, fixed_sampler_class, largest_difference,
    load_balancing_batch_sampler, load_balancing_sampler, make_model, one_process_ddp, rank_batch, rank_loads,
    second_epoch_error, step_cost, token_budget_batches, train_wrapped, workload_table, wrap_order_job,
    wrap_order_table)
from ortlab.env import quiet_import

STEPS, LR, WORLD = 3, 0.1, 2
LENGTHS = [5, 1, 9, 3, 7, 2, 8, 4, 6, 10]


@pytest.fixture(scope="module")
def job():
    return launch(wrap_order_job, world_size=WORLD, args=(0, STEPS, LR), timeout=240)


def sgd(model, batches, steps=STEPS):
    """Plain torch: SGD on the concatenated batches (mean loss); each batch's loss before each step."""
    x, y = torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(steps):
        with torch.no_grad():
            losses.append([F.mse_loss(model(a), b).item() for a, b in batches])
        optimizer.zero_grad()
        F.mse_loss(model(x), y).backward()
        optimizer.step()
    return [list(per_batch) for per_batch in zip(*losses)], dict(model.named_parameters())


def assert_params_close(first, second, atol=1e-6):
    assert sorted(first) == sorted(second)
    for key in first:
        torch.testing.assert_close(first[key], second[key], atol=atol, rtol=0)


def test_plain_ddp_is_one_process(job):
    losses, params = sgd(make_model(0), [rank_batch(r) for r in range(WORLD)])
    for rank in range(WORLD):
        assert job[rank]["ddp"]["losses"] == pytest.approx(losses[rank], abs=1e-6)
        assert_params_close(job[rank]["ddp"]["params"], params)
    reference = one_process_ddp(WORLD, 0, STEPS, LR)  # ortlab's one-process helper agrees
    for found, expected in zip(reference["losses"], losses):
        assert found == pytest.approx(expected, abs=1e-6)
    assert_params_close(reference["params"], params)


def test_ddp_of_ortmodule_equals_ddp(job):
    for rank in range(WORLD):
        found, ddp = job[rank]["ddp_ortmodule"], job[rank]["ddp"]
        assert found["fell_back"] is False  # ORT ran the model (fallback disabled anyway)
        assert found["losses"] == pytest.approx(ddp["losses"], abs=1e-6)
        assert_params_close(found["params"], ddp["params"])
    assert_params_close(job[0]["ddp_ortmodule"]["params"], job[1]["ddp_ortmodule"]["params"])


def test_ortmodule_of_ddp_drifts(job):
    first, second = (job[r]["ortmodule_ddp"] for r in range(WORLD))
    assert first["fell_back"] is False and second["fell_back"] is False
    for rank in range(WORLD):
        found, ddp = job[rank]["ortmodule_ddp"]["losses"], job[rank]["ddp"]["losses"]
        assert found[0] == pytest.approx(ddp[0], abs=1e-6)  # same start
        assert abs(found[-1] - ddp[-1]) > 1e-2  # then each rank goes its own way
    assert largest_difference(first["params"], second["params"]) > 1e-2


def test_ortmodule_of_ddp_is_local_training(job):
    """No all-reduce at all: each rank's parameters are those of SGD on its own batch alone."""
    for rank in range(WORLD):
        losses, params = sgd(make_model(0), [rank_batch(rank)])
        assert job[rank]["ortmodule_ddp"]["losses"] == pytest.approx(losses[0], abs=1e-6)
        assert_params_close(job[rank]["ortmodule_ddp"]["params"], params)


def test_ort_logs_are_captured(job):
    assert job.outputs == ["", ""]
    assert any("Auto Fallback" in line and "OFF" in line for line in job[0]["log_lines"])


def test_wrap_order_table(job):
    table = wrap_order_table(job, one_process_ddp(WORLD, 0, STEPS, LR))
    assert [row[0] for row in table.rows] == ["DDP(model)", "DDP(ORTModule(model))", "ORTModule(DDP(model))"]
    assert table.header[-2:] == ("params rank 0 vs 1", "params vs one process")
    assert table.rows[0][-2] == "0.0e+00"


def test_train_wrapped_refuses_an_unknown_order():
    with pytest.raises(OrtDistributedError, match="order must be one of"):
        train_wrapped("fsdp", 0)
    assert WRAP_ORDERS == ("ddp", "ddp_ortmodule", "ortmodule_ddp")


# ---------------------------------------------------------------------------------------------
# The sampler.


def ort_data():
    return quiet_import("onnxruntime.training.utils.data")


def test_ort_sampler_fails_on_its_second_pass():
    error = second_epoch_error(LENGTHS, int)
    assert isinstance(error, ValueError)
    assert "truth value of an array with more than one element is ambiguous" in str(error)
    batch_sampler = ort_data().LoadBalancingDistributedBatchSampler(
        ort_data().LoadBalancingDistributedSampler(LENGTHS, int, world_size=2, rank=0), lambda i: [i])
    with pytest.raises(ValueError, match="truth value of an array"):
        batch_sampler.set_epoch(1)


def test_fixed_sampler_equals_a_fresh_ort_sampler_every_epoch():
    fixed = load_balancing_sampler(LENGTHS, int, world_size=2, rank=1, shuffle=True, seed=3)
    assert isinstance(fixed, ort_data().LoadBalancingDistributedSampler)
    for epoch in range(4):
        fixed.set_epoch(epoch)
        fresh = ort_data().LoadBalancingDistributedSampler(LENGTHS, int, world_size=2, rank=1, seed=3)
        fresh.set_epoch(epoch)
        assert list(fixed) == list(fresh)  # ORT's own first pass is right
    assert pickle.loads(pickle.dumps(fixed)).rank == 1


def test_sampler_deals_sorted_samples_round_robin():
    ranks = [list(load_balancing_sampler(LENGTHS, int, 2, r, shuffle=False)) for r in range(2)]
    assert sorted(ranks[0] + ranks[1]) == list(range(len(LENGTHS)))
    order = sorted(range(len(LENGTHS)), key=LENGTHS.__getitem__)
    assert ranks == [order[0::2], order[1::2]]


def test_shuffled_steps_keep_their_pairs():
    loads = [list(load_balancing_sampler(LENGTHS, int, 2, r, shuffle=True, seed=5)) for r in range(2)]
    steps = sorted(tuple(LENGTHS[i] for i in pair) for pair in zip(*loads))
    ordered = sorted(LENGTHS)
    assert steps == [tuple(ordered[i:i + 2]) for i in range(0, len(ordered), 2)]


def min_step_cost(lengths):
    """Brute force: the smallest sum over steps of the longer sample, over every pairing of samples."""
    def pairings(items):
        if not items:
            yield []
            return
        first, rest = items[0], items[1:]
        for k in range(len(rest)):
            for tail in pairings(rest[:k] + rest[k + 1:]):
                yield [(first, rest[k])] + tail
    return min(sum(max(a, b) for a, b in p) for p in pairings(list(lengths)))


def test_workload_balance_against_torch():
    loads = rank_loads(LENGTHS, world_size=2, epochs=2, shuffle=True, seed=0)
    assert all(isinstance(x, RankLoad) for x in loads) and len(loads) == 2 * 2 * 2
    for epoch in range(2):
        ort = [x for x in loads if x.sampler == "ORT LoadBalancing" and x.epoch == epoch]
        torch_loads = [x for x in loads if x.sampler.startswith("torch") and x.epoch == epoch]
        assert step_cost(ort) == min_step_cost(LENGTHS) == sum(sorted(LENGTHS)[1::2])
        assert step_cost(torch_loads) > step_cost(ort)
        sampler = torch.utils.data.DistributedSampler(LENGTHS, num_replicas=2, rank=1, seed=0)
        sampler.set_epoch(epoch)
        assert torch_loads[1].indices == list(sampler)
    unshuffled = rank_loads(LENGTHS, epochs=1, shuffle=False)
    torch_indices = [x.indices for x in unshuffled if x.sampler.startswith("torch")]
    assert torch_indices == [[0, 2, 4, 6, 8], [1, 3, 5, 7, 9]]
    table = workload_table(LENGTHS, epochs=2)
    assert len(table.rows) == 4 and "step cost" in table.header


def test_batch_sampler_across_epochs():
    budget = 12
    per_rank = []
    for rank in range(2):
        sampler = load_balancing_sampler(LENGTHS, int, 2, rank, shuffle=True, seed=1)
        batches = load_balancing_batch_sampler(sampler, token_budget_batches(LENGTHS, budget))
        epochs = []
        for epoch in range(3):
            batches.set_epoch(epoch)
            epochs.append(list(batches))
            loader = torch.utils.data.DataLoader(LENGTHS, batch_sampler=batches)
            assert [b.tolist() for b in loader] == [[LENGTHS[i] for i in b] for b in epochs[-1]]
            assert all(sum(LENGTHS[i] for i in b) <= budget or len(b) == 1 for b in epochs[-1])
        per_rank.append(epochs)
    for epoch in range(3):
        assert len(per_rank[0][epoch]) == len(per_rank[1][epoch])  # padded to the same count
        for rank in range(2):
            sampler = load_balancing_sampler(LENGTHS, int, 2, rank, shuffle=True, seed=1)
            sampler.set_epoch(epoch)
            seen = dict.fromkeys(i for b in per_rank[rank][epoch] for i in b)
            assert list(seen) == list(sampler)


def test_token_budget_batches():
    assert token_budget_batches(LENGTHS, 12)([1, 3, 0, 4, 2]) == [[1, 3, 0], [4], [2]]
    assert token_budget_batches([20, 1], 5)([0, 1]) == [[0], [1]]


def test_sampler_names_its_arguments():
    with pytest.raises(TypeError, match="num_replicas"):  # ORT's own spelling
        ort_data().LoadBalancingDistributedSampler(LENGTHS, int, num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="Default process group has not been initialized"):
        ort_data().LoadBalancingDistributedSampler(LENGTHS, int)


@pytest.mark.parametrize("kwargs,match", [
    ({"world_size": 2, "rank": 0, "num_replicas": 2}, "pass world_size= instead"),
    ({}, "no process group: pass rank= and world_size="),
    ({"world_size": 2, "rank": 2}, r"rank must be in \[0, world_size\)"),
    ({"world_size": 2.0, "rank": 0}, "world_size must be an int"),
    ({"world_size": 2, "rank": 0, "shufle": True}, "unknown option"),
])
def test_sampler_bad_input(kwargs, match):
    with pytest.raises(OrtDistributedError, match=match):
        load_balancing_sampler(LENGTHS, int, **kwargs)


def test_more_bad_input():
    with pytest.raises(OrtDistributedError, match="complexity_fn must be a function"):
        load_balancing_sampler(LENGTHS, 3, 2, 0)
    with pytest.raises(OrtDistributedError, match="map-style"):
        load_balancing_sampler(iter(LENGTHS), int, 2, 0)
    with pytest.raises(OrtDistributedError, match="empty"):
        load_balancing_sampler([], int, 2, 0)
    with pytest.raises(OrtDistributedError, match="must be a LoadBalancingDistributedSampler"):
        load_balancing_batch_sampler(torch.utils.data.SequentialSampler(LENGTHS), len)
    with pytest.raises(OrtDistributedError, match="budget must be a positive int"):
        token_budget_batches(LENGTHS, 0)
    with pytest.raises(OrtDistributedError, match="lengths must be a non-empty list"):
        rank_loads([1, -2])
    with pytest.raises(OrtDistributedError, match="name different tensors"):
        largest_difference({"a": torch.zeros(1)}, {"b": torch.zeros(1)})


def test_repr():
    sampler = load_balancing_sampler(LENGTHS, int, 2, 0)
    assert repr(sampler).startswith("FixedLoadBalancingDistributedSampler(10 samples, rank 0 of 2")
    assert fixed_sampler_class() is type(sampler)
    assert "total 25" in repr(RankLoad("x", 0, 0, [1, 3], [10, 15]))


def test_brute_force_helper():
    assert min_step_cost([1, 2, 3, 4]) == 2 + 4  # (1, 2) and (3, 4)
    assert min_step_cost([5, 5, 1, 1]) == 6

"""ortlab.distributed.moe: a mixture-of-experts layer whose experts live on 2 real gloo ranks.

One launch (the `ranks` fixture) trains, for two configurations (2 experts top-1, 4 experts top-2), the
expert-parallel layer on every rank next to the one-process MoE on the same tokens; the routing maths,
the one-process reference and bad input are checked without a process group.
"""
import ast
import math

import pytest
import torch

from ortlab.distributed import launch
from ortlab.distributed.moe import DistributedMoE, MoE, MoEError, expert_capacity, plot_routing, route, routing_table
from ortlab.distributed.checks.moe import CONFIGS, moe_check
from ortlab.errors import OrtlabError

TOL = 1e-6
WORLD, TOKENS, STEPS = 2, 12, 2


@pytest.fixture(scope="module")
def ranks():
    return launch(moe_check, world_size=WORLD, args=(CONFIGS, 8, 16, TOKENS, STEPS), timeout=150)


def _records(ranks):
    """(rank, config record, step record) for every rank, configuration and step."""
    return [(rank, config, step) for rank, configs in enumerate(ranks) for config in configs
            for step in config["steps"]]


# ---------------------------------------------------------------------------------------------
# Distributed against one process.


def test_outputs_and_input_grads_equal_one_process(ranks):
    for _, _, step in _records(ranks):
        assert step["out"] < TOL
        assert step["x_grad"] < TOL
        assert step["loss"] == pytest.approx(step["reference_loss"], abs=TOL)


def test_expert_and_router_grads_equal_one_process(ranks):
    for rank, config, step in _records(ranks):
        local = config["config"]["num_experts"] // WORLD
        experts = {name.split(".")[1] for name in step["grads"] if name.startswith("experts.")}
        assert experts == {str(rank * local + i) for i in range(local)}
        assert max(step["grads"].values()) < TOL


def test_weights_after_training_equal_one_process(ranks):
    for configs in ranks:
        for config in configs:
            assert max(config["weights"].values()) < TOL


def test_tokens_per_expert_and_drops_equal_one_process(ranks):
    for _, _, step in _records(ranks):
        assert step["tokens_per_expert"] == step["reference_tokens_per_expert"]
        assert step["dropped"] == step["reference_dropped"]


def test_each_expert_receives_what_every_rank_routed_to_it(ranks):
    for _, _, step in _records(ranks):
        assert step["exchange"]["received_per_expert"] == step["reference_received"]
        assert sum(step["exchange"]["output_splits"]) == sum(step["reference_received"])


def test_capacity_is_respected_and_overflow_is_dropped(ranks):
    drops = 0
    for _, config, step in _records(ranks):
        settings = config["config"]
        k, experts = settings["k"], settings["num_experts"]
        assert step["capacity"] == math.ceil(k * TOKENS * settings["capacity_factor"] / experts)
        assert max(step["tokens_per_expert"]) <= step["capacity"]
        assert sum(step["tokens_per_expert"]) + step["dropped"] == k * TOKENS
        wanted = step["wanted_per_expert"]
        assert step["dropped"] == sum(max(0, n - step["capacity"]) for n in wanted)
        drops += step["dropped"]
    assert drops > 0  # the capacity cut was exercised


def test_top1_drops_whole_tokens_top2_keeps_their_second_choice(ranks):
    for _, config, step in _records(ranks):
        if config["config"]["k"] == 1:
            assert step["dropped_tokens"] == step["dropped"]
        else:
            assert step["dropped_tokens"] <= step["dropped"]


def test_uneven_split_sizes_are_exercised(ranks):
    uneven = 0
    for _, _, step in _records(ranks):
        exchange = step["exchange"]
        assert len(exchange["input_splits"]) == len(exchange["output_splits"]) == WORLD
        splits_in, splits_out = exchange["input_splits"], exchange["output_splits"]
        uneven += len(set(splits_in)) > 1 or splits_in != splits_out
    assert uneven > 0
    k1 = [step["exchange"] for _, config, step in _records(ranks) if config["config"]["k"] == 1]
    assert any(len(set(e["input_splits"])) > 1 for e in k1)
    assert any(e["input_splits"] != e["output_splits"] for e in k1)


def test_split_sizes_agree_between_ranks(ranks):
    """What rank i sends to rank j is what rank j expects from rank i."""
    for config in range(len(CONFIGS)):
        for step in range(STEPS):
            exchanges = [ranks[r][config]["steps"][step]["exchange"] for r in range(WORLD)]
            for i in range(WORLD):
                for j in range(WORLD):
                    assert exchanges[i]["input_splits"][j] == exchanges[j]["output_splits"][i]


def test_routing_table_and_plot(ranks):
    per_rank = [ranks[r][0]["routing"] for r in range(WORLD)]
    table = routing_table(per_rank).splitlines()
    assert table[0].split("|")[0].strip() == "rank" and "dropped" in table[0]
    totals = [int(c) for c in table[-1].split("|")[1:]]
    experts = CONFIGS[0]["num_experts"]
    assert totals[:experts] == [sum(s["tokens_per_expert"][e] for s in per_rank) for e in range(experts)]
    assert totals[-1] == sum(s["dropped"] for s in per_rank)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ax = plot_routing(per_rank)
    assert len(ax.patches) == experts * WORLD
    plt.close(ax.figure)


def test_repr_names_the_rank_experts(ranks):
    assert "experts 2..3 of 4 on rank 1/2" in ranks[1][1]["repr"]


# ---------------------------------------------------------------------------------------------
# Routing maths and the one-process reference, without ranks.


def test_capacity_formula():
    assert expert_capacity(12, 4, 2, 1.0) == 6
    assert expert_capacity(10, 4, 1, 1.25) == math.ceil(10 * 1.25 / 4)
    assert expert_capacity(1, 8, 1, 1.0) == 1


def test_second_choices_queue_after_all_first_choices():
    # token 0 prefers e0, token 1 prefers e1, token 2 prefers e0; k=2 on 2 experts, capacity 2.
    logits = torch.tensor([[2.0, 0.0], [0.0, 1.0], [1.0, 0.5]])
    routing = route(logits, k=2, capacity=2)
    assert routing.expert.tolist() == [[0, 1], [1, 0], [0, 1]]
    # e0: first choices of tokens 0, 2 -> slots 0, 1; then token 1's second choice -> slot 2 (dropped)
    # e1: first choice of token 1 -> slot 0; then second choices of tokens 0, 2 -> slots 1, 2
    assert routing.position.tolist() == [[0, 1], [0, 2], [1, 2]]
    assert routing.kept.tolist() == [[True, True], [True, False], [True, False]]
    assert routing.dropped == 2 and routing.dropped_tokens == 0
    assert routing.tokens_per_expert() == [2, 2]
    probs = torch.softmax(logits, -1).sort(dim=-1, descending=True).values
    torch.testing.assert_close(routing.gate, probs)  # two experts: the renormalised top-2 is softmax itself


def test_top1_gate_is_the_router_probability_and_overflow_drops_tokens():
    logits = torch.tensor([[3.0, 0.0, 0.0]] * 4 + [[0.0, 2.0, 0.0]])
    routing = route(logits, k=1, capacity=2)
    assert routing.kept.reshape(-1).tolist() == [True, True, False, False, True]
    assert routing.dropped == routing.dropped_tokens == 2
    torch.testing.assert_close(routing.gate[:, 0], torch.softmax(logits, -1).max(-1).values)
    probs = torch.softmax(logits, -1)
    first = torch.tensor([4 / 5, 1 / 5, 0.0])
    torch.testing.assert_close(routing.aux_loss, 3 * (first * probs.mean(0)).sum())


@pytest.mark.parametrize("k", [1, 2])
def test_moe_with_room_for_everything_is_the_gated_sum_of_experts(k):
    torch.manual_seed(1)
    moe = MoE(6, 10, num_experts=4, k=k, capacity_factor=100.0)
    x = torch.randn(2, 5, 6)
    out = moe(x)
    tokens = x.reshape(-1, 6)
    probs = torch.softmax(tokens @ moe.router.weight.T, -1)
    expected = []
    for t in range(tokens.shape[0]):
        top_p, top_e = probs[t].topk(k)
        gates = top_p / top_p.sum() if k == 2 else top_p
        expected.append(sum(g * moe.experts[int(e)](tokens[t]) for g, e in zip(gates, top_e)))
    torch.testing.assert_close(out, torch.stack(expected).reshape(x.shape), rtol=1e-5, atol=1e-6)
    assert moe.last_routing.dropped == 0


def test_dropped_token_gets_zero_output():
    torch.manual_seed(2)
    moe = MoE(4, 8, num_experts=2, k=1, capacity_factor=0.25)
    out = moe(torch.randn(8, 4))
    dropped = ~moe.last_routing.kept[:, 0]
    assert dropped.sum() == moe.last_routing.dropped > 0
    assert out[dropped].abs().max() == 0


def test_reprs():
    moe = MoE(4, 8, num_experts=4, k=2)
    assert "experts=4, k=2" in repr(moe)
    assert "experts 0..1 of 4 on rank 0/2" in repr(DistributedMoE(moe, rank=0, world_size=2))
    moe(torch.randn(3, 4))
    assert "capacity=" in repr(moe.last_routing)


@pytest.mark.parametrize("kwargs, words", [
    ({"k": 3}, "k must be 1 (Switch) or 2 (GShard)"),
    ({"k": 0}, "k must be a positive int"),
    ({"k": True}, "k must be a positive int"),
    ({"k": 2, "num_experts": 1}, "need at least 2 experts"),
    ({"capacity_factor": 0}, "capacity_factor must be a positive finite number"),
    ({"capacity_factor": -1.0}, "capacity_factor must be a positive finite number"),
    ({"capacity_factor": float("nan")}, "capacity_factor must be a positive finite number"),
    ({"capacity_factor": float("inf")}, "capacity_factor must be a positive finite number"),
    ({"capacity_factor": "1.0"}, "capacity_factor must be a positive finite number"),
    ({"num_experts": 2.0}, "num_experts must be a positive int"),
])
def test_bad_settings_are_refused(kwargs, words):
    settings = {"d_model": 4, "d_hidden": 8, "num_experts": 4, **kwargs}
    with pytest.raises(MoEError) as info:
        MoE(**settings)
    assert words in str(info.value) and isinstance(info.value, OrtlabError)


@pytest.mark.parametrize("x, words", [
    (torch.randn(3, 5), "shape (..., 4)"),
    (torch.randn(4), "shape (..., 4)"),
    (torch.randn(0, 4), "at least one token"),
    (torch.ones(3, 4, dtype=torch.int64), "floating-point"),
    (torch.tensor([[1.0, float("nan"), 0.0, 0.0]]), "NaN or inf"),
    ([[1.0, 2.0, 3.0, 4.0]], "must be a torch.Tensor"),
])
def test_bad_input_is_refused(x, words):
    with pytest.raises(MoEError) as info:
        MoE(4, 8, num_experts=2)(x)
    assert words in str(info.value)


@pytest.mark.parametrize("build, words", [
    (lambda: DistributedMoE(MoE(4, 8, num_experts=3), rank=0, world_size=2),
     "num_experts (3) is not divisible"),
    (lambda: DistributedMoE(MoE(4, 8, num_experts=2), rank=2, world_size=2),
     "rank must be in [0, world_size)"),
    (lambda: DistributedMoE(MoE(4, 8, num_experts=2), rank=True, world_size=2), "rank must be an int"),
    (lambda: DistributedMoE(torch.nn.Linear(4, 4), rank=0, world_size=2), "built from an ortlab MoE"),
    (lambda: DistributedMoE(MoE(4, 8, num_experts=2)), "no process group"),
])
def test_bad_distributed_layer_is_refused(build, words):
    with pytest.raises(MoEError) as info:
        build()
    assert words in str(info.value)


def test_zero_split_sizes_work(ranks):
    """A router of zeros: every token ties, all go to one expert (capacity 6 of 12 kept), so one rank
    sends the other nothing and the other rank receives nothing."""
    zero = [ranks[r][2]["steps"][0] for r in range(WORLD)]
    assert CONFIGS[2].get("zero_router")
    splits = [step["exchange"]["input_splits"] for step in zero]
    assert splits[0] == splits[1] and sorted(splits[0]) == [0, TOKENS // 2]
    idle = splits[0].index(0)
    assert zero[idle]["exchange"]["output_splits"] == [0, 0]
    assert zero[idle]["exchange"]["received_per_expert"] == [0]
    assert all(step["dropped"] == TOKENS // 2 for step in zero)
    for step in zero:
        assert step["out"] < TOL and step["x_grad"] < TOL and max(step["grads"].values()) < TOL


def test_all_to_all_calls_per_step(ranks):
    """Forward: the counts, the dispatch and the combine; backward: the two reverse exchanges."""
    for _, _, step in _records(ranks):
        assert step["all_to_all_calls"] == {"forward": 3, "backward": 2}


def test_check_table_reads_every_rank_and_flags_a_difference(ranks):
    from ortlab.distributed.checks.moe import check_table

    table = check_table(ranks)
    assert len(table.rows) == len(ranks[0])
    assert all(cell == "<= 1e-06" for row in table.rows for cell in row[1:5])
    assert all(row[5] == "yes" for row in table.rows)
    sent = [ast.literal_eval(row[6]) for row in table.rows]
    assert sent == [rec["steps"][0]["exchange"]["input_splits"] for rec in ranks[0]]
    assert any(len(set(s)) > 1 for s in sent)  # uneven splits are really exercised
    spoiled = [[{**rec, "steps": [{**s, "tokens_per_expert": [0] * len(s["tokens_per_expert"])}
                                  for s in rec["steps"]]} for rec in r] for r in ranks]
    assert all(row[5] == "NO" for row in check_table(spoiled).rows)
    with pytest.raises(OrtlabError, match="launch"):
        check_table([{"x": 1}])


@pytest.mark.parametrize("args,match", [((10, 0, 1, 1.0), "num_experts must be a positive int"),
                                        ((10, 2, 0, 1.0), "k must be a positive int"),
                                        ((-1, 2, 1, 1.0), "num_tokens must be a non-negative int"),
                                        ((10, 2, 1, 0.0), "capacity_factor must be a positive number"),
                                        ((10, 2, 1, "1"), "capacity_factor must be a positive number")])
def test_expert_capacity_bad_input(args, match):
    from ortlab.distributed.moe import MoEError, expert_capacity

    with pytest.raises(MoEError, match=match):
        expert_capacity(*args)

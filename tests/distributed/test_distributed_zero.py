"""ZeRO 1/2/3 on 2 ranks: equal to one process with torch.optim.Adam and to the stock implementations (DDP,
ZeroRedundancyOptimizer, FSDP1); measured memory equal to the ZeRO paper's partitions; counted bytes equal
to the papers' volumes (ZeRO-1: reduce-scatter + all-gather, 2 Psi; torch's ZeRO-1 under DDP: 3 Psi);
stage 1's gradients after step; the calculator against the paper's figure 1; bad input."""
import math

import matplotlib
import pytest
import torch
import torch.distributed as dist
from torch import nn

from ortlab.distributed import launch
from ortlab.distributed.accounting import (AccountingError, CommCounter, MemoryReport, calculator,
                                           calculator_table, comm_volume, count_torch_collectives,
                                           measure_memory, memory_formula, measured_table, plot_memory)
from ortlab.distributed.zero import FlatLayout, ZeroError, zero
from ortlab.distributed.checks.zero import TECHNIQUES, TiedToyModel, toy_batch, toy_model, zero_check
from ortlab.errors import OrtlabError

matplotlib.use("Agg")

WORLD, STEPS, LR = 2, 3, 0.05
STOCK = {1: "torch_zero1", 2: "fsdp_shard_grad_op", 3: "fsdp_full_shard"}


@pytest.fixture(scope="module")
def runs():
    """One 2-rank job training every technique (ortlab zero1/2/3, DDP, ZeroRedundancyOptimizer, FSDP1)."""
    return launch(zero_check, world_size=WORLD, args=(TECHNIQUES, STEPS, LR), timeout=300)


@pytest.fixture(scope="module")
def reference():
    """One process, torch.optim.Adam on the whole global batch, from the same weights."""
    model = toy_model(0)
    tokens, targets = toy_batch(WORLD)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=LR)
    losses = []
    for _ in range(STEPS):
        loss = model(tokens, targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses, {name: p.detach() for name, p in model.named_parameters()}


def psi():
    return sum(p.numel() for p in TiedToyModel().parameters() if p.requires_grad)


def test_toy_model_has_what_sharding_must_handle():
    model = TiedToyModel()
    assert model.head.weight is model.emb.weight
    assert "head.weight" not in dict(model.named_parameters())
    assert psi() % WORLD == 1  # does not divide by the world size
    assert any(not p.requires_grad for p in model.parameters()) and len(list(model.buffers())) == 1


@pytest.mark.parametrize("technique", TECHNIQUES)
def test_equal_to_one_process_adam(runs, reference, technique):
    ref_losses, ref_params = reference
    mean_losses = [sum(r[technique]["losses"][i] for r in runs) / WORLD for i in range(STEPS)]
    assert max(abs(a - b) for a, b in zip(mean_losses, ref_losses)) < 1e-6
    for rank in range(WORLD):
        params = runs[rank][technique]["params"]
        assert sorted(params) == sorted(ref_params)  # tied weight once, frozen parameter present
        for name, value in ref_params.items():
            assert torch.allclose(params[name], value, atol=1e-6, rtol=0), (technique, rank, name)


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_equal_to_stock_implementation(runs, stage):
    ours, stock = runs[0][f"zero{stage}"], runs[0][STOCK[stage]]
    assert max(abs(a - b) for a, b in zip(ours["losses"], stock["losses"])) < 1e-6
    for name, value in stock["params"].items():
        assert (ours["params"][name] - value).abs().max().item() < 1e-6


def test_stage3_accumulation_and_no_grad_forward(runs):
    model = toy_model(0)
    tokens, targets = toy_batch(WORLD)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=LR)
    model(tokens, targets).backward()
    optimizer.step()
    with torch.no_grad():
        loss = model(tokens, targets).item()
    for rank in range(WORLD):
        extras = runs[rank]["extras"]
        for name, value in model.named_parameters():
            assert (extras["params"][name] - value).abs().max().item() < 1e-6, name
        assert abs(extras["eval_loss"] - loss) < 1e-6
        assert extras["after_eval"] == 0  # the gathered buffer was freed after the no_grad forward
        assert "stage=3" in extras["repr"] and f"rank={rank}/2" in extras["repr"]
        assert "did not accept" in extras["bad_kwarg"] and "momentum" in extras["bad_kwarg"]


def test_parameters_moved(runs, reference):
    _, ref_params = reference
    start = dict(toy_model(0).named_parameters())
    assert (ref_params["emb.weight"] - start["emb.weight"]).abs().max() > 0.05
    assert torch.equal(ref_params["scale"], start["scale"])  # frozen


def _expected_memory(stage, numel, world):
    """Bytes per rank by the paper's partitions for fp32 Adam (4 + 4 + 8 bytes per element), Psi padded."""
    shard = numel / world
    return {"params": 4 * (shard if stage == 3 else numel), "grads": 4 * (shard if stage >= 2 else numel),
            "state": 8 * (shard if stage >= 1 else numel)}


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_zero_memory_equals_formula_partition(runs, stage):
    padded = math.ceil(psi() / WORLD) * WORLD
    expected = _expected_memory(stage, padded, WORLD)
    for rank in range(WORLD):
        memory = runs[rank][f"zero{stage}"]["memory"]
        assert {k: memory[k] for k in expected} == expected
        assert memory["step_bytes"] == 4  # one Adam step counter over the one shard parameter
        assert memory["other_bytes"] == (5 + 4 * 5) * 4  # frozen scale and buffer, whole on every rank
    formula = memory_formula(padded, WORLD, stage, "fp32")
    assert {k: formula[k] for k in expected} == expected


def test_ddp_memory_is_unpartitioned(runs):
    memory = runs[0]["ddp"]["memory"]
    assert (memory["params"], memory["grads"], memory["state"]) == (4 * psi(), 4 * psi(), 8 * psi())


def test_stock_memory(runs):
    # ZeroRedundancyOptimizer splits whole parameters (uneven), keeps full params and grads
    z = [runs[r]["torch_zero1"]["memory"] for r in range(WORLD)]
    assert all(m["params"] == m["grads"] == 4 * psi() for m in z)
    assert sum(m["state"] for m in z) == 8 * psi()
    # FSDP1 shards params, grads and state (its flat parameters also hold the frozen one, and pad)
    for name in ("fsdp_shard_grad_op", "fsdp_full_shard"):
        m = runs[0][name]["memory"]
        assert m["params"] == m["grads"] < 4 * psi() and m["state"] < 8 * psi()


def _volume(step):
    factor = {"all_reduce": 2, "reduce_scatter": 1, "all_gather": 1, "broadcast": 1}
    return sum(factor[k] * n for k, n in step.items())


def test_communication_equals_papers_volumes(runs):
    numel, padded = psi(), math.ceil(psi() / WORLD) * WORLD
    for rank in range(WORLD):
        result = runs[rank]
        for technique in TECHNIQUES:
            steps = result[technique]["comm"]
            assert len(steps) == STEPS and all(s == steps[0] for s in steps), technique
        assert result["ddp"]["comm"][0] == {"all_reduce": 4 * numel}
        assert result["zero1"]["comm"][0] == {"reduce_scatter": 4 * padded, "all_gather": 4 * padded}
        assert result["zero2"]["comm"][0] == {"reduce_scatter": 4 * padded, "all_gather": 4 * padded}
        assert result["zero3"]["comm"][0] == {"all_gather": 8 * padded, "reduce_scatter": 4 * padded}
        assert result["torch_zero1"]["comm"][0] == {"all_reduce": 4 * numel, "broadcast": 4 * numel}
    volumes = {t: _volume(runs[0][t]["comm"][0]) for t in TECHNIQUES}
    assert volumes["ddp"] == 2 * 4 * numel
    assert volumes["zero2"] == 2 * 4 * padded
    assert volumes["zero3"] == 3 * 4 * padded
    assert volumes["zero1"] == 2 * 4 * padded  # the paper's P_os: the same volume as DDP
    assert volumes["torch_zero1"] == 3 * 4 * numel  # DDP all-reduces (2 Psi) before the broadcasts (Psi)
    assert comm_volume(numel, 0) == volumes["ddp"] and comm_volume(padded, 3) == volumes["zero3"]
    assert comm_volume(padded, 1) == volumes["zero1"] == comm_volume(padded, 2)
    assert comm_volume(numel, 1, stage1_all_reduce=True) == volumes["torch_zero1"]
    assert comm_volume(numel, 2, stage1_all_reduce=True) == comm_volume(numel, 2)
    with pytest.raises(AccountingError, match="stage1_all_reduce must be True"):
        comm_volume(numel, 1, stage1_all_reduce="yes")


def test_stage1_call_structure(runs):
    # one reduce-scatter of the full flat gradient, then one all-gather of the full flat parameters, per step
    padded = math.ceil(psi() / WORLD) * WORLD
    for rank in range(WORLD):
        calls = runs[rank]["zero1"]["calls"]
        kinds = ("reduce_scatter", "all_gather")
        assert calls == [(step, kind, padded) for step in range(STEPS) for kind in kinds]
        assert [kind for _, kind, _ in runs[rank]["torch_zero1"]["calls"]].count("all_reduce") >= STEPS


def test_stage1_grads_after_step(runs):
    # own shard: the gradient averaged over ranks (= one process on the whole batch); the rest: this rank's
    tokens, targets = toy_batch(WORLD)
    padded = math.ceil(psi() / WORLD) * WORLD
    shard = padded // WORLD

    def flat_grad(rows):
        model = toy_model(0)
        model(tokens[rows], targets[rows]).backward()
        grads = [p.grad.reshape(-1) for p in model.parameters() if p.requires_grad]
        return torch.cat(grads + [torch.zeros(padded - psi())])

    whole = flat_grad(slice(0, 2 * WORLD))
    for rank in range(WORLD):
        local = flat_grad(slice(2 * rank, 2 * rank + 2))
        grad = runs[rank]["extras"]["stage1_grad"]
        own = torch.zeros(padded, dtype=torch.bool)
        own[rank * shard:(rank + 1) * shard] = True
        assert torch.allclose(grad[own], whole[own], atol=1e-6, rtol=0)
        assert torch.allclose(grad[~own], local[~own], atol=1e-6, rtol=0)
        assert not torch.allclose(local, whole, atol=1e-3)  # the two are told apart
        assert runs[rank]["extras"]["stage1_shares_storage"]  # shard_param.grad is a view: grads held once


def test_fsdp_volumes(runs):
    sgo = runs[0]["fsdp_shard_grad_op"]
    full = runs[0]["fsdp_full_shard"]
    # SHARD_GRAD_OP: one all-gather forward, one reduce-scatter: 2 Psi (FSDP pads each unit)
    assert sgo["comm"][0]["all_gather"] == sgo["comm"][0]["reduce_scatter"] >= 4 * psi()
    # FULL_SHARD: the non-root units are gathered again for backward; the root unit is not freed after forward
    step = [(kind, n) for s, kind, n in full["calls"] if s == 1]
    gathers = [n for kind, n in step if kind == "all_gather"]
    scatters = [n for kind, n in step if kind == "reduce_scatter"]
    root = gathers[0]
    assert sorted(gathers) == sorted(scatters + [n for n in scatters if n != root])


def test_setup_is_not_a_step():
    counter = CommCounter(2)
    counter.record("broadcast", 10)
    counter.mark_setup()
    counter.record("all_reduce", 3, 4)
    counter.next_step()
    assert counter.setup == {"broadcast": 40} and counter.bytes() == {"all_reduce": 12}
    assert counter.volume() == 24 and counter.sent() == 12
    assert "steps=1" in repr(counter)
    with pytest.raises(AccountingError, match="kind must be one of"):
        counter.record("gather", 3)
    with pytest.raises(AccountingError, match="no step was counted"):
        CommCounter().bytes()


def test_count_torch_collectives_restores_functions():
    originals = (dist.all_reduce, dist.all_gather, dist.reduce_scatter_tensor)
    with count_torch_collectives(CommCounter()):
        assert dist.all_reduce is not originals[0]
    assert (dist.all_reduce, dist.all_gather, dist.reduce_scatter_tensor) == originals


def test_calculator_matches_paper_figure_1():
    # ZeRO paper, figure 1: Psi = 7.5B, N_d = 64, K = 12: 120 GB, 31.4 GB, 16.6 GB, 1.88 GB per device
    totals = [calculator(7.5e9, 64, stage)["total_gb"] for stage in range(4)]
    assert [round(t, 1) for t in totals[:3]] == [120.0, 31.4, 16.6] and round(totals[3], 2) == 1.88
    c = calculator(7e9, 64, 3, bandwidth_gb_s=100)
    assert c["kind"].startswith("arithmetic") and c["comm_volume_gb"] == pytest.approx(3 * 2 * 7)
    assert c["comm_seconds"] == pytest.approx(42 * 63 / 64 / 100)
    table = calculator_table(7e9, 64, bandwidth_gb_s=100)
    assert [r[0] for r in table.rows] == ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3"]
    assert "comm s / step" in table.header
    assert plot_memory(7e9).get_ylabel() == "GB per rank"


def test_measured_table(runs):
    techniques = ("ddp", "zero1", "zero2", "zero3", "torch_zero1")
    results = {t: runs[0][t] | {"comm": runs[0][t]["comm"][0]} for t in techniques}
    table = measured_table(results, psi(), WORLD)
    column = table.header.index("in Psi")
    assert [r[column] for r in table.rows] == ["2.00", f"{2 * 92 / 91:.2f}", f"{2 * 92 / 91:.2f}",
                                               f"{3 * 92 / 91:.2f}", "3.00"]
    notes = dict(zip(techniques, [r[table.header.index("note")] for r in table.rows]))
    assert notes["zero1"] == f"reduce-scatter {92 / 91:.2f} + all-gather {92 / 91:.2f}"
    assert notes["torch_zero1"] == "all-reduce 2.00 + broadcast 1.00 (DDP all-reduces first)"
    assert notes["ddp"] == "all-reduce 2.00"  # DDP all-reduces too: no ZeRO flag
    assert "zero3" in repr(table)


def test_flat_layout():
    model = TiedToyModel()
    named = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    layout = FlatLayout(named, 2)
    assert (layout.numel, layout.padded, layout.shard) == (91, 92, 46)
    assert layout.shard_range(1) == (46, 92) and layout.owners("emb.weight") == [0]
    # emb.weight is elements 0-34, fc1.weight 35-54: the shard boundary (46) cuts it in two
    assert layout.owners("fc1.weight") == [0, 1] and layout.owners("fc1.bias") == [1]
    flat = layout.flatten([p.detach() for _, p in named])
    assert flat[-1] == 0 and all(torch.equal(v, p) for v, (_, p) in zip(layout.views(flat), named))
    assert "padded=92" in repr(layout)


def test_memory_report_and_measure():
    model = nn.Linear(3, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    report = measure_memory(model, optimizer)
    assert (report.params, report.grads, report.state, report.step_bytes) == (32, 32, 64, 8)
    assert report.total == 128 and "total=128" in repr(report)
    assert isinstance(MemoryReport(1, 2, 3).as_dict(), dict)
    with pytest.raises(AccountingError, match="torch.nn.Module"):
        measure_memory("model", optimizer)
    with pytest.raises(AccountingError, match="torch optimizer"):
        measure_memory(model, object())


@pytest.mark.parametrize("stage", [4, 0, True, "1", None])
def test_bad_stage(stage):
    with pytest.raises(ZeroError, match="stage must be 1"):
        zero(TiedToyModel(), torch.optim.Adam, stage)


@pytest.mark.parametrize("optimizer_class", [torch.optim.Adam([nn.Parameter(torch.ones(1))]), "Adam",
                                             lambda params: torch.optim.Adam(params), nn.Linear])
def test_optimizer_class_must_be_a_class(optimizer_class):
    with pytest.raises(ZeroError, match="optimizer_class must be a torch.optim.Optimizer subclass"):
        zero(TiedToyModel(), optimizer_class, 1)


def test_bad_model_and_no_process_group():
    assert not dist.is_initialized()
    with pytest.raises(ZeroError, match="torch.nn.Module"):
        zero("model", torch.optim.Adam, 1)
    frozen = nn.Linear(2, 2).requires_grad_(False)
    with pytest.raises(ZeroError, match="no trainable parameters"):
        zero(frozen, torch.optim.Adam, 1)
    with pytest.raises(ZeroError, match="one dtype") as info:
        zero(nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2).double()), torch.optim.Adam, 1)
    assert isinstance(info.value, OrtlabError)
    with pytest.raises(ZeroError, match="ortlab.distributed.launch"):
        zero(TiedToyModel(), torch.optim.Adam, 2, lr=0.1)


@pytest.mark.parametrize("bad", [dict(numel=0), dict(world_size=True), dict(stage=5), dict(precision="fp8")])
def test_calculator_bad_input(bad):
    args = dict(numel=7e9, world_size=64, stage=3, precision="mixed") | bad
    with pytest.raises(AccountingError):
        calculator(args["numel"], args["world_size"], args["stage"], args["precision"])


def test_check_table_and_measured_table_read_the_launch_results(runs):
    from ortlab.distributed.checks.zero import check_table

    table = check_table(runs, steps=STEPS, lr=LR)
    assert [row[0] for row in table.rows] == list(TECHNIQUES)
    assert all(row[2] == row[3] == "<= 1e-06" for row in table.rows)  # against one-process torch Adam
    wrong_lr = check_table(runs, steps=STEPS, lr=LR * 2)  # a reference that is not this run: seen, not hidden
    assert any(row[3] != "<= 1e-06" for row in wrong_lr.rows)
    last = {t: runs[0][t] | {"comm": runs[0][t]["comm"][-1]} for t in TECHNIQUES}
    assert measured_table(runs).rows == measured_table(last, psi(), WORLD).rows
    for bad in ([], [{"x": 1}], "runs"):
        with pytest.raises(OrtlabError, match="launch"):
            measured_table(bad) if bad != "runs" else check_table(bad)


def test_an_optimizer_instance_is_named_by_its_type_not_its_repr():
    model = torch.nn.Linear(2, 2)
    with pytest.raises(ZeroError, match=r"got an instance of Adam; pass its arguments") as info:
        zero(model, torch.optim.Adam(model.parameters()), 1)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("bad", [-5, 0, "7e9", None])
def test_calculator_names_its_own_argument(bad):
    with pytest.raises(AccountingError, match=r"params \(the model's parameter count\) must be a positive"):
        calculator(bad, 64, 3)

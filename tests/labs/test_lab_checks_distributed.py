"""lab07's checks on 2 real ranks: right answers pass; typical wrong ones (forgot to divide, chunks in the
wrong order, the whole buffer updated instead of the shard, both ranks sending first, a rank that raises) get
feedback naming the rank, the parameter or chunk and the size of the difference. The answers here are written
independently of the solution notebook's; a few jobs of several exercises each keep the file fast."""
import pytest
import torch
import torch.distributed as dist

from ortlab.labs import lab07, rank_jobs
from ortlab.labs.judges import lab07 as judge07


# --- right answers ---------------------------------------------------------------------------------

def ring_right(tensor):
    """Ring all-reduce with a blocking send on even ranks first and odd ranks receiving first."""
    rank, world = dist.get_rank(), dist.get_world_size()
    chunks = list(torch.tensor_split(tensor.view(-1), world))
    right, left = (rank + 1) % world, (rank - 1) % world

    def exchange(out, into):
        if rank % 2 == 0:
            dist.send(out.clone(), right)
            dist.recv(into, left)
        else:
            dist.recv(into, left)
            dist.send(out.clone(), right)

    for step in range(world - 1):  # reduce-scatter
        out, into = chunks[(rank - step) % world], chunks[(rank - step - 1) % world]
        incoming = torch.empty_like(into)
        exchange(out, incoming)
        into += incoming
    for step in range(world - 1):  # all-gather
        out, into = chunks[(rank - step + 1) % world], chunks[(rank - step) % world]
        exchange(out, into)
    return tensor


def average_right(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()


def zero_right(flat, grad, state):
    world = dist.get_world_size()
    shard = torch.empty(flat.numel() // world)
    dist.reduce_scatter_tensor(shard, grad)
    shard /= world
    start, end = lab07.shard_range(flat.numel(), dist.get_rank(), world)
    lab07.adam_update(flat[start:end], shard, state)
    mine = flat[start:end].clone()
    dist.all_gather_into_tensor(flat, mine)


# --- wrong answers ---------------------------------------------------------------------------------

def ring_swap(tensor):
    """Not a ring: each rank sends its whole tensor to the other."""
    other = torch.empty_like(tensor)
    request = dist.isend(tensor.clone(), 1 - dist.get_rank())
    dist.recv(other, 1 - dist.get_rank())
    request.wait()
    tensor += other


def ring_chunks_reversed(tensor):
    ring_right(tensor)
    tensor.copy_(torch.cat(list(torch.tensor_split(tensor, dist.get_world_size()))[::-1]))


def ring_with_all_reduce(tensor):
    dist.all_reduce(tensor)
    return tensor


def ring_raises_on_rank_1(tensor):
    if dist.get_rank() == 1:
        raise ValueError("boom")
    ring_right(tensor)


def ring_both_send_first(tensor):
    other = torch.empty_like(tensor)
    dist.send(tensor, 1 - dist.get_rank())
    dist.recv(other, 1 - dist.get_rank())
    tensor += other


def average_no_divide(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def average_nothing(model):
    pass


def average_with_avg(model):
    for p in model.parameters():
        dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)


def zero_whole_buffer(flat, grad, state):
    dist.all_reduce(grad)
    grad /= dist.get_world_size()
    lab07.adam_update(flat, grad, state)


def zero_wrong_shard(flat, grad, state):
    world = dist.get_world_size()
    dist.all_reduce(grad)
    grad /= world
    start, end = lab07.shard_range(flat.numel(), world - 1 - dist.get_rank(), world)
    mine = flat[start:end].clone()
    lab07.adam_update(mine, grad[start:end], state)
    dist.all_gather_into_tensor(flat, mine)


def zero_no_divide(flat, grad, state):
    world = dist.get_world_size()
    dist.all_reduce(grad)
    start, end = lab07.shard_range(flat.numel(), dist.get_rank(), world)
    mine = flat[start:end].clone()
    lab07.adam_update(mine, grad[start:end], state)
    dist.all_gather_into_tensor(flat, mine)


# --- the jobs: one launch each, many asserts --------------------------------------------------------

JOBS = {
    "right": dict(ring_all_reduce=ring_right, average_gradients=average_right, zero1_step=zero_right),
    "b": dict(ring_all_reduce=ring_swap, average_gradients=average_no_divide, zero1_step=zero_whole_buffer),
    "c": dict(ring_all_reduce=ring_chunks_reversed, average_gradients=average_nothing,
              zero1_step=zero_wrong_shard),
    "d": dict(ring_all_reduce=ring_with_all_reduce, average_gradients=average_right,
              zero1_step=zero_no_divide),
    "raise": dict(ring_all_reduce=ring_raises_on_rank_1, average_gradients=average_with_avg),
    "avg": dict(average_gradients=average_with_avg, zero1_step=zero_right),
}


@pytest.fixture(scope="module")
def verdicts():
    """Three jobs: the sets that run through share one; each set that stops a job has its own."""
    found = dict(zip(["right", "b", "c", "d"], judge07.run_many([JOBS[k] for k in ("right", "b", "c", "d")])))
    found["raise"] = judge07.run_checks(**JOBS["raise"])
    found["avg"] = judge07.run_checks(**JOBS["avg"])
    return found


def verdict(verdicts, job, exercise):
    result = verdicts[job][exercise]
    return result.status, result.message


def test_right_answers_pass(verdicts):
    assert [r.status for r in verdicts["right"].values()] == ["pass"] * 3, verdicts["right"]


@pytest.mark.parametrize("job, exercise, words", [
    ("b", "ring_all_reduce", ["rank 0", "sent 1 message(s), 10 elements", "2(N-1) = 2 messages"]),
    ("c", "ring_all_reduce", ["rank 0", "tensor of 10 elements", "holds the sum of chunk", "wrong order",
                              "largest difference"]),
    ("d", "ring_all_reduce", ["called dist.all_reduce", "send / dist.recv"]),
    ("b", "average_gradients", ["rank 0, step 0", "'fc1.weight'", "2x the one-process", "divide the SUM"]),
    ("c", "average_gradients", ["rank 0, step 0", "'fc1.weight'", "own micro-batch"]),
    ("b", "zero1_step", ["rank 0, step 0", "adam_update got 66 elements",
                         "its shard (33 elements, flat [0, 33))"]),
    ("c", "zero1_step", ["rank 0, step 0", "updated rank 1's shard (flat [33, 66))"]),
    ("d", "zero1_step", ["rank 0, step 0", "2x the average", "divide"]),
])
def test_wrong_answers_name_the_rank_and_what_differs(verdicts, job, exercise, words):
    status, message = verdict(verdicts, job, exercise)
    assert status == "fail" and all(w in message for w in words), message
    assert verdicts[job]["average_gradients"].status == "pass" or job != "d"


def test_a_rank_that_raises_is_named_and_the_rest_is_not_checked(verdicts):
    status, message = verdict(verdicts, "raise", "ring_all_reduce")
    assert status == "fail", message
    assert message.startswith("rank 1: your ring_all_reduce raised ValueError: boom"), message
    assert "raise ValueError" in message  # the learner's line
    status, message = verdict(verdicts, "raise", "average_gradients")
    assert status == "not done" and "stopped at ring_all_reduce" in message


def test_gloo_has_no_avg_and_the_feedback_says_sum_then_divide(verdicts):
    status, message = verdict(verdicts, "avg", "average_gradients")
    assert status == "fail" and "Cannot use ReduceOp.AVG with Gloo" in message, message
    assert "SUM, then divide by the world size" in message
    assert verdicts["avg"]["zero1_step"].status == "not done"


def test_both_ranks_sending_first_hangs_and_the_feedback_asks_about_the_order():
    result = judge07.run_checks(ring_all_reduce=ring_both_send_first, timeout=20)["ring_all_reduce"]
    assert result.status == "fail", result
    assert "did not finish ring_all_reduce within 20 s" in result.message
    assert "same collectives in the same order" in result.message
    # where it waited, in the learner's code
    assert "dist.send(tensor, 1 - dist.get_rank())" in result.message


# --- shipping functions to the ranks: no launch ----------------------------------------------------

SCALES = [1.0]


def uses_list(tensor):
    return tensor * SCALES[0]


def notebook_cell(source, namespace):
    """Run `source` as a Jupyter cell does: module __main__, a file name only linecache knows."""
    import linecache

    name = f"/tmp/ipykernel_0/{abs(hash(source))}.py"
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    exec(compile(source, name, "exec"), namespace)
    return namespace


def test_job_source_carries_imports_constants_and_helpers():
    cell = notebook_cell("import torch\nimport torch.distributed as dist\nfrom ortlab.labs import lab07\n"
                         "SCALE = 3\n\ndef helper(x):\n    return x * SCALE\n\n"
                         "def ring(tensor):\n    return helper(tensor)\n", {"__name__": "__main__"})
    text = lab07.job_source(ring_all_reduce=cell["ring"], zero1_step=zero_right)
    assert "SCALE = 3" in text and "def helper(x):" in text and "def ring(tensor):" in text, text
    assert "ring_all_reduce = ring" in text and "zero1_step = zero_right" in text
    assert "import torch.distributed as dist" in text and "import ortlab.labs.lab07 as lab07" in text
    namespace = {}
    exec(compile(text, "job", "exec"), namespace)  # a module a fresh process can run
    assert namespace["ring_all_reduce"](torch.ones(2)).tolist() == [3.0, 3.0]


@pytest.mark.parametrize("kwargs, words", [
    (dict(ring_all_reduce=uses_list), "uses `SCALES` (list)"),
    (dict(ring_all_reduce=lambda t: t), "is a lambda"),
    (dict(ring_all_reduce=3), "must be a function"),
    ({}, "give the functions"),
])
def test_job_source_bad_input(kwargs, words):
    with pytest.raises(lab07.RankJobError, match=words.replace("(", r"\(").replace(")", r"\)")):
        lab07.job_source(**kwargs)


def test_run_checks_bad_input_and_stubs_need_no_launch(tmp_path):
    with pytest.raises(lab07.RankJobError, match="as keywords"):
        judge07.run_checks(ring=ring_right)
    results = judge07.run_checks(ring_all_reduce=uses_list, zero1_step="x")
    assert results["ring_all_reduce"].status == "fail" and "SCALES" in results["ring_all_reduce"].message
    assert results["zero1_step"].status == "fail" and "must be a function" in results["zero1_step"].message
    (tmp_path / "lab07_job.py").write_text("mine")
    with pytest.raises(lab07.RankJobError, match="never overwrites"):
        rank_jobs.write_job(str(tmp_path), ring_all_reduce=ring_right)
    assert (tmp_path / "lab07_job.py").read_text() == "mine"
    with pytest.raises(lab07.RankJobError, match="never overwrites"):
        lab07.save_job_script("x", str(tmp_path / "lab07_job.py"))


def test_adam_update_is_torchs_adam_on_a_shard():
    torch.manual_seed(0)
    p = torch.nn.Parameter(torch.randn(10))
    flat = p.detach().clone()
    state, other = {}, {}
    opt = torch.optim.Adam([p], lr=lab07.ADAM_LR)
    for _ in range(3):
        g = torch.randn(10)
        p.grad = g.clone()
        opt.step()
        lab07.adam_update(flat[:5], g[:5], state)
        lab07.adam_update(flat[5:], g[5:], other)
    assert torch.allclose(flat, p.detach(), atol=1e-7)
    assert state["exp_avg"].shape == (5,)
    with pytest.raises(lab07.RankJobError, match="same size|of the same elements"):
        lab07.adam_update(flat[:5], g[:4], {})
    with pytest.raises(lab07.RankJobError, match="must be a dict"):
        lab07.adam_update(flat[:5], g[:5], [])


def test_job_script_and_torchrun_commands_bad_input(tmp_path):
    script = lab07.job_script(average_right, steps=2)
    assert "def train(rank, world_size, steps=2):" in script and "dist.init_process_group(\"gloo\")" in script
    assert "BEGIN SOLUTION" not in script
    compile(script, "train_job.py", "exec")
    lines = script.splitlines()
    header = [i for i, line in enumerate(lines) if line.startswith("# ")]
    first_import = min(i for i, line in enumerate(lines) if line.startswith(("import ", "from ")))
    assert header[:3] == [0, 1, 2] and first_import == 3  # the header comment whole, then the imports
    commands = lab07.torchrun_commands(str(tmp_path / "train_job.py"), nodes=2, procs_per_node=4)
    assert [c.split("--node-rank ")[1].split()[0] for c in commands] == ["0", "1"]
    assert all("--nproc-per-node 4" in c and c.endswith(" train_job.py") for c in commands)
    with pytest.raises(lab07.RankJobError, match="nodes must be a positive int"):
        lab07.torchrun_commands("x.py", nodes=0)
    with pytest.raises(lab07.RankJobError, match="steps must be a positive int"):
        lab07.job_script(average_right, steps=True)
    with pytest.raises(lab07.RankJobError, match="does not divide over 3 ranks"):
        lab07.micro_batch(0, 0, 3)
    with pytest.raises(lab07.RankJobError, match="list of"):
        judge07.run_many("ring")

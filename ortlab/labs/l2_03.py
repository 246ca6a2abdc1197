"""Exercises of the walkthrough L2_03_distributed_training: DDP's gradient buckets and the all-to-all exchange of a
mixture of experts, each written as a function of plain data (no process is launched to check them).

'ddp_buckets': the learner's function gets gradients as (name, elements, dtype) in the order backward makes them
ready, and the two size limits DDP gives its Reducer; the check (ortlab.labs.judges.l2_03) compares its buckets
with those torch's own C++ assignment gives (torch.distributed._compute_bucket_assignment_by_size, which DDP calls:
torch/csrc/distributed/c10d/reducer.cpp compute_bucket_assignment_by_size). 'all_to_all': the learner's function
gets every rank's rows and split sizes as numpy arrays and returns what dist.all_to_all_single leaves on each rank;
the check compares with the exchange as torch documents it, and tests/labs/test_exercise_facts_l2_03.py checks
that definition against gloo's all_to_all_single on real ranks (`torch_all_to_all`, one launch). The reference
answers are in solutions/walkthroughs/L2_03_distributed_training.py, outside the package.
"""
import numpy as np

from ortlab.labs.checks import CheckFailed, judge
from ortlab.labs.remote import learner, probe

# --- 'ddp_buckets' ---------------------------------------------------------------------------------------------
DTYPES = ("float32", "float16", "float64", "bfloat16")
ITEM = {"float32": 4, "float16": 2, "float64": 8, "bfloat16": 2}
KIB = 1024
# (what the case is, gradients in ready order as (name, elements, dtype), first bucket's limit, later limit)
BUCKET_CASES = (
    ("the notebook's model, bucket_cap_mb=0.0001 (104 bytes for every bucket)",
     (("fc3.bias", 2, "float32"), ("fc3.weight", 32, "float32"), ("fc2.bias", 16, "float32"),
      ("fc2.weight", 256, "float32"), ("fc1.bias", 16, "float32"), ("fc1.weight", 64, "float32")),
     104, 104),
    ("a small first bucket: limits 1 KiB, then 4 KiB",
     (("head.bias", 10, "float32"), ("head.weight", 300, "float32"), ("block2.norm", 64, "float32"),
      ("block2.fc", 1024, "float32"), ("block1.norm", 64, "float32"), ("block1.fc", 900, "float32"),
      ("embed", 700, "float32")),
     1 * KIB, 4 * KIB),
    ("two dtypes: fp16 weights, fp32 norms; limits 512 bytes, then 1 KiB",
     (("out.weight", 200, "float16"), ("ln2.weight", 64, "float32"), ("ln2.bias", 64, "float32"),
      ("mlp.weight", 600, "float16"), ("ln1.weight", 64, "float32"), ("ln1.bias", 64, "float32"),
      ("attn.weight", 256, "float16"), ("embed.weight", 100, "float16")),
     512, 1 * KIB),
)


def bucket_cases():
    """What the check of 'ddp_buckets' gives the learner's function: one row per gradient of each case."""
    rows = []
    for k, (what, grads, first, cap) in enumerate(BUCKET_CASES):
        for i, (name, numel, dtype) in enumerate(grads):
            rows.append({"case": f"{k}: {what}" if i == 0 else "", "ready": i, "name": name, "elements": numel,
                         "dtype": dtype, "bytes": numel * ITEM[dtype],
                         "limits (bytes)": f"first {first}, then {cap}" if i == 0 else ""})
    return rows


@probe
def buckets_of(fn, case_index):
    """The learner's fn(grads, first_cap, cap) on BUCKET_CASES[case_index], as a list of lists of names."""
    _, grads, first, cap = BUCKET_CASES[int(case_index)]
    found = fn([tuple(g) for g in grads], first, cap)
    if isinstance(found, (str, bytes, dict)) or not hasattr(found, "__iter__"):
        raise CheckFailed(f"return a list of buckets, each a list of gradient names, not {type(found).__name__}")
    buckets = []
    for bucket in found:
        if isinstance(bucket, (str, bytes)) or not hasattr(bucket, "__iter__"):
            raise CheckFailed(f"each bucket must be a list of gradient names, got {type(bucket).__name__} "
                              f"({bucket!r:.40})")
        buckets.append([str(name) for name in bucket])
    return buckets


def check_ddp_buckets(fn):
    """Exercise 'ddp_buckets': fn(grads, first_cap, cap) -> DDP's buckets (lists of names, ordered by their first
    gradient), checked against torch's compute_bucket_assignment_by_size on BUCKET_CASES."""
    judge("ddp_buckets", "l2_03.ddp_buckets", learner(fn))


# --- 'all_to_all' ----------------------------------------------------------------------------------------------
# (rows each rank holds, split sizes: splits[r][j] rows of rank r go to rank j, in row order)
A2A_CASES = (
    ((5, 4, 3), ((2, 0, 3), (1, 2, 1), (0, 3, 0))),
    ((3, 4), ((3, 0), (1, 3))),
    ((2, 6, 1), ((1, 1, 0), (2, 0, 4), (0, 0, 1))),
)
FEATURES = 2


def a2a_inputs(case):
    """(inputs, splits) of one A2A_CASES entry: rank r's rows are float32 (rows, FEATURES), row i of rank r
    holding [100 * r + i, -(100 * r + i)], so that any row says where it came from."""
    counts, splits = case
    inputs = [np.stack([np.array([100 * r + i, -(100 * r + i)], np.float32) for i in range(n)])
              for r, n in enumerate(counts)]
    return inputs, [list(s) for s in splits]


def a2a_table(case_index=0):
    """One row per rank of A2A_CASES[case_index]: its rows (by their first value) and its split sizes."""
    inputs, splits = a2a_inputs(A2A_CASES[case_index])
    return [{"rank": r, "rows (first value)": " ".join(f"{v:g}" for v in x[:, 0]), "splits (to rank 0, 1, ...)":
             str(splits[r])} for r, x in enumerate(inputs)]


@probe
def exchanged(fn, case_index):
    """The learner's fn(inputs, splits) on A2A_CASES[case_index]: (outputs as float32 arrays, output splits as
    lists of ints)."""
    inputs, splits = a2a_inputs(A2A_CASES[int(case_index)])
    found = fn([x.copy() for x in inputs], [list(s) for s in splits])
    if not isinstance(found, (tuple, list)) or len(found) != 2:
        raise CheckFailed(f"return (outputs, output_splits): two lists with one entry per rank, not "
                          f"{type(found).__name__}")
    outputs, output_splits = found
    world = len(inputs)
    for what, value in (("outputs", outputs), ("output_splits", output_splits)):
        if not isinstance(value, (list, tuple)) or len(value) != world:
            size = f" of {len(value)}" if isinstance(value, (list, tuple)) else ""
            raise CheckFailed(f"{what} must be a list with one entry per rank ({world}), got "
                              f"{type(value).__name__}{size}")
    arrays = []
    for r, out in enumerate(outputs):
        try:
            arrays.append(np.asarray(out, dtype=np.float32).reshape(-1, FEATURES))
        except (TypeError, ValueError):
            raise CheckFailed(f"outputs[{r}] must be an array of rows ({FEATURES} values each), got "
                              f"{type(out).__name__}") from None
    counts = []
    for r, s in enumerate(output_splits):
        try:
            counts.append([int(n) for n in s])
        except (TypeError, ValueError):
            raise CheckFailed(f"output_splits[{r}] must be a list of ints, one per rank, got {s!r:.40}") from None
    return arrays, counts


def check_all_to_all(fn):
    """Exercise 'all_to_all': fn(inputs, splits) -> (outputs, output_splits) as dist.all_to_all_single leaves them
    on every rank, checked on A2A_CASES."""
    judge("all_to_all", "l2_03.all_to_all", learner(fn))


def torch_all_to_all(rank, world_size, cases):
    """A rank function (ortlab.distributed.launch) for tests: gloo's dist.all_to_all_single on this rank's rows of
    every case whose world fits, in a group of that many ranks: [(outputs on this rank, or None), ...]."""
    import torch  # heavy: torch
    import torch.distributed as dist  # heavy: torch

    groups = {}
    results = []
    for case in cases:
        world = len(case[0])
        if world not in groups:
            groups[world] = dist.new_group(list(range(world))) if world < world_size else None
        if rank >= world:
            results.append(None)
            continue
        inputs, splits = a2a_inputs(case)
        received = [splits[j][rank] for j in range(world)]
        output = torch.empty(sum(received), FEATURES)
        dist.all_to_all_single(output, torch.from_numpy(inputs[rank]), received, splits[rank], group=groups[world])
        results.append(output.numpy())
    return results

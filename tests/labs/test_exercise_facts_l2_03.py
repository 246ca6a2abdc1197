"""L2_03's exercises are judged without launching a process. Here, independently of the judge:

- 'ddp_buckets' is judged by torch's own compute_bucket_assignment_by_size; its buckets for the notebook's model
  are those the notebook's real DDP all-reduced from its second step (a comm hook saw them) and those of ortlab's
  mirror (data_parallel.assign_buckets), the first case's gradients are that model's parameters in reverse, and the
  other cases' buckets are worked out by hand from reducer.cpp's rule;
- 'all_to_all' is judged by all_to_all_single's definition as torch documents it; here gloo's
  dist.all_to_all_single on real ranks (one launch of 3 ranks, the 2-rank case in a group of two) leaves exactly
  those rows on every rank.
"""
import warnings

import numpy as np
import torch

from ortlab.distributed import launch
from ortlab.distributed.checks.data_parallel import make_model
from ortlab.distributed.data_parallel import assign_buckets
from ortlab.labs import l2_03
from ortlab.labs.judges.l2_03 import all_to_all_single, torch_buckets

MIB = 1 << 20


def test_the_first_case_is_the_notebooks_model_in_ready_order():
    _, grads, first, cap = l2_03.BUCKET_CASES[0]
    reverse = [(name, p.numel(), str(p.dtype).replace("torch.", "")) for name, p in
               reversed(list(make_model().named_parameters()))]
    assert list(grads) == reverse
    assert first == cap == int(0.0001 * MIB)  # DDP(bucket_cap_mb=0.0001): both limits are the cap


def test_the_buckets_of_the_notebooks_model_are_those_ddp_all_reduced_and_the_mirrors():
    _, grads, first, cap = l2_03.BUCKET_CASES[0]
    seen_by_the_comm_hook = [["fc3.bias", "fc3.weight"], ["fc2.bias", "fc2.weight"], ["fc1.bias", "fc1.weight"]]
    assert torch_buckets(grads, first, cap) == seen_by_the_comm_hook
    mirror = assign_buckets([torch.empty(n) for _, n, _ in grads], cap / MIB)
    assert [[grads[i][0] for i in bucket] for bucket in mirror] == seen_by_the_comm_hook


def test_the_other_cases_by_hand():
    # case 1 (float32, 4 bytes an element; limits 1024 then 4096): head.bias 40 + head.weight 1200 = 1240 >= 1024
    # closes the first bucket; block2.norm 256 + block2.fc 4096 = 4352 >= 4096 closes the second; block1.norm 256 +
    # block1.fc 3600 + embed 2800 = 6656 >= 4096 closes the third.
    _, grads, first, cap = l2_03.BUCKET_CASES[1]
    assert torch_buckets(grads, first, cap) == [["head.bias", "head.weight"], ["block2.norm", "block2.fc"],
                                                ["block1.norm", "block1.fc", "embed"]]
    # case 2, float16 (2 bytes): out 400 + mlp 1200 = 1600 >= 512 closes the fp16 first bucket; attn 512 + embed 200
    # = 712 < 1024 stays open. float32 (4 bytes): ln2.weight 256 + ln2.bias 256 = 512 >= 512 closes the fp32 first
    # bucket; ln1.weight 256 + ln1.bias 256 = 512 < 1024 stays open. Ordered by their first gradient.
    _, grads, first, cap = l2_03.BUCKET_CASES[2]
    assert torch_buckets(grads, first, cap) == [["out.weight", "mlp.weight"], ["ln2.weight", "ln2.bias"],
                                                ["ln1.weight", "ln1.bias"], ["attn.weight", "embed.weight"]]


def test_gloos_all_to_all_single_leaves_what_the_definition_says():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # 3 ranks on fewer cores: a LaunchWarning, the results are the same
        results = launch(l2_03.torch_all_to_all, 3, args=(l2_03.A2A_CASES,), timeout=240)
    for k, case in enumerate(l2_03.A2A_CASES):
        outputs, _ = all_to_all_single(*l2_03.a2a_inputs(case))
        for rank, expected in enumerate(outputs):
            np.testing.assert_array_equal(results[rank][k], expected)

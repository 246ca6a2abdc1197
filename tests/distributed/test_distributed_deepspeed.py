"""DeepSpeed's ZeRO 1/2/3 (the production implementation, CPU accelerator on gloo) on the job ortlab's `zero`
is checked with: equal to one process with clipping off, and with DeepSpeed's default config equal to one
process that clips the global gradient norm to 1.0 (torch.nn.utils.clip_grad_norm_, computed independently
of DeepSpeed), and different from the unclipped one. One 2-rank job runs every case."""
import os
import subprocess
import sys

import pytest
import torch

from ortlab.distributed import launch
from ortlab.distributed.zero import ZeroError
from ortlab.distributed.checks.zero import check_table, reference_run, toy_model
from ortlab.distributed.zero_deepspeed import (DEEPSPEED_DEFAULT_CLIPPING, deepspeed_available,
                                               deepspeed_check, deepspeed_config, deepspeed_dir)

WORLD, STEPS, LR = 2, 3, 0.05


@pytest.fixture(scope="module")
def runs():
    # the first use on a machine compiles DeepSpeed's shm comm op (about 40 s): a generous limit
    return launch(deepspeed_check, world_size=WORLD, args=((1, 2, 3), STEPS, LR, 0, (0.0, None)), timeout=300)


def _gap(runs, label, params):
    return max(float((run[label]["params"][name] - value).abs().max())
               for run in runs for name, value in params.items())


def _loss_gap(runs, label, losses):
    mean = [sum(step) / WORLD for step in zip(*(run[label]["losses"] for run in runs))]
    return max(abs(a - b) for a, b in zip(mean, losses))


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_without_clipping_equals_one_process(runs, stage):
    losses, params = reference_run(WORLD, STEPS, LR)
    label = f"deepspeed_zero{stage}"
    assert runs[0][label]["clipping"] == 0.0
    assert _gap(runs, label, params) <= 1e-6
    assert _loss_gap(runs, label, losses) <= 1e-6


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_default_config_clips_to_norm_one(runs, stage):
    label = f"deepspeed_zero{stage} (default config)"
    assert runs[0][label]["clipping"] == DEEPSPEED_DEFAULT_CLIPPING == 1.0
    _, unclipped = reference_run(WORLD, STEPS, LR)
    losses, clipped = reference_run(WORLD, STEPS, LR, clip=1.0)
    assert _gap(runs, label, clipped) <= 1e-6 and _loss_gap(runs, label, losses) <= 1e-6
    assert _gap(runs, label, unclipped) > 1e-3  # the toy job's gradient norm is above 1: clipping shows


def test_the_toy_gradient_norm_is_above_one():
    """The premise of the clipping test, checked in one process: the first step's global norm exceeds 1."""
    from ortlab.distributed.checks.zero import toy_batch
    model = toy_model(0)
    model(*toy_batch(WORLD)).backward()
    norm = torch.linalg.vector_norm(torch.stack([p.grad.norm() for p in model.parameters() if p.grad is not None]))
    assert norm > 1.5


def test_deepspeed_optimizer_classes(runs):
    classes = {label: run["optimizer"] for label, run in runs[0].items()}
    assert classes["deepspeed_zero1"] == classes["deepspeed_zero2"] == "DeepSpeedZeroOptimizer"
    assert classes["deepspeed_zero3"] == "DeepSpeedZeroOptimizer_Stage3"


def test_check_table_lists_every_run_without_unmeasured_memory_columns(runs):
    table = check_table(runs)
    assert [row[0] for row in table.rows] == list(runs[0])
    assert table.header[-1] == "params vs one process"
    assert table.rows[2][2:] == ("<= 1e-06", "<= 1e-06") and table.rows[5][2:] != ("<= 1e-06", "<= 1e-06")


@pytest.mark.parametrize("bad", [0, 4, True, "3", None])
def test_bad_stage_is_explained(bad):
    with pytest.raises(ZeroError, match="stage must be 1, 2 or 3"):
        deepspeed_config(bad, 2)


@pytest.mark.parametrize("bad", [(), 1.0, (-1.0,), (True,), ("0",)])
def test_bad_clippings_are_explained_before_anything_starts(bad):
    with pytest.raises(ZeroError, match="clippings must be"):
        deepspeed_check(0, 1, clippings=bad)


def test_config_leaves_default_clipping_unless_given():
    assert "gradient_clipping" not in deepspeed_config(3, 2)
    assert deepspeed_config(1, 2, 0.0)["gradient_clipping"] == 0.0
    assert deepspeed_config(2, 4)["zero_optimization"] == {"stage": 2}


@pytest.mark.parametrize("bad", [(), 3, (0,), (1, 4)])
def test_bad_stages_are_explained_before_anything_starts(bad):
    with pytest.raises(ZeroError, match="stage"):
        deepspeed_check(0, 1, stages=bad)


def test_setup_installed_deepspeed_in_its_own_folder():
    assert deepspeed_available(), f"make setup installs DeepSpeed into {deepspeed_dir()}"
    assert (deepspeed_dir() / "deepspeed" / "__init__.py").is_file()


def _ortmodule_imports_deepspeed(extra_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [extra_path, os.environ.get("PYTHONPATH")]))}
    code = "import sys, onnxruntime.training.ortmodule; print('deepspeed' in sys.modules)"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.strip().splitlines()[-1]


def test_ortmodule_imports_deepspeed_when_it_can_which_is_why_it_lives_apart():
    """ORT 1.19.2's ortmodule/__init__.py imports deepspeed whenever it is importable (to wrap
    deepspeed.checkpointing.checkpoint): so DeepSpeed stays off the environment's path."""
    assert _ortmodule_imports_deepspeed(None) == "False"
    assert _ortmodule_imports_deepspeed(str(deepspeed_dir())) == "True"


@pytest.mark.parametrize("bad", [None, [], [{}], "x", [{"numel": 91}]])
def test_check_table_refuses_what_is_not_a_launch_result(bad):
    with pytest.raises(ZeroError, match="check_table"):
        check_table(bad)
